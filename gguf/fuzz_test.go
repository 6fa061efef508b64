package gguf

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the header parser: it must return a
// File or an error, never panic, hang or allocate beyond the input's size.
// Seeds: the committed corpus in testdata/fuzz/FuzzParse plus, when present,
// the real files of ../shared/testdata.
func FuzzParse(f *testing.F) {
	root := filepath.Join("..", "..", "shared", "testdata")
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Ext(p) == ".gguf" {
			if b, err := os.ReadFile(p); err == nil && len(b) < 1<<20 {
				f.Add(b)
			}
		}
		return nil
	})
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := NewFile(bytes.NewReader(b), int64(len(b)), "fuzz.gguf")
		if err != nil {
			return
		}
		// Everything the parser accepted must be readable and rewritable.
		for _, kv := range file.KVs {
			_ = kv.Value.String()
			_ = kv.Value.Interface(4)
		}
		for i := range file.Tensors {
			if _, err := file.TensorData(&file.Tensors[i]); err != nil {
				t.Fatalf("accepted tensor %q unreadable: %v", file.Tensors[i].Name, err)
			}
		}
		w, err := Rewrite(file)
		if err != nil {
			t.Fatalf("rewrite: %v", err)
		}
		var out bytes.Buffer
		if _, err := w.WriteTo(&out); err != nil {
			t.Fatalf("write: %v", err)
		}
		if _, err := NewFile(bytes.NewReader(out.Bytes()), int64(out.Len()), "rewritten.gguf"); err != nil {
			t.Fatalf("rewritten file does not parse: %v", err)
		}
	})
}
