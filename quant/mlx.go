package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// MLX affine quantization (mlx.core.quantize): a row is cut into groups of
// groupSize elements; each group stores a scale s and a bias b, and each
// element an unsigned bits-wide integer q with w ≈ s*q + b. Integers are
// packed 32/bits to a little-endian uint32 word, the first element in the
// lowest bits.

// MLXPackedBytes is the packed size of n elements at bits per element.
func MLXPackedBytes(n, bits int) int { return n * bits / 8 }

func checkMLX(bits, groupSize, n int) error {
	if bits != 2 && bits != 3 && bits != 4 && bits != 6 && bits != 8 {
		return fmt.Errorf("mlx: %d bits unsupported", bits)
	}
	if 32%bits != 0 {
		return fmt.Errorf("mlx: %d-bit packing is not supported here", bits)
	}
	if groupSize <= 0 || n%groupSize != 0 || groupSize%(32/bits) != 0 {
		return fmt.Errorf("mlx: %d elements in groups of %d at %d bits", n, groupSize, bits)
	}
	return nil
}

// MLXDequantize unpacks len(dst) elements from packed using one scale and
// bias per group.
func MLXDequantize(bits, groupSize int, packed []byte, scales, biases, dst []float32) error {
	n := len(dst)
	if err := checkMLX(bits, groupSize, n); err != nil {
		return err
	}
	if len(packed) != MLXPackedBytes(n, bits) || len(scales) != n/groupSize || len(biases) != n/groupSize {
		return fmt.Errorf("mlx: %d packed bytes, %d scales, %d biases for %d elements", len(packed), len(scales), len(biases), n)
	}
	mask := uint32(1)<<bits - 1
	per := 32 / bits
	for w := 0; w < len(packed)/4; w++ {
		word := binary.LittleEndian.Uint32(packed[4*w:])
		for k := range per {
			i := w*per + k
			g := i / groupSize
			dst[i] = scales[g]*float32((word>>uint(k*bits))&mask) + biases[g]
		}
	}
	return nil
}

// MLXQuantize quantizes src as mlx.core.quantize does: per group, scale =
// (max − min) / (2^bits − 1) and bias = min (with the scale's sign flipped
// and bias = max when |min| > |max|, so the larger end is exact), q =
// round((w − bias) / scale) clamped to the range. Scales and biases are
// returned rounded to float16 precision, as they are stored, and q is
// computed against the rounded values.
func MLXQuantize(bits, groupSize int, src []float32, packed []byte, scales, biases []float32) error {
	n := len(src)
	if err := checkMLX(bits, groupSize, n); err != nil {
		return err
	}
	if len(packed) != MLXPackedBytes(n, bits) || len(scales) != n/groupSize || len(biases) != n/groupSize {
		return fmt.Errorf("mlx: %d packed bytes, %d scales, %d biases for %d elements", len(packed), len(scales), len(biases), n)
	}
	levels := float32(uint32(1)<<bits - 1)
	clear(packed)
	per := 32 / bits
	for g := 0; g < n/groupSize; g++ {
		grp := src[g*groupSize : (g+1)*groupSize]
		lo, hi := grp[0], grp[0]
		for _, v := range grp {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("mlx: non-finite value in group %d", g)
			}
			lo, hi = min(lo, v), max(hi, v)
		}
		scale := (hi - lo) / levels
		bias := lo
		if float32(math.Abs(float64(lo))) > float32(math.Abs(float64(hi))) {
			scale, bias = -scale, hi
		}
		scale = F16ToF32(F32ToF16(scale))
		bias = F16ToF32(F32ToF16(bias))
		scales[g], biases[g] = scale, bias
		for j, v := range grp {
			var q float32
			if scale != 0 {
				q = float32(math.RoundToEven(float64((v - bias) / scale)))
			}
			q = min(max(q, 0), levels)
			i := g*groupSize + j
			w, k := i/per, i%per
			word := binary.LittleEndian.Uint32(packed[4*w:])
			word |= uint32(q) << uint(k*bits)
			binary.LittleEndian.PutUint32(packed[4*w:], word)
		}
	}
	return nil
}
