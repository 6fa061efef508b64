package tokenizer

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

// charClass is the set of Unicode properties the pre-tokenizers test: the
// general categories behind the regex classes \p{L}, \p{N}, \p{P}, \p{S},
// \p{M}, the letter cases of \p{Lu} etc., and White_Space (\s).
type charClass uint16

const (
	clL  charClass = 1 << iota // letter (\p{L})
	clN                        // number (\p{N})
	clWS                       // White_Space (\s)
	clP                        // punctuation (\p{P})
	clS                        // symbol (\p{S})
	clM                        // mark (\p{M})
	clLu                       // uppercase letter
	clLl                       // lowercase letter
	clLt                       // titlecase letter
	clLm                       // modifier letter
	clLo                       // other letter
)

var (
	asciiClass [utf8.RuneSelf]charClass
	bmpOnce    sync.Once
	bmpClass   []charClass // classes of U+0000..U+FFFF, built on first use
)

func init() {
	for r := rune(0); r < utf8.RuneSelf; r++ {
		asciiClass[r] = computeClass(r)
	}
}

func computeClass(r rune) charClass {
	var c charClass
	switch {
	case unicode.IsLetter(r):
		c |= clL
		switch {
		case unicode.Is(unicode.Lu, r):
			c |= clLu
		case unicode.Is(unicode.Ll, r):
			c |= clLl
		case unicode.Is(unicode.Lt, r):
			c |= clLt
		case unicode.Is(unicode.Lm, r):
			c |= clLm
		default:
			c |= clLo
		}
	case unicode.IsNumber(r):
		c |= clN
	case unicode.IsPunct(r):
		c |= clP
	case unicode.IsSymbol(r):
		c |= clS
	case unicode.IsMark(r):
		c |= clM
	}
	if unicode.IsSpace(r) { // White_Space, as \s in the tokenizers' regexes
		c |= clWS
	}
	return c
}

// classOf returns the properties of r.
func classOf(r rune) charClass {
	if r < utf8.RuneSelf {
		return asciiClass[r]
	}
	if r <= 0xFFFF {
		bmpOnce.Do(func() {
			t := make([]charClass, 0x10000)
			for i := range t {
				t[i] = computeClass(rune(i))
			}
			bmpClass = t
		})
		return bmpClass[r]
	}
	return computeClass(r)
}

// classAt returns the code point starting at s[i], its properties and its
// length in bytes. An invalid byte reads as U+FFFD of length 1, so every byte
// of the text belongs to exactly one piece.
func classAt(s string, i int) (rune, charClass, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), asciiClass[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return r, classOf(r), n
}

// spanClass returns the end of the run of code points from i that have one
// of the properties in want.
func spanClass(s string, i int, want charClass) int {
	for i < len(s) {
		_, c, n := classAt(s, i)
		if c&want == 0 {
			break
		}
		i += n
	}
	return i
}

// spanNotClass returns the end of the run of code points from i that have
// none of the properties in avoid.
func spanNotClass(s string, i int, avoid charClass) int {
	for i < len(s) {
		_, c, n := classAt(s, i)
		if c&avoid != 0 {
			break
		}
		i += n
	}
	return i
}

// runeRange is an inclusive range of code points.
type runeRange struct{ lo, hi rune }

// runeSet is a sorted list of disjoint ranges: a bracketed character class.
type runeSet []runeRange

func (t runeSet) has(r rune) bool {
	lo, hi := 0, len(t)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		switch {
		case r < t[m].lo:
			hi = m
		case r > t[m].hi:
			lo = m + 1
		default:
			return true
		}
	}
	return false
}

// span returns the end of the run of code points from i that are in t.
func (t runeSet) span(s string, i int) int {
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !t.has(r) {
			break
		}
		i += n
	}
	return i
}
