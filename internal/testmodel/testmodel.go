// Package testmodel finds the shared real-model test data and derives the
// fixtures several packages' tests need from it. Tests skip, with the
// reason, when the shared data is absent.
package testmodel

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/weftlm/weft/gguf"
)

// Shared returns the path of rel under the shared test data
// (../shared/testdata beside the repository), skipping t when it is absent.
func Shared(t testing.TB, rel string) string {
	t.Helper()
	_, self, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(self), "..", "..", "..", "shared", "testdata")
	p := filepath.Join(root, rel)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("shared test data %s not available: %v", rel, err)
	}
	return p
}

// Stories is the real 260K-parameter story model (GGUF, llama).
func Stories(t testing.TB) string {
	return Shared(t, "gguf-stories260K/stories260K.gguf")
}

// StoriesWithTemplate writes a copy of the story model carrying a real
// chat template (Gemma 2's, from the shared templates), so chat paths run
// end to end, and returns its path.
func StoriesWithTemplate(t testing.TB) string {
	return StoriesWithTemplateFile(t, "google-gemma-2-2b-it.jinja")
}

// StoriesWithTemplateFile is StoriesWithTemplate with the shared template
// of that file name.
func StoriesWithTemplateFile(t testing.TB, name string) string {
	t.Helper()
	tmpl, err := os.ReadFile(Shared(t, "hf-chat-templates/"+name))
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.OpenFile(Stories(t), gguf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := gguf.Rewrite(f)
	if err != nil {
		t.Fatal(err)
	}
	w.Size = 0 // the header grows; let the writer lay the data out anew
	w.SetKV("tokenizer.chat_template", gguf.String(string(tmpl)))
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "stories-chat.gguf")
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}
