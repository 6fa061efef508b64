package tokenizer

import "unicode/utf8"

// GPT-2's byte-level BPE spells every byte as one printable code point so
// that vocabulary entries are valid text: the printable Latin-1 bytes
// (0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF) stand for themselves and the other 68
// bytes, in order, take U+0100, U+0101, ... (space 0x20 becomes "Ġ" U+0120,
// newline 0x0A becomes "Ċ" U+010A).
var (
	byteRune [256]rune         // byte -> code point
	runeByte = map[rune]byte{} // inverse of byteRune
)

func init() {
	next := rune(256)
	for b := 0; b < 256; b++ {
		if (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE {
			byteRune[b] = rune(b)
		} else {
			byteRune[b] = next
			next++
		}
		runeByte[byteRune[b]] = byte(b)
	}
}

// byteLevelEncode appends the byte-level spelling of s to dst.
func byteLevelEncode(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		dst = utf8.AppendRune(dst, byteRune[s[i]])
	}
	return dst
}

// byteLevelDecode maps a byte-level spelled token back to its bytes. ok is
// false when some code point is not in the byte alphabet (such a token is
// not byte-level text, e.g. an added token).
func byteLevelDecode(dst []byte, s string) ([]byte, bool) {
	for _, r := range s {
		b, ok := runeByte[r]
		if !ok {
			return dst, false
		}
		dst = append(dst, b)
	}
	return dst, true
}
