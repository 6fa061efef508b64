package gguf

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/weftlm/weft/ggml"
)

// rawFile assembles a GGUF image by hand so tests can plant any fault.
type rawFile struct{ b []byte }

func (r *rawFile) u32(x uint32) *rawFile { r.b = binary.LittleEndian.AppendUint32(r.b, x); return r }
func (r *rawFile) u64(x uint64) *rawFile { r.b = binary.LittleEndian.AppendUint64(r.b, x); return r }
func (r *rawFile) str(s string) *rawFile { r.u64(uint64(len(s))); r.b = append(r.b, s...); return r }
func (r *rawFile) raw(p ...byte) *rawFile {
	r.b = append(r.b, p...)
	return r
}

func header(version uint32, nTensors, nKV uint64) *rawFile {
	r := &rawFile{b: []byte(Magic)}
	return r.u32(version).u64(nTensors).u64(nKV)
}

// tensorInfo appends a tensor info record.
func (r *rawFile) tensorInfo(name string, typ ggml.Type, offset uint64, dims ...uint64) *rawFile {
	r.str(name).u32(uint32(len(dims)))
	for _, d := range dims {
		r.u64(d)
	}
	return r.u32(uint32(typ)).u64(offset)
}

// pad appends zeros up to the next multiple of 32 and then n data bytes.
func (r *rawFile) data(n int) *rawFile {
	for len(r.b)%DefaultAlignment != 0 {
		r.b = append(r.b, 0)
	}
	r.b = append(r.b, make([]byte, n)...)
	return r
}

func parseBytes(b []byte) (*File, error) {
	return NewFile(bytes.NewReader(b), int64(len(b)), "test.gguf")
}

func TestMalformed(t *testing.T) {
	tests := []struct {
		name string
		file []byte
		want string // substring of the error
	}{
		{"empty", nil, "not a GGUF file: file is 0 bytes"},
		{"bad magic", []byte("GGML\x03\x00\x00\x00"), `not a GGUF file: magic is "GGML"`},
		{"version 1", header(1, 0, 0).b, "GGUF version 1 is not supported"},
		{"big endian", (&rawFile{b: []byte(Magic)}).raw(0, 0, 0, 3).u64(0).u64(0).b, "big-endian GGUF is not supported"},
		{"future version", header(99, 0, 0).b, "unsupported GGUF version 99"},
		{"truncated header", []byte("GGUF\x03\x00\x00\x00\x00"), "header: truncated"},
		{"kv count beyond file", header(3, 0, 1<<40).b, "metadata count 1099511627776 cannot fit"},
		{"tensor count beyond file", header(3, 1<<40, 0).b, "tensor count 1099511627776 cannot fit"},
		{"key length beyond file", header(3, 0, 1).u64(1 << 50).raw(make([]byte, 20)...).b, "metadata entry 0: string length 1125899906842624 exceeds"},
		{"string value beyond file", header(3, 0, 1).str("k").u32(uint32(TypeString)).u64(1 << 40).raw(make([]byte, 8)...).b, `key "k": string length 1099511627776 exceeds the`},
		{"array length beyond file", header(3, 0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeUint32)).u64(1 << 40).b, `key "k": array of 1099511627776 uint32 elements exceeds`},
		{"unknown value type", header(3, 0, 1).str("k").u32(13).raw(make([]byte, 8)...).b, `key "k": unknown value type 13`},
		{"unknown array element type", header(3, 0, 1).str("k").u32(uint32(TypeArray)).u32(77).u64(1).b, `key "k": array of unknown value type 77`},
		{"nesting too deep", func() []byte {
			r := header(3, 0, 1).str("k").u32(uint32(TypeArray))
			for range 10 {
				r.u32(uint32(TypeArray)).u64(1)
			}
			return r.u32(uint32(TypeUint8)).u64(0).raw(make([]byte, 32)...).b
		}(), `key "k": arrays nested deeper than 8`},
		{"duplicate key", header(3, 0, 2).str("k").u32(uint32(TypeUint8)).raw(1).str("k").u32(uint32(TypeUint8)).raw(2).b, `key "k": duplicate key`},
		{"bad alignment", header(3, 0, 1).str(KeyAlignment).u32(uint32(TypeUint32)).u32(24).b, `key "general.alignment": alignment 24 is not a power of two`},
		{"too many dims", header(3, 1, 0).tensorInfo("t", ggml.F32, 0, 1, 1, 1, 1, 1).data(4).b, `tensor "t": 5 dimensions, at most 4 allowed`},
		{"unknown tensor type", header(3, 1, 0).tensorInfo("t", ggml.Type(4), 0, 8).data(32).b, `tensor "t": unknown tensor type id 4`},
		{"dimension overflow", header(3, 1, 0).tensorInfo("t", ggml.F32, 0, 1<<32, 1<<32).data(32).b, `tensor "t": shape [4294967296 4294967296] of type F32: dimensions [4294967296 4294967296] overflow`},
		{"byte size overflow", header(3, 1, 0).tensorInfo("t", ggml.F64, 0, 1<<62).data(32).b, `tensor "t": shape [4611686018427387904] of type F64: 4611686018427387904 elements of F64 overflow`},
		{"partial block", header(3, 1, 0).tensorInfo("t", ggml.Q4_0, 0, 33).data(64).b, `tensor "t": shape [33] of type Q4_0: row length 33 is not a multiple of Q4_0's block size 32`},
		{"misaligned offset", header(3, 1, 0).tensorInfo("t", ggml.F32, 4, 4).data(64).b, `tensor "t": data offset 4 is not a multiple of the alignment 32`},
		{"data outside file", header(3, 1, 0).tensorInfo("t", ggml.F32, 0, 1024).data(16).b, `tensor "t": data [0, +4096) lies outside the file's 16 data bytes`},
		{"overlapping tensors", header(3, 2, 0).tensorInfo("a", ggml.F32, 0, 16).tensorInfo("b", ggml.F32, 32, 16).data(128).b, `tensor "b": data at 32 overlaps tensor "a" at [0, +64)`},
		{"duplicate tensor", header(3, 2, 0).tensorInfo("a", ggml.F32, 0, 8).tensorInfo("a", ggml.F32, 32, 8).data(64).b, `tensor "a": duplicate tensor name`},
		{"truncated tensor info", header(3, 1, 0).str("t").u32(2).u64(4).u64(4).b, `tensor "t": truncated`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseBytes(tt.file)
			if err == nil {
				t.Fatalf("parsed without error; want %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q\nwant it to contain %q", err, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "gguf test.gguf: ") {
				t.Fatalf("error %q does not name the file", err)
			}
		})
	}
}

// TestAllValueTypes writes every metadata type, nested arrays included, and
// reads them back.
func TestAllValueTypes(t *testing.T) {
	inner1, _ := ArrayOf(TypeInt16, []Value{Int16(-3), Int16(7)})
	inner2, _ := ArrayOf(TypeInt16, []Value{Int16(100)})
	nested, err := ArrayOf(TypeArray, []Value{inner1, inner2})
	if err != nil {
		t.Fatal(err)
	}
	boolArr, _ := ArrayOf(TypeBool, []Value{Bool(true), Bool(false)})
	kvs := []KV{
		{"u8", Uint8(200)}, {"i8", Int8(-100)}, {"u16", Uint16(60000)}, {"i16", Int16(-30000)},
		{"u32", Uint32(4000000000)}, {"i32", Int32(-2000000000)}, {"f32", Float32(1.5)}, {"bool", Bool(true)},
		{"str", String("héllo")}, {"strs", Strings([]string{"a", "", "ccc"})}, {"u64", Uint64(math.MaxUint64)},
		{"i64", Int64(math.MinInt64)}, {"f64", Float64(-2.25)}, {"nested", nested}, {"bools", boolArr},
		{"f32s", Float32s([]float32{1, 2.5})}, {"i32s", Int32s([]int32{-1, 5})},
	}
	w := NewWriter()
	for _, kv := range kvs {
		w.SetKV(kv.Key, kv.Value)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := parseBytes(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(f.KVs) != len(kvs) {
		t.Fatalf("read %d keys, wrote %d", len(f.KVs), len(kvs))
	}
	for i, kv := range kvs {
		got := f.KVs[i]
		if got.Key != kv.Key || got.Value.Type() != kv.Value.Type() || got.Value.String() != kv.Value.String() {
			t.Errorf("key %d: got %s=%s (%s), want %s=%s (%s)", i, got.Key, got.Value, got.Value.Type(), kv.Key, kv.Value, kv.Value.Type())
		}
	}
	if u, _ := GetUint(f, "u64"); u != math.MaxUint64 {
		t.Errorf("u64 = %d", u)
	}
	if i, _ := f.KVs[11].Value.Int(); i != math.MinInt64 {
		t.Errorf("i64 = %d", i)
	}
	arr, _ := GetArray(f, "nested")
	var flat []int64
	for _, e := range arr.All() {
		a, _ := e.Array()
		xs, err := a.Int64s()
		if err != nil {
			t.Fatal(err)
		}
		flat = append(flat, xs...)
	}
	if len(flat) != 3 || flat[0] != -3 || flat[1] != 7 || flat[2] != 100 {
		t.Errorf("nested array decoded as %v", flat)
	}
	ss, _ := GetArray(f, "strs")
	strs, _ := ss.Strings()
	if strings.Join(strs, ",") != "a,,ccc" || ss.At(2).String() != `"ccc"` {
		t.Errorf("string array decoded as %q", strs)
	}
}

func writeModel(t *testing.T, path string, kvs []KV, tensors map[string][]float32) {
	t.Helper()
	w := NewWriter()
	for _, kv := range kvs {
		w.SetKV(kv.Key, kv.Value)
	}
	for _, name := range sortedKeys(tensors) {
		vals := tensors[name]
		b := make([]byte, 4*len(vals))
		for i, v := range vals {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
		if err := w.AddTensor(name, ggml.F32, []uint64{uint64(len(vals))}, b); err != nil {
			t.Fatal(err)
		}
	}
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteTo(out); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func sortedKeys(m map[string][]float32) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	for i := range ks {
		for j := i + 1; j < len(ks); j++ {
			if ks[j] < ks[i] {
				ks[i], ks[j] = ks[j], ks[i]
			}
		}
	}
	return ks
}

func TestMmapAndReadPathsAgree(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.gguf")
	writeModel(t, path, []KV{{"general.architecture", String("llama")}}, map[string][]float32{"a": {1, 2, 3}, "b": {4, 5}})
	for _, noMmap := range []bool{false, true} {
		f, err := OpenFile(path, Options{NoMmap: noMmap})
		if err != nil {
			t.Fatal(err)
		}
		if f.Mapped() == noMmap {
			t.Errorf("NoMmap=%v but Mapped()=%v", noMmap, f.Mapped())
		}
		ti, _ := f.Tensor("b")
		d, err := f.TensorData(ti)
		if err != nil {
			t.Fatal(err)
		}
		if got := math.Float32frombits(binary.LittleEndian.Uint32(d[4:])); got != 5 {
			t.Errorf("NoMmap=%v: b[1] = %v, want 5", noMmap, got)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	}
}

func TestSplitModel(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "m")
	shards := []map[string][]float32{{"a": {1}, "b": {2}}, {"c": {3}}, {"d": {4, 4}}}
	for i, ts := range shards {
		kvs := []KV{{KeySplitNo, Uint16(uint16(i))}, {KeySplitCount, Uint16(3)}}
		if i == 0 {
			kvs = append([]KV{{"general.architecture", String("llama")}}, append(kvs, KV{KeySplitTensorsCount, Int32(4)})...)
		}
		writeModel(t, SplitPath(prefix, i, 3), kvs, ts)
	}
	for _, given := range []int{0, 2} {
		m, err := Open(SplitPath(prefix, given, 3), Options{})
		if err != nil {
			t.Fatalf("open via shard %d: %v", given+1, err)
		}
		if len(m.Tensors()) != 4 || len(m.Files) != 3 {
			t.Fatalf("got %d tensors in %d files", len(m.Tensors()), len(m.Files))
		}
		if a, _ := GetString(m, "general.architecture"); a != "llama" {
			t.Errorf("metadata not taken from the first shard: %q", a)
		}
		d, ok := m.Tensor("d")
		if !ok || d.File != m.Files[2] {
			t.Errorf("tensor d not found in shard 3")
		}
		m.Close()
	}

	// A tensor in two shards is rejected, naming both files.
	writeModel(t, SplitPath(prefix, 1, 3), []KV{{KeySplitNo, Uint16(1)}, {KeySplitCount, Uint16(3)}}, map[string][]float32{"a": {9}})
	_, err := Open(SplitPath(prefix, 0, 3), Options{})
	if err == nil || !strings.Contains(err.Error(), `tensor "a" is also in`) {
		t.Errorf("duplicate across shards: got %v", err)
	}
	// A missing shard is named.
	os.Remove(SplitPath(prefix, 2, 3))
	_, err = Open(SplitPath(prefix, 0, 3), Options{})
	if err == nil || !strings.Contains(err.Error(), "shard 3 of 3 is missing") {
		t.Errorf("missing shard: got %v", err)
	}
}

// countingReaderAt records every byte range read.
type countingReaderAt struct {
	f        *os.File
	bytes    atomic.Int64
	maxEnd   atomic.Int64
	numReads atomic.Int64
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	c.numReads.Add(1)
	c.bytes.Add(int64(len(p)))
	if end := off + int64(len(p)); end > c.maxEnd.Load() {
		c.maxEnd.Store(end)
	}
	return c.f.ReadAt(p, off)
}

// TestOpenReadsOnlyTheHeader opens a sparse 8 GiB file whose header is
// valid and checks that parsing touched nothing past the header (plus at
// most one read chunk of look-ahead).
func TestOpenReadsOnlyTheHeader(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.gguf")
	const tensorBytes = 1 << 30 // 8 tensors of 1 GiB F32
	var hdr bytes.Buffer
	r := header(3, 8, 1).str("general.architecture").u32(uint32(TypeString)).str("llama")
	for i := range 8 {
		r.tensorInfo("t"+string(rune('0'+i)), ggml.F32, uint64(i)*tensorBytes, tensorBytes/4)
	}
	hdr.Write(r.b)
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := out.Write(hdr.Bytes()); err != nil {
		t.Fatal(err)
	}
	dataStart := alignUp(uint64(hdr.Len()), DefaultAlignment)
	if err := out.Truncate(int64(dataStart) + 8*tensorBytes); err != nil {
		t.Skipf("cannot make a sparse 8 GiB file here: %v", err)
	}
	out.Close()
	osf, _ := os.Open(path)
	defer osf.Close()
	st, _ := osf.Stat()
	cr := &countingReaderAt{f: osf}
	f, err := NewFile(cr, st.Size(), path)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Tensors) != 8 || f.DataOffset != int64(dataStart) {
		t.Fatalf("parsed %d tensors, data at %d", len(f.Tensors), f.DataOffset)
	}
	if got, limit := cr.maxEnd.Load(), f.HeaderSize+readChunk; got > limit {
		t.Errorf("read up to byte %d; the header ends at %d (limit %d with look-ahead)", got, f.HeaderSize, limit)
	}
	if cr.bytes.Load() > f.HeaderSize+readChunk {
		t.Errorf("read %d bytes in %d reads for a %d-byte header", cr.bytes.Load(), cr.numReads.Load(), f.HeaderSize)
	}
	// The mapped path must not fault the data in either: open it for real.
	mf, err := OpenFile(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	mf.Close()
}

// TestZeroCopy: a mapped file's tensor data is a view of the map itself.
func TestZeroCopy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.gguf")
	writeModel(t, path, nil, map[string][]float32{"a": {1, 2, 3, 4}})
	f, err := OpenFile(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !f.Mapped() {
		t.Skip("mmap unavailable on this platform")
	}
	ti, _ := f.Tensor("a")
	d, _ := f.TensorData(ti)
	want := &f.mapped[f.DataOffset+int64(ti.Offset)]
	if &d[0] != want || cap(d) != len(d) {
		t.Errorf("tensor data is not a capped view of the map")
	}
}
