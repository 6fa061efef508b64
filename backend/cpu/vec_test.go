package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/quant"
)

func randFloats(rng *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * scale)
	}
	return x
}

// closeTo reports |got − want| ≤ tol·(|want| + floor).
func closeTo(got, want, tol, floor float64) bool {
	return math.Abs(got-want) <= tol*(math.Abs(want)+floor)
}

// checkAttention compares scores (scale 0.125) and a weighted sum out of
// n keys and values at(j·stride + d) (d < len(q)) against float64.
func checkAttention(t *testing.T, name string, q []float32, at func(i int) float64, stride int, scores, p, out []float32) {
	t.Helper()
	hd := len(q)
	for j := range scores {
		var want, mag float64
		for d := range hd {
			want += float64(q[d]) * at(j*stride+d)
			mag += math.Abs(float64(q[d]) * at(j*stride+d))
		}
		if !closeTo(float64(scores[j]), 0.125*want, 1e-6, 0.125*mag) {
			t.Fatalf("%s: score %d = %g, want %g", name, j, scores[j], 0.125*want)
		}
	}
	for d := range hd {
		var want, mag float64
		for j := range p {
			want += float64(p[j]) * at(j*stride+d)
			mag += math.Abs(float64(p[j]) * at(j*stride+d))
		}
		if !closeTo(float64(out[d]), want, 1e-6, mag) {
			t.Fatalf("%s: wsum[%d] = %g, want %g", name, d, out[d], want)
		}
	}
}

// TestVectorKernels compares every level's attention and activation
// kernels with float64 references on random data: head sizes that the
// SIMD kernels take and ones they hand back to Go, strides wider than a
// head, lengths that are not whole vectors; the attention kernels also
// over a cache of IEEE half floats.
func TestVectorKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, k := range isas {
		for _, hd := range []int{8, 16, 24, 64, 80, 128} {
			for _, n := range []int{1, 3, 17, 100} {
				name := fmt.Sprintf("%s/hd%d/n%d", k.name, hd, n)
				stride := hd*3 + 8
				q := randFloats(rng, hd, 1)
				kv := randFloats(rng, (n-1)*stride+hd, 1)
				scores := make([]float32, n)
				k.scores(q, kv, stride, scores, 0.125)
				p := randFloats(rng, n, 1)
				out := randFloats(rng, hd, 1) // overwritten
				k.wsum(p, kv, stride, out)
				checkAttention(t, name, q, func(i int) float64 { return float64(kv[i]) }, stride, scores, p, out)
				// The same over a cache of IEEE half floats.
				kv16 := make([]uint16, len(kv))
				toF16(kv16, kv)
				k.scores16(q, kv16, stride, scores, 0.125)
				k.wsum16(p, kv16, stride, out)
				checkAttention(t, name+"/f16", q, func(i int) float64 { return float64(quant.F16ToF32(kv16[i])) }, stride, scores, p, out)
			}
		}
		for _, n := range []int{1, 7, 8, 9, 37, 1000} {
			name := fmt.Sprintf("%s/n%d", k.name, n)
			x := randFloats(rng, n, 10)
			x[0] = -200 // underflows to 0, not to garbage
			m := float32(3)
			want := make([]float64, n)
			var sum float64
			for i, v := range x {
				want[i] = math.Exp(float64(v - m))
				sum += want[i]
			}
			got := k.expSub(x, m)
			if !closeTo(float64(got), sum, 1e-6, 1e-37) {
				t.Fatalf("%s: Σ exp = %g, want %g", name, got, sum)
			}
			for i := range x {
				if !closeTo(float64(x[i]), want[i], 3e-7, 1e-37) {
					t.Fatalf("%s: exp[%d] = %g, want %g", name, i, x[i], want[i])
				}
			}
			a, b := randFloats(rng, n, 5), randFloats(rng, n, 1)
			a[0], a[n-1] = 100, -100 // saturated tails
			out := make([]float32, n)
			for _, act := range []struct {
				name string
				fn   func(a, b, out []float32)
				ref  func(x float64) float64
			}{
				{"silu", k.siluMul, func(x float64) float64 { return x / (1 + math.Exp(-x)) }},
				{"gelu", k.geluMul, func(x float64) float64 {
					return 0.5 * x * (1 + math.Tanh(0.7978845608028654*(x+0.044715*x*x*x)))
				}},
			} {
				act.fn(a, b, out)
				for i := range a {
					want := act.ref(float64(a[i])) * float64(b[i])
					// the floor: GELU of a very negative x is 0 in float64, ~1e-31 in float32
					if !closeTo(float64(out[i]), want, 1e-6, 1e-3*math.Abs(float64(a[i]*b[i]))) {
						t.Fatalf("%s %s: [%d] f(%g)·%g = %g, want %g", name, act.name, i, a[i], b[i], out[i], want)
					}
				}
			}
		}
	}
}

// TestToF16 checks toF16 against quant's rounding (to nearest even).
func TestToF16(t *testing.T) {
	x := []float32{0, float32(math.Copysign(0, -1)), 1, 65504, 65520, 1e-8, float32(math.Inf(-1)), 3.14159}
	h := make([]uint16, len(x))
	toF16(h, x)
	for i, v := range x {
		if h[i] != quant.F32ToF16(v) {
			t.Errorf("toF16(%g) = %#x, want %#x", v, h[i], quant.F32ToF16(v))
		}
	}
}

// TestConvertMatchesPortable: every level's activation records are
// byte-identical to the portable quantizers', zero blocks, ties between
// +m and −m and huge ranges included.
func TestConvertMatchesPortable(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, f := range []*format{formats[ggml.Q8_0], formats[ggml.Q4_K], formats[ggml.F16]} {
		cols := 1024
		x := randFloats(rng, 3*cols, 1)
		clear(x[256:512])      // a zero block
		x[600], x[700] = 5, -5 // a tie for the largest magnitude
		x[1100] = 1e30         // a huge range
		for i := 2 * cols; i < 3*cols; i++ {
			x[i] = float32(int(x[i] * 4)) // many exact halves
		}
		for _, k := range isas {
			lay := layoutFor(f, cols, 2)
			want, got := make([]byte, lay.bytes(3)), make([]byte, lay.bytes(3))
			for c := range 3 {
				lay.convertRow(x[c*cols:(c+1)*cols], want, c)
				k.convert(lay, x[c*cols:(c+1)*cols], got, c)
			}
			for i := range want {
				if want[i] != got[i] {
					t.Fatalf("%s %s: record byte %d is %#x, want %#x", k.name, f.typ, i, got[i], want[i])
				}
			}
		}
	}
}
