package cpu

import "math"

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
