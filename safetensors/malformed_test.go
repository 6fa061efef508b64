package safetensors_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"strings"
	"testing"

	"github.com/weftlm/weft/safetensors"
)

// rawFile builds a file from a header exactly as given and dataLen zero
// bytes of data.
func rawFile(header string, dataLen int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, make([]byte, dataLen)...)
}

// lengthOnly is a ReaderAt for a file that declares a header length and
// reads as zeros everywhere else.
type lengthOnly struct{ n uint64 }

func (l lengthOnly) ReadAt(p []byte, off int64) (int, error) {
	clear(p)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], l.n)
	if off < 8 {
		copy(p, b[off:])
	}
	return len(p), nil
}

func TestMalformed(t *testing.T) {
	const f32x2 = `"dtype":"F32","shape":[2]`
	for _, tc := range []struct {
		name string
		file []byte
		want string
	}{
		{"too short", []byte{1, 0, 0}, "header: file is 3 bytes, too short"},
		{"length past file", rawFile("{}", 0)[:9], "header: header length 2 exceeds the 1 bytes after the length field"},
		{"not JSON", rawFile(`{"a":`, 0), `tensor "a": entry: not valid JSON: unexpected end`},
		{"syntax error", rawFile(`{"a" 1}`, 0), `tensor "a": entry: not valid JSON: invalid character '1'`},
		{"bad key", rawFile(`{1:2}`, 0), `header: not valid JSON: invalid character '1'`},
		{"not an object", rawFile(`[1,2]`, 0), "header: is an array, want an object"},
		{"empty header", rawFile(``, 0), "header: not valid JSON: unexpected end"},
		{"trailing data", rawFile(`{} {}`, 0), "header: an object follows the top-level object"},
		{"invalid UTF-8", rawFile("{\"\xff\":1}", 0), "header: JSON is not valid UTF-8"},
		{"entry not an object", rawFile(`{"w":[1]}`, 0), `tensor "w": entry is an array, want an object`},
		{"missing dtype", rawFile(`{"w":{"shape":[2],"data_offsets":[0,8]}}`, 8), `tensor "w": missing "dtype"`},
		{"missing shape", rawFile(`{"w":{"dtype":"F32","data_offsets":[0,8]}}`, 8), `tensor "w": missing "shape"`},
		{"missing data_offsets", rawFile(`{"w":{`+f32x2+`}}`, 8), `tensor "w": missing "data_offsets"`},
		{"dtype not a string", rawFile(`{"w":{"dtype":4,"shape":[2],"data_offsets":[0,8]}}`, 8), `tensor "w": dtype is a number, want a string`},
		{"unknown dtype", rawFile(`{"w":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}`, 1), `tensor "w": unknown dtype "F4"`},
		{"negative dim", rawFile(`{"w":{"dtype":"F32","shape":[2,-3],"data_offsets":[0,8]}}`, 8), `tensor "w": shape element 1 is -3, negative`},
		{"fractional dim", rawFile(`{"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}}`, 8), `tensor "w": shape element 0 is 2.5, not an integer`},
		{"huge dim", rawFile(`{"w":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8]}}`, 8), `tensor "w": shape element 0 is 99999999999999999999, not an integer that fits in int64`},
		{"shape not array", rawFile(`{"w":{"dtype":"F32","shape":{},"data_offsets":[0,8]}}`, 8), `tensor "w": shape is an object, want an array of integers`},
		{"nested shape", rawFile(`{"w":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}}`, 8), `tensor "w": shape element 0 is an array, want an integer`},
		{"shape overflow", rawFile(`{"w":{"dtype":"F32","shape":[4611686018427387904,2],"data_offsets":[0,8]}}`, 8), `tensor "w": shape [4611686018427387904 2] of F32: byte size overflows int64`},
		{"shape bytes mismatch", rawFile(`{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 8), `tensor "w": shape [3] of F32 needs 12 bytes but data_offsets [0, 8] hold 8`},
		{"begin after end", rawFile(`{"w":{`+f32x2+`,"data_offsets":[16,8]}}`, 16), `tensor "w": data_offsets [16, 8]: begin is after end`},
		{"one offset", rawFile(`{"w":{`+f32x2+`,"data_offsets":[8]}}`, 16), `tensor "w": data_offsets has 1 elements, want [begin, end]`},
		{"negative offset", rawFile(`{"w":{`+f32x2+`,"data_offsets":[-8,0]}}`, 16), `tensor "w": data_offsets element 0 is -8, negative`},
		{"outside the file", rawFile(`{"w":{`+f32x2+`,"data_offsets":[4,12]}}`, 8), `tensor "w": data [4, 12) lies outside the file's 8 data bytes`},
		{"overlap", rawFile(`{"a":{`+f32x2+`,"data_offsets":[0,8]},"b":{`+f32x2+`,"data_offsets":[4,12]}}`, 12), `tensor "b": data [4, 12) overlaps tensor "a" at [0, 8)`},
		{"overlap past an empty tensor", rawFile(`{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"e":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}}`, 8), `tensor "b": data [6, 8) overlaps tensor "a" at [0, 8)`},
		{"duplicate tensor", rawFile(`{"w":{`+f32x2+`,"data_offsets":[0,8]},"w":{`+f32x2+`,"data_offsets":[8,16]}}`, 16), `tensor "w": appears twice in the same object`},
		{"duplicate field", rawFile(`{"w":{`+f32x2+`,"data_offsets":[0,8],"dtype":"I32"}}`, 8), `tensor "w": field "dtype" appears twice`},
		{"duplicate metadata entry", rawFile(`{"__metadata__":{},"__metadata__":{}}`, 0), `__metadata__: appears twice`},
		{"duplicate metadata key", rawFile(`{"__metadata__":{"k":"a","k":"b"}}`, 0), `__metadata__ key "k": appears twice`},
		{"metadata value not a string", rawFile(`{"__metadata__":{"total":12}}`, 0), `__metadata__ key "total": value is a number, want a string`},
		{"metadata not an object", rawFile(`{"__metadata__":"pt"}`, 0), `__metadata__: is a string, want an object of strings`},
		{"bad unknown field", rawFile(`{"w":{`+f32x2+`,"data_offsets":[0,8],"x":[}}`, 8), `tensor "w": field "x": not valid JSON`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := safetensors.NewFile(bytes.NewReader(tc.file), int64(len(tc.file)), "bad.safetensors")
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			if !strings.HasPrefix(err.Error(), "safetensors bad.safetensors: ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to name the file and contain %q", err, tc.want)
			}
		})
	}
}

// TestHeaderLimit declares a 200 MiB header in a 1 GiB file: it must be
// refused before the header is allocated or read.
func TestHeaderLimit(t *testing.T) {
	_, err := safetensors.NewFile(lengthOnly{200 << 20}, 1<<30, "big.safetensors")
	if err == nil || !strings.Contains(err.Error(), "header length 209715200 exceeds the limit of 104857600 bytes") {
		t.Fatalf("error %v", err)
	}
}

// TestShortRead reports a reader that returns fewer bytes than the size
// promised.
func TestShortRead(t *testing.T) {
	raw := rawFile(`{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}`, 4)
	_, err := safetensors.NewFile(bytes.NewReader(raw[:20]), int64(len(raw)), "short.safetensors")
	if err == nil || !strings.Contains(err.Error(), "reading: "+io.ErrUnexpectedEOF.Error()) {
		t.Fatalf("error %v", err)
	}
}

// TestAccepted lists headers that are unusual but valid.
func TestAccepted(t *testing.T) {
	for _, tc := range []struct {
		name   string
		file   []byte
		checks func(*safetensors.File) bool
	}{
		{"empty object", rawFile(`{}`, 0), func(f *safetensors.File) bool { return len(f.Tensors()) == 0 }},
		{"null metadata", rawFile(`{"__metadata__":null}`, 0), func(f *safetensors.File) bool { return len(f.Metadata()) == 0 }},
		{"padding and gaps", rawFile(`{"w":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}    `, 10), func(f *safetensors.File) bool {
			w, ok := f.Tensor("w")
			return ok && w.Begin == 4 && w.End == 6
		}},
		{"unknown fields skipped", rawFile(`{"w":{"dtype":"U8","extra":{"a":[1,{"b":null}]},"shape":[1],"data_offsets":[0,1]}}`, 1), func(f *safetensors.File) bool {
			_, ok := f.Tensor("w")
			return ok
		}},
		{"empty tensors share an offset", rawFile(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[1,1]},"b":{"dtype":"F32","shape":[3,0],"data_offsets":[1,1]},"c":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`, 2), func(f *safetensors.File) bool {
			ts := f.Tensors()
			return len(ts) == 3 && ts[0].Name == "c" && ts[1].Name == "a" && ts[2].Name == "b"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := safetensors.NewFile(bytes.NewReader(tc.file), int64(len(tc.file)), "ok.safetensors")
			if err != nil {
				t.Fatal(err)
			}
			if !tc.checks(f) {
				t.Fatalf("parsed as %+v, metadata %v", f.Tensors(), f.Metadata())
			}
		})
	}
}
