package safetensors_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/weftlm/weft/safetensors"
)

// pyTensor is one entry of a sidecar written by make_fixtures.py.
type pyTensor struct {
	File   string            `json:"file"`
	DType  safetensors.DType `json:"dtype"`
	Shape  []int64           `json:"shape"`
	Hex    string            `json:"hex"`
	SHA256 string            `json:"sha256"`
}

func readSidecar(t *testing.T, path string) map[string]pyTensor {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var side map[string]pyTensor
	if err := json.Unmarshal(b, &side); err != nil {
		t.Fatal(err)
	}
	return side
}

// checkAgainstPython compares one tensor with what torch saw.
func checkAgainstPython(t *testing.T, name string, info *safetensors.TensorInfo, data []byte, want pyTensor) {
	t.Helper()
	if info.DType != want.DType || !reflect.DeepEqual(info.Shape, want.Shape) {
		t.Errorf("%s: %s %v, torch saw %s %v", name, info.DType, info.Shape, want.DType, want.Shape)
	}
	if want.Hex != "" {
		wantBytes, _ := hex.DecodeString(want.Hex)
		if !bytes.Equal(data, wantBytes) {
			t.Errorf("%s: bytes %x, torch saw %s", name, data, want.Hex)
		}
	}
	if want.SHA256 != "" {
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != want.SHA256 {
			t.Errorf("%s: sha256 differs from torch's", name)
		}
	}
}

// TestPythonSaveFile reads a file written by safetensors.torch.save_file.
func TestPythonSaveFile(t *testing.T) {
	dir := filepath.Join("testdata", "python")
	side := readSidecar(t, filepath.Join(dir, "alldtypes.json"))
	f, err := safetensors.OpenFile(filepath.Join(dir, "alldtypes.safetensors"), safetensors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if want := map[string]string{"format": "pt", "writer": "safetensors.torch.save_file"}; !reflect.DeepEqual(f.Metadata(), want) {
		t.Errorf("metadata %v", f.Metadata())
	}
	if len(f.Tensors()) != len(side) {
		t.Fatalf("%d tensors, torch saved %d", len(f.Tensors()), len(side))
	}
	seen := map[safetensors.DType]bool{}
	for name, want := range side {
		info, ok := f.Tensor(name)
		if !ok {
			t.Fatalf("%s missing", name)
		}
		data, err := f.TensorData(info)
		if err != nil {
			t.Fatal(err)
		}
		checkAgainstPython(t, name, info, data, want)
		seen[info.DType] = true
	}
	for _, dt := range safetensors.DTypes() {
		if !seen[dt] {
			t.Errorf("fixture has no %s tensor", dt)
		}
	}
}

// TestPythonSavePretrained opens a sharded checkpoint written by
// transformers' save_pretrained.
func TestPythonSavePretrained(t *testing.T) {
	dir := filepath.Join("testdata", "python", "tinyllama")
	side := readSidecar(t, filepath.Join("testdata", "python", "tinyllama.json"))
	m, err := safetensors.Open(dir, safetensors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if len(m.Files) != 3 || len(m.Tensors()) != len(side) {
		t.Fatalf("%d files, %d tensors; torch saved %d tensors", len(m.Files), len(m.Tensors()), len(side))
	}
	if m.Index.Metadata["total_size"] != json.Number("13504") {
		t.Errorf("index metadata %v", m.Index.Metadata)
	}
	for name, want := range side {
		tensor, ok := m.Tensor(name)
		if !ok {
			t.Fatalf("%s missing", name)
		}
		if filepath.Base(tensor.File.Name) != want.File {
			t.Errorf("%s is in %s, torch read it from %s", name, tensor.File.Name, want.File)
		}
		data, err := tensor.Data()
		if err != nil {
			t.Fatal(err)
		}
		checkAgainstPython(t, name, tensor.TensorInfo, data, want)
	}
	for _, f := range m.Files {
		if f.Metadata()["format"] != "pt" {
			t.Errorf("%s: metadata %v", f.Name, f.Metadata())
		}
	}
}
