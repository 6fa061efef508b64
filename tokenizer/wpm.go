package tokenizer

import (
	"fmt"
	"sync"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// wpm segments text for BERT vocabularies the way Hugging Face's BERT
// tokenizer does (BertNormalizer, BertPreTokenizer, WordPiece), which
// llama.cpp's llm_tokenizer_wpm approximates. llama.cpp's GGUF vocabulary
// marks word starts, not continuations: BERT's "the" is stored as "▁the"
// and "##ing" as "ing".
//
// Preprocessing, per code point: whitespace ends a word; NUL, U+FFFD and
// control, format, private-use and surrogate characters are dropped; CJK
// ideographs are words of their own. Every other character is decomposed
// (NFD) and stripped of its nonspacing marks (Mn), then lower-cased;
// punctuation and ASCII symbols become words of their own. Each word, with
// "▁" put before it, is then cut greedily into the longest pieces from the
// left; a word of more than 100 characters, or with any part that matches
// no piece, becomes a single UNK.
//
// llama.cpp differs in two ways this type does not copy: it keeps only the
// first code point of a decomposition, so a Hangul syllable loses its vowel
// and final consonant, and it keeps nonspacing marks typed as such (a
// Devanagari virama, Thai vowel signs), which turns their words into UNK.
// On English text and llama.cpp's own test vectors the two agree.
//
// wpm is read-only after newWPM and safe for concurrent use.
type wpm struct {
	ids    map[string]int32
	maxLen int // longest piece, in bytes
	unk    int32

	words sync.Pool // *[]byte, the word being built
}

// wpmClass is what preprocessing does with an ASCII character.
type wpmClass uint8

const (
	wpmLetter wpmClass = iota // joins the current word
	wpmSpace                  // ends the current word
	wpmDrop                   // is dropped
	wpmAlone                  // is a word of its own
)

// wpmMaxWordChars is WordPiece's max_input_chars_per_word: a longer word
// is UNK.
const wpmMaxWordChars = 100

var wpmASCII = func() (t [128]wpmClass) {
	for c := range t {
		t[c] = wpmClassOf(rune(c))
	}
	return t
}()

func newWPM(v *Vocab) (*wpm, error) {
	n := len(v.Tokens)
	if v.UNK < 0 || int(v.UNK) >= n {
		return nil, fmt.Errorf("tokenizer: WordPiece needs an unknown token; id %d is outside the vocabulary of %d tokens", v.UNK, n)
	}
	w := &wpm{ids: make(map[string]int32, n), unk: v.UNK}
	for i, tok := range v.Tokens {
		if tok == "" {
			continue
		}
		if j, dup := w.ids[tok]; dup {
			return nil, fmt.Errorf("tokenizer: token %d %q repeats token %d", i, tok, j)
		}
		w.ids[tok] = int32(i)
		w.maxLen = max(w.maxLen, len(tok))
	}
	w.words.New = func() any { b := make([]byte, 0, 64); return &b }
	return w, nil
}

// encode appends the tokens of one fragment of raw text (special tokens
// already split out) to dst.
func (w *wpm) encode(dst []int32, text string) []int32 {
	bp := w.words.Get().(*[]byte)
	defer w.words.Put(bp)
	word := append((*bp)[:0], spmSpace...) // word[:3] is the "▁" prefix
	const prefix = len(spmSpace)
	var decomposed wpmRunes

	for i := 0; i < len(text); {
		c := text[i]
		if c < utf8.RuneSelf {
			i++
			switch wpmASCII[c] {
			case wpmLetter:
				if 'A' <= c && c <= 'Z' {
					c += 'a' - 'A'
				}
				word = append(word, c)
			case wpmSpace:
				dst = w.word(dst, word)
				word = word[:prefix]
			case wpmAlone:
				dst = w.word(dst, word)
				dst = w.word(dst, append(word[:prefix], c))
				word = word[:prefix]
			}
			continue
		}
		r, size := utf8.DecodeRuneInString(text[i:])
		src := text[i : i+size]
		i += size
		switch {
		case unicode.IsSpace(r):
			dst = w.word(dst, word)
			word = word[:prefix]
			continue
		case r == 0 || r == utf8.RuneError || unicode.Is(unicode.C, r):
			continue
		case wpmCJK(r):
			dst = w.word(dst, word)
			word = word[:prefix]
			for _, d := range wpmDecompose(&decomposed, r, src) {
				if !unicode.Is(unicode.Mn, d) {
					word = utf8.AppendRune(word, unicode.ToLower(d))
				}
			}
			dst = w.word(dst, word)
			word = word[:prefix]
			continue
		}
		for _, d := range wpmDecompose(&decomposed, r, src) {
			if unicode.Is(unicode.Mn, d) {
				continue
			}
			d = unicode.ToLower(d)
			switch wpmClassOf(d) {
			case wpmLetter:
				word = utf8.AppendRune(word, d)
			case wpmSpace:
				dst = w.word(dst, word)
				word = word[:prefix]
			case wpmAlone:
				dst = w.word(dst, word)
				dst = w.word(dst, utf8.AppendRune(word[:prefix], d))
				word = word[:prefix]
			}
		}
	}
	dst = w.word(dst, word)
	*bp = word
	return dst
}

// word appends the pieces of one "▁"-prefixed word: at each position the
// longest piece that matches, or, if some position matches none, UNK alone.
func (w *wpm) word(dst []int32, word []byte) []int32 {
	n := len(word)
	if n == len(spmSpace) {
		return dst // empty word
	}
	if n-len(spmSpace) > wpmMaxWordChars && utf8.RuneCount(word[len(spmSpace):]) > wpmMaxWordChars {
		return append(dst, w.unk)
	}
	n0 := len(dst)
	for i := 0; i < n; {
		j := min(n, i+w.maxLen)
		for ; j > i; j-- {
			if id, ok := w.ids[string(word[i:j])]; ok {
				dst = append(dst, id)
				break
			}
		}
		if j == i {
			return append(dst[:n0], w.unk)
		}
		i = j
	}
	return dst
}

// wpmClassOf sorts a code point by its Unicode general category.
func wpmClassOf(r rune) wpmClass {
	switch {
	case unicode.IsSpace(r):
		return wpmSpace
	case r == 0 || r == utf8.RuneError || unicode.Is(unicode.C, r):
		return wpmDrop
	case unicode.IsPunct(r) || (r < 0x7F && unicode.IsSymbol(r)) || wpmCJK(r):
		return wpmAlone
	}
	return wpmLetter
}

// wpmRunes holds a decomposition: the longest canonical one is 4 code
// points, a Hangul syllable's 3.
type wpmRunes [8]rune

// wpmDecompose returns r's canonical decomposition (NFD), in buf; src is
// r's UTF-8 encoding.
func wpmDecompose(buf *wpmRunes, r rune, src string) []rune {
	const sBase, sCount, lBase, vBase, tBase, nCount, tCount = 0xAC00, 11172, 0x1100, 0x1161, 0x11A7, 588, 28
	if r < 0xC0 {
		buf[0] = r // nothing below U+00C0 decomposes
		return buf[:1]
	}
	if s := r - sBase; 0 <= s && s < sCount {
		buf[0], buf[1] = lBase+s/nCount, vBase+s%nCount/tCount
		if t := s % tCount; t != 0 {
			buf[2] = tBase + t
			return buf[:3]
		}
		return buf[:2]
	}
	d := norm.NFD.PropertiesString(src).Decomposition()
	if len(d) == 0 {
		buf[0] = r
		return buf[:1]
	}
	n := 0
	for len(d) > 0 && n < len(buf) {
		c, size := utf8.DecodeRune(d)
		buf[n] = c
		n++
		d = d[size:]
	}
	return buf[:n]
}

// wpmCJK reports whether r is a CJK ideograph, by the ranges BERT uses (with
// its 0x2B920 for 0x2B820, as llama.cpp and Hugging Face keep it).
func wpmCJK(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) ||
		(r >= 0x3400 && r <= 0x4DBF) ||
		(r >= 0x20000 && r <= 0x2A6DF) ||
		(r >= 0x2A700 && r <= 0x2B73F) ||
		(r >= 0x2B740 && r <= 0x2B81F) ||
		(r >= 0x2B920 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) ||
		(r >= 0x2F800 && r <= 0x2FA1F)
}
