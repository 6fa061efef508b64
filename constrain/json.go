// Package constrain restricts generation to a language: at each step it
// tells which tokens keep the output a valid prefix. JSON is the language
// it knows: an object, as OpenAI's response_format json_object asks.
package constrain

// maxDepth bounds nesting so a state is a small fixed-size value that can
// be copied freely while testing candidate tokens.
const maxDepth = 64

// maxSpaces bounds a run of whitespace between tokens of the document, so
// a model cannot pad forever (strings may hold any amount).
const maxSpaces = 16

type mode uint8

const (
	start        mode = iota // before the top-level value: whitespace, then '{'
	value                    // a value is expected
	keyOrClose               // after '{': a key or '}'
	key                      // after ',' in an object: a key
	colon                    // after a key
	commaOrClose             // after a member or element
	valueOrClose             // after '[': a value or ']'
	str                      // inside a string
	strEscape                // after a backslash
	strHex                   // inside \uXXXX; hex counts the digits left
	num                      // inside a number; numState says where
	literal                  // inside true / false / null
	done                     // the top-level object is complete
)

// number grammar states
const (
	nSign     = iota // after '-'
	nZero            // after a leading 0
	nInt             // in integer digits
	nDot             // after '.'
	nFrac            // in fraction digits
	nExp             // after e/E
	nExpSign         // after the exponent's sign
	nExpDigit        // in exponent digits
)

// JSON is the state of a JSON-object prefix. The zero value expects the
// start of the document. It is a plain value: copy it to try bytes
// without changing the original.
type JSON struct {
	mode     mode
	isKey    bool // the string being read is an object key
	hex      uint8
	numState uint8
	lit      string // the rest of a literal still to come
	spaces   uint8  // length of the current whitespace run between tokens
	depth    uint8
	stack    [maxDepth]byte // '{' or '['
}

// Complete reports whether a whole top-level object has been read.
func (j *JSON) Complete() bool { return j.mode == done }

func isSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' }

// Feed advances by one byte and reports whether the prefix is still valid.
// After false the state is unusable. The document must start with '{'
// (no leading whitespace) and whitespace runs between tokens are bounded.
func (j *JSON) Feed(b byte) bool {
	if j.mode != str && j.mode != strEscape && j.mode != strHex && j.mode != num && j.mode != literal {
		if isSpace(b) {
			if j.mode == start || j.spaces == maxSpaces {
				return false
			}
			j.spaces++
			return true
		}
		j.spaces = 0
	}
	switch j.mode {
	case start:
		if b != '{' {
			return false
		}
		return j.open('{')
	case done:
		return isSpace(b)
	case value, valueOrClose:
		if isSpace(b) {
			return true
		}
		if b == ']' && j.mode == valueOrClose {
			return j.close()
		}
		return j.beginValue(b)
	case keyOrClose, key:
		if isSpace(b) {
			return true
		}
		if b == '}' && j.mode == keyOrClose {
			return j.close()
		}
		if b != '"' {
			return false
		}
		j.mode, j.isKey = str, true
		return true
	case colon:
		if isSpace(b) {
			return true
		}
		if b != ':' {
			return false
		}
		j.mode = value
		return true
	case commaOrClose:
		if isSpace(b) {
			return true
		}
		top := j.stack[j.depth-1]
		switch {
		case b == ',' && top == '{':
			j.mode = key
		case b == ',' && top == '[':
			j.mode = value
		case b == '}' && top == '{', b == ']' && top == '[':
			return j.close()
		default:
			return false
		}
		return true
	case str:
		switch {
		case b == '"':
			if j.isKey {
				j.mode, j.isKey = colon, false
			} else {
				j.valueDone()
			}
		case b == '\\':
			j.mode = strEscape
		case b < 0x20:
			return false
		}
		return true
	case strEscape:
		switch b {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			j.mode = str
		case 'u':
			j.mode, j.hex = strHex, 4
		default:
			return false
		}
		return true
	case strHex:
		if !(b >= '0' && b <= '9' || b >= 'a' && b <= 'f' || b >= 'A' && b <= 'F') {
			return false
		}
		if j.hex--; j.hex == 0 {
			j.mode = str
		}
		return true
	case literal:
		if b != j.lit[0] {
			return false
		}
		if j.lit = j.lit[1:]; j.lit == "" {
			j.valueDone()
		}
		return true
	case num:
		return j.feedNumber(b)
	}
	return false
}

// beginValue starts a value with its first byte.
func (j *JSON) beginValue(b byte) bool {
	switch {
	case b == '{' || b == '[':
		return j.open(b)
	case b == '"':
		j.mode, j.isKey = str, false
	case b == '-':
		j.mode, j.numState = num, nSign
	case b == '0':
		j.mode, j.numState = num, nZero
	case b >= '1' && b <= '9':
		j.mode, j.numState = num, nInt
	case b == 't':
		j.mode, j.lit = literal, "rue"
	case b == 'f':
		j.mode, j.lit = literal, "alse"
	case b == 'n':
		j.mode, j.lit = literal, "ull"
	default:
		return false
	}
	return true
}

func (j *JSON) feedNumber(b byte) bool {
	digit := b >= '0' && b <= '9'
	switch j.numState {
	case nSign:
		switch {
		case b == '0':
			j.numState = nZero
		case digit:
			j.numState = nInt
		default:
			return false
		}
		return true
	case nDot:
		if !digit {
			return false
		}
		j.numState = nFrac
		return true
	case nExp:
		switch {
		case b == '+' || b == '-':
			j.numState = nExpSign
		case digit:
			j.numState = nExpDigit
		default:
			return false
		}
		return true
	case nExpSign:
		if !digit {
			return false
		}
		j.numState = nExpDigit
		return true
	case nInt, nZero:
		if digit && j.numState == nInt {
			return true
		}
		if b == '.' {
			j.numState = nDot
			return true
		}
		if b == 'e' || b == 'E' {
			j.numState = nExp
			return true
		}
	case nFrac:
		if digit {
			return true
		}
		if b == 'e' || b == 'E' {
			j.numState = nExp
			return true
		}
	case nExpDigit:
		if digit {
			return true
		}
	}
	// The number ended (it was in a complete state); the byte belongs to
	// what follows it.
	j.valueDone()
	return j.Feed(b)
}

func (j *JSON) open(b byte) bool {
	if int(j.depth) == maxDepth {
		return false
	}
	j.stack[j.depth] = b
	j.depth++
	if b == '{' {
		j.mode = keyOrClose
	} else {
		j.mode = valueOrClose
	}
	return true
}

func (j *JSON) close() bool {
	j.depth--
	j.valueDone()
	return true
}

// valueDone moves past a complete value.
func (j *JSON) valueDone() {
	if j.depth == 0 {
		j.mode = done
	} else {
		j.mode = commaOrClose
	}
}

// FeedString feeds every byte of s.
func (j *JSON) FeedString(s string) bool {
	for i := 0; i < len(s); i++ {
		if !j.Feed(s[i]) {
			return false
		}
	}
	return true
}
