package quant

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/weftlm/weft/ggml"
)

// FuzzDequantize feeds arbitrary bytes as blocks of any type id: whole
// blocks of a known type must convert, anything else must fail cleanly.
func FuzzDequantize(f *testing.F) {
	f.Add(uint8(ggml.Q4_K), make([]byte, 144))
	f.Add(uint8(ggml.IQ1_M), []byte("not a multiple of the block size"))
	f.Fuzz(func(t *testing.T, id uint8, data []byte) {
		typ := ggml.Type(id % 48)
		if !typ.Valid() {
			if Dequantize(typ, data, nil) == nil {
				t.Fatalf("type id %d accepted", id)
			}
			return
		}
		bs, bb := int(typ.BlockSize()), int(typ.BlockBytes())
		nb := len(data) / bb
		dst := make([]float32, nb*bs)
		if err := Dequantize(typ, data[:nb*bb], dst); err != nil {
			t.Fatalf("%s, %d whole blocks: %v", typ, nb, err)
		}
		if len(data)%bb != 0 && Dequantize(typ, data, dst) == nil {
			t.Fatalf("%s: %d bytes for %d elements accepted", typ, len(data), len(dst))
		}
	})
}

// FuzzQuantize quantizes arbitrary float32s: it must never panic, and
// finite input that quantizes must dequantize to finite output.
func FuzzQuantize(f *testing.F) {
	f.Add(uint8(ggml.Q6_K), make([]byte, 1024))
	f.Add(uint8(ggml.Q4_0), []byte{0, 0, 0x80, 0x7f, 0, 0, 0x80, 0xff})
	f.Fuzz(func(t *testing.T, id uint8, data []byte) {
		typ := ggml.Type(id % 48)
		if !QuantizeSupported(typ) {
			return
		}
		bs := int(typ.BlockSize())
		x := make([]float32, len(data)/4/bs*bs)
		finite := true
		for i := range x {
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
			finite = finite && !nonFinite(x[i])
		}
		n, _ := typ.RowBytes(uint64(len(x)))
		q := make([]byte, n)
		if err := Quantize(typ, x, q); err != nil {
			if finite && !typ.Quantized() {
				t.Fatalf("%s: %v", typ, err)
			}
			return
		}
		y := make([]float32, len(x))
		if err := Dequantize(typ, q, y); err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		if !finite || !typ.Quantized() {
			return
		}
		for i, v := range y {
			if nonFinite(v) {
				t.Fatalf("%s: finite input, element %d came back as %g", typ, i, v)
			}
		}
	})
}
