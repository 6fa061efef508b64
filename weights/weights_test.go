package weights

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weftlm/weft/arch"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/gguf"
	"github.com/weftlm/weft/safetensors"
)

func sharedPath(t *testing.T, rel string) string {
	t.Helper()
	p := filepath.Join("..", "..", "shared", "testdata", rel)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("shared test data %s not available: %v", rel, err)
	}
	return p
}

func TestStoriesGGUF(t *testing.T) {
	p, err := Open(sharedPath(t, "gguf-stories260K/stories260K.gguf"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := p.Config
	want := Config{Architecture: "llama", NLayers: 5, Dim: 64, NHeads: 8, NKVHeads: 4, HeadDim: 8, FFNDim: 172, VocabSize: 512, ContextLength: 2048, NormEps: 1e-5, RopeTheta: 10000, RopeDim: 8}
	if c.Architecture != want.Architecture || c.NLayers != want.NLayers || c.Dim != want.Dim || c.NHeads != want.NHeads ||
		c.NKVHeads != want.NKVHeads || c.HeadDim != want.HeadDim || c.FFNDim != want.FFNDim || c.VocabSize != want.VocabSize ||
		c.ContextLength != want.ContextLength || c.NormEps != want.NormEps || c.RopeTheta != want.RopeTheta || c.RopeDim != want.RopeDim {
		t.Errorf("config\n got %+v\nwant %+v", c, want)
	}
	if c.TiedEmbeddings || c.RopeLayout != "interleaved" {
		t.Errorf("tied=%v rope=%s, want untied interleaved", c.TiedEmbeddings, c.RopeLayout)
	}
	q, ok := p.Tensor("layers.4.attention.q.weight")
	if !ok || q.FileName != "blk.4.attn_q.weight" || q.Type != "F32" || len(q.Shape) != 2 || q.Shape[0] != 64 || q.Shape[1] != 64 {
		t.Fatalf("q tensor: %+v", q)
	}
	k, _ := p.Tensor("layers.0.attention.k.weight")
	if k.Rows() != 32 || k.Cols() != 64 {
		t.Errorf("k is %dx%d, want 32x64 (kv_dim x dim)", k.Rows(), k.Cols())
	}
	d, err := p.Data("output_norm.weight")
	if err != nil || len(d.Bytes) != 256 {
		t.Fatalf("output_norm data: %d bytes, %v", len(d.Bytes), err)
	}
	d2, _ := p.Data("output_norm.weight")
	if &d.Bytes[0] != &d2.Bytes[0] {
		t.Error("second Data call did not return the cached view")
	}
}

func TestHFConfigs(t *testing.T) {
	tests := []struct {
		name  string
		json  string
		check func(t *testing.T, c Config)
	}{
		{"llama3 rope scaling", `{"model_type":"llama","hidden_size":2048,"num_hidden_layers":16,"num_attention_heads":32,"num_key_value_heads":8,
			"intermediate_size":8192,"vocab_size":128256,"max_position_embeddings":131072,"rms_norm_eps":1e-05,"rope_theta":500000.0,
			"rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,"original_max_position_embeddings":8192,"rope_type":"llama3"},
			"tie_word_embeddings":true}`,
			func(t *testing.T, c Config) {
				if c.RopeScaling != (RopeScaling{Type: "llama3", Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalCtx: 8192}) {
					t.Errorf("rope scaling %+v", c.RopeScaling)
				}
				if c.HeadDim != 64 || c.NKVHeads != 8 || !c.TiedEmbeddings || c.RopeTheta != 500000 || c.RopeLayout != "neox" {
					t.Errorf("config %+v", c)
				}
			}},
		{"transformers 5 rope_parameters", `{"model_type":"llama","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":128,
			"vocab_size":100,"max_position_embeddings":256,"rope_parameters":{"rope_type":"linear","rope_theta":123.0,"factor":2.0}}`,
			func(t *testing.T, c Config) {
				if c.RopeTheta != 123 || c.RopeScaling.Type != "linear" || c.RopeScaling.Factor != 2 {
					t.Errorf("rope %g %+v", c.RopeTheta, c.RopeScaling)
				}
			}},
		{"gemma3 multimodal wrapper with layer types", `{"model_type":"gemma3","text_config":{"model_type":"gemma3_text","hidden_size":64,"num_hidden_layers":3,
			"num_attention_heads":4,"num_key_value_heads":1,"head_dim":32,"intermediate_size":128,"vocab_size":100,"max_position_embeddings":256,
			"sliding_window":8,"layer_types":["sliding_attention","sliding_attention","full_attention"],"query_pre_attn_scalar":16,
			"rope_parameters":{"full_attention":{"rope_type":"linear","factor":8.0,"rope_theta":1000000.0},"sliding_attention":{"rope_type":"default","rope_theta":10000.0}}}}`,
			func(t *testing.T, c Config) {
				if c.Architecture != "gemma3" || c.HeadDim != 32 || c.SlidingWindow != 8 || len(c.SlidingLayers) != 3 || !c.SlidingLayers[0] || c.SlidingLayers[2] {
					t.Errorf("config %+v", c)
				}
				if c.RopeTheta != 1e6 || c.RopeLocalTheta != 1e4 || c.RopeScaling.Factor != 8 || math.Abs(c.AttnScale-0.25) > 1e-12 {
					t.Errorf("rope %g local %g scaling %+v attn scale %g", c.RopeTheta, c.RopeLocalTheta, c.RopeScaling, c.AttnScale)
				}
			}},
		{"gemma3 pattern without layer types", `{"model_type":"gemma3_text","hidden_size":64,"num_hidden_layers":12,"num_attention_heads":4,"num_key_value_heads":1,
			"head_dim":16,"intermediate_size":128,"vocab_size":100,"max_position_embeddings":256,"sliding_window":8,"sliding_window_pattern":6}`,
			func(t *testing.T, c Config) {
				for i, s := range c.SlidingLayers {
					if s != (i != 5 && i != 11) {
						t.Errorf("layer %d sliding=%v", i, s)
					}
				}
				if c.RopeLocalTheta != 10000 {
					t.Errorf("local theta %g, want the family default 10000", c.RopeLocalTheta)
				}
			}},
		{"qwen2 ignores an unused sliding window", `{"model_type":"qwen2","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
			"intermediate_size":128,"vocab_size":100,"max_position_embeddings":256,"sliding_window":131072,"use_sliding_window":false,"tie_word_embeddings":true}`,
			func(t *testing.T, c Config) {
				if c.SlidingWindow != 0 || c.SlidingLayers != nil {
					t.Errorf("sliding %d %v", c.SlidingWindow, c.SlidingLayers)
				}
			}},
		{"mlx quantization", `{"model_type":"qwen3","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"head_dim":32,"intermediate_size":128,
			"vocab_size":100,"max_position_embeddings":256,"quantization":{"group_size":32,"bits":4}}`,
			func(t *testing.T, c Config) {
				if c.QuantBits != 4 || c.QuantGroupSize != 32 || c.HeadDim != 32 {
					t.Errorf("quant %d/%d head %d", c.QuantBits, c.QuantGroupSize, c.HeadDim)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, err := ParseHFConfig([]byte(tt.json), "config.json")
			if err == nil {
				err = c.Validate("config.json")
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

func TestHFConfigErrors(t *testing.T) {
	base := `"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":128,"vocab_size":100,"max_position_embeddings":256`
	tests := []struct{ json, want string }{
		{`[1,2]`, "config.json: (file): not a JSON object"},
		{`{` + base + `}`, "config.json: model_type: missing"},
		{`{"model_type":"gpt_bigcode",` + base + `}`, `config.json: model_type: unsupported architecture "gpt_bigcode"`},
		{`{"model_type":"llama","num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":128,"vocab_size":100,"max_position_embeddings":256}`, "config.json: hidden_size: missing"},
		{`{"model_type":"llama",` + strings.Replace(base, `"hidden_size":64`, `"hidden_size":"64"`, 1) + `}`, "config.json: hidden_size: want a number, got string"},
		{`{"model_type":"llama",` + strings.Replace(base, `"hidden_size":64`, `"hidden_size":6.5`, 1) + `}`, "config.json: hidden_size: want a non-negative integer"},
		{`{"model_type":"llama","num_key_value_heads":3,` + base + `}`, "config.json: n_kv_heads: 3 does not divide n_heads 4"},
		{`{"model_type":"llama","rope_scaling":{"rope_type":"dynamic","factor":2},` + base + `}`, `config.json: rope_scaling.type: unsupported "dynamic"`},
		{`{"model_type":"llama","rope_scaling":{"rope_type":"llama3","factor":8},` + base + `}`, "config.json: rope_scaling: llama3 scaling needs"},
		{`{"text_config":{"model_type":"gemma3_text","hidden_size":"x"}}`, "config.json: text_config.hidden_size: want a number"},
		{`{"model_type":"gemma3_text","sliding_window":4,"layer_types":["full_attention","local"],` + base + `}`, `config.json: layer_types: element 1 is "local"`},
	}
	for _, tt := range tests {
		c, _, err := ParseHFConfig([]byte(tt.json), "config.json")
		if err == nil {
			err = c.Validate("config.json")
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s\n got error %v\nwant %q", tt.json, err, tt.want)
		}
	}
}

func TestSharedHFConfigs(t *testing.T) {
	for _, rel := range []string{"hf-configs/Llama-3.2-1B/config.json", "hf-configs/TinyLlama-1.1B-Chat-v1.0/config.json", "hf-qwen2.5-0.5b/config.json"} {
		b, err := os.ReadFile(sharedPath(t, rel))
		if err != nil {
			t.Fatal(err)
		}
		c, _, err := ParseHFConfig(b, rel)
		if err == nil {
			err = c.Validate(rel)
		}
		if err != nil {
			t.Errorf("%s: %v", rel, err)
		}
		if strings.Contains(rel, "Llama-3.2") && (c.RopeScaling.Type != "llama3" || c.NLayers != 16 || c.NKVHeads != 8 || !c.TiedEmbeddings) {
			t.Errorf("%s: %+v", rel, c)
		}
	}
}

func TestNames(t *testing.T) {
	tests := []struct {
		rules  []nameRule
		family string
		file   string
		want   string
	}{
		{ggufRules, "llama", "blk.2.attn_q.weight", "layers.2.attention.q.weight"},
		{ggufRules, "llama", "blk.3.attn_q.weight", ""}, // beyond 3 layers
		{ggufRules, "llama", "blk.02.attn_q.weight", ""},
		{ggufRules, "qwen2", "blk.0.attn_k.bias", "layers.0.attention.k.bias"},
		{ggufRules, "gemma3", "blk.1.post_ffw_norm.weight", "layers.1.ffn_post_norm.weight"},
		{ggufRules, "llama", "token_embd.weight", "token_embedding.weight"},
		{hfRules, "llama", "model.layers.1.post_attention_layernorm.weight", "layers.1.ffn_norm.weight"},
		{hfRules, "gemma3", "model.layers.1.post_attention_layernorm.weight", "layers.1.attention_post_norm.weight"},
		{hfRules, "gemma3", "model.layers.1.pre_feedforward_layernorm.weight", "layers.1.ffn_norm.weight"},
		{hfRules, "qwen3", "model.layers.0.self_attn.k_norm.weight", "layers.0.attention.k_norm.weight"},
		{hfRules, "llama", "lm_head.weight", "output.weight"},
	}
	for _, tt := range tests {
		nm := newNamer(tt.rules, tt.family, 3)
		if got := nm.canonical(tt.file); got != tt.want {
			t.Errorf("%s %s -> %q, want %q", tt.family, tt.file, got, tt.want)
		}
	}
	for in, want := range map[string]string{
		"language_model.model.layers.0.mlp.up_proj.weight": "model.layers.0.mlp.up_proj.weight",
		"model.language_model.embed_tokens.weight":         "model.embed_tokens.weight",
		"language_model.lm_head.weight":                    "lm_head.weight",
		"vision_tower.blocks.0.weight":                     "vision_tower.blocks.0.weight",
	} {
		if got := stripHFPrefix(in); got != want {
			t.Errorf("stripHFPrefix(%q) = %q, want %q", in, got, want)
		}
	}
}

// tinyLlama writes a complete 1-layer llama GGUF; mutate may change the
// tensor list before writing.
func tinyLlama(t *testing.T, mutate func(shapes map[string][]uint64)) string {
	t.Helper()
	const dim, ffn, vocab, heads, kv = 16, 32, 10, 2, 1
	hd := dim / heads
	shapes := map[string][]uint64{ // GGUF order: innermost first
		"token_embd.weight": {dim, vocab}, "output_norm.weight": {dim}, "output.weight": {dim, vocab},
		"blk.0.attn_norm.weight": {dim}, "blk.0.attn_q.weight": {dim, dim}, "blk.0.attn_k.weight": {dim, kv * uint64(hd)},
		"blk.0.attn_v.weight": {dim, kv * uint64(hd)}, "blk.0.attn_output.weight": {dim, dim}, "blk.0.ffn_norm.weight": {dim},
		"blk.0.ffn_gate.weight": {dim, ffn}, "blk.0.ffn_up.weight": {dim, ffn}, "blk.0.ffn_down.weight": {ffn, dim},
	}
	if mutate != nil {
		mutate(shapes)
	}
	w := gguf.NewWriter()
	w.SetKV("general.architecture", gguf.String("llama"))
	for k, v := range map[string]uint32{"llama.block_count": 1, "llama.embedding_length": dim, "llama.feed_forward_length": ffn,
		"llama.attention.head_count": heads, "llama.attention.head_count_kv": kv, "llama.context_length": 64, "llama.vocab_size": vocab} {
		w.SetKV(k, gguf.Uint32(v))
	}
	w.SetKV("llama.attention.layer_norm_rms_epsilon", gguf.Float32(1e-5))
	names := make([]string, 0, len(shapes))
	for n := range shapes {
		names = append(names, n)
	}
	for i := range names {
		for j := i + 1; j < len(names); j++ {
			if names[j] < names[i] {
				names[i], names[j] = names[j], names[i]
			}
		}
	}
	for _, n := range names {
		sz, _ := ggml.F32.TensorBytes(shapes[n])
		if err := w.AddTensor(n, ggml.F32, shapes[n], make([]byte, sz)); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCheckTensors(t *testing.T) {
	p, err := Open(tinyLlama(t, nil), Options{})
	if err != nil {
		t.Fatalf("complete model: %v", err)
	}
	p.Close()
	tests := []struct {
		name   string
		mutate func(map[string][]uint64)
		want   string
	}{
		{"missing", func(s map[string][]uint64) { delete(s, "blk.0.ffn_up.weight") }, `tensor "layers.0.ffn.up.weight": missing`},
		{"wrong shape", func(s map[string][]uint64) { s["blk.0.attn_k.weight"] = []uint64{16, 16} }, `tensor "layers.0.attention.k.weight": shape [16 16] (file name "blk.0.attn_k.weight"), want [8 16]`},
		{"extra layer", func(s map[string][]uint64) { s["blk.1.attn_norm.weight"] = []uint64{16} }, `tensor "blk.1.attn_norm.weight": not a tensor of a 1-layer llama model`},
		{"unknown layer tensor", func(s map[string][]uint64) { s["blk.0.attn_rot.weight"] = []uint64{16} }, `tensor "blk.0.attn_rot.weight": not a tensor of a 1-layer llama model`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Open(tinyLlama(t, tt.mutate), Options{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want %q", err, tt.want)
			}
		})
	}
	// Without output.weight the embedding is tied.
	p, err = Open(tinyLlama(t, func(s map[string][]uint64) { delete(s, "output.weight") }), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Config.TiedEmbeddings {
		t.Error("no output.weight but not tied")
	}
	p.Close()
}

func TestFormatDetection(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"model.bin": "PK\x03\x04rest", "notes.txt": "hello world", "tiny": "ab", "old.bin": "ggjt\x00\x00"} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), 0o644)
		_, err := Open(p, Options{})
		if err == nil || !strings.Contains(err.Error(), "unrecognised model format") || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: got %v", name, err)
		}
	}
	_, err := Open(dir, Options{})
	if err == nil || !strings.Contains(err.Error(), "no model.safetensors.index.json and no .safetensors files") {
		t.Errorf("empty dir: %v", err)
	}
}

// TestMLXTriple builds an MLX-style directory: a 4-bit quantized q_proj
// (packed uint32 weights, f16 scales and biases) is presented as one tensor.
func TestMLXTriple(t *testing.T) {
	dir := t.TempDir()
	cfg := `{"model_type":"llama","hidden_size":64,"num_hidden_layers":1,"num_attention_heads":4,"intermediate_size":128,"vocab_size":10,
		"max_position_embeddings":64,"quantization":{"group_size":32,"bits":4}}`
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644)
	w := safetensors.NewWriter()
	add := func(name string, dt safetensors.DType, shape ...int64) {
		n := int64(dt.Size())
		for _, d := range shape {
			n *= d
		}
		if err := w.Add(name, dt, shape, make([]byte, n)); err != nil {
			t.Fatal(err)
		}
	}
	add("model.layers.0.self_attn.q_proj.weight", safetensors.U32, 64, 64*4/32)
	add("model.layers.0.self_attn.q_proj.scales", safetensors.F16, 64, 2)
	add("model.layers.0.self_attn.q_proj.biases", safetensors.F16, 64, 2)
	add("model.embed_tokens.weight", safetensors.F16, 10, 64)
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "model.safetensors"), buf.Bytes(), 0o644)
	p, cfgErr, err := Inspect(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if cfgErr != nil {
		t.Fatal(cfgErr)
	}
	q, ok := p.Tensor(arch.Layer(arch.AttnQ, 0))
	if !ok || q.MLX == nil || q.Type != "MLX_Q4" || q.Shape[0] != 64 || q.Shape[1] != 64 || q.MLX.GroupSize != 32 || q.MLX.ScalesType != "F16" {
		t.Fatalf("q: %+v mlx %+v", q, q.MLX)
	}
	d, err := p.Data(q.Name)
	if err != nil || len(d.Bytes) != 64*8*4 || len(d.Scales) != 64*2*2 || len(d.Biases) != 64*2*2 {
		t.Fatalf("data %d/%d/%d %v", len(d.Bytes), len(d.Scales), len(d.Biases), err)
	}
	var canon []string
	for _, f := range p.FileTensors() {
		canon = append(canon, f.Canonical)
	}
	if !strings.Contains(strings.Join(canon, ","), "layers.0.attention.q.scales") {
		t.Errorf("scales not mapped in the file listing: %v", canon)
	}
	// Full Open reports the missing tensors of this partial model by name.
	if _, err := Open(dir, Options{}); err == nil || !strings.Contains(err.Error(), `tensor "output_norm.weight": missing`) {
		t.Errorf("Open of a partial model: %v", err)
	}
}

func FuzzParseHFConfig(f *testing.F) {
	f.Add([]byte(`{"model_type":"llama","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":128,"vocab_size":100,"max_position_embeddings":256}`))
	f.Add([]byte(`{"text_config":{"model_type":"gemma3_text","layer_types":["full_attention"],"rope_parameters":{"full_attention":{"rope_theta":1}}},"quantization":{"bits":4}}`))
	for _, rel := range []string{"hf-configs/Llama-3.2-1B/config.json", "hf-qwen2.5-0.5b/config.json"} {
		if b, err := os.ReadFile(filepath.Join("..", "..", "shared", "testdata", rel)); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, _, err := ParseHFConfig(b, "fuzz.json")
		if err != nil {
			return
		}
		_ = c.Validate("fuzz.json")
	})
}
