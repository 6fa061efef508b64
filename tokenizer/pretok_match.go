package tokenizer

import (
	"slices"
	"strings"
	"unicode/utf8"
)

// The character classes of DeepSeek's pre-tokenizer regexes, spelled out
// code point by code point in the regexes themselves.
const (
	reDeepseekLetters = `\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+`
	reDeepseekPunct   = `\s?[!-/:-~！-／：-～‘-‟　-。]+`
)

var (
	deepseekLetters = bracketSet(reDeepseekLetters)
	deepseekPunct   = bracketSet(reDeepseekPunct)
	cjkSet          = bracketSet(reCJK)
	cjkKanaSet      = bracketSet(reCJKKana)
)

// bracketSet parses the first bracketed class of re, a list of single code
// points and ranges a-b without escapes, into a runeSet.
func bracketSet(re string) runeSet {
	body := re[strings.IndexByte(re, '[')+1 : strings.LastIndexByte(re, ']')]
	rs := []rune(body)
	var set runeSet
	for i := 0; i < len(rs); i++ {
		lo, hi := rs[i], rs[i]
		if i+2 < len(rs) && rs[i+1] == '-' {
			hi = rs[i+2]
			i += 2
		}
		set = append(set, runeRange{lo, hi})
	}
	slices.SortFunc(set, func(a, b runeRange) int { return int(a.lo - b.lo) })
	merged := set[:1]
	for _, r := range set[1:] {
		last := &merged[len(merged)-1]
		if r.lo <= last.hi+1 {
			last.hi = max(last.hi, r.hi)
			continue
		}
		merged = append(merged, r)
	}
	return merged
}

// contraction returns the length of the English contraction suffix
// (s t m d re ve ll) at s[i:], right after an apostrophe, or 0. With fold,
// letters match in either case, as (?i:...) does; U+017F (long s) folds to s.
func contraction(s string, i int, fold bool) int {
	lower := func(k int) (byte, int) {
		if k >= len(s) {
			return 0, 0
		}
		c := s[k]
		if fold {
			if c >= 'A' && c <= 'Z' {
				return c + 'a' - 'A', 1
			}
			if c == 0xC5 && k+1 < len(s) && s[k+1] == 0xBF { // U+017F
				return 's', 2
			}
		}
		return c, 1
	}
	c1, n1 := lower(i)
	switch c1 {
	case 's', 't', 'm', 'd':
		return n1
	case 'r', 'v', 'l':
		c2, n2 := lower(i + n1)
		if (c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l') {
			return n1 + n2
		}
	}
	return 0
}

// wsRun scans the run of white space from i. It returns the run's end, the
// start of its last code point, its length in code points and the end of
// its last CR or LF (0 when it has none).
func wsRun(s string, i int) (end, last, n, crlfEnd int) {
	end, last = i, i
	for end < len(s) {
		r, c, sz := classAt(s, end)
		if c&clWS == 0 {
			break
		}
		last = end
		end += sz
		n++
		if r == '\r' || r == '\n' {
			crlfEnd = end
		}
	}
	return end, last, n, crlfEnd
}

// matchGPT2 matches GPT-2's regex at i:
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// the last alternative only when trailingWS is set.
func matchGPT2(s string, i int, trailingWS bool) int {
	if s[i] == '\'' {
		if n := contraction(s, i+1, false); n > 0 {
			return i + 1 + n
		}
	}
	j := i
	if s[i] == ' ' && i+1 < len(s) {
		j++
	}
	_, c, n := classAt(s, j)
	switch {
	case c&clL != 0:
		return spanClass(s, j+n, clL)
	case c&clN != 0:
		return spanClass(s, j+n, clN)
	case c&clWS == 0:
		return spanNotClass(s, j+n, clWS|clL|clN)
	}
	end, last, runes, _ := wsRun(s, i)
	switch {
	case end == i:
		return -1
	case end == len(s):
		return end
	case runes > 1: // \s+(?!\S): leave the last one to go with what follows
		return last
	case trailingWS:
		return end
	}
	return -1
}

// matchLlama3 matches Llama 3's regex at i (Qwen2's with digits = 1):
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func matchLlama3(s string, i int, digits int) int {
	if s[i] == '\'' {
		if n := contraction(s, i+1, true); n > 0 {
			return i + 1 + n
		}
	}
	r, c, n := classAt(s, i)
	if c&clL != 0 {
		return spanClass(s, i+n, clL)
	}
	if r != '\r' && r != '\n' && c&clN == 0 && i+n < len(s) {
		if _, c2, n2 := classAt(s, i+n); c2&clL != 0 {
			return spanClass(s, i+n+n2, clL)
		}
	}
	if c&clN != 0 {
		e := i + n
		for k := 1; k < digits && e < len(s); k++ {
			_, c2, n2 := classAt(s, e)
			if c2&clN == 0 {
				break
			}
			e += n2
		}
		return e
	}
	j, cj, nj := i, c, n
	if r == ' ' && i+1 < len(s) {
		j = i + 1
		_, cj, nj = classAt(s, j)
	}
	if cj&(clWS|clL|clN) == 0 {
		e := spanNotClass(s, j+nj, clWS|clL|clN)
		for e < len(s) && (s[e] == '\r' || s[e] == '\n') {
			e++
		}
		return e
	}
	end, last, runes, crlfEnd := wsRun(s, i)
	switch {
	case end == i:
		return -1
	case crlfEnd > 0:
		return crlfEnd
	case end < len(s) && runes > 1:
		return last
	}
	return end
}

// matchPunctRun matches [\p{P}\$\+<=>\^~\|]+ (with the backtick too when
// backtick is set).
func matchPunctRun(s string, i int, backtick bool) int {
	e := i
	for e < len(s) {
		r, c, n := classAt(s, e)
		if c&clP == 0 && !strings.ContainsRune("$+<=>^~|", r) && !(backtick && r == '`') {
			break
		}
		e += n
	}
	return e
}

// matchDigit matches \p{N}.
func matchDigit(s string, i int) int {
	if _, c, n := classAt(s, i); c&clN != 0 {
		return i + n
	}
	return -1
}

// matchDigits matches \p{N}+.
func matchDigits(s string, i int) int { return spanClass(s, i, clN) }

// matchDigits3 matches [0-9][0-9][0-9].
func matchDigits3(s string, i int) int {
	if i+3 <= len(s) && isDigit(s[i]) && isDigit(s[i+1]) && isDigit(s[i+2]) {
		return i + 3
	}
	return -1
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// matchCRLF matches [\r\n].
func matchCRLF(s string, i int) int {
	if s[i] == '\r' || s[i] == '\n' {
		return i + 1
	}
	return -1
}

// matchSpaceThen matches \s?X+ where in tells whether a code point is in X.
func matchSpaceThen(s string, i int, in func(rune, charClass) bool) int {
	span := func(e int) int {
		for e < len(s) {
			r, c, n := classAt(s, e)
			if !in(r, c) {
				break
			}
			e += n
		}
		return e
	}
	r, c, n := classAt(s, i)
	if c&clWS != 0 && i+n < len(s) {
		if e := span(i + n); e > i+n {
			return e
		}
	}
	if in(r, c) {
		return span(i + n)
	}
	return -1
}

// matchSet matches [set]+.
func matchSet(s string, i int, set runeSet) int { return set.span(s, i) }

// matchBloom matches BLOOM's " ?[^(\s|.,!?…。，、।۔،)]+": runs of anything but
// white space and those delimiters, with one leading space.
func matchBloom(s string, i int) int {
	stop := func(r rune, c charClass) bool {
		return c&clWS != 0 || strings.ContainsRune("(|.,!?…。，、।۔،)", r)
	}
	j := i
	if s[i] == ' ' {
		j++
	}
	e := j
	for e < len(s) {
		r, c, n := classAt(s, e)
		if stop(r, c) {
			break
		}
		e += n
	}
	if e == j {
		return -1
	}
	return e
}

// trailingWS matches \s+$: white space that ends the piece. A run that does
// not reach the end is skipped whole, so the search stays linear.
type trailingWS struct{}

func (trailingWS) find(s string, i int) (int, int) {
	for i < len(s) {
		_, c, n := classAt(s, i)
		if c&clWS == 0 {
			i += n
			continue
		}
		end, _, _, _ := wsRun(s, i)
		if end == len(s) {
			return i, end
		}
		i = end
	}
	return -1, -1
}

// Letter classes of Mistral's tekken regex: A = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
// (may start a word), B = [\p{Ll}\p{Lm}\p{Lo}\p{M}] (may continue it).
const (
	tekkenA = clLu | clLt | clLm | clLo | clM
	tekkenB = clLl | clLm | clLo | clM
)

// matchTekken matches Mistral's tekken regex at i:
//
//	[^\r\n\p{L}\p{N}]?[A]*[B]+|[^\r\n\p{L}\p{N}]?[A]+[B]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
func matchTekken(s string, i int) int {
	r, c, n := classAt(s, i)
	// The optional first character: anything but CR, LF, letters and digits.
	starts := []int{i}
	if r != '\r' && r != '\n' && c&(clL|clN) == 0 && i+n < len(s) {
		starts = []int{i + n, i}
	}
	for _, j := range starts { // A*B+: the A run gives back code points until a B can follow
		k, lastB := j, -1
		for k < len(s) {
			_, ck, nk := classAt(s, k)
			if ck&tekkenA == 0 {
				break
			}
			if ck&tekkenB != 0 {
				lastB = k
			}
			k += nk
		}
		if e := spanClass(s, k, tekkenB); e > k {
			return e
		}
		if lastB >= 0 {
			return spanClass(s, lastB, tekkenB)
		}
	}
	for _, j := range starts { // A+B*
		if k := spanClass(s, j, tekkenA); k > j {
			return spanClass(s, k, tekkenB)
		}
	}
	if c&clN != 0 {
		return i + n
	}
	j, cj, nj := i, c, n
	if r == ' ' && i+1 < len(s) {
		j = i + 1
		_, cj, nj = classAt(s, j)
	}
	if cj&(clWS|clL|clN) == 0 {
		e := spanNotClass(s, j+nj, clWS|clL|clN)
		for e < len(s) && (s[e] == '\r' || s[e] == '\n' || s[e] == '/') {
			e++
		}
		return e
	}
	end, last, runes, crlfEnd := wsRun(s, i)
	switch {
	case end == i:
		return -1
	case crlfEnd > 0:
		return crlfEnd
	case end < len(s) && runes > 1:
		return last
	}
	return end
}

// matchDigits1to3 matches \p{N}{1,3}.
func matchDigits1to3(s string, i int) int {
	e := i
	for k := 0; k < 3 && e < len(s); k++ {
		_, c, n := classAt(s, e)
		if c&clN == 0 {
			break
		}
		e += n
	}
	if e == i {
		return -1
	}
	return e
}

// matchDeepseekV3 matches the last regex of DeepSeek V3's pre-tokenizer at i:
//
//	[ASCII punctuation][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func matchDeepseekV3(s string, i int) int {
	isASCIILetter := func(k int) bool { return k < len(s) && (s[k]|0x20) >= 'a' && (s[k]|0x20) <= 'z' }
	if c := s[i]; c < utf8.RuneSelf && c > ' ' && c != 0x7F && asciiClass[c]&(clL|clN) == 0 && isASCIILetter(i+1) {
		e := i + 1
		for isASCIILetter(e) {
			e++
		}
		return e
	}
	r, c, n := classAt(s, i)
	if r != '\r' && r != '\n' && c&(clL|clP|clS) == 0 && i+n < len(s) {
		if e := spanClass(s, i+n, clL|clM); e > i+n {
			return e
		}
	}
	if e := spanClass(s, i, clL|clM); e > i {
		return e
	}
	j, cj, nj := i, c, n
	if r == ' ' && i+1 < len(s) {
		j = i + 1
		_, cj, nj = classAt(s, j)
	}
	if cj&(clP|clS) != 0 {
		e := spanClass(s, j+nj, clP|clS)
		for e < len(s) && (s[e] == '\r' || s[e] == '\n') {
			e++
		}
		return e
	}
	end, last, runes, crlfEnd := wsRun(s, i)
	switch {
	case end == i:
		return -1
	case crlfEnd > 0:
		return crlfEnd
	case end < len(s) && runes > 1:
		return last
	}
	return end
}
