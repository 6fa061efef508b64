package constrain

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/weftlm/weft/tokenizer"
)

// qwenPieces reads Qwen 2.5's 151k vocabulary from the shared test data.
func qwenPieces(tb testing.TB) ([]string, []bool) {
	tb.Helper()
	tok, err := tokenizer.FromHF(filepath.Join("..", "..", "shared", "testdata", "hf-qwen2.5-0.5b"))
	if err != nil {
		tb.Skipf("shared test data hf-qwen2.5-0.5b not available: %v", err)
	}
	v := tok.Len()
	pieces, eog := make([]string, v), make([]bool, v)
	for id := range v {
		if t := tok.Type(int32(id)); t != tokenizer.TypeControl && t != tokenizer.TypeUnknown && t != tokenizer.TypeUnused {
			pieces[id] = tok.Piece(int32(id))
		}
		eog[id] = tok.IsEOG(int32(id))
	}
	return pieces, eog
}

// vocabStates are prefixes of a schema document in every kind of state.
var vocabStates = []string{`{"name":"Ann","age":3`, `{"name":"An`, `{"na`, `{"name":"Ann","age":3,"extra":{"`, `{"name":"Ann","age":3,"extra":{"k":`, `{"name":"A\`, `{"name":"Ann","age":3,"mood":"so`, `{"name":"Ann","age":3,"nick":"a`, `{"name":"Ann","age":3,"bio":"ab`, `{"name":"Ann","age":3,"code":"a`}

// TestMaskerRealVocabulary: on a real 151k vocabulary — quotes, escapes,
// whitespace runs, multi-byte text — the trie walk allows exactly what
// feeding every token would.
func TestMaskerRealVocabulary(t *testing.T) {
	pieces, eog := qwenPieces(t)
	m := NewMasker(pieces, eog)
	s, err := CompileSchema([]byte(personSchema))
	if err != nil {
		t.Fatal(err)
	}
	for _, at := range vocabStates {
		j := NewSchemaJSON(s)
		if !j.FeedString(at) {
			t.Fatalf("%q refused", at)
		}
		logits := make([]float32, len(pieces))
		m.Apply(&j, logits)
		for id, p := range pieces {
			ok := eog[id] && j.Complete()
			if !eog[id] && p != "" {
				c := j
				ok = c.FeedString(p)
			}
			if got := !math.IsInf(float64(logits[id]), -1); got != ok {
				t.Fatalf("after %q: token %d %q allowed %v, want %v", at, id, p, got, ok)
			}
		}
	}
}

// BenchmarkMaskRealVocabulary masks Qwen 2.5's vocabulary in each state.
func BenchmarkMaskRealVocabulary(b *testing.B) {
	pieces, eog := qwenPieces(b)
	m := NewMasker(pieces, eog)
	s, err := CompileSchema([]byte(personSchema))
	if err != nil {
		b.Fatal(err)
	}
	for _, at := range vocabStates {
		j := NewSchemaJSON(s)
		j.FeedString(at)
		logits := make([]float32, len(pieces))
		b.Run(at, func(b *testing.B) {
			for range b.N {
				m.Apply(&j, logits)
			}
		})
	}
}
