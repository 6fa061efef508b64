package quant

import (
	"encoding/binary"
	"math"
)

// The original block formats: 32 elements per block, an fp16 scale d (and
// for the _1 types an fp16 offset m), and the quants. In the 4- and 5-bit
// types byte j holds element j in its low nibble and element j+16 in its
// high nibble; the 5-bit types keep bit 4 of element j in bit j of qh.
//
// The formulas below keep ggml's order of float32 operations; an explicit
// float32(...) around a product stops the compiler from fusing it with the
// following addition (a fused multiply-add rounds once, ggml rounds twice).

const qk = 32

// Q4_0: d fp16 | qs[16]. x = d × (q - 8).
func dequantQ4_0(src []byte, dst []float32) {
	for ; len(dst) >= qk; src, dst = src[18:], dst[qk:] {
		d := f16(src)
		qs := src[2:18:18]
		y := dst[:qk:qk]
		for j, b := range qs {
			y[j] = d * float32(int(b&0xf)-8)
			y[j+16] = d * float32(int(b>>4)-8)
		}
	}
}

// Q4_1: d fp16 | m fp16 | qs[16]. x = d × q + m.
func dequantQ4_1(src []byte, dst []float32) {
	for ; len(dst) >= qk; src, dst = src[20:], dst[qk:] {
		d, m := f16(src), f16(src[2:])
		qs := src[4:20:20]
		y := dst[:qk:qk]
		for j, b := range qs {
			y[j] = float32(d*float32(b&0xf)) + m
			y[j+16] = float32(d*float32(b>>4)) + m
		}
	}
}

// Q5_0: d fp16 | qh u32 | qs[16]. x = d × (q - 16).
func dequantQ5_0(src []byte, dst []float32) {
	for ; len(dst) >= qk; src, dst = src[22:], dst[qk:] {
		d := f16(src)
		qh := binary.LittleEndian.Uint32(src[2:])
		qs := src[6:22:22]
		y := dst[:qk:qk]
		for j, b := range qs {
			lo := int(b&0xf) | int(qh>>j&1)<<4
			hi := int(b>>4) | int(qh>>(j+16)&1)<<4
			y[j] = d * float32(lo-16)
			y[j+16] = d * float32(hi-16)
		}
	}
}

// Q5_1: d fp16 | m fp16 | qh u32 | qs[16]. x = d × q + m.
func dequantQ5_1(src []byte, dst []float32) {
	for ; len(dst) >= qk; src, dst = src[24:], dst[qk:] {
		d, m := f16(src), f16(src[2:])
		qh := binary.LittleEndian.Uint32(src[4:])
		qs := src[8:24:24]
		y := dst[:qk:qk]
		for j, b := range qs {
			lo := uint32(b&0xf) | (qh>>j&1)<<4
			hi := uint32(b>>4) | (qh>>(j+16)&1)<<4
			y[j] = float32(d*float32(lo)) + m
			y[j+16] = float32(d*float32(hi)) + m
		}
	}
}

// Q8_0: d fp16 | qs[32] int8. x = q × d.
func dequantQ8_0(src []byte, dst []float32) {
	for ; len(dst) >= qk; src, dst = src[34:], dst[qk:] {
		d := f16(src)
		qs := src[2:34:34]
		y := dst[:qk:qk]
		for j, b := range qs {
			y[j] = float32(int8(b)) * d
		}
	}
}

// Q8_1: d fp16 | s fp16 | qs[32] int8, where s = d × Σq is a by-product
// kept for dot products. x = q × d.
func dequantQ8_1(src []byte, dst []float32) {
	for ; len(dst) >= qk; src, dst = src[36:], dst[qk:] {
		d := f16(src)
		qs := src[4:36:36]
		y := dst[:qk:qk]
		for j, b := range qs {
			y[j] = float32(int8(b)) * d
		}
	}
}

// absMax returns the element of largest magnitude, the first one on ties
// (numpy's argmax, which gguf-py uses, picks the first).
func absMax(x []float32) float32 {
	m, am := x[0], abs32(x[0])
	for _, v := range x[1:] {
		if a := abs32(v); a > am {
			m, am = v, a
		}
	}
	return m
}

func minMax(x []float32) (lo, hi float32) {
	lo, hi = x[0], x[0]
	for _, v := range x[1:] {
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

func inv(d float32) float32 {
	if d == 0 {
		return 0
	}
	return 1 / d
}

// truncOffset is gguf-py's emulation of ggml's fused x*id + off: the product
// of two float32 is exact in float64, the sum is rounded to float32 once,
// then truncated toward zero.
func truncOffset(x, id float32, off float64) int {
	return int(float32(float64(x)*float64(id) + off))
}

// quantSymmetric quantizes one block of Q4_0 (nmax 8) or Q5_0 (nmax 16):
// d = max/-nmax where max is the element of largest magnitude, so the
// levels 0..2·nmax-1 map to d×(q-nmax). It returns the stored d and the
// levels in q.
func quantSymmetric(x []float32, b []byte, nmax int, q *[qk]uint8) (float32, bool) {
	d := absMax(x) / float32(-nmax)
	id := inv(d)
	stored := putF16(b, d)
	for j, v := range x {
		q[j] = uint8(min(max(truncOffset(v, id, float64(nmax)+0.5), 0), 2*nmax-1))
	}
	return stored, !nonFinite(stored)
}

// quantAffine quantizes one block of Q4_1 (nmax 15) or Q5_1 (nmax 31):
// d = (max-min)/nmax, levels q = trunc((x-min)/d + 0.5) in 0..nmax.
func quantAffine(x []float32, b []byte, nmax int, q *[qk]uint8) (float32, bool) {
	lo, hi := minMax(x)
	d := (hi - lo) / float32(nmax)
	id := inv(d)
	stored := putF16(b, d)
	m := putF16(b[2:], lo)
	for j, v := range x {
		l := int(float32(float32(v-lo)*id) + 0.5)
		q[j] = uint8(min(max(l, 0), nmax))
	}
	return stored, !nonFinite(stored) && !nonFinite(m)
}

// nonFinite reports an infinite or NaN scale, which no reader can use.
func nonFinite(v float32) bool {
	return math.IsInf(float64(v), 0) || math.IsNaN(float64(v))
}

func packNibbles(q *[qk]uint8, qs []byte) {
	for j := range 16 {
		qs[j] = q[j]&0xf | q[j+16]<<4
	}
}

func packHighBits(q *[qk]uint8) uint32 {
	var qh uint32
	for j, l := range q {
		qh |= uint32(l>>4&1) << j
	}
	return qh
}

func quantQ4_0(src []float32, dst []byte) error {
	var q [qk]uint8
	for i := 0; len(src) >= qk; i, src, dst = i+1, src[qk:], dst[18:] {
		if d, ok := quantSymmetric(src[:qk], dst, 8, &q); !ok {
			return scaleOverflow(i, d)
		}
		packNibbles(&q, dst[2:18])
	}
	return nil
}

func quantQ4_1(src []float32, dst []byte) error {
	var q [qk]uint8
	for i := 0; len(src) >= qk; i, src, dst = i+1, src[qk:], dst[20:] {
		if d, ok := quantAffine(src[:qk], dst, 15, &q); !ok {
			return scaleOverflow(i, d)
		}
		packNibbles(&q, dst[4:20])
	}
	return nil
}

func quantQ5_0(src []float32, dst []byte) error {
	var q [qk]uint8
	for i := 0; len(src) >= qk; i, src, dst = i+1, src[qk:], dst[22:] {
		if d, ok := quantSymmetric(src[:qk], dst, 16, &q); !ok {
			return scaleOverflow(i, d)
		}
		binary.LittleEndian.PutUint32(dst[2:], packHighBits(&q))
		packNibbles(&q, dst[6:22])
	}
	return nil
}

func quantQ5_1(src []float32, dst []byte) error {
	var q [qk]uint8
	for i := 0; len(src) >= qk; i, src, dst = i+1, src[qk:], dst[24:] {
		if d, ok := quantAffine(src[:qk], dst, 31, &q); !ok {
			return scaleOverflow(i, d)
		}
		binary.LittleEndian.PutUint32(dst[4:], packHighBits(&q))
		packNibbles(&q, dst[8:24])
	}
	return nil
}

// quant8 fills qs with round-half-away(x/d), d = max|x|/127, stores d as
// fp16 at b and returns it both exact and as stored.
func quant8(x []float32, b []byte, qs []byte) (d, stored float32) {
	var amax float32
	for _, v := range x {
		amax = max(amax, abs32(v))
	}
	d = amax / 127
	id := inv(d)
	for j, v := range x {
		qs[j] = byte(int8(math.Round(float64(v * id))))
	}
	return d, putF16(b, d)
}

func quantQ8_0(src []float32, dst []byte) error {
	for i := 0; len(src) >= qk; i, src, dst = i+1, src[qk:], dst[34:] {
		if _, d := quant8(src[:qk], dst, dst[2:34]); nonFinite(d) {
			return scaleOverflow(i, d)
		}
	}
	return nil
}

// quantQ8_1 is Q8_0 plus s = fp16(d × Σq), with d before fp16 rounding, as
// in ggml's quantize_row_q8_1_ref.
func quantQ8_1(src []float32, dst []byte) error {
	for i := 0; len(src) >= qk; i, src, dst = i+1, src[qk:], dst[36:] {
		d, stored := quant8(src[:qk], dst, dst[4:36])
		if nonFinite(stored) {
			return scaleOverflow(i, stored)
		}
		sum := 0
		for _, b := range dst[4:36] {
			sum += int(int8(b))
		}
		putF16(dst[2:], float32(sum)*d)
	}
	return nil
}
