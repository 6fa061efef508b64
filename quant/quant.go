// Package quant converts between float32 and the tensor element types of
// ggml (GGUF, llama.cpp): it dequantizes every ggml.Type to float32 and
// quantizes float32 into the plain types and the common block formats.
//
// Dequantization is bit-exact with ggml's reference (dequantize_row_* in
// ggml-quants.c, as mirrored by gguf-py's gguf.quants.dequantize): each
// element is computed with the same float32 operations in the same order.
// Quantization follows ggml's reference quantizers (quantize_row_*_ref); for
// the types gguf-py can quantize the bytes are identical to gguf-py's.
//
// Data is little-endian, as in GGUF files. A row of n elements of type t
// takes t.RowBytes(n) bytes; n must be a multiple of t.BlockSize().
package quant

import (
	"errors"
	"fmt"
	"math"

	"github.com/weftlm/weft/ggml"
)

// ErrUnsupported is returned (wrapped) by Quantize for a type it cannot
// produce.
var ErrUnsupported = errors.New("quantization to this type is not supported")

// dequantRow converts whole blocks: len(src) is exactly len(dst)/BlockSize
// blocks, checked by the caller.
type dequantRow func(src []byte, dst []float32)

// quantRow converts whole blocks, sizes checked by the caller. It fails only
// when a block's scale does not fit its stored format.
type quantRow func(src []float32, dst []byte) error

var dequantizers = [...]dequantRow{
	ggml.F32:     dequantF32,
	ggml.F16:     dequantF16,
	ggml.Q4_0:    dequantQ4_0,
	ggml.Q4_1:    dequantQ4_1,
	ggml.Q5_0:    dequantQ5_0,
	ggml.Q5_1:    dequantQ5_1,
	ggml.Q8_0:    dequantQ8_0,
	ggml.Q8_1:    dequantQ8_1,
	ggml.Q2_K:    dequantQ2_K,
	ggml.Q3_K:    dequantQ3_K,
	ggml.Q4_K:    dequantQ4_K,
	ggml.Q5_K:    dequantQ5_K,
	ggml.Q6_K:    dequantQ6_K,
	ggml.Q8_K:    dequantQ8_K,
	ggml.IQ2_XXS: dequantIQ2_XXS,
	ggml.IQ2_XS:  dequantIQ2_XS,
	ggml.IQ3_XXS: dequantIQ3_XXS,
	ggml.IQ1_S:   dequantIQ1_S,
	ggml.IQ4_NL:  dequantIQ4_NL,
	ggml.IQ3_S:   dequantIQ3_S,
	ggml.IQ2_S:   dequantIQ2_S,
	ggml.IQ4_XS:  dequantIQ4_XS,
	ggml.I8:      dequantI8,
	ggml.I16:     dequantI16,
	ggml.I32:     dequantI32,
	ggml.I64:     dequantI64,
	ggml.F64:     dequantF64,
	ggml.IQ1_M:   dequantIQ1_M,
	ggml.BF16:    dequantBF16,
	ggml.TQ1_0:   dequantTQ1_0,
	ggml.TQ2_0:   dequantTQ2_0,
	ggml.MXFP4:   dequantMXFP4,
}

var quantizers = [...]quantRow{
	ggml.F32:    noFail(quantF32),
	ggml.F16:    noFail(quantF16),
	ggml.BF16:   noFail(quantBF16),
	ggml.Q4_0:   quantQ4_0,
	ggml.Q4_1:   quantQ4_1,
	ggml.Q5_0:   quantQ5_0,
	ggml.Q5_1:   quantQ5_1,
	ggml.Q8_0:   quantQ8_0,
	ggml.Q8_1:   quantQ8_1,
	ggml.Q2_K:   quantQ2_K,
	ggml.Q3_K:   quantQ3_K,
	ggml.Q4_K:   quantQ4_K,
	ggml.Q5_K:   quantQ5_K,
	ggml.Q6_K:   quantQ6_K,
	ggml.Q8_K:   quantQ8_K,
	ggml.IQ4_NL: quantIQ4_NL,
	ggml.IQ4_XS: quantIQ4_XS,
	ggml.TQ1_0:  quantTQ1_0,
	ggml.TQ2_0:  quantTQ2_0,
}

func noFail(f func([]float32, []byte)) quantRow {
	return func(src []float32, dst []byte) error {
		f(src, dst)
		return nil
	}
}

// Dequantize converts src, a whole number of blocks of type t, to float32 in
// dst. len(dst) must be a multiple of t.BlockSize() and len(src) exactly the
// bytes those elements take. It does not allocate.
func Dequantize(t ggml.Type, src []byte, dst []float32) error {
	fn := dequantizerOf(t)
	if fn == nil {
		return fmt.Errorf("quant: dequantize: unknown tensor type id %d", uint32(t))
	}
	if err := checkSizes(t, len(src), len(dst)); err != nil {
		return fmt.Errorf("quant: dequantize %s: %w", t, err)
	}
	fn(src, dst)
	return nil
}

// DequantizeRow is Dequantize under the name hot paths use when they convert
// one tensor row at a time; it does not allocate.
func DequantizeRow(t ggml.Type, src []byte, dst []float32) error {
	return Dequantize(t, src, dst)
}

// QuantizeSupported reports whether Quantize can produce type t.
func QuantizeSupported(t ggml.Type) bool {
	return uint64(t) < uint64(len(quantizers)) && quantizers[t] != nil
}

// Quantize converts src to type t in dst. len(src) must be a multiple of
// t.BlockSize() and len(dst) exactly the bytes those elements take. The
// block types accept finite values only, and fail when a block's values are
// too large for its fp16 scale (about 65504 times the type's largest level).
// For an unsupported type the error wraps ErrUnsupported.
func Quantize(t ggml.Type, src []float32, dst []byte) error {
	if !QuantizeSupported(t) {
		return fmt.Errorf("quant: quantize %s: %w", t, ErrUnsupported)
	}
	if err := checkSizes(t, len(dst), len(src)); err != nil {
		return fmt.Errorf("quant: quantize %s: %w", t, err)
	}
	if t.Quantized() {
		for i, v := range src {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("quant: quantize %s: element %d is %v; block types hold finite values only", t, i, v)
			}
		}
	}
	if err := quantizers[t](src, dst); err != nil {
		return fmt.Errorf("quant: quantize %s: %w", t, err)
	}
	return nil
}

func dequantizerOf(t ggml.Type) dequantRow {
	if !t.Valid() || uint64(t) >= uint64(len(dequantizers)) {
		return nil
	}
	return dequantizers[t]
}

// checkSizes verifies that nElems elements of t are whole blocks taking
// exactly nBytes bytes.
func checkSizes(t ggml.Type, nBytes, nElems int) error {
	bs, bb := int(t.BlockSize()), int(t.BlockBytes())
	if nElems%bs != 0 {
		return fmt.Errorf("%d elements is not a whole number of %d-element blocks", nElems, bs)
	}
	blocks := nElems / bs
	if blocks > math.MaxInt/bb {
		return fmt.Errorf("%d blocks overflow a byte count", blocks)
	}
	if want := blocks * bb; nBytes != want {
		return fmt.Errorf("%d elements take %d bytes (%d blocks of %d), got %d", nElems, want, blocks, bb, nBytes)
	}
	return nil
}

// scaleOverflow reports a block whose scale does not fit its fp16 field.
func scaleOverflow(block int, scale float32) error {
	return fmt.Errorf("block %d: scale %g overflows fp16; values are too large for this type", block, scale)
}
