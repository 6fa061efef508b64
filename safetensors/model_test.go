package safetensors_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weftlm/weft/safetensors"
)

// writeShard writes a file in dir holding one U8 [1] tensor per name, whose
// byte is the name's first letter.
func writeShard(t *testing.T, dir, file string, names ...string) {
	t.Helper()
	w := safetensors.NewWriter()
	w.SetMetadata("format", "pt")
	for _, n := range names {
		if err := w.Add(n, safetensors.U8, []int64{1}, []byte{n[0]}); err != nil {
			t.Fatal(err)
		}
	}
	if err := safetensors.WriteFile(filepath.Join(dir, file), w); err != nil {
		t.Fatal(err)
	}
}

func writeIndex(t *testing.T, dir string, weightMap map[string]string) {
	t.Helper()
	b, err := json.MarshalIndent(map[string]any{
		"metadata":   map[string]any{"total_size": 3},
		"weight_map": weightMap,
	}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, safetensors.IndexFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestOpenIndexedDirectory(t *testing.T) {
	dir := t.TempDir()
	writeShard(t, dir, "model-00001-of-00002.safetensors", "a.weight", "b.weight")
	writeShard(t, dir, "model-00002-of-00002.safetensors", "c.weight")
	writeShard(t, dir, "consolidated.safetensors", "a.weight", "b.weight", "c.weight") // not in the index: ignored
	writeIndex(t, dir, map[string]string{
		"a.weight": "model-00001-of-00002.safetensors",
		"b.weight": "model-00001-of-00002.safetensors",
		"c.weight": "model-00002-of-00002.safetensors",
	})
	for _, path := range []string{dir, filepath.Join(dir, safetensors.IndexFile)} {
		m, err := safetensors.Open(path, safetensors.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Files) != 2 || len(m.Tensors()) != 3 {
			t.Fatalf("%d files, %d tensors", len(m.Files), len(m.Tensors()))
		}
		if m.Index == nil || m.Index.Metadata["total_size"] != json.Number("3") {
			t.Errorf("index metadata %v", m.Index)
		}
		for _, name := range []string{"a.weight", "b.weight", "c.weight"} {
			tensor, ok := m.Tensor(name)
			if !ok {
				t.Fatalf("%s missing", name)
			}
			data, err := tensor.Data()
			if err != nil || len(data) != 1 || data[0] != name[0] {
				t.Errorf("%s: %v %v", name, data, err)
			}
			if want := filepath.Join(dir, m.Index.WeightMap[name]); tensor.File.Name != want {
				t.Errorf("%s is in %s, want %s", name, tensor.File.Name, want)
			}
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOpenPlainDirectoryAndFile(t *testing.T) {
	dir := t.TempDir()
	writeShard(t, dir, "b.safetensors", "y")
	writeShard(t, dir, "a.safetensors", "x", "z")
	os.WriteFile(filepath.Join(dir, "README.md"), []byte("not a shard"), 0o644)
	m, err := safetensors.Open(dir, safetensors.Options{NoMmap: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var names []string
	for _, tensor := range m.Tensors() {
		names = append(names, filepath.Base(tensor.File.Name)+":"+tensor.Name)
	}
	if got := strings.Join(names, " "); got != "a.safetensors:x a.safetensors:z b.safetensors:y" {
		t.Errorf("tensors %s", got)
	}
	if m.Index != nil {
		t.Error("a directory without an index has an Index")
	}

	one, err := safetensors.Open(filepath.Join(dir, "b.safetensors"), safetensors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	if len(one.Files) != 1 || len(one.Tensors()) != 1 {
		t.Errorf("single file: %d files, %d tensors", len(one.Files), len(one.Tensors()))
	}
}

func TestOpenBadDirectories(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  string
	}{
		{"empty directory", func(t *testing.T, dir string) {}, "no model.safetensors.index.json and no .safetensors files"},
		{"missing shard", func(t *testing.T, dir string) {
			writeShard(t, dir, "s1.safetensors", "a")
			writeIndex(t, dir, map[string]string{"a": "s1.safetensors", "b": "s2.safetensors"})
		}, "model.safetensors.index.json: a shard it lists is missing: safetensors "},
		{"tensor missing from its shard", func(t *testing.T, dir string) {
			writeShard(t, dir, "s1.safetensors", "a")
			writeIndex(t, dir, map[string]string{"a": "s1.safetensors", "ghost": "s1.safetensors"})
		}, `model.safetensors.index.json: tensor "ghost": listed in shard s1.safetensors, which does not hold it`},
		{"tensor in the wrong shard", func(t *testing.T, dir string) {
			writeShard(t, dir, "s1.safetensors", "a", "b")
			writeShard(t, dir, "s2.safetensors", "c")
			writeIndex(t, dir, map[string]string{"a": "s1.safetensors", "b": "s2.safetensors", "c": "s2.safetensors"})
		}, `tensor "b": listed in shard s2.safetensors but stored in `},
		{"shard tensor not in the index", func(t *testing.T, dir string) {
			writeShard(t, dir, "s1.safetensors", "a", "extra")
			writeIndex(t, dir, map[string]string{"a": "s1.safetensors"})
		}, `s1.safetensors: tensor "extra" is not in the weight_map of `},
		{"parent path", func(t *testing.T, dir string) {
			writeIndex(t, dir, map[string]string{"a": "../outside.safetensors"})
		}, `weight_map: tensor "a": shard "../outside.safetensors" is not a .safetensors file inside the model's directory`},
		{"climbing path", func(t *testing.T, dir string) {
			writeIndex(t, dir, map[string]string{"a": "sub/../../outside.safetensors"})
		}, `shard "sub/../../outside.safetensors" is not a .safetensors file inside`},
		{"absolute path", func(t *testing.T, dir string) {
			writeIndex(t, dir, map[string]string{"a": "/etc/x.safetensors"})
		}, `shard "/etc/x.safetensors" is not a .safetensors file inside`},
		{"not a safetensors shard", func(t *testing.T, dir string) {
			writeIndex(t, dir, map[string]string{"a": "pytorch_model.bin"})
		}, `shard "pytorch_model.bin" is not a .safetensors file`},
		{"duplicate across files", func(t *testing.T, dir string) {
			writeShard(t, dir, "a.safetensors", "x", "y")
			writeShard(t, dir, "b.safetensors", "y")
		}, `b.safetensors: tensor "y" is also in `},
		{"duplicate across indexed shards", func(t *testing.T, dir string) {
			writeShard(t, dir, "s1.safetensors", "x", "y")
			writeShard(t, dir, "s2.safetensors", "y")
			writeIndex(t, dir, map[string]string{"x": "s1.safetensors", "y": "s2.safetensors"})
		}, `s2.safetensors: tensor "y" is also in `},
		{"duplicate weight_map key", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, safetensors.IndexFile),
				[]byte(`{"weight_map":{"a":"s1.safetensors","a":"s2.safetensors"}}`), 0o644)
		}, `weight_map: tensor "a" appears twice`},
		{"index without weight_map", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, safetensors.IndexFile), []byte(`{"metadata":{}}`), 0o644)
		}, `index: missing "weight_map"`},
		{"empty weight_map", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, safetensors.IndexFile), []byte(`{"weight_map":{}}`), 0o644)
		}, `weight_map: lists no tensors`},
		{"index not JSON", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, safetensors.IndexFile), []byte(`{"weight_map":`), 0o644)
		}, `weight_map: not valid JSON`},
		{"bad shard", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "bad.safetensors"), []byte("nonsense"), 0o644)
		}, `bad.safetensors: header: header length`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setup(t, dir)
			m, err := safetensors.Open(dir, safetensors.Options{})
			if err == nil {
				m.Close()
				t.Fatalf("no error, want %q", tc.want)
			}
			if !strings.HasPrefix(err.Error(), "safetensors "+dir) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to name a file in the directory and contain %q", err, tc.want)
			}
			if tc.name == "missing shard" && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("missing shard error does not wrap os.ErrNotExist")
			}
		})
	}
	if _, err := safetensors.Open(filepath.Join(t.TempDir(), "nope"), safetensors.Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing path: %v", err)
	}
}
