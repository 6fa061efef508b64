package quant

import (
	"encoding/binary"
	"math"
)

// F16ToF32 widens an IEEE 754 binary16 value (given by its bits) to float32.
// Every half value, subnormals included, is exactly representable; NaNs keep
// their payload.
func F16ToF32(h uint16) float32 {
	if isNormalF16(h) {
		return normalF16(h)
	}
	return f16Special(h)
}

// isNormalF16 reports an exponent field of 1..30 (0 wraps past 30).
func isNormalF16(h uint16) bool { return (h>>10&0x1f)-1 < 30 }

// normalF16 converts a normal half: rebias the exponent 15 -> 127 by adding
// 112 to the exponent field, and widen the mantissa.
func normalF16(h uint16) float32 {
	return math.Float32frombits(uint32(h&0x8000)<<16 | (uint32(h&0x7fff)+112<<10)<<13)
}

// f16Special converts the zeros, subnormals, infinities and NaNs.
func f16Special(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	mant := uint32(h & 0x3ff)
	if h&0x7c00 != 0 { // inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	// Zero or subnormal: mant × 2^-24, exact in float32.
	v := float32(mant) * (1.0 / (1 << 24))
	if sign != 0 {
		v = -v
	}
	return v
}

// F32ToF16 narrows a float32 to binary16 bits, rounding to nearest with ties
// to even (as numpy's astype(float16) and ggml's GGML_FP32_TO_FP16 do).
// Values too large overflow to infinity, values too small flush to a signed
// zero through the subnormals, and a NaN stays a quiet NaN.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff

	if exp == 0xff {
		if mant != 0 { // NaN: keep the top payload bits, force quiet
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	}
	// Unbiased exponent; half normals cover -14..15.
	e := exp - 127
	if e > 15 {
		return sign | 0x7c00
	}
	if e >= -14 {
		// Normal half: keep 10 mantissa bits, round the 13 dropped ones.
		h := uint32(e+15)<<10 | mant>>13
		rest := mant & 0x1fff
		if rest > 0x1000 || (rest == 0x1000 && h&1 == 1) {
			h++ // may carry into the exponent, reaching inf: correct
		}
		return sign | uint16(h)
	}
	if e < -25 {
		return sign // below half the smallest subnormal
	}
	// Subnormal half m × 2^-24: the value is full × 2^(e-23) with full the
	// 24-bit significand, so m = full >> -(e+1), rounded on the dropped bits.
	full := mant | 0x800000
	shift := uint32(-e - 1)
	h := full >> shift
	rest := full & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rest > half || (rest == half && h&1 == 1) {
		h++
	}
	return sign | uint16(h)
}

// BF16ToF32 widens a bfloat16 value (given by its bits) to float32: bfloat16
// is the top half of a float32.
func BF16ToF32(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// F32ToBF16 narrows a float32 to bfloat16 bits, rounding to nearest with ties
// to even. A NaN keeps its top bits and is forced quiet, as in ggml's
// ggml_compute_fp32_to_bf16 and gguf-py.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	return uint16((uint64(u) + 0x7fff + uint64(u>>16&1)) >> 16)
}

// Plain element types. Each row function assumes the caller checked that
// len(src) == len(dst) × element size.

func dequantF32(src []byte, dst []float32) {
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// dequantF16 keeps the common normal case inline; F16ToF32 itself is too
// big for the compiler to inline.
func dequantF16(src []byte, dst []float32) {
	for i := range dst {
		h := binary.LittleEndian.Uint16(src[2*i:])
		if isNormalF16(h) {
			dst[i] = normalF16(h)
		} else {
			dst[i] = f16Special(h)
		}
	}
}

func dequantBF16(src []byte, dst []float32) {
	for i := range dst {
		dst[i] = BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

// dequantF64 rounds each float64 to the nearest float32.
func dequantF64(src []byte, dst []float32) {
	for i := range dst {
		dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:])))
	}
}

// The integer types convert by value, rounding to the nearest float32 where
// the integer has more than 24 significant bits.

func dequantI8(src []byte, dst []float32) {
	for i := range dst {
		dst[i] = float32(int8(src[i]))
	}
}

func dequantI16(src []byte, dst []float32) {
	for i := range dst {
		dst[i] = float32(int16(binary.LittleEndian.Uint16(src[2*i:])))
	}
}

func dequantI32(src []byte, dst []float32) {
	for i := range dst {
		dst[i] = float32(int32(binary.LittleEndian.Uint32(src[4*i:])))
	}
}

func dequantI64(src []byte, dst []float32) {
	for i := range dst {
		dst[i] = float32(int64(binary.LittleEndian.Uint64(src[8*i:])))
	}
}

func quantF32(src []float32, dst []byte) {
	for i, v := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
}

func quantF16(src []float32, dst []byte) {
	for i, v := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(v))
	}
}

func quantBF16(src []float32, dst []byte) {
	for i, v := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], F32ToBF16(v))
	}
}

// f16 reads a little-endian binary16 scale at b[0:2].
func f16(b []byte) float32 {
	return F16ToF32(binary.LittleEndian.Uint16(b))
}

// putF16 stores v as a little-endian binary16 at b[0:2] and returns the
// value the reader will see.
func putF16(b []byte, v float32) float32 {
	h := F32ToF16(v)
	binary.LittleEndian.PutUint16(b, h)
	return F16ToF32(h)
}
