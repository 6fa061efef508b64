package constrain

import (
	"encoding/json"
	"math"
	"testing"
)

func TestJSONPrefixes(t *testing.T) {
	valid := []string{
		`{}`, `{ "a" : 1 } `, `{"a":[1,2.5,-3e10,0,0.1E+2,true,false,null,"x\"y\\u00e9"],"b":{"c":{}}}`,
		`{"k": "multi-byte é 日本"}`, `{"n":-0.0e-0}`,
	}
	for _, s := range valid {
		var j JSON
		if !j.FeedString(s) || !j.Complete() {
			t.Errorf("%q rejected or incomplete", s)
		}
		if json.Valid([]byte(s)) != true {
			t.Fatalf("test string %q is not JSON", s)
		}
	}
	incomplete := []string{``, `{`, `{"a"`, `{"a":`, `{"a":1`, `{"a":"x`, `{"a":[`, `{"a":tr`, `{"a":1.`}
	for _, s := range incomplete {
		var j JSON
		if !j.FeedString(s) || j.Complete() {
			t.Errorf("prefix %q: rejected or wrongly complete", s)
		}
	}
	invalid := []string{`[]`, `"x"`, `{a}`, `{"a" 1}`, `{"a":01}`, `{"a":1,}`, `{"a":-}`, `{"a":1.e5}`, `{"a":"\x01"}`,
		`{"a":"\q"}`, `{"a":"\u12G4"}`, `{"a":tru}`, `{} {}`, `{"a":[1 2]}`, `{"a":1]`, `{"a":nul1}`}
	for _, s := range invalid {
		var j JSON
		if j.FeedString(s) && j.Complete() {
			t.Errorf("%q accepted", s)
		}
	}
}

// FuzzJSON: whatever the automaton accepts as complete is JSON to
// encoding/json, and every JSON object it is given is accepted.
func FuzzJSON(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":[1,{"b":null}]}`, `{"x":"\u0041"}`, `{"n":-1.5e3}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var j JSON
		ok := j.FeedString(s) && j.Complete()
		var obj map[string]any
		isObj := json.Unmarshal([]byte(s), &obj) == nil && json.Valid([]byte(s)) && s[0] == '{' && !longSpaces(s)
		if ok && !json.Valid([]byte(s)) {
			t.Fatalf("accepted invalid JSON %q", s)
		}
		if isObj && !ok && depth(s) < maxDepth {
			t.Fatalf("rejected JSON object %q", s)
		}
	})
}

func depth(s string) int {
	d, m := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '{', '[':
			d++
			m = max(m, d)
		case '}', ']':
			d--
		}
	}
	return m
}

func TestMasker(t *testing.T) {
	pieces := []string{"", "{", "}", `"a"`, ":", "1", " hello", "\"", "x", "]"}
	eog := make([]bool, len(pieces))
	eog[0] = true
	m := NewMasker(pieces, eog)
	logits := make([]float32, len(pieces))
	var j JSON
	if n := m.Apply(&j, logits); n != 1 || !math.IsInf(float64(logits[6]), -1) || logits[1] != 0 {
		t.Errorf("at the start %d allowed: %v", n, logits)
	}
	j.FeedString(`{"a":1}`)
	logits = make([]float32, len(pieces))
	m.Apply(&j, logits)
	if logits[0] != 0 || !math.IsInf(float64(logits[1]), -1) {
		t.Errorf("after a complete object: %v", logits)
	}
}

// longSpaces reports a whitespace run longer than the automaton allows.
func longSpaces(s string) bool {
	run := 0
	for i := 0; i < len(s); i++ {
		if isSpace(s[i]) {
			if run++; run > maxSpaces {
				return true
			}
		} else {
			run = 0
		}
	}
	return false
}

// BenchmarkMask32k masks a 32k vocabulary of short pieces mid-document.
func BenchmarkMask32k(b *testing.B) {
	const v = 32000
	pieces, eog := make([]string, v), make([]bool, v)
	words := []string{"the", " a", "\"", "{", "}", ":", ",", "1", " true", "[", "]", " \"x", "é", "\n"}
	for i := range pieces {
		pieces[i] = words[i%len(words)] + words[(i/len(words))%len(words)]
	}
	m := NewMasker(pieces, eog)
	var j JSON
	j.FeedString(`{"a":[1,`)
	logits := make([]float32, v)
	b.ResetTimer()
	for range b.N {
		m.Apply(&j, logits)
	}
}
