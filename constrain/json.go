// Package constrain restricts generation to a language: at each step it
// tells which tokens keep the output a valid prefix. JSON is the language
// it knows: an object, as OpenAI's response_format json_object asks, or a
// document that follows a JSON Schema (CompileSchema), as json_schema
// asks.
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
	enumValue                // inside a value of a schema's enum
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

	// With a schema (NewSchemaJSON): the node of each open container
	// (-1: any content), what each has had (an object's members as bits,
	// an array's element count), the node of the value expected next, and
	// for a key or an enum value being read, the candidates it can still
	// be and how many bytes of it were read.
	sch     *Schema
	frame   [schemaDepth]int16
	had     [schemaDepth]uint64
	want    int16
	cands   uint64
	pos     uint16
	intOnly bool // the number being read must be an integer
	// A string value with length bounds counts its characters.
	counting       bool
	strLen, lenMin int32
	lenMax         int32 // < 0: unbounded
}

// NewSchemaJSON is the state before a document that must follow s.
func NewSchemaJSON(s *Schema) JSON {
	return JSON{sch: s, want: s.root}
}

// Complete reports whether a whole top-level object has been read.
func (j *JSON) Complete() bool { return j.mode == done }

func isSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' }

// Feed advances by one byte and reports whether the prefix is still valid.
// After false the state is unusable. The document must start with '{'
// (no leading whitespace) and whitespace runs between tokens are bounded.
func (j *JSON) Feed(b byte) bool {
	if j.mode != str && j.mode != strEscape && j.mode != strHex && j.mode != num && j.mode != literal && j.mode != enumValue {
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
		if j.sch != nil {
			return j.beginValue(b)
		}
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
			return j.closeOK() && j.close()
		}
		if n := j.frameNode(); j.mode == valueOrClose && n != nil && n.maxItems == 0 {
			return false
		}
		return j.beginValue(b)
	case keyOrClose, key:
		if isSpace(b) {
			return true
		}
		if b == '}' && j.mode == keyOrClose {
			return j.closeOK() && j.close()
		}
		if b != '"' {
			return false
		}
		j.mode, j.isKey = str, true
		if n := j.frameNode(); n != nil && n.props != nil {
			j.cands, j.pos = allBits(len(n.props))&^j.had[j.depth-1], 0
			return j.cands != 0
		}
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
			if n := j.frameNode(); n != nil && n.props != nil && allBits(len(n.props))&^j.had[j.depth-1] == 0 {
				return false // every property is written
			}
			j.mode = key
		case b == ',' && top == '[':
			if n := j.frameNode(); n != nil {
				if n.maxItems >= 0 && j.had[j.depth-1] >= uint64(n.maxItems) {
					return false
				}
				j.want = n.items
			}
			j.mode = value
		case b == '}' && top == '{', b == ']' && top == '[':
			return j.closeOK() && j.close()
		default:
			return false
		}
		return true
	case str:
		if j.isKey && j.sch != nil {
			if n := j.frameNode(); n != nil && n.props != nil {
				return j.feedKey(n, b)
			}
		}
		switch {
		case b == '"':
			if j.isKey {
				j.mode, j.isKey = colon, false
				if n := j.frameNode(); j.sch != nil && (n == nil || n.props == nil) {
					j.want = -1 // a member of an object of any content
				}
			} else {
				if j.counting && j.strLen < j.lenMin {
					return false
				}
				j.counting = false
				j.valueDone()
			}
		case b == '\\':
			j.mode = strEscape
			return j.count()
		case b < 0x20:
			return false
		case b&0xc0 != 0x80: // a character's first byte
			return j.count()
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
	case enumValue:
		return j.feedEnum(b)
	}
	return false
}

// beginValue starts a value with its first byte.
func (j *JSON) beginValue(b byte) bool {
	if n := j.wantNode(); n != nil {
		if n.enum != nil {
			j.mode, j.cands, j.pos = enumValue, allBits(len(n.enum)), 0
			return j.feedEnum(b)
		}
		var need uint8
		switch {
		case b == '{':
			need = tObject
		case b == '[':
			need = tArray
		case b == '"':
			need = tString
			if n.minLen > 0 || n.maxLen >= 0 {
				j.counting, j.strLen, j.lenMin, j.lenMax = true, 0, int32(n.minLen), int32(n.maxLen)
			}
		case b == '-' || b >= '0' && b <= '9':
			need = tNumber | tInteger
			j.intOnly = n.types&tNumber == 0
		case b == 't' || b == 'f':
			need = tBoolean
		case b == 'n':
			need = tNull
		}
		if n.types&need == 0 {
			return false
		}
	}
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
	if j.intOnly && (b == '.' || b == 'e' || b == 'E') {
		return false
	}
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
	if j.sch != nil && int(j.depth) < schemaDepth {
		n := j.wantNode()
		id := int16(-1)
		if n != nil {
			id = j.want
		}
		j.frame[j.depth], j.had[j.depth] = id, 0
		if b == '[' {
			j.want = -1
			if n != nil {
				j.want = n.items
			}
		}
	} else if j.sch != nil {
		if j.wantNode() != nil {
			return false // a recursive schema nested past the depth a state tracks
		}
		j.want = -1
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
	j.intOnly = false
	if j.depth == 0 {
		j.mode = done
		return
	}
	j.mode = commaOrClose
	if j.sch != nil && j.stack[j.depth-1] == '[' && j.frameNode() != nil {
		j.had[j.depth-1]++
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

// countedString reports whether the state is inside a string value with
// length bounds (its plain bytes change only the count).
func (j *JSON) countedString() bool { return j.mode == str && j.counting && !j.isKey }

// count counts one more character of a string with length bounds.
func (j *JSON) count() bool {
	if !j.counting {
		return true
	}
	j.strLen++
	return j.lenMax < 0 || j.strLen <= j.lenMax
}

// plainString reports whether the state is inside a string whose plain
// bytes (plainStringByte) it takes without changing: a value's string
// without length bounds or a key no schema property list narrows.
func (j *JSON) plainString() bool {
	if j.mode != str || j.counting {
		return false
	}
	if j.isKey && j.sch != nil {
		if n := j.frameNode(); n != nil && n.props != nil {
			return false
		}
	}
	return true
}

// plainStringByte is a byte a string takes as itself: not a quote, a
// backslash or a control character.
func plainStringByte(b byte) bool { return b >= 0x20 && b != '"' && b != '\\' }

// allBits is a mask of the first n bits.
func allBits(n int) uint64 {
	if n >= 64 {
		return ^uint64(0)
	}
	return 1<<n - 1
}

// frameNode is the schema node of the innermost open container, or nil
// where its content is free.
func (j *JSON) frameNode() *node {
	if j.sch == nil || j.depth == 0 || int(j.depth) > schemaDepth {
		return nil
	}
	id := j.frame[j.depth-1]
	if id < 0 || j.sch.nodes[id].free {
		return nil
	}
	return &j.sch.nodes[id]
}

// wantNode is the schema node of the value expected next, or nil where it
// is free.
func (j *JSON) wantNode() *node {
	if j.sch == nil || j.want < 0 || j.sch.nodes[j.want].free {
		return nil
	}
	return &j.sch.nodes[j.want]
}

// closeOK reports whether the innermost container may close: an object
// once it has every required property, an array once it has minItems.
func (j *JSON) closeOK() bool {
	n := j.frameNode()
	if n == nil {
		return true
	}
	had := j.had[j.depth-1]
	if j.stack[j.depth-1] == '{' {
		return n.required&^had == 0
	}
	return had >= uint64(n.minItems)
}

// feedKey reads a byte of an object key that must name one of n's
// properties not written yet (no escapes: names are plain).
func (j *JSON) feedKey(n *node, b byte) bool {
	if b == '"' {
		for i, p := range n.props {
			if j.cands&(1<<i) != 0 && len(p.name) == int(j.pos) {
				j.had[j.depth-1] |= 1 << i
				j.want, j.mode, j.isKey = p.node, colon, false
				return true
			}
		}
		return false
	}
	var next uint64
	for i, p := range n.props {
		if j.cands&(1<<i) != 0 && int(j.pos) < len(p.name) && p.name[j.pos] == b {
			next |= 1 << i
		}
	}
	if next == 0 {
		return false
	}
	j.cands, j.pos = next, j.pos+1
	return true
}

// feedEnum reads a byte of a value that must be one of the expected
// node's enum texts. A byte no candidate continues ends the value if one
// is complete, and then belongs to what follows.
func (j *JSON) feedEnum(b byte) bool {
	n := &j.sch.nodes[j.want]
	var next uint64
	complete := false
	for i, text := range n.enum {
		if j.cands&(1<<i) == 0 {
			continue
		}
		switch {
		case int(j.pos) < len(text) && text[j.pos] == b:
			next |= 1 << i
		case int(j.pos) == len(text):
			complete = true
		}
	}
	if next != 0 {
		j.cands, j.pos = next, j.pos+1
		return true
	}
	if !complete {
		return false
	}
	j.valueDone()
	return j.Feed(b)
}
