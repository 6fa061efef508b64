package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/weftlm/weft/modelpath"
)

// fakeModelStores writes a Hugging Face cache with one safetensors repo and
// an ollama store with one model plus one whose blob is missing, and points
// the environment at them.
func fakeModelStores(t *testing.T) (snap, blob string) {
	t.Helper()
	root := t.TempDir()
	hub := filepath.Join(root, "hf", "hub")
	models := filepath.Join(root, "ollama")
	t.Setenv("HF_HUB_CACHE", hub)
	t.Setenv("HF_HOME", "")
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("OLLAMA_MODELS", models)
	t.Setenv("HOME", filepath.Join(root, "home"))
	write := func(p string, data []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const commit = "0123456789abcdef0123456789abcdef01234567"
	repo := filepath.Join(hub, "models--org--tiny")
	write(filepath.Join(repo, "refs", "main"), []byte(commit))
	snap = filepath.Join(repo, "snapshots", commit)
	for name, data := range map[string]string{"config.json": "{}", "model.safetensors": "0123456789"} {
		write(filepath.Join(repo, "blobs", name+".blob"), []byte(data))
		if err := os.MkdirAll(snap, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..", "..", "blobs", name+".blob"), filepath.Join(snap, name)); err != nil {
			t.Fatal(err)
		}
	}
	model := []byte("GGUF\x03\x00\x00\x00rest")
	digest := "1111111111111111111111111111111111111111111111111111111111111111"
	manifest := `{"schemaVersion":2,"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:` + digest + `","size":12}]}`
	write(filepath.Join(models, "manifests", "registry.ollama.ai", "library", "tiny", "q4"), []byte(manifest))
	write(filepath.Join(models, "manifests", "registry.ollama.ai", "library", "gone", "latest"), []byte(strings.ReplaceAll(manifest, "1111", "2222")))
	blob = filepath.Join(models, "blobs", "sha256-"+digest)
	write(blob, model)
	return snap, blob
}

func TestListJSON(t *testing.T) {
	snap, blob := fakeModelStores(t)
	var stdout, stderr bytes.Buffer
	if code := runMain(context.Background(), []string{"list", "--json"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var got []modelpath.Entry
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("%v:\n%s", err, stdout.String())
	}
	want := []modelpath.Entry{
		{Name: "org/tiny", Source: "huggingface", Path: snap, Format: "safetensors", Size: 10},
		{Name: "tiny:q4", Source: "ollama", Path: blob, Format: "gguf", Size: 12},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	if !strings.Contains(stderr.String(), "left out 1 incomplete model") {
		t.Errorf("stderr does not mention the skipped model: %q", stderr.String())
	}
}

func TestListTable(t *testing.T) {
	snap, blob := fakeModelStores(t)
	out, errOut, code := runWeft(t, "list", "-v")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != "NAME SOURCE FORMAT SIZE PATH" {
		t.Fatalf("table:\n%s", out)
	}
	for i, want := range [][]string{{"org/tiny", "huggingface", "safetensors", "10 B", snap}, {"tiny:q4", "ollama", "gguf", "12 B", blob}} {
		for _, w := range want {
			if !strings.Contains(lines[i+1], w) {
				t.Errorf("row %d %q lacks %q", i+1, lines[i+1], w)
			}
		}
	}
	if !strings.Contains(errOut, "skipped ollama gone:latest") || !strings.Contains(errOut, "is missing") {
		t.Errorf("-v does not explain the skipped model: %q", errOut)
	}
}

func TestListEmptyAndUsage(t *testing.T) {
	root := t.TempDir()
	t.Setenv("HF_HUB_CACHE", filepath.Join(root, "none"))
	t.Setenv("OLLAMA_MODELS", filepath.Join(root, "none"))
	out, errOut, code := runWeft(t, "list", "--json")
	if code != 0 || strings.TrimSpace(out) != "[]" {
		t.Errorf("empty stores: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if _, _, code := runWeft(t, "list", "extra"); code != 2 {
		t.Errorf("list with an argument: exit %d, want 2", code)
	}
}
