package testmodel

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// Reference is a fixture made by scripts/make_hf_fixtures.py or
// scripts/make_quant_references.py: transformers' logits for a fixed prompt
// and its greedy continuation, one row per fed token.
type Reference struct {
	Tokens    []int32   `json:"tokens"`
	Generated []int32   `json:"generated"`
	Rows      int       `json:"rows"`
	Vocab     int       `json:"vocab"`
	PromptLen int       `json:"prompt_len"`
	Logits    []float32 `json:"-"` // [Rows, Vocab]
}

// Row returns row i of the logits.
func (r *Reference) Row(i int) []float32 { return r.Logits[i*r.Vocab : (i+1)*r.Vocab] }

// LoadReference reads dir/reference.json and dir/logits.f32.
func LoadReference(t testing.TB, dir string) *Reference {
	t.Helper()
	return LoadReferenceFiles(t, filepath.Join(dir, "reference.json"), filepath.Join(dir, "logits.f32"))
}

// LoadReferenceFiles reads a reference from its two files.
func LoadReferenceFiles(t testing.TB, jsonPath, logitsPath string) *Reference {
	t.Helper()
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var r Reference
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("%s: %v", jsonPath, err)
	}
	raw, err := os.ReadFile(logitsPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) != 4*r.Rows*r.Vocab {
		t.Fatalf("%s has %d bytes, want %d", logitsPath, len(raw), 4*r.Rows*r.Vocab)
	}
	r.Logits = make([]float32, r.Rows*r.Vocab)
	for i := range r.Logits {
		r.Logits[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return &r
}

// RelErr is ‖a−b‖/‖b‖, summed in float64.
func RelErr(a, b []float32) float64 {
	var d, n float64
	for i := range b {
		x := float64(a[i]) - float64(b[i])
		d += x * x
		n += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(d / n)
}

// Argmax is the index of the largest value, the lowest on ties.
func Argmax(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

// CheckQuantRows holds the logits got of a model with int8-quantized
// activations, fed r's prompt and continuation teacher-forced, to r's
// rows under the bounds of the quantized references (engine's
// TestQuantizedReferences says why): mean row relative error ≤ 0.12,
// worst ≤ 0.35, top-1 agreement on at least 75 % of rows.
func CheckQuantRows(t testing.TB, got []float32, r *Reference) {
	t.Helper()
	worst, mean, top1 := 0.0, 0.0, 0
	for row := 0; row < r.Rows; row++ {
		g, w := got[row*r.Vocab:(row+1)*r.Vocab], r.Row(row)
		e := RelErr(g, w)
		worst = max(worst, e)
		mean += e / float64(r.Rows)
		if Argmax(g) == Argmax(w) {
			top1++
		}
	}
	t.Logf("row relative error: mean %.3g, worst %.3g; top-1 %d/%d", mean, worst, top1, r.Rows)
	if mean > 0.12 || worst > 0.35 || top1*4 < r.Rows*3 {
		t.Errorf("row relative error mean %.3g (bound 0.12), worst %.3g (bound 0.35); top-1 agreement %d/%d (bound 75 %%)", mean, worst, top1, r.Rows)
	}
}
