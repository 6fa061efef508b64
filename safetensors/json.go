package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// walker reads a JSON document token by token. encoding/json's Unmarshal
// keeps the last of two equal keys without a word; a header or index that
// names a tensor twice is ambiguous, so both parsers walk the tokens and
// check every object's keys themselves.
type walker struct {
	dec *json.Decoder
}

func newWalker(doc []byte) *walker {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	return &walker{dec: dec}
}

// syntaxError is a walker error that is about the JSON text itself, not
// about a value of the wrong kind.
type syntaxError struct{ msg string }

func (e *syntaxError) Error() string { return e.msg }

// about prefixes err with the field it concerns: "shape is a string" for a
// value of the wrong kind, "shape: not valid JSON" for a syntax error.
func about(field string, err error) error {
	var se *syntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("%s: %w", field, err)
	}
	return fmt.Errorf("%s %w", field, err)
}

// token returns the next token; a syntax error or a document that ends
// early is reported with the byte offset reached.
func (w *walker) token() (json.Token, error) {
	tok, err := w.dec.Token()
	if err == io.EOF {
		return nil, &syntaxError{fmt.Sprintf("not valid JSON: unexpected end (at byte %d)", w.dec.InputOffset())}
	}
	if err != nil {
		return nil, &syntaxError{fmt.Sprintf("not valid JSON: %v (at byte %d)", err, w.dec.InputOffset())}
	}
	return tok, nil
}

// kind names what a token starts, for error messages.
func kind(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		if v == '{' {
			return "an object"
		}
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", tok)
}

// object consumes the '{' that must come next.
func (w *walker) object() error {
	tok, err := w.token()
	if err != nil {
		return err
	}
	if tok != json.Delim('{') {
		return fmt.Errorf("is %s, want an object", kind(tok))
	}
	return nil
}

// key returns the next key of the object being walked and records it in
// seen, or reports done after consuming the closing '}'.
func (w *walker) key(seen map[string]bool) (key string, done bool, err error) {
	if !w.dec.More() {
		if _, err := w.token(); err != nil {
			return "", false, err
		}
		return "", true, nil
	}
	tok, err := w.token()
	if err != nil {
		return "", false, err
	}
	key, ok := tok.(string)
	if !ok {
		return "", false, &syntaxError{fmt.Sprintf("not valid JSON: object key is %s", kind(tok))}
	}
	if seen[key] {
		return key, false, errDuplicate
	}
	seen[key] = true
	return key, false, nil
}

// errDuplicate is returned by key for a key seen before in the same object.
var errDuplicate = errors.New("appears twice in the same object")

// str reads a string value.
func (w *walker) str() (string, error) {
	tok, err := w.token()
	if err != nil {
		return "", err
	}
	s, ok := tok.(string)
	if !ok {
		return "", fmt.Errorf("is %s, want a string", kind(tok))
	}
	return s, nil
}

// nonNegInts reads an array of integers in [0, 2^63).
func (w *walker) nonNegInts() ([]int64, error) {
	tok, err := w.token()
	if err != nil {
		return nil, err
	}
	if tok != json.Delim('[') {
		return nil, fmt.Errorf("is %s, want an array of integers", kind(tok))
	}
	out := []int64{}
	for w.dec.More() {
		tok, err := w.token()
		if err != nil {
			return nil, err
		}
		num, ok := tok.(json.Number)
		if !ok {
			return nil, fmt.Errorf("element %d is %s, want an integer", len(out), kind(tok))
		}
		v, err := strconv.ParseInt(string(num), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("element %d is %s, not an integer that fits in int64", len(out), num)
		}
		if v < 0 {
			return nil, fmt.Errorf("element %d is %d, negative", len(out), v)
		}
		out = append(out, v)
	}
	if _, err := w.token(); err != nil {
		return nil, err
	}
	return out, nil
}

// skip consumes one value of any type. Decode bounds the nesting depth,
// so a deeply nested unknown field cannot exhaust the stack.
func (w *walker) skip() error {
	var raw json.RawMessage
	if err := w.dec.Decode(&raw); err != nil {
		return &syntaxError{fmt.Sprintf("not valid JSON: %v (at byte %d)", err, w.dec.InputOffset())}
	}
	return nil
}

// value decodes one value of any type (numbers as json.Number).
func (w *walker) value() (any, error) {
	var v any
	if err := w.dec.Decode(&v); err != nil {
		return nil, &syntaxError{fmt.Sprintf("not valid JSON: %v (at byte %d)", err, w.dec.InputOffset())}
	}
	return v, nil
}

// end checks that only whitespace follows the top-level value.
func (w *walker) end() error {
	tok, err := w.dec.Token()
	if err == io.EOF {
		return nil
	}
	if err != nil {
		return &syntaxError{fmt.Sprintf("not valid JSON after the top-level object: %v (at byte %d)", err, w.dec.InputOffset())}
	}
	return fmt.Errorf("%s follows the top-level object (at byte %d)", kind(tok), w.dec.InputOffset())
}
