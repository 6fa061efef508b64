package constrain

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

const personSchema = `{
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer"},
    "height": {"type": "number"},
    "mood": {"enum": ["happy", "sad", "so so"]},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
    "pet": {"type": ["object", "null"], "properties": {"kind": {"const": "cat"}, "lives": {"enum": [9, 7.5, true, null]}}, "required": ["kind"]},
    "extra": {},
    "nick": {"type": "string", "minLength": 2, "maxLength": 4},
    "bio": {"type": "string", "maxLength": 40},
    "code": {"type": "string", "minLength": 3}
  },
  "required": ["name", "age"],
  "additionalProperties": false
}`

func TestSchemaDocuments(t *testing.T) {
	s, err := CompileSchema([]byte(personSchema))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		doc      string
		valid    bool // every byte accepted
		complete bool
	}{
		{`{"name":"Ann","age":30}`, true, true},
		{`{"age": 30, "name": "A\"n"}`, true, true},
		{`{ "name" : "x", "age": -4, "height": 1.5e3, "mood": "so so" }`, true, true},
		{`{"name":"x","age":1,"tags":["a"],"pet":null}`, true, true},
		{`{"name":"x","age":1,"tags":["a","b"],"pet":{"kind":"cat","lives":7.5}}`, true, true},
		{`{"name":"x","age":1,"pet":{"kind":"cat","lives":true}}`, true, true},
		{`{"name":"x","age":1,"extra":{"any":[1,{"deep":null}]}}`, true, true},
		{`{"name":"x","age":1,"extra":"also free"}`, true, true},
		{`{"name":"x"`, true, false},
		{`{"name":"x"}`, false, false},           // age is required
		{`{"name":"x","age":1.5`, false, false},  // integer
		{`{"name":"x","age":1e3`, false, false},  // integer
		{`{"name":1`, false, false},              // string
		{`{"nam":`, false, false},                // not a property
		{`{"nick":"x"`, false, false},            // not a property
		{`{"name":"x","name":"y"`, false, false}, // written twice
		{`{"name":"x","age":1,"mood":"glad"`, false, false},
		{`{"name":"x","age":1,"mood":"so  so"`, false, false},
		{`{"name":"x","age":1,"tags":[]`, false, false},            // minItems 1
		{`{"name":"x","age":1,"tags":["a","b","c"]`, false, false}, // maxItems 2
		{`{"name":"x","age":1,"tags":[1]`, false, false},
		{`{"name":"x","age":1,"pet":{"lives":9}`, false, false}, // kind required
		{`{"name":"x","age":1,"pet":{"kind":"dog"`, false, false},
		{`{"name":"x","age":1,"pet":{"kind":"cat","lives":8}`, false, false},
		{`{"name":"x","age":1,"pet":true`, false, false},
		{`{"na\u006de":"x"`, false, false}, // escapes in keys are refused
		{`{"name":"x","age":1,"nick":"ab"}`, true, true},
		{`{"name":"x","age":1,"nick":"é€xy"}`, true, true},  // characters, not bytes
		{`{"name":"x","age":1,"nick":"a\"bc"}`, true, true}, // an escape is one
		{`{"name":"x","age":1,"nick":"a`, true, false},      // may go on
		{`{"name":"x","age":1,"nick":"a"}`, false, false},   // minLength 2
		{`{"name":"x","age":1,"nick":"abcde`, false, false}, // maxLength 4
		{`{"name":"x","age":1,"nick":"a\u0041bcd`, false, false},
		{`["x"]`, false, false}, // an object is expected
	} {
		j := NewSchemaJSON(s)
		ok := j.FeedString(tc.doc)
		if ok != tc.valid || (ok && j.Complete() != tc.complete) {
			t.Errorf("%s: valid %v complete %v, want %v %v", tc.doc, ok, ok && j.Complete(), tc.valid, tc.complete)
		}
		if ok && tc.complete {
			var v map[string]any
			if err := json.Unmarshal([]byte(tc.doc), &v); err != nil {
				t.Errorf("%s: accepted but not JSON: %v", tc.doc, err)
			}
		}
	}
}

func TestSchemaArraysRefsAndLimits(t *testing.T) {
	_, err := CompileSchema([]byte(`{
		"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v"]}},
		"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3}`))
	if err == nil || !strings.Contains(err.Error(), "anyOf") {
		t.Fatalf("anyOf accepted: %v", err)
	}
	s, err := CompileSchema([]byte(`{
		"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}}, "required": ["v"]}},
		"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3}`))
	if err != nil {
		t.Fatal(err)
	}
	for doc, want := range map[string]bool{
		`[]`:                                      true,
		`[{"v":1},{"v":2,"next":{"v":3}}]`:        true,
		`[{"v":1,"next":{"next":{"v":2}}}]`:       false, // inner v missing
		`[{"v":1},{"v":1},{"v":1},{"v":1}]`:       false,
		`[{"v":1,"next":{"v":2,"next":{"v":3}}}]`: true,
	} {
		j := NewSchemaJSON(s)
		if ok := j.FeedString(doc) && j.Complete(); ok != want {
			t.Errorf("%s: %v, want %v", doc, ok, want)
		}
	}
	s, err = CompileSchema([]byte(`{"type":"array","maxItems":0}`))
	if err != nil {
		t.Fatal(err)
	}
	if j := NewSchemaJSON(s); !j.FeedString("[]") || !j.Complete() {
		t.Error("empty array refused")
	}
	if j := NewSchemaJSON(s); j.FeedString("[1") {
		t.Error("an element accepted past maxItems 0")
	}
}

func TestCompileSchemaErrors(t *testing.T) {
	for _, tc := range []struct{ schema, want string }{
		{`[]`, "not a JSON object"},
		{`{"type":"string"}`, "top level"},
		{`{}`, "top level"},
		{`{"type":"object","properties":{"a":{"type":"date"}}}`, `/properties/a: type "date"`},
		{`{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":true}`, "additionalProperties"},
		{`{"type":"object","properties":{"a":{"type":"string"}},"required":["b"]}`, `"b" is not a property`},
		{`{"type":"object","properties":{"a":{"pattern":"x"}}}`, `"pattern" is not supported`},
		{`{"type":"object","properties":{"a\"b":{}}}`, "needs escaping"},
		{`{"type":"array","items":{"$ref":"#/$defs/none"}}`, "does not resolve"},
		{`{"type":"array","items":{"$ref":"http://x/y"}}`, "only local references"},
		{`{"type":"array","minItems":3,"maxItems":2}`, "maxItems 2 < minItems 3"},
		{`{"type":"array","minItems":-1}`, "minItems"},
		{`{"type":"object","properties":{"a":{"enum":[]}}}`, "enum"},
		{`{"type":"object","properties":{"a":{"enum":[{"x":1}]}}}`, "only strings"},
	} {
		if _, err := CompileSchema([]byte(tc.schema)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.schema, err, tc.want)
		}
	}
	deep := strings.Repeat(`{"type":"array","items":`, 20) + `{"type":"string"}` + strings.Repeat("}", 20)
	if _, err := CompileSchema([]byte(deep)); err == nil || !strings.Contains(err.Error(), "nested 16 or more") {
		t.Errorf("20 levels: %v", err)
	}
}

// TestSchemaMasker: with a toy vocabulary the masker leaves only tokens
// that keep the document on the schema, and end of generation only once
// it is complete.
func TestSchemaMasker(t *testing.T) {
	s, err := CompileSchema([]byte(`{"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer"}},"required":["ok"]}`))
	if err != nil {
		t.Fatal(err)
	}
	pieces := []string{`{"`, `ok`, `":`, `true`, `}`, `,"`, `n`, `1.5`, `7`, `"x"`, ``, `no`}
	eog := make([]bool, len(pieces))
	eog[10] = true
	m := NewMasker(pieces, eog)
	state := NewSchemaJSON(s)
	allowed := func() []string {
		l := make([]float32, len(pieces))
		m.Apply(&state, l)
		var out []string
		for i, v := range l {
			if !math.IsInf(float64(v), -1) {
				out = append(out, pieces[i])
			}
		}
		return out
	}
	steps := []struct {
		feed string
		want string
	}{
		{"", `{"`},
		{`{"`, `ok|n`},
		{`n`, `":`},
		{`":`, `7`},
		{`7`, `,"|7`}, // no "}": ok is required
	}
	for _, st := range steps {
		if !state.FeedString(st.feed) {
			t.Fatalf("feeding %q refused", st.feed)
		}
		if got := strings.Join(allowed(), "|"); got != st.want {
			t.Errorf("after %q: allowed %s, want %s", st.feed, got, st.want)
		}
	}
	// "}" now would leave "ok" out: it is masked; after ok, end is allowed.
	state.FeedString(`,"ok":true}`)
	if got := strings.Join(allowed(), "|"); got != "" {
		t.Errorf("after the object: %q allowed besides end of generation", got)
	}
}

// FuzzSchema: compiling any bytes and feeding any document never panics,
// and a document the automaton takes whole is valid JSON.
func FuzzSchema(f *testing.F) {
	f.Add(personSchema, `{"name":"Ann","age":30,"tags":["a"]}`)
	f.Add(`{"type":"array","items":{"enum":[1,"a",null]},"maxItems":2}`, `[1,"a"]`)
	f.Add(`{"$defs":{"n":{"type":"object","properties":{"x":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"}`, `{"x":{"x":{}}}`)
	f.Add(`{"type":"object"}`, `{"a":[1,2,{"b":true}]}`)
	f.Fuzz(func(t *testing.T, schema, doc string) {
		s, err := CompileSchema([]byte(schema))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "schema: ") {
				t.Fatalf("error %q does not say it is about the schema", err)
			}
			return
		}
		j := NewSchemaJSON(s)
		if j.FeedString(doc) && j.Complete() && !json.Valid([]byte(doc)) {
			t.Fatalf("accepted %q, which is not JSON", doc)
		}
	})
}

// BenchmarkMaskSchema128k masks a 128k vocabulary of short pieces in the
// middle of a schema document.
func BenchmarkMaskSchema128k(b *testing.B) {
	const v = 128000
	pieces, eog := make([]string, v), make([]bool, v)
	words := []string{"the", " a", "\"", "{", "}", ":", ",", "1", " true", "[", "]", " \"x", "é", "\n", "name", "age", "ta", "gs"}
	n := len(words)
	for i := range pieces {
		pieces[i] = words[i%n] + words[(i/n)%n] + words[(i/n/n)%n]
	}
	m := NewMasker(pieces, eog)
	s, err := CompileSchema([]byte(personSchema))
	if err != nil {
		b.Fatal(err)
	}
	for _, at := range []string{`{"name":"Ann","age":3`, `{"name":"Ann","tags":[`, `{"na`, `{"name":"An`} {
		b.Run(at, func(b *testing.B) {
			j := NewSchemaJSON(s)
			if !j.FeedString(at) {
				b.Fatal("prefix refused")
			}
			logits := make([]float32, v)
			b.ResetTimer()
			for range b.N {
				m.Apply(&j, logits)
			}
		})
	}
}

// TestMaskerMatchesBruteForce: the trie walk allows exactly the tokens
// whose every byte the state accepts (and end of generation only when the
// document is complete), with and without a schema, at every prefix of
// some documents, over a vocabulary with shared prefixes, duplicates and
// multi-byte pieces.
func TestMaskerMatchesBruteForce(t *testing.T) {
	words := []string{"", "{", "}", `{"`, `"`, `":`, ",", `,"`, "1", "1.", "12", "-", "e", "tr", "true", " ", "  ",
		"name", "nam", "n", "age", "a", "ag", "tags", "[", "]", `["`, `"]`, "so", " so", "happy", "sad", "\\", "\\u00", "é", "null", "n", "x"}
	rng := rand.New(rand.NewPCG(7, 7))
	pieces := append([]string(nil), words...)
	for range 3000 {
		pieces = append(pieces, words[rng.IntN(len(words))]+words[rng.IntN(len(words))]+words[rng.IntN(len(words))])
	}
	eog := make([]bool, len(pieces))
	eog[0], eog[len(pieces)-1] = true, true
	m := NewMasker(pieces, eog)
	schema, err := CompileSchema([]byte(personSchema))
	if err != nil {
		t.Fatal(err)
	}
	docs := []string{`{"name":"Ann","age":30,"mood":"so so","nick":"é\"x","tags":["a","b"],"pet":{"kind":"cat","lives":7.5}}`, `{"a":[1,true,null],"b":{"c":-1.5e3}}`}
	for _, withSchema := range []bool{false, true} {
		for _, doc := range docs {
			start := JSON{}
			if withSchema {
				start = NewSchemaJSON(schema)
			}
			for i := 0; i <= len(doc); i++ {
				state := start
				if !state.FeedString(doc[:i]) {
					break // the other document leaves the schema
				}
				logits := make([]float32, len(pieces))
				n := m.Apply(&state, logits)
				want := 0
				for id, p := range pieces {
					ok := false
					if eog[id] {
						ok = state.Complete()
					} else if p != "" {
						s := state
						ok = s.FeedString(p)
					}
					if ok {
						want++
					}
					if got := !math.IsInf(float64(logits[id]), -1); got != ok {
						t.Fatalf("schema %v, after %q: token %d %q allowed %v, want %v", withSchema, doc[:i], id, p, got, ok)
					}
				}
				if n != want {
					t.Fatalf("after %q: %d allowed, want %d", doc[:i], n, want)
				}
			}
		}
	}
}

// TestRecursionDepth: a recursive schema is followed to the depth a state
// tracks and no further: past it the document cannot go on nesting, rather
// than nesting unchecked.
func TestRecursionDepth(t *testing.T) {
	s, err := CompileSchema([]byte(`{"type":"object","properties":{"c":{"$ref":"#"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	j := NewSchemaJSON(s)
	for d := 0; d < schemaDepth; d++ {
		if !j.FeedString(`{"c":`) {
			t.Fatalf("refused at depth %d", d)
		}
	}
	if j.FeedString(`{`) {
		t.Error("nested past the tracked depth")
	}
	j = NewSchemaJSON(s)
	if !j.FeedString(`{"c":{"c":{}}}`) || !j.Complete() {
		t.Error("a shallow document refused")
	}
}
