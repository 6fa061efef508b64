package safetensors_test

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/weftlm/weft/safetensors"
)

var update = flag.Bool("update", false, "rewrite the writer's golden files and fuzz seeds under testdata")

// checkGolden compares got with the file at path, or writes it with -update.
func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to create it)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("writer output differs from %s (%d bytes vs %d); if the change is intended, run with -update and re-check with testdata/python/make_fixtures.py", path, len(got), len(want))
	}
}

// goldenAllDTypes is every dtype plus a name that needs JSON escaping.
func goldenAllDTypes() []testTensor {
	return append(everyDType(), testTensor{`odd "name" <é>\`, safetensors.I16, []int64{1, 2}, pattern(4, 200)})
}

// TestGoldenAllDTypes pins the writer's bytes; testdata/python checks that
// the Python safetensors library reads the same file as this package.
func TestGoldenAllDTypes(t *testing.T) {
	raw := write(t, map[string]string{"format": "pt"}, goldenAllDTypes())
	checkGolden(t, filepath.Join("testdata", "go", "alldtypes.safetensors"), raw)
}

// tinyLlamaShapes are the tensors of a one-layer Llama with hidden size 16,
// 2 query heads and 1 KV head of 8, FFN 32 and vocab 32; the weights are
// [out, in] as Hugging Face stores them.
var tinyLlamaShapes = []struct {
	name  string
	shape []int64
	shard int
}{
	{"model.embed_tokens.weight", []int64{32, 16}, 1},
	{"model.layers.0.input_layernorm.weight", []int64{16}, 1},
	{"model.layers.0.self_attn.q_proj.weight", []int64{16, 16}, 1},
	{"model.layers.0.self_attn.k_proj.weight", []int64{8, 16}, 1},
	{"model.layers.0.self_attn.v_proj.weight", []int64{8, 16}, 1},
	{"model.layers.0.self_attn.o_proj.weight", []int64{16, 16}, 1},
	{"model.layers.0.post_attention_layernorm.weight", []int64{16}, 2},
	{"model.layers.0.mlp.gate_proj.weight", []int64{32, 16}, 2},
	{"model.layers.0.mlp.up_proj.weight", []int64{32, 16}, 2},
	{"model.layers.0.mlp.down_proj.weight", []int64{16, 32}, 2},
	{"model.norm.weight", []int64{16}, 2},
	{"lm_head.weight", []int64{32, 16}, 2},
}

const tinyLlamaConfig = `{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 16,
  "intermediate_size": 32,
  "num_hidden_layers": 1,
  "num_attention_heads": 2,
  "num_key_value_heads": 1,
  "head_dim": 8,
  "vocab_size": 32,
  "max_position_embeddings": 64,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "dtype": "float32"
}
`

// tinyLlamaWeights returns the F32 values of tensor k: element i is
// (((i*13 + k) mod 251) - 125) / 256, exact in float32 so Python can
// recompute it bit for bit.
func tinyLlamaWeights(k int, n int64) []byte {
	b := make([]byte, 4*n)
	for i := range n {
		v := float32((i*13+int64(k))%251-125) / 256
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// TestGoldenTinyLlama pins a two-shard Llama checkpoint with its index, as
// transformers' from_pretrained expects to find it (format=pt metadata).
func TestGoldenTinyLlama(t *testing.T) {
	dir := filepath.Join("testdata", "go", "tinyllama")
	shards := [2]*safetensors.Writer{safetensors.NewWriter(), safetensors.NewWriter()}
	weightMap := map[string]string{}
	var total int64
	for k, tt := range tinyLlamaShapes {
		n := int64(1)
		for _, d := range tt.shape {
			n *= d
		}
		w := shards[tt.shard-1]
		if err := w.Add(tt.name, safetensors.F32, tt.shape, tinyLlamaWeights(k, n)); err != nil {
			t.Fatal(err)
		}
		weightMap[tt.name] = fmt.Sprintf("model-%05d-of-00002.safetensors", tt.shard)
		total += 4 * n
	}
	for i, w := range shards {
		w.SetMetadata("format", "pt")
		var buf bytes.Buffer
		if _, err := w.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		checkGolden(t, filepath.Join(dir, fmt.Sprintf("model-%05d-of-00002.safetensors", i+1)), buf.Bytes())
	}
	index := fmt.Sprintf("{\n  \"metadata\": {\"total_size\": %d},\n  \"weight_map\": {\n", total)
	for k, tt := range tinyLlamaShapes {
		sep := ","
		if k == len(tinyLlamaShapes)-1 {
			sep = ""
		}
		index += fmt.Sprintf("    %q: %q%s\n", tt.name, weightMap[tt.name], sep)
	}
	index += "  }\n}\n"
	checkGolden(t, filepath.Join(dir, safetensors.IndexFile), []byte(index))
	checkGolden(t, filepath.Join(dir, "config.json"), []byte(tinyLlamaConfig))

	if *update {
		return
	}
	m, err := safetensors.Open(dir, safetensors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if len(m.Tensors()) != len(tinyLlamaShapes) || len(m.Files) != 2 {
		t.Fatalf("%d tensors in %d files", len(m.Tensors()), len(m.Files))
	}
}
