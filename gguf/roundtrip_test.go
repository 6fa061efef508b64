package gguf_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/weftlm/weft/gguf"
)

// sharedGGUFs returns every .gguf file under ../shared/testdata, skipping
// the test when the folder is absent.
func sharedGGUFs(t testing.TB) []string {
	t.Helper()
	root := filepath.Join("..", "..", "shared", "testdata")
	if _, err := os.Stat(root); err != nil {
		t.Skipf("shared test data not found at %s: %v", root, err)
	}
	var out []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Ext(p) == ".gguf" {
			out = append(out, p)
		}
		return nil
	})
	if len(out) == 0 {
		t.Skipf("no .gguf files under %s", root)
	}
	return out
}

func TestRoundTripSharedFiles(t *testing.T) {
	for _, path := range sharedGGUFs(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			orig, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			f, err := gguf.OpenFile(path, gguf.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			w, err := gguf.Rewrite(f)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if _, err := w.WriteTo(&buf); err != nil {
				t.Fatal(err)
			}
			got := buf.Bytes()
			if !bytes.Equal(got, orig) {
				i := 0
				for i < len(got) && i < len(orig) && got[i] == orig[i] {
					i++
				}
				t.Fatalf("rewrite differs from the original at byte %d (sizes %d vs %d)", i, len(got), len(orig))
			}
		})
	}
}
