package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weftlm/weft/weights"
)

// TestSynthAndConvert makes a random model from a real config shape scaled
// down, converts it, and runs both.
func TestSynthAndConvert(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	os.WriteFile(cfg, []byte(`{"model_type":"qwen2","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
		"intermediate_size":128,"vocab_size":300,"max_position_embeddings":64,"rms_norm_eps":1e-6,"tie_word_embeddings":true}`), 0o644)
	out := filepath.Join(dir, "m.gguf")
	if _, stderr, code := runWeft(t, "synth", "--config", cfg, "--type", "Q8_0", "--seed", "3", "-o", out); code != 0 {
		t.Fatalf("synth: %s", stderr)
	}
	stdout, stderr, code := runWeft(t, "inspect", out)
	if code != 0 || !strings.Contains(stdout, "blk.1.attn_q.bias") || !strings.Contains(stdout, "Q8_0") {
		t.Fatalf("inspect: %s %s", stdout, stderr)
	}
	f16 := filepath.Join(dir, "m-f16.gguf")
	if _, stderr, code := runWeft(t, "convert", out, "-o", f16, "--type", "F16"); code != 0 {
		t.Fatalf("convert: %s", stderr)
	}
	for _, m := range []string{out, f16} {
		if _, stderr, code := runWeft(t, "logits", "-m", m, "--tokens", "1,2,3", "--generate", "2", "--out", filepath.Join(dir, "l")); code != 0 {
			t.Errorf("%s: %s", m, stderr)
		}
	}
	if _, stderr, code := runWeft(t, "synth", "--config", cfg, "--type", "Q9_9", "-o", out); code != 2 || !strings.Contains(stderr, `unknown tensor type "Q9_9"`) {
		t.Errorf("bad type: exit %d, %s", code, stderr)
	}
}

// TestCheckWithoutGPU: weft check says why it cannot run here.
func TestCheckWithoutGPU(t *testing.T) {
	_, stderr, code := runWeft(t, "check", "-m", filepath.Join("..", "..", "testdata", "models", "llama3-tiny"))
	if code == 0 {
		t.Skip("a GPU is present")
	}
	if !strings.Contains(stderr, "no GPU to check against") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
	if _, stderr, code := runWeft(t, "check", "--exact", "-m", filepath.Join("..", "..", "testdata", "models", "llama3-tiny")); code == 0 || !strings.Contains(stderr, "no GPU to check against") {
		t.Errorf("--exact: exit %d, stderr %q", code, stderr)
	}
	for _, v := range []string{"0", "-1", "x", "+Inf"} {
		if _, stderr, code := runWeft(t, "check", "-m", "any", "--max-kl", v); code != 2 || !strings.Contains(stderr, "max-kl") {
			t.Errorf("--max-kl %s: exit %d, stderr %q", v, code, stderr)
		}
	}
}

// TestKLHint: weft check explains a KL over the bar for models with
// quantized matrices only.
func TestKLHint(t *testing.T) {
	for _, tc := range []struct {
		path  string
		quant bool
	}{
		{filepath.Join("..", "..", "testdata", "models", "llama3-tiny"), false},
		{filepath.Join("..", "..", "testdata", "models", "quant", "llama3-tiny-Q4_0.gguf"), true},
		{filepath.Join("..", "..", "testdata", "models", "quant", "llama3-tiny-mlx4"), true},
	} {
		w, err := weights.Open(tc.path, weights.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := klHint(w); (got != "") != tc.quant || (tc.quant && !strings.Contains(got, "int8")) {
			t.Errorf("%s: hint %q", tc.path, got)
		}
		w.Close()
	}
}
