package cuda

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/weftlm/weft/arch"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/synth"
	"github.com/weftlm/weft/weights"
)

// llama1B is the shape of Llama-3.2-1B (tied embeddings), the model of the
// peer figures in the shared performance notes: every weight byte, about
// 0.7 GB in Q4_0, is read once per decoded token.
func llama1B() weights.Config {
	return weights.Config{Architecture: "llama", NLayers: 16, Dim: 2048, NHeads: 32, NKVHeads: 8, HeadDim: 64,
		FFNDim: 8192, VocabSize: 128256, ContextLength: 4096, NormEps: 1e-5, RopeTheta: 500000, RopeDim: 64, TiedEmbeddings: true}
}

// benchModel writes a random-weight model of llama1B's shape, once per
// machine: later runs find it in the temporary folder.
func benchModel(b *testing.B, typ ggml.Type) string {
	dir := filepath.Join(os.TempDir(), "weft-cuda-bench")
	path := filepath.Join(dir, "llama-1b-"+typ.String()+".gguf")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(f.Name())
	d, _ := arch.Lookup("llama")
	if err := synth.Write(f, llama1B(), d, synth.Options{Type: typ, Seed: 1}); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		b.Fatal(err)
	}
	return path
}

func loadBench(b *testing.B, typ ggml.Type, opts engine.Options) *engine.Model {
	gpu := newGPU(b)
	w, err := weights.Open(benchModel(b, typ), weights.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { w.Close() })
	m, err := engine.Load(w, gpu, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m
}

// BenchmarkDecode measures single-sequence greedy decode of the 1B shape,
// the cache growing up to 1024 positions and starting over.
func BenchmarkDecode(b *testing.B) {
	for _, typ := range []ggml.Type{ggml.F16, ggml.Q8_0, ggml.Q4_0} {
		b.Run(typ.String(), func(b *testing.B) {
			m := loadBench(b, typ, engine.Options{Context: 1024})
			seq, err := m.NewSequence()
			if err != nil {
				b.Fatal(err)
			}
			logits := make([]float32, m.Vocab())
			tok := []int32{1}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if seq.Pos() == m.Context() {
					seq.Rewind(0)
				}
				if err := seq.ForwardInto(tok, false, logits); err != nil {
					b.Fatal(err)
				}
				tok[0] = argmax(logits)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

// BenchmarkPrefill measures a 512-token prompt of the 1B shape in chunks
// of 64 rows.
func BenchmarkPrefill(b *testing.B) {
	for _, typ := range []ggml.Type{ggml.F16, ggml.Q8_0, ggml.Q4_0} {
		b.Run(typ.String(), func(b *testing.B) {
			m := loadBench(b, typ, engine.Options{Context: 1024, MaxBatch: 64})
			prompt := make([]int32, 512)
			for i := range prompt {
				prompt[i] = int32(300 + i)
			}
			logits := make([]float32, m.Vocab())
			b.ResetTimer()
			for range b.N {
				seq, err := m.NewSequence()
				if err != nil {
					b.Fatal(err)
				}
				if err := seq.ForwardInto(prompt, false, logits); err != nil {
					b.Fatal(err)
				}
				seq.Close()
			}
			b.ReportMetric(float64(b.N*len(prompt))/b.Elapsed().Seconds(), "tok/s")
		})
	}
}
