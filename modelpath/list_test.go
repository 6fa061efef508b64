package modelpath

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestScan(t *testing.T) {
	tr := newTree(t)
	// A snapshot with both kinds of weights, and one whose quant tags clash.
	both := tr.hfSnapshot("org/both", commit("both"), []string{"main"}, map[string]string{
		"config.json": "{}", "model.safetensors": "st", "both-F16.gguf": "GGUF-f16",
	})
	dup := tr.hfSnapshot("org/dup-GGUF", commit("dup"), []string{"main"}, map[string]string{
		"a/x-Q4_0.gguf": "GGUF-a", "b/y-Q4_0.gguf": "GGUF-bb",
	})
	// Incomplete things, which Scan reports as skipped.
	os.Remove(tr.ollamaModel("registry.ollama.ai/library/broken/latest", ggufBytes("broken")))
	tr.ollamaRaw("registry.ollama.ai/library/cloud/latest", []byte(`{"layers":[]}`))
	os.MkdirAll(tr.hfRepoDir("org/empty"), 0o755)
	tr.hfRemoveBlob(filepath.Join(tr.hfSnapshot("org/partial-GGUF", commit("p"), []string{"main"}, map[string]string{"p-Q4_0.gguf": "GGUF-p"}), "p-Q4_0.gguf"))
	// Not models: ignored without a word.
	os.MkdirAll(filepath.Join(tr.hf, "datasets--org--data"), 0o755)
	tr.write(filepath.Join(tr.ol, "manifests", "stray-file"), []byte("x"))

	l, err := tr.stores().Scan()
	if err != nil {
		t.Fatal(err)
	}
	hf, ol := SourceHuggingFace, SourceOllama
	want := []Entry{
		{"Qwen/Qwen2.5-0.5B-Instruct", hf, tr.qwenMain, FormatSafetensors, 12},
		{"Qwen/Qwen2.5-0.5B-Instruct@refs/pr/3", hf, tr.qwenPR, FormatSafetensors, 10},
		{"Qwen/Qwen2.5-0.5B-Instruct@v1", hf, tr.qwenV1, FormatSafetensors, 11},
		{"TheBloke/tiny-GGUF", hf, tr.tiny, FormatGGUF, 9},
		{"bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M", hf, tr.bartQ4, FormatGGUF, 7},
		{"bartowski/Llama-3.2-1B-Instruct-GGUF:Q8_0", hf, tr.bartQ8, FormatGGUF, 9},
		{"gpt2", hf, tr.gpt2, FormatSafetensors, 18},
		{"org/both", hf, both, FormatSafetensors, 2},
		{"org/both:F16", hf, filepath.Join(both, "both-F16.gguf"), FormatGGUF, 8},
		{"org/dup-GGUF:a/x-Q4_0.gguf", hf, filepath.Join(dup, "a", "x-Q4_0.gguf"), FormatGGUF, 6},
		{"org/dup-GGUF:b/y-Q4_0.gguf", hf, filepath.Join(dup, "b", "y-Q4_0.gguf"), FormatGGUF, 7},
		{"org/split-GGUF:Q4_K_M", hf, tr.splitQ4, FormatGGUF, 15},
		{"org/split-GGUF:Q8_0", hf, tr.splitQ8, FormatGGUF, 7},
		{"hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M", ol, tr.hfco, FormatGGUF, 12},
		{"llama3.2:1b", ol, tr.llama1b, FormatGGUF, 10},
		{"llama3.2:latest", ol, tr.llamaLatest, FormatGGUF, 14},
		{"myuser/mymodel:latest", ol, tr.mine, FormatGGUF, 12},
		// The short name Qwen/Qwen2.5-0.5B-Instruct:latest would reach the HF repo.
		{"registry.ollama.ai/Qwen/Qwen2.5-0.5B-Instruct:latest", ol, tr.qol, FormatGGUF, 19},
	}
	if !reflect.DeepEqual(l.Entries, want) {
		t.Errorf("entries:\n%s\nwant:\n%s", entriesText(l.Entries), entriesText(want))
	}
	wantSkipped := map[string]string{
		"org/empty":        "no refs and no snapshots",
		"org/partial-GGUF": "missing p-Q4_0.gguf",
		"broken:latest":    "is missing",
		"cloud:latest":     "no layer of mediaType",
	}
	gotSkipped := map[string]string{}
	for _, s := range l.Skipped {
		gotSkipped[s.Name] = s.Reason
	}
	if len(gotSkipped) != len(wantSkipped) {
		t.Errorf("skipped %v, want the keys of %v", gotSkipped, wantSkipped)
	}
	for name, reason := range wantSkipped {
		if !strings.Contains(gotSkipped[name], reason) {
			t.Errorf("skipped %s: reason %q, want it to contain %q", name, gotSkipped[name], reason)
		}
	}
	// Every listed name resolves to the listed path.
	for _, e := range l.Entries {
		p, err := Resolve(e.Name)
		if err != nil || p != e.Path {
			t.Errorf("Resolve(%q) = %q, %v; listed as %s", e.Name, p, err, e.Path)
		}
	}
	entries, err := List()
	if err != nil || !reflect.DeepEqual(entries, want) {
		t.Errorf("List() = %d entries, %v; want the %d of Scan", len(entries), err, len(want))
	}
}

func entriesText(es []Entry) string {
	var b strings.Builder
	for _, e := range es {
		b.WriteString("  " + e.Name + " " + e.Source + " " + e.Format + " " + e.Path + "\n")
	}
	return b.String()
}

// TestScanEmpty: stores that do not exist hold nothing and are no error.
func TestScanEmpty(t *testing.T) {
	root := t.TempDir()
	l, err := Stores{HuggingFace: filepath.Join(root, "no-hf"), Ollama: filepath.Join(root, "no-ollama")}.Scan()
	if err != nil || len(l.Entries) != 0 || len(l.Skipped) != 0 {
		t.Fatalf("got %+v, %v", l, err)
	}
	l, err = Stores{}.Scan()
	if err != nil || len(l.Entries) != 0 {
		t.Fatalf("unconfigured stores: got %+v, %v", l, err)
	}
}

// TestScanUnreadableRoot: a root that exists but is not a folder is an
// error naming it.
func TestScanUnreadableRoot(t *testing.T) {
	root := t.TempDir()
	hf := filepath.Join(root, "hub")
	if err := os.WriteFile(hf, []byte("not a folder"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Stores{HuggingFace: hf}.Scan()
	if err == nil || !strings.Contains(err.Error(), "huggingface cache "+hf) {
		t.Fatalf("got %v", err)
	}
}
