package cpu

import (
	"encoding/binary"
	"math"

	"github.com/weftlm/weft/quant"
)

// The portable vector kernels for attention and activations; vec_amd64.go
// has the SIMD ones with the same contracts.

// scoresGo sets out[j] = scale · q·k[j·kstride : j·kstride+len(q)] for j
// in [0, len(out)).
func scoresGo(q, k []float32, kstride int, out []float32, scale float32) {
	hd := len(q)
	for j := range out {
		out[j] = dotGo(q, k[j*kstride:j*kstride+hd]) * scale
	}
}

// expSubGo sets x[i] = e^(x[i]−m) and returns Σ x[i].
func expSubGo(x []float32, m float32) float32 {
	var sum float32
	for i, v := range x {
		e := float32(math.Exp(float64(v - m)))
		x[i] = e
		sum += e
	}
	return sum
}

// wsumGo sets out[d] = Σ_j p[j]·v[j·vstride + d].
func wsumGo(p, v []float32, vstride int, out []float32) {
	clear(out)
	for j, pj := range p {
		axpyGo(pj, v[j*vstride:j*vstride+len(out)], out)
	}
}

// scores16Go is scoresGo over keys stored as IEEE half floats.
func scores16Go(q []float32, k []uint16, kstride int, out []float32, scale float32) {
	hd := len(q)
	for j := range out {
		kj := k[j*kstride : j*kstride+hd]
		var s0, s1, s2, s3 float32
		i := 0
		for ; i+4 <= hd; i += 4 {
			s0 += q[i] * quant.F16ToF32(kj[i])
			s1 += q[i+1] * quant.F16ToF32(kj[i+1])
			s2 += q[i+2] * quant.F16ToF32(kj[i+2])
			s3 += q[i+3] * quant.F16ToF32(kj[i+3])
		}
		for ; i < hd; i++ {
			s0 += q[i] * quant.F16ToF32(kj[i])
		}
		out[j] = ((s0 + s1) + (s2 + s3)) * scale
	}
}

// wsum16Go is wsumGo over values stored as IEEE half floats.
func wsum16Go(p []float32, v []uint16, vstride int, out []float32) {
	clear(out)
	for j, pj := range p {
		for d, h := range v[j*vstride : j*vstride+len(out)] {
			out[d] += pj * quant.F16ToF32(h)
		}
	}
}

// toF16 stores src as IEEE half floats, rounded to nearest even.
func toF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = quant.F32ToF16(x)
	}
}

// siluMulGo sets out = a·sigmoid(a)·b.
func siluMulGo(a, b, out []float32) {
	b, out = b[:len(a)], out[:len(a)]
	for i, x := range a {
		out[i] = x / (1 + float32(math.Exp(float64(-x)))) * b[i]
	}
}

// geluMulGo sets out = gelu_tanh(a)·b.
func geluMulGo(a, b, out []float32) {
	const c = 0.7978845608028654 // √(2/π)
	b, out = b[:len(a)], out[:len(a)]
	for i, x := range a {
		v := float64(x)
		out[i] = float32(0.5*v*(1+math.Tanh(c*(v+0.044715*v*v*v)))) * b[i]
	}
}

// streamReadGo returns the XOR of x's 8-byte words (len(x) a multiple of
// 32), reading them in four chains: the portable bandwidth loop.
func streamReadGo(x []byte) uint64 {
	var s0, s1, s2, s3 uint64
	for i := 0; i+32 <= len(x); i += 32 {
		c := x[i : i+32 : i+32]
		s0 ^= binary.LittleEndian.Uint64(c)
		s1 ^= binary.LittleEndian.Uint64(c[8:])
		s2 ^= binary.LittleEndian.Uint64(c[16:])
		s3 ^= binary.LittleEndian.Uint64(c[24:])
	}
	return s0 ^ s1 ^ s2 ^ s3
}
