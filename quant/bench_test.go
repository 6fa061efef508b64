package quant

import (
	"encoding/binary"
	"testing"

	"github.com/weftlm/weft/ggml"
)

var benchTypes = []ggml.Type{
	ggml.F32, ggml.F16, ggml.BF16,
	ggml.Q4_0, ggml.Q4_1, ggml.Q5_0, ggml.Q5_1, ggml.Q8_0,
	ggml.Q2_K, ggml.Q3_K, ggml.Q4_K, ggml.Q5_K, ggml.Q6_K,
	ggml.IQ2_XXS, ggml.IQ2_XS, ggml.IQ2_S, ggml.IQ3_XXS, ggml.IQ3_S,
	ggml.IQ1_S, ggml.IQ1_M, ggml.IQ4_NL, ggml.IQ4_XS, ggml.MXFP4,
}

// benchRow returns n elements of typ as they would look in a model file:
// quantized Gaussian values where Quantize supports the type, otherwise
// fixed pseudo-random quants under a moderate scale (random scale bits
// would put subnormals and NaNs into the timing).
func benchRow(typ ggml.Type, n int) []byte {
	nb, _ := typ.RowBytes(uint64(n))
	src := make([]byte, nb)
	if QuantizeSupported(typ) {
		if err := Quantize(typ, gaussian(n, 0.02, 9), src); err != nil {
			panic(err)
		}
		return src
	}
	for i := range src {
		src[i] = byte(i*131 + i>>3)
	}
	bb := int(typ.BlockBytes())
	for b := 0; typ.Quantized() && b < len(src); b += bb {
		blk := src[b : b+bb]
		switch typ {
		case ggml.IQ1_M: // fp16 d in the top nibbles of the last four u16
			for k := range 4 {
				blk[48+2*k+1] = blk[48+2*k+1]&0x0f | byte(uint16(0x2c00)>>(4*k)&0xf)<<4
			}
		case ggml.MXFP4:
			blk[0] = 120
		default: // the other grid types keep d in their first two bytes
			binary.LittleEndian.PutUint16(blk, F32ToF16(0.001))
		}
	}
	return src
}

// BenchmarkDequantize converts one 4096-element row; the reported bytes/s
// count the float32 output (4 bytes per element), so MB/s ÷ 4 is millions
// of elements per second whatever the type.
func BenchmarkDequantize(b *testing.B) {
	const n = 4096
	for _, typ := range benchTypes {
		b.Run(typ.String(), func(b *testing.B) {
			src := benchRow(typ, n)
			dst := make([]float32, n)
			b.SetBytes(4 * n)
			b.ReportAllocs()
			for b.Loop() {
				if err := DequantizeRow(typ, src, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkQuantize measures the reference quantizers on Gaussian rows,
// bytes/s counting the float32 input.
func BenchmarkQuantize(b *testing.B) {
	const n = 4096
	x := gaussian(n, 1, 1)
	for _, typ := range []ggml.Type{ggml.F16, ggml.Q4_0, ggml.Q8_0, ggml.Q4_K, ggml.Q6_K, ggml.IQ4_XS} {
		b.Run(typ.String(), func(b *testing.B) {
			nb, _ := typ.RowBytes(n)
			dst := make([]byte, nb)
			b.SetBytes(4 * n)
			for b.Loop() {
				if err := Quantize(typ, x, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
