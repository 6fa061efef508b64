package constrain

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Schema is a compiled JSON Schema: the subset that structured-output APIs
// use (OpenAI's strict mode, ollama's format). Supported keywords:
//
//   - type: "object", "array", "string", "number", "integer", "boolean",
//     "null", or a list of them (["string", "null"]);
//   - properties and required for objects; a property not listed is never
//     written (additionalProperties may be absent or false), and an object
//     without properties takes any members;
//   - items, minItems and maxItems for arrays;
//   - minLength and maxLength for strings, in characters (an escape is one,
//     so a surrogate pair written as two \u escapes counts two);
//   - enum and const of strings (written without escapes), of numbers,
//     booleans and null;
//   - $defs / definitions with local "$ref": "#/$defs/name";
//   - descriptions, titles, formats and the like are ignored, and so are
//     numeric bounds (minimum, maximum, multipleOf): generation follows
//     the type but not the range.
//
// A schema with no type and no enum stands for any JSON value. The top
// level must be an object or an array. Other structure — anyOf, patterns,
// additionalProperties other than false — is refused with an error that
// names where it is, rather than silently generating what the schema
// does not allow.
type Schema struct {
	nodes []node
	root  int16
}

// JSON types as bits of node.types.
const (
	tObject uint8 = 1 << iota
	tArray
	tString
	tNumber
	tInteger
	tBoolean
	tNull
	tAny = tObject | tArray | tString | tNumber | tBoolean | tNull
)

// node is one compiled (sub)schema.
type node struct {
	types    uint8
	free     bool     // any value: the plain JSON automaton takes over
	props    []prop   // object members, at most 64
	required uint64   // bits of props
	items    int16    // array element node
	minItems int      // array bounds; maxItems < 0 is unbounded
	maxItems int      //
	minLen   int      // string length bounds in characters; maxLen < 0 is unbounded
	maxLen   int      //
	enum     []string // allowed values as JSON text (strings quoted); nil is any
}

type prop struct {
	name string
	node int16
}

// Limits that keep a parser state small: a schema nests at most
// schemaDepth containers, an object lists at most 64 properties and an
// enum at most 64 values.
const (
	schemaDepth = 16
	maxSchemaN  = 64
	maxNodes    = 1 << 12
)

// CompileSchema reads a JSON Schema document.
func CompileSchema(data []byte) (*Schema, error) {
	var root map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&root); err != nil {
		return nil, fmt.Errorf("schema: not a JSON object: %w", err)
	}
	c := &compiler{root: root, refs: map[string]int16{}}
	s := &Schema{}
	c.s = s
	top, err := c.compile(root, "", 0)
	if err != nil {
		return nil, err
	}
	if n := s.nodes[top]; n.free || n.types&^(tObject|tArray) != 0 || n.enum != nil {
		return nil, fmt.Errorf("schema: the top level must be an object or an array")
	}
	s.root = top
	return s, nil
}

type compiler struct {
	s    *Schema
	root map[string]any
	refs map[string]int16 // compiled $refs, so recursion terminates
}

func (c *compiler) add(n node) (int16, error) {
	if len(c.s.nodes) >= maxNodes {
		return 0, fmt.Errorf("schema: more than %d subschemas", maxNodes)
	}
	c.s.nodes = append(c.s.nodes, n)
	return int16(len(c.s.nodes) - 1), nil
}

func (c *compiler) compile(v map[string]any, path string, depth int) (int16, error) {
	at := path
	if at == "" {
		at = "/"
	}
	bad := func(format string, args ...any) (int16, error) {
		return 0, fmt.Errorf("schema: %s: %s", at, fmt.Sprintf(format, args...))
	}
	if depth >= schemaDepth {
		return bad("nested %d or more deep", schemaDepth)
	}
	if ref, ok := v["$ref"]; ok {
		r, ok := ref.(string)
		if !ok {
			return bad("$ref is not a string")
		}
		if id, done := c.refs[r]; done {
			return id, nil
		}
		target, err := c.resolve(r)
		if err != nil {
			return bad("%v", err)
		}
		// Reserve the id first: a schema may refer to itself.
		id, err := c.add(node{})
		if err != nil {
			return 0, err
		}
		c.refs[r] = id
		n, err := c.compile(target, r, depth+1)
		if err != nil {
			return 0, err
		}
		c.s.nodes[id] = c.s.nodes[n]
		return id, nil
	}
	for _, k := range []string{"anyOf", "oneOf", "allOf", "not", "if", "pattern", "patternProperties", "prefixItems", "uniqueItems", "dependentRequired"} {
		if _, ok := v[k]; ok {
			return bad("%q is not supported", k)
		}
	}
	n := node{items: -1, maxItems: -1, maxLen: -1}
	switch t := v["type"].(type) {
	case nil:
	case string:
		b, err := typeBit(t)
		if err != nil {
			return bad("%v", err)
		}
		n.types = b
	case []any:
		for _, x := range t {
			s, ok := x.(string)
			if !ok {
				return bad("type list holds %v", x)
			}
			b, err := typeBit(s)
			if err != nil {
				return bad("%v", err)
			}
			n.types |= b
		}
	default:
		return bad("type is %v, want a name or a list of names", t)
	}
	if e, ok := v["enum"]; ok {
		list, ok := e.([]any)
		if !ok || len(list) == 0 || len(list) > maxSchemaN {
			return bad("enum must be a list of 1 to %d values", maxSchemaN)
		}
		for _, x := range list {
			s, err := literalText(x)
			if err != nil {
				return bad("enum: %v", err)
			}
			n.enum = append(n.enum, s)
		}
	}
	if x, ok := v["const"]; ok {
		s, err := literalText(x)
		if err != nil {
			return bad("const: %v", err)
		}
		n.enum = []string{s}
	}
	if n.enum != nil {
		n.types = 0
		for _, s := range n.enum {
			n.types |= literalType(s)
		}
		return c.add(n)
	}
	if n.types == 0 {
		switch {
		case v["properties"] != nil:
			n.types = tObject
		case v["items"] != nil:
			n.types = tArray
		default:
			n.free = true
			return c.add(n)
		}
	}
	if n.types&tObject != 0 {
		if err := c.object(&n, v, path, depth); err != nil {
			return 0, err
		}
	}
	if n.types&tArray != 0 {
		if err := c.array(&n, v, path, depth); err != nil {
			return 0, err
		}
	}
	if n.types&tString != 0 {
		if err := counts(v, path, &n.minLen, &n.maxLen, "minLength", "maxLength"); err != nil {
			return 0, err
		}
	}
	return c.add(n)
}

func (c *compiler) object(n *node, v map[string]any, path string, depth int) error {
	props, _ := v["properties"].(map[string]any)
	if v["properties"] != nil && props == nil {
		return fmt.Errorf("schema: %s/properties: not an object", path)
	}
	if ap, ok := v["additionalProperties"]; ok && ap != false && len(props) > 0 {
		return fmt.Errorf("schema: %s/additionalProperties: only false is supported beside properties", path)
	}
	if len(props) > maxSchemaN {
		return fmt.Errorf("schema: %s/properties: %d properties, at most %d", path, len(props), maxSchemaN)
	}
	if len(props) == 0 {
		if _, ok := v["required"]; ok {
			return fmt.Errorf("schema: %s/required: needs properties", path)
		}
		n.props = nil
		return nil
	}
	names := make([]string, 0, len(props))
	for name := range props {
		names = append(names, name)
	}
	slices.Sort(names) // a fixed order; generation may write them in any
	for _, name := range names {
		if name == "" || strings.ContainsAny(name, "\"\\") || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 }) {
			return fmt.Errorf("schema: %s/properties: property name %q needs escaping, which is not supported", path, name)
		}
		sub, ok := props[name].(map[string]any)
		if !ok {
			return fmt.Errorf("schema: %s/properties/%s: not a schema object", path, name)
		}
		id, err := c.compile(sub, path+"/properties/"+name, depth+1)
		if err != nil {
			return err
		}
		n.props = append(n.props, prop{name: name, node: id})
	}
	if r, ok := v["required"]; ok {
		list, ok := r.([]any)
		if !ok {
			return fmt.Errorf("schema: %s/required: not a list", path)
		}
		for _, x := range list {
			name, _ := x.(string)
			i := slices.IndexFunc(n.props, func(p prop) bool { return p.name == name })
			if i < 0 {
				return fmt.Errorf("schema: %s/required: %q is not a property", path, x)
			}
			n.required |= 1 << i
		}
	}
	return nil
}

func (c *compiler) array(n *node, v map[string]any, path string, depth int) error {
	n.items = -1
	if it, ok := v["items"]; ok {
		sub, ok := it.(map[string]any)
		if !ok {
			return fmt.Errorf("schema: %s/items: not a schema object", path)
		}
		id, err := c.compile(sub, path+"/items", depth+1)
		if err != nil {
			return err
		}
		n.items = id
	}
	return counts(v, path, &n.minItems, &n.maxItems, "minItems", "maxItems")
}

// counts reads a pair of bounds such as minItems and maxItems (counts up
// to 65536) into lo and hi, leaving what is absent.
func counts(v map[string]any, path string, lo, hi *int, loKey, hiKey string) error {
	for _, k := range []struct {
		key string
		dst *int
	}{{loKey, lo}, {hiKey, hi}} {
		x, ok := v[k.key]
		if !ok {
			continue
		}
		num, ok := x.(json.Number)
		i, err := strconv.Atoi(string(num))
		if !ok || err != nil || i < 0 || i > 1<<16 {
			return fmt.Errorf("schema: %s/%s: %v is not a count up to 65536", path, k.key, x)
		}
		*k.dst = i
	}
	if *hi >= 0 && *hi < *lo {
		return fmt.Errorf("schema: %s: %s %d < %s %d", path, hiKey, *hi, loKey, *lo)
	}
	return nil
}

// resolve finds a local reference: "#", "#/$defs/x", "#/definitions/x".
func (c *compiler) resolve(ref string) (map[string]any, error) {
	if ref == "#" {
		return c.root, nil
	}
	rest, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, fmt.Errorf("$ref %q: only local references (#/...) are supported", ref)
	}
	var cur any = c.root
	for _, part := range strings.Split(rest, "/") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("$ref %q does not resolve", ref)
		}
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		if cur, ok = m[part]; !ok {
			return nil, fmt.Errorf("$ref %q does not resolve", ref)
		}
	}
	m, ok := cur.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("$ref %q is not a schema object", ref)
	}
	return m, nil
}

func typeBit(name string) (uint8, error) {
	switch name {
	case "object":
		return tObject, nil
	case "array":
		return tArray, nil
	case "string":
		return tString, nil
	case "number":
		return tNumber, nil
	case "integer":
		return tInteger, nil
	case "boolean":
		return tBoolean, nil
	case "null":
		return tNull, nil
	}
	return 0, fmt.Errorf("type %q is not a JSON Schema type", name)
}

// literalText is an enum or const value as the JSON text generation must
// write: strings quoted (without escapes), numbers as given.
func literalText(x any) (string, error) {
	switch v := x.(type) {
	case string:
		if strings.ContainsAny(v, "\"\\") || strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 }) {
			return "", fmt.Errorf("%q needs escaping, which is not supported", v)
		}
		return `"` + v + `"`, nil
	case json.Number:
		return string(v), nil
	case bool:
		return strconv.FormatBool(v), nil
	case nil:
		return "null", nil
	}
	return "", fmt.Errorf("%v: only strings, numbers, booleans and null are supported", x)
}

func literalType(s string) uint8 {
	switch {
	case s[0] == '"':
		return tString
	case s == "true" || s == "false":
		return tBoolean
	case s == "null":
		return tNull
	}
	return tNumber
}
