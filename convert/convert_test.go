package convert

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/weftlm/weft/backend/cpu"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/internal/testmodel"
	"github.com/weftlm/weft/weights"
)

// logitsOf runs the reference's prompt and its 32 generated tokens through
// the model at path, teacher-forced, and returns every row.
func logitsOf(t *testing.T, path string, r *testmodel.Reference) []float32 {
	t.Helper()
	p, err := weights.Open(path, weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	m, err := engine.Load(p, cpu.New(2), engine.Options{Context: 128, MaxBatch: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	seq, _ := m.NewSequence()
	defer seq.Close()
	all := append(append([]int32{}, r.Tokens...), r.Generated...)
	out, err := seq.Forward(all, true)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func rowErrors(got, want []float32, vocab int) (worst, mean float64, top1 int) {
	rows := len(want) / vocab
	for row := 0; row < rows; row++ {
		g, w := got[row*vocab:(row+1)*vocab], want[row*vocab:(row+1)*vocab]
		var d, n float64
		for i := range w {
			x := float64(g[i]) - float64(w[i])
			d += x * x
			n += float64(w[i]) * float64(w[i])
		}
		e := math.Sqrt(d / n)
		worst = max(worst, e)
		mean += e / float64(rows)
		if testmodel.Argmax(g) == testmodel.Argmax(w) {
			top1++
		}
	}
	return worst, mean, top1
}

// TestGGUFConversion converts every reference model to GGUF the way
// llama.cpp's converter does (q/k permutation for llama, rope_freqs for
// llama 3 scaling, Gemma norms stored as 1+w) and checks the GGUF gives
// transformers' logits.
//
// Tolerances (relative error of a row of logits, ‖Δ‖/‖ref‖): F32 is exact
// up to summation order, 1e-4 for every row. F16 rounds every weight to 11
// significant bits (relative error ≤ 2^-11 ≈ 4.9e-4, RMS ≈ 2.8e-4); through
// 2-3 layers of random weights with std 0.2 this grows about tenfold, so the
// mean row error must stay under 5e-3 and the worst row (rows whose logits
// are small amplify it) under 3e-2. BF16 keeps 8 bits, 8× coarser: 4e-2
// mean, 1.5e-1 worst. Top-1 must agree on 95 % of rows.
func TestGGUFConversion(t *testing.T) {
	type bound struct{ mean, worst float64 }
	tol := map[ggml.Type]bound{ggml.F32: {1e-4, 1e-4}, ggml.F16: {5e-3, 3e-2}, ggml.BF16: {4e-2, 1.5e-1}}
	for _, name := range []string{"llama3-tiny", "qwen2-tiny", "qwen3-tiny", "gemma3-tiny"} {
		dir := filepath.Join("..", "testdata", "models", name)
		r := testmodel.LoadReference(t, dir)
		src, err := weights.Open(dir, weights.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, typ := range []ggml.Type{ggml.F32, ggml.F16, ggml.BF16} {
			t.Run(name+"/"+typ.String(), func(t *testing.T) {
				out := filepath.Join(t.TempDir(), "m.gguf")
				f, err := os.Create(out)
				if err != nil {
					t.Fatal(err)
				}
				if err := WriteGGUF(src, f, Options{Type: typ, Name: name}); err != nil {
					t.Fatal(err)
				}
				f.Close()
				got := logitsOf(t, out, r)
				worst, mean, top1 := rowErrors(got, r.Logits, r.Vocab)
				t.Logf("row relative error: mean %.3g, worst %.3g; top-1 agreement %d/%d", mean, worst, top1, r.Rows)
				if mean > tol[typ].mean || worst > tol[typ].worst {
					t.Errorf("row relative error mean %.3g worst %.3g, bounds %g and %g", mean, worst, tol[typ].mean, tol[typ].worst)
				}
				if top1 < r.Rows*95/100 {
					t.Errorf("top-1 agrees on %d of %d rows", top1, r.Rows)
				}
			})
		}
		src.Close()
	}
}
