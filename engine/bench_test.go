package engine

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/weftlm/weft/arch"
	"github.com/weftlm/weft/backend/cpu"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/synth"
	"github.com/weftlm/weft/weights"
)

// benchConfig is a llama-shaped model of about 134M parameters (GPT-2
// small's width and depth with Llama's blocks and a 32k vocabulary).
func benchConfig() weights.Config {
	return weights.Config{Architecture: "llama", NLayers: 12, Dim: 768, NHeads: 12, NKVHeads: 12, HeadDim: 64,
		FFNDim: 2048, VocabSize: 32000, ContextLength: 2048, NormEps: 1e-5, RopeTheta: 10000, RopeDim: 64}
}

var benchModels sync.Map // type → path

func benchModel(b *testing.B, typ ggml.Type) string {
	if p, ok := benchModels.Load(typ); ok {
		return p.(string)
	}
	dir, err := os.MkdirTemp("", "weft-bench")
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(dir, fmt.Sprintf("llama-134m-%s.gguf", typ))
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	d, _ := arch.Lookup("llama")
	if err := synth.Write(f, benchConfig(), d, synth.Options{Type: typ, Seed: 1}); err != nil {
		b.Fatal(err)
	}
	f.Close()
	benchModels.Store(typ, path)
	return path
}

// BenchmarkDecode measures single-sequence decode (one token per plan
// replay, the KV cache growing) of a 134M-parameter llama-shaped model.
func BenchmarkDecode(b *testing.B) {
	for _, typ := range []ggml.Type{ggml.Q8_0, ggml.Q4_0} {
		b.Run(typ.String(), func(b *testing.B) {
			p, err := weights.Open(benchModel(b, typ), weights.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			m, err := Load(p, cpu.New(0), Options{Context: 2048})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			seq, _ := m.NewSequence()
			logits := make([]float32, m.Vocab())
			tok := []int32{1}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
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
