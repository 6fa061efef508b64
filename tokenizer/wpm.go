package tokenizer

import (
	"fmt"
	"sync"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// wpm segments text the way llama.cpp's llm_tokenizer_wpm does for BERT
// vocabularies. Its GGUF vocabulary marks word starts, not continuations:
// BERT's "the" is stored as "▁the" and "##ing" as "ing".
//
// Preprocessing, per code point: each is replaced by the first code point of
// its canonical decomposition (NFD), which drops the accents of precomposed
// letters ("é" → "e", but a Hangul syllable keeps only its leading jamo);
// whitespace ends a word; NUL, U+FFFD and control/format characters are
// dropped; the rest is lower-cased, and punctuation, ASCII symbols and CJK
// ideographs become words of one character. Each word, with "▁" put before
// it, is then cut greedily into the longest pieces from the left; a word
// with any part that matches no piece becomes a single UNK.
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
		if r != utf8.RuneError {
			r = wpmNFDFirst(r, text[i:i+size])
		}
		i += size
		switch wpmClassOf(r) {
		case wpmLetter:
			word = utf8.AppendRune(word, unicode.ToLower(r))
		case wpmSpace:
			dst = w.word(dst, word)
			word = word[:prefix]
		case wpmAlone:
			dst = w.word(dst, word)
			dst = w.word(dst, utf8.AppendRune(word[:prefix], unicode.ToLower(r)))
			word = word[:prefix]
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

// wpmClassOf sorts a code point, already mapped by wpmNFDFirst, as
// llama.cpp's preprocessing does: by its Unicode general category.
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

// wpmNFDFirst returns the first code point of r's canonical decomposition
// (r itself if it has none); src is r's UTF-8 encoding.
func wpmNFDFirst(r rune, src string) rune {
	const hangulFirst, hangulLast, jamoL, perL = 0xAC00, 0xD7A3, 0x1100, 21 * 28
	if r < 0xC0 {
		return r // nothing below U+00C0 decomposes
	}
	if hangulFirst <= r && r <= hangulLast {
		return jamoL + (r-hangulFirst)/perL
	}
	if d := norm.NFD.PropertiesString(src).Decomposition(); len(d) > 0 {
		first, _ := utf8.DecodeRune(d)
		return first
	}
	return r
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
