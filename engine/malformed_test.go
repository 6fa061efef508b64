package engine

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weftlm/weft/arch"
	"github.com/weftlm/weft/backend/cpu"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/gguf"
	"github.com/weftlm/weft/synth"
	"github.com/weftlm/weft/weights"
)

// TestUnsupportedWeightType: a matrix in a type the CPU backend cannot
// multiply by fails at load, naming the tensor and the type.
func TestUnsupportedWeightType(t *testing.T) {
	c := weights.Config{Architecture: "llama", NLayers: 1, Dim: 256, NHeads: 4, NKVHeads: 4, HeadDim: 64, FFNDim: 256,
		VocabSize: 300, ContextLength: 64, NormEps: 1e-5, RopeTheta: 10000, RopeDim: 64}
	d, _ := arch.Lookup("llama")
	var buf bytes.Buffer
	if err := synth.Write(&buf, c, d, synth.Options{Type: ggml.F32, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	src, err := gguf.NewFile(bytes.NewReader(buf.Bytes()), int64(buf.Len()), "src.gguf")
	if err != nil {
		t.Fatal(err)
	}
	w := gguf.NewWriter()
	for _, kv := range src.KVs {
		w.SetKV(kv.Key, kv.Value)
	}
	for i := range src.Tensors {
		ti := &src.Tensors[i]
		data, _ := src.TensorData(ti)
		typ := ti.Type
		if ti.Name == "blk.0.attn_q.weight" {
			typ = ggml.IQ2_XXS
			n, _ := typ.TensorBytes(ti.Dims)
			data = make([]byte, n)
		}
		if err := w.AddTensor(ti.Name, typ, ti.Dims, data); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "iq2.gguf")
	var out bytes.Buffer
	if _, err := w.WriteTo(&out); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path, out.Bytes(), 0o644)
	p, err := weights.Open(path, weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_, err = Load(p, cpu.New(1), Options{})
	if err == nil || !strings.Contains(err.Error(), `tensor "layers.0.attention.q.weight" has type IQ2_XXS, which the cpu backend does not support`) {
		t.Fatalf("got %v", err)
	}
}
