package safetensors_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/weftlm/weft/safetensors"
)

// The seed corpora under testdata/fuzz are written by TestFuzzSeeds from
// the writer; inputs the fuzzer found that once broke the parsers sit
// beside them under other names.

// FuzzNewFile parses arbitrary bytes. Whatever parses must be consistent:
// every tensor inside the file, its data the size its shape says, and the
// file rewritten by Writer must parse back to the same tensors and metadata.
func FuzzNewFile(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		sf, err := safetensors.NewFile(bytes.NewReader(data), int64(len(data)), "fuzz")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "safetensors fuzz: ") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		w := safetensors.NewWriter()
		for k, v := range sf.Metadata() {
			w.SetMetadata(k, v)
		}
		for _, info := range sf.Tensors() {
			if info.Begin < 0 || info.Begin > info.End || sf.DataOffset+info.End > int64(len(data)) {
				t.Fatalf("%q at [%d, %d) outside the %d-byte file", info.Name, info.Begin, info.End, len(data))
			}
			if got, ok := sf.Tensor(info.Name); !ok || got.Begin != info.Begin {
				t.Fatalf("Tensor(%q) = %v, %v", info.Name, got, ok)
			}
			td, err := sf.TensorData(&info)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(td, data[sf.DataOffset+info.Begin:sf.DataOffset+info.End]) {
				t.Fatalf("%q: TensorData is not the bytes at its offsets", info.Name)
			}
			if err := w.Add(info.Name, info.DType, info.Shape, td); err != nil {
				t.Fatalf("a parsed tensor cannot be written back: %v", err)
			}
		}
		var buf bytes.Buffer
		if _, err := w.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		again, err := safetensors.NewFile(bytes.NewReader(buf.Bytes()), int64(buf.Len()), "rewritten")
		if err != nil {
			t.Fatalf("rewritten file does not parse: %v", err)
		}
		if !reflect.DeepEqual(again.Metadata(), sf.Metadata()) || len(again.Tensors()) != len(sf.Tensors()) {
			t.Fatalf("rewrite changed the metadata or tensor count")
		}
		for _, info := range sf.Tensors() {
			a, ok := again.Tensor(info.Name)
			if !ok || a.DType != info.DType || !reflect.DeepEqual(a.Shape, info.Shape) || a.Size() != info.Size() {
				t.Fatalf("%q: rewrite changed it to %+v", info.Name, a)
			}
		}
	})
}

// FuzzParseIndex parses arbitrary index JSON. Whatever parses lists only
// local .safetensors shard names.
func FuzzParseIndex(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		idx, err := safetensors.ParseIndex(data, "fuzz.json")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "safetensors fuzz.json: ") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if idx.WeightMap == nil {
			t.Fatal("parsed index without a weight map")
		}
		for name, shard := range idx.WeightMap {
			if !filepath.IsLocal(shard) || filepath.Ext(shard) != ".safetensors" {
				t.Fatalf("tensor %q: shard %q accepted", name, shard)
			}
		}
	})
}

// fuzzSeeds returns the named seed inputs of each fuzz target.
func fuzzSeeds(t *testing.T) map[string]map[string][]byte {
	newFile := map[string][]byte{
		"writer-every-dtype": write(t, map[string]string{"format": "pt"}, goldenAllDTypes()),
		"writer-empty":       write(t, nil, nil),
		"writer-scalar-and-empty": write(t, map[string]string{"k": "v"}, []testTensor{
			{"s", safetensors.F64, []int64{}, pattern(8, 1)},
			{"e", safetensors.U8, []int64{0}, nil},
			{"z", safetensors.F8_E5M2, []int64{1, 1, 1, 1, 3}, pattern(3, 2)},
		}),
		"writer-one-tensor": write(t, nil, []testTensor{{"w", safetensors.BF16, []int64{4, 2}, pattern(16, 3)}}),
	}
	index := func(meta map[string]any, wm map[string]string) []byte {
		b, err := json.Marshal(map[string]any{"metadata": meta, "weight_map": wm})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	parseIndex := map[string][]byte{
		"two-shards": index(map[string]any{"total_size": 13504}, map[string]string{
			"a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"}),
		"subfolder": index(nil, map[string]string{"x": "sub/x.safetensors"}),
		"empty":     index(map[string]any{}, map[string]string{}),
	}
	return map[string]map[string][]byte{"FuzzNewFile": newFile, "FuzzParseIndex": parseIndex}
}

// TestFuzzSeeds checks that the committed seed corpora match the writer's
// current output (or rewrites them with -update).
func TestFuzzSeeds(t *testing.T) {
	for target, seeds := range fuzzSeeds(t) {
		for name, data := range seeds {
			path := filepath.Join("testdata", "fuzz", target, name)
			content := []byte(fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", data))
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, content, 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			got, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(got, content) {
				t.Errorf("seed %s is missing or stale (run go test -run TestFuzzSeeds -update): %v", path, err)
			}
		}
	}
}
