package safetensors_test

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/weftlm/weft/safetensors"
)

// pattern returns n deterministic bytes that differ per seed.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

// testTensor is one tensor for a writer, with its expected bytes.
type testTensor struct {
	name  string
	dtype safetensors.DType
	shape []int64
	data  []byte
}

// everyDType returns one tensor per supported dtype plus a scalar and an
// empty tensor.
func everyDType() []testTensor {
	var ts []testTensor
	for i, dt := range safetensors.DTypes() {
		data := pattern(6*dt.Size(), byte(i))
		if dt == safetensors.BOOL {
			data = []byte{0, 1, 1, 0, 0, 1} // only 0 and 1 are booleans to torch
		}
		ts = append(ts, testTensor{"t." + strings.ToLower(string(dt)), dt, []int64{2, 3}, data})
	}
	ts = append(ts,
		testTensor{"scalar", safetensors.F32, []int64{}, pattern(4, 99)},
		testTensor{"empty", safetensors.BF16, []int64{4, 0, 2}, []byte{}},
	)
	return ts
}

func write(t testing.TB, meta map[string]string, ts []testTensor) []byte {
	t.Helper()
	w := safetensors.NewWriter()
	for k, v := range meta {
		w.SetMetadata(k, v)
	}
	for _, tt := range ts {
		if err := w.Add(tt.name, tt.dtype, tt.shape, tt.data); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	n, err := w.WriteTo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Fatalf("WriteTo reported %d bytes, wrote %d", n, buf.Len())
	}
	return buf.Bytes()
}

// checkFile asserts that f holds exactly ts (in any order) and meta.
func checkFile(t *testing.T, f *safetensors.File, meta map[string]string, ts []testTensor) {
	t.Helper()
	if len(f.Tensors()) != len(ts) {
		t.Fatalf("%d tensors, want %d", len(f.Tensors()), len(ts))
	}
	for _, want := range ts {
		info, ok := f.Tensor(want.name)
		if !ok {
			t.Fatalf("tensor %q missing", want.name)
		}
		if info.DType != want.dtype || !reflect.DeepEqual(info.Shape, want.shape) {
			t.Errorf("%s: got %s %v, want %s %v", want.name, info.DType, info.Shape, want.dtype, want.shape)
		}
		data, err := f.TensorData(info)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(data, want.data) {
			t.Errorf("%s: data differs", want.name)
		}
		dst := make([]byte, len(want.data))
		if err := f.ReadTensor(info, dst); err != nil || !bytes.Equal(dst, want.data) {
			t.Errorf("%s: ReadTensor: %v, equal=%v", want.name, err, bytes.Equal(dst, want.data))
		}
	}
	if len(meta) == 0 && len(f.Metadata()) == 0 {
		return
	}
	if !reflect.DeepEqual(f.Metadata(), meta) {
		t.Errorf("metadata %v, want %v", f.Metadata(), meta)
	}
}

func TestRoundTripEveryDType(t *testing.T) {
	meta := map[string]string{"format": "pt", "note": `quotes " and <tags> & ünïcode`}
	ts := everyDType()
	raw := write(t, meta, ts)

	n := binary.LittleEndian.Uint64(raw)
	if (8+n)%8 != 0 {
		t.Errorf("data starts at %d, not a multiple of 8", 8+n)
	}
	if !strings.HasPrefix(string(raw[8:]), `{"__metadata__":{"format":"pt","note":"quotes \" and <tags> & ünïcode"},"empty":`) {
		t.Errorf("header starts %q", raw[8:min(len(raw), 120)])
	}

	path := filepath.Join(t.TempDir(), "all.safetensors")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		open func() (*safetensors.File, error)
	}{
		{"NewFile", func() (*safetensors.File, error) {
			return safetensors.NewFile(bytes.NewReader(raw), int64(len(raw)), "all.safetensors")
		}},
		{"OpenFile mmap", func() (*safetensors.File, error) { return safetensors.OpenFile(path, safetensors.Options{}) }},
		{"OpenFile NoMmap", func() (*safetensors.File, error) {
			return safetensors.OpenFile(path, safetensors.Options{NoMmap: true})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := tc.open()
			if err != nil {
				t.Fatal(err)
			}
			checkFile(t, f, meta, ts)
			if f.DataOffset != int64(8+n) || f.Size != int64(len(raw)) {
				t.Errorf("DataOffset %d Size %d", f.DataOffset, f.Size)
			}
			// Tensors come back in data order, which is the order added.
			for i, info := range f.Tensors() {
				if info.Name != ts[i].name {
					t.Errorf("tensor %d is %q, want %q", i, info.Name, ts[i].name)
				}
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			info := f.Tensors()[0]
			if _, err := f.TensorData(&info); err == nil || !strings.Contains(err.Error(), "closed") {
				t.Errorf("TensorData after Close: %v", err)
			}
		})
	}
}

func TestDTypeSizes(t *testing.T) {
	want := map[safetensors.DType]int{
		"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
		"U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
		"F4": 0, "f32": 0, "": 0,
	}
	for dt, size := range want {
		if dt.Size() != size || dt.Valid() != (size > 0) {
			t.Errorf("%q: Size %d Valid %v, want %d", dt, dt.Size(), dt.Valid(), size)
		}
	}
	if len(safetensors.DTypes()) != 15 {
		t.Errorf("DTypes lists %d types", len(safetensors.DTypes()))
	}
}

func TestWriterRejects(t *testing.T) {
	for _, tc := range []struct {
		name, tensor string
		dtype        safetensors.DType
		shape        []int64
		data         []byte
		want         string
	}{
		{"reserved name", "__metadata__", safetensors.U8, []int64{1}, []byte{0}, "reserved"},
		{"bad utf8", "a\xff", safetensors.U8, []int64{1}, []byte{0}, "UTF-8"},
		{"duplicate", "x", safetensors.U8, []int64{1}, []byte{0}, "added twice"},
		{"unknown dtype", "y", "F4", []int64{1}, []byte{0}, `unknown dtype "F4"`},
		{"negative dim", "y", safetensors.U8, []int64{2, -1}, nil, "negative"},
		{"overflow", "y", safetensors.F64, []int64{1 << 31, 1 << 31}, nil, "overflows"},
		{"wrong length", "y", safetensors.F32, []int64{3}, make([]byte, 8), "8 bytes of data, shape [3] of F32 needs 12"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := safetensors.NewWriter()
			if err := w.Add("x", safetensors.U8, []int64{1}, []byte{1}); err != nil {
				t.Fatal(err)
			}
			err := w.Add(tc.tensor, tc.dtype, tc.shape, tc.data)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
	w := safetensors.NewWriter()
	w.SetMetadata("k", "bad \xff")
	if _, err := w.WriteTo(&bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), `metadata "k"`) {
		t.Errorf("invalid UTF-8 metadata: %v", err)
	}
}

func TestWriteFile(t *testing.T) {
	ts := everyDType()[:2]
	w := safetensors.NewWriter()
	for _, tt := range ts {
		if err := w.Add(tt.name, tt.dtype, tt.shape, tt.data); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "w.safetensors")
	if err := safetensors.WriteFile(path, w); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.OpenFile(path, safetensors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	checkFile(t, f, nil, ts)
	if err := safetensors.WriteFile(filepath.Join(path, "sub"), w); err == nil {
		t.Error("WriteFile under a regular file succeeded")
	}
}
