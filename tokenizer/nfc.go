package tokenizer

import (
	_ "embed"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// Unicode Normalization Form C (UAX #15), which Qwen2's Hugging Face
// tokenizer applies before pre-tokenizing: canonical decomposition,
// canonical ordering of combining marks, then canonical composition.
// The tables come from nfc_data.txt (see nfc_gen.py).

//go:generate python3 nfc_gen.py

//go:embed nfc_data.txt
var nfcData string

var (
	nfcOnce   sync.Once
	nfcDecomp map[rune][]rune // full canonical decomposition
	nfcCCC    map[rune]uint8  // canonical combining class, when not 0
	nfcPairs  map[uint64]rune // starter<<32 | mark -> primary composite
	nfcSecond map[rune]bool   // code points that compose with a preceding one
)

// Hangul syllables decompose and compose by arithmetic.
const (
	hangulS, hangulL, hangulV, hangulT = 0xAC00, 0x1100, 0x1161, 0x11A7
	hangulLCount, hangulVCount         = 19, 21
	hangulTCount                       = 28
	hangulNCount                       = hangulVCount * hangulTCount
	hangulSCount                       = hangulLCount * hangulNCount
)

func loadNFC() {
	nfcDecomp = map[rune][]rune{}
	nfcCCC = map[rune]uint8{}
	nfcPairs = map[uint64]rune{}
	nfcSecond = map[rune]bool{}
	for _, line := range strings.Split(nfcData, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] == "#" {
			continue
		}
		var cps []rune
		for _, h := range f[1:] {
			x, err := strconv.ParseUint(h, 16, 32)
			if err != nil {
				panic("tokenizer: nfc_data.txt: bad code point " + h) // embedded data: a build error
			}
			cps = append(cps, rune(x))
		}
		switch f[0] {
		case "D":
			nfcDecomp[cps[0]] = cps[1:]
		case "C":
			x, _ := strconv.ParseUint(f[2], 10, 8)
			nfcCCC[cps[0]] = uint8(x)
		case "P":
			nfcPairs[uint64(cps[0])<<32|uint64(cps[1])] = cps[2]
			nfcSecond[cps[1]] = true
		}
	}
}

// nfcMaybeChanges reports whether r might not survive NFC unchanged.
func nfcMaybeChanges(r rune) bool {
	if r < 0x300 {
		return false
	}
	if r >= hangulL && r < hangulL+0x100 || r >= hangulS && r < hangulS+hangulSCount {
		return true // Hangul jamo compose; syllables take trailing jamo
	}
	_, d := nfcDecomp[r]
	return d || nfcCCC[r] != 0 || nfcSecond[r]
}

// nfc returns s in Normalization Form C. Invalid UTF-8 bytes pass through.
func nfc(s string) string {
	nfcOnce.Do(loadNFC)
	start := -1
	for i, r := range s {
		if nfcMaybeChanges(r) {
			start = i
			break
		}
	}
	if start < 0 {
		return s
	}
	// Normalize from the last starter before the first suspect code point.
	for start > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:start])
		if nfcCCC[r] == 0 && !nfcSecond[r] {
			start -= n
			break
		}
		start -= n
	}
	var b strings.Builder
	b.WriteString(s[:start])
	var buf []rune
	for i := start; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b.WriteString(string(nfcCompose(buf)))
			buf = buf[:0]
			b.WriteByte(s[i])
			i++
			continue
		}
		buf = nfcDecompose(buf, r)
		i += n
	}
	b.WriteString(string(nfcCompose(buf)))
	return b.String()
}

func nfcDecompose(dst []rune, r rune) []rune {
	if r >= hangulS && r < hangulS+hangulSCount {
		si := r - hangulS
		dst = append(dst, hangulL+si/hangulNCount, hangulV+(si%hangulNCount)/hangulTCount)
		if t := si % hangulTCount; t != 0 {
			dst = append(dst, hangulT+t)
		}
		return dst
	}
	if d, ok := nfcDecomp[r]; ok {
		return append(dst, d...)
	}
	return append(dst, r)
}

// nfcCompose puts each run of combining marks in canonical order, then
// composes the sequence in place.
func nfcCompose(cps []rune) []rune {
	for i := 0; i < len(cps); {
		if nfcCCC[cps[i]] == 0 {
			i++
			continue
		}
		j := i
		for j < len(cps) && nfcCCC[cps[j]] != 0 {
			j++
		}
		slices.SortStableFunc(cps[i:j], func(a, b rune) int { return int(nfcCCC[a]) - int(nfcCCC[b]) })
		i = j
	}
	if len(cps) == 0 {
		return cps
	}
	out := cps[:1]
	starter := 0 // index in out of the last starter, -1 if none
	if nfcCCC[cps[0]] != 0 {
		starter = -1
	}
	lastCCC := -1 // class of the last code point appended after the starter
	for _, c := range cps[1:] {
		ccc := int(nfcCCC[c])
		if starter >= 0 && (lastCCC < ccc || lastCCC == -1 && ccc == 0) {
			if comp, ok := nfcComposePair(out[starter], c); ok {
				out[starter] = comp
				continue
			}
		}
		if ccc == 0 {
			starter = len(out)
			lastCCC = -1
		} else {
			lastCCC = ccc
		}
		out = append(out, c)
	}
	return out
}

func nfcComposePair(a, b rune) (rune, bool) {
	if a >= hangulL && a < hangulL+hangulLCount && b >= hangulV && b < hangulV+hangulVCount {
		return hangulS + ((a-hangulL)*hangulVCount+(b-hangulV))*hangulTCount, true
	}
	if a >= hangulS && a < hangulS+hangulSCount && (a-hangulS)%hangulTCount == 0 && b > hangulT && b < hangulT+hangulTCount {
		return a + (b - hangulT), true
	}
	c, ok := nfcPairs[uint64(a)<<32|uint64(b)]
	return c, ok
}
