package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func sharedTestdata(t *testing.T) string {
	t.Helper()
	root := filepath.Join("..", "..", "..", "shared", "testdata")
	if _, err := os.Stat(root); err != nil {
		t.Skipf("shared test data not found at %s: %v", root, err)
	}
	return root
}

func runWeft(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	code = runMain(context.Background(), args, &o, &e)
	return o.String(), e.String(), code
}

// TestInspectEveryGGUF runs `weft inspect --json` on every .gguf under the
// shared test data, vocabulary-only files included, and checks the
// documented fields.
func TestInspectEveryGGUF(t *testing.T) {
	var paths []string
	filepath.WalkDir(sharedTestdata(t), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".gguf") {
			paths = append(paths, p)
		}
		return nil
	})
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			out, errOut, code := runWeft(t, "inspect", p, "--json")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			var rep map[string]any
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatal(err)
			}
			if rep["format"] != "gguf" || rep["architecture"] == "" || rep["metadata"] == nil || rep["tensors"] == nil {
				t.Fatalf("report lacks fields: %v", mapKeys(rep))
			}
			cfg := rep["config"].(map[string]any)
			for _, k := range []string{"n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab_size", "context_length", "rope_theta", "norm_eps", "tied_embeddings"} {
				if _, ok := cfg[k]; !ok {
					t.Errorf("config lacks %q", k)
				}
			}
			if _, err := os.Stat(p); err == nil && strings.Contains(p, "stories260K") {
				ts := rep["tensors"].([]any)
				first := ts[0].(map[string]any)
				if len(ts) != 48 || first["name"] != "token_embd.weight" || first["canonical"] != "token_embedding.weight" || first["type"] != "F32" || first["bytes"].(float64) != 131072 {
					t.Errorf("tensors: %d, first %v", len(ts), first)
				}
				if cfg["n_layers"].(float64) != 5 || rep["config_error"] != nil {
					t.Errorf("config %v, error %v", cfg, rep["config_error"])
				}
			}
		})
	}
}

func mapKeys(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func TestInspectText(t *testing.T) {
	p := filepath.Join(sharedTestdata(t), "gguf-stories260K", "stories260K.gguf")
	out, _, code := runWeft(t, "inspect", p)
	if code != 0 || !strings.Contains(out, "layers 5, dim 64, heads 8 (kv 4, head_dim 8)") || !strings.Contains(out, "blk.4.ffn_down.weight") {
		t.Fatalf("exit %d, output:\n%s", code, out)
	}
}

func TestInspectBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.gguf")
	os.WriteFile(bad, []byte("GGUF\x03\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x00"), 0o644)
	out, errOut, code := runWeft(t, "inspect", bad)
	if code != 1 || out != "" || !strings.Contains(errOut, "bad.gguf") || !strings.Contains(errOut, "tensor count") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	_, errOut, code = runWeft(t, "inspect", filepath.Join(dir, "missing.gguf"))
	if code != 1 || !strings.Contains(errOut, "no such file") {
		t.Errorf("missing file: exit %d, stderr %q", code, errOut)
	}
	_, _, code = runWeft(t, "inspect")
	if code != 2 {
		t.Errorf("no args: exit %d, want 2", code)
	}
}

// TestInspectHFDirectories covers the safetensors side: plain, sharded and
// MLX-quantized directories made for the tests.
func TestInspectHFDirectories(t *testing.T) {
	models := filepath.Join("..", "..", "testdata", "models")
	for _, tc := range []struct {
		dir, arch string
		tensors   int
		mlx       bool
	}{
		{"llama3-tiny", "llama", 30, false},
		{"llama3-tiny-sharded", "llama", 30, false},
		{"gemma3-tiny", "gemma3", 0, false},
		{"quant/llama3-tiny-mlx4", "llama", 0, true},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			out, errOut, code := runWeft(t, "inspect", "--json", filepath.Join(models, tc.dir))
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			var rep InspectReport
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatal(err)
			}
			if rep.Format != "safetensors" || rep.Architecture != tc.arch || rep.ConfigError != "" || rep.Config.NLayers == 0 {
				t.Fatalf("format %s arch %s config error %q", rep.Format, rep.Architecture, rep.ConfigError)
			}
			if tc.tensors > 0 && len(rep.Tensors) != tc.tensors {
				t.Errorf("%d tensors, want %d", len(rep.Tensors), tc.tensors)
			}
			for _, ft := range rep.Tensors {
				if ft.Canonical == "" {
					t.Errorf("tensor %q has no canonical name", ft.Name)
				}
			}
			if tc.mlx && (len(rep.MLX) == 0 || rep.Config.QuantBits != 4) {
				t.Errorf("MLX quantization not reported: %v bits %d", rep.MLX, rep.Config.QuantBits)
			}
		})
	}
}
