package cpu

import (
	"math"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/quant"
)

// The exact level (WEFT_CPU_KERNELS=exact) computes a model so that its
// result does not depend on the order of any sum: every sum whose result
// is rounded (a product's row, a norm's sum of squares, an attention
// head's scores, softmax and weighted values) is taken in float64 over
// terms that are exact in float64, and rounded to float32 once, where the
// float32 value is stored. Two implementations that keep to this — another
// split of K over lanes, flash-decoding's partial softmaxes, a different
// number of threads — give the same float32 unless a value lies within a
// few float64 ulps of a float32 rounding boundary (a chance of about
// 2⁻²⁹ per rounded value for sums of a few hundred terms), and so the same
// int8 activations for the next product. Without it, one float32 ulp in
// the wrong place moves an int8 level now and then, which on a model as
// narrow as stories260K (64 wide) costs a KL of about 1e-3.
//
// The contract, term by term (a GPU backend that is to agree bit for bit
// keeps to the same):
//   - quantized products: per block (or super-block) the integer sum T,
//     exact, times s = fl32(dw·da) (the weight's and the activation's
//     scales multiplied in float32), both as float64 (T·s is then exact);
//     affine types add Σa·fl32(m·da), k-quants subtract MSUM·fl32(dmin·da);
//     the row's terms summed in float64 and rounded once;
//   - float weights: Σ float64(w)·float64(a), rounded once;
//   - RMSNorm: ss = Σ float64(x)², inv = 1/sqrt(ss/n + eps) in float64,
//     y = fl32(float64(x)·inv·float64(w)) in that order;
//   - RoPE: y0 = fl32(float64(x0)·c − float64(x1)·s), y1 =
//     fl32(float64(x0)·s + float64(x1)·c), with c and s the float32
//     roundings of the float64 cosine and sine of float64(pos)·invFreq;
//   - attention: scores float64(q·k)·scale in float64 (soft-capped in
//     float64), e_j = exp(s_j − max), out = fl32(Σ e_j·v_j / Σ e_j), all in
//     float64;
//   - SiLU/GELU: the float64 formula on float64(x), times float64(b),
//     rounded once;
//   - the activations' int8 quantization, residual adds and biases are
//     single float32 operations on equal inputs, so equal already.
//
// The level runs the portable kernels with float64 accumulators
// ("exact-go"), or on AVX-512 VNNI machines ("exact") assembly products
// that widen each block's term into float64 zmm accumulators (asmgen's
// VNNIX kernels, bit-identical to the portable ones) with the portable
// float64 attention, norm and activations: the reference other backends
// are checked against, about 0.6× the default level's prefill.
//
// exactLevel is the portable form: named "exact", or "exact-go" where the
// VNNI form takes that name (gemm_amd64.go). Its attention kernels are the
// portable ones, which its own attention step (attentionExactBody) does
// not call.
var exactLevel = &isa{
	name:    "exact",
	group:   4,
	exact:   true,
	gemm:    gemmAcc[float64, float32],
	convert: actLayout.convertRow,
	dot:     dotExact,
	siluMul: siluMulExact,
	geluMul: geluMulExact,

	scores:   scoresGo,
	expSub:   expSubGo,
	wsum:     wsumGo,
	scores16: scores16Go,
	wsum16:   wsum16Go,
}

// dot64 is Σ float64(a[i])·float64(b[i]) (each product exact).
func dot64(a, b []float32) float64 {
	b = b[:len(a)]
	var s float64
	for i, v := range a {
		s += float64(v) * float64(b[i])
	}
	return s
}

// dot64h is dot64 against IEEE half floats.
func dot64h(a []float32, b []uint16) float64 {
	b = b[:len(a)]
	var s float64
	for i, v := range a {
		s += float64(v) * float64(quant.F16ToF32(b[i]))
	}
	return s
}

func dotExact(a, b []float32) float32 { return float32(dot64(a, b)) }

func siluMulExact(a, b, out []float32) {
	b, out = b[:len(a)], out[:len(a)]
	for i, x := range a {
		v := float64(x)
		out[i] = float32(v / (1 + math.Exp(-v)) * float64(b[i]))
	}
}

func geluMulExact(a, b, out []float32) {
	const c = 0.7978845608028654 // √(2/π)
	b, out = b[:len(a)], out[:len(a)]
	for i, x := range a {
		v := float64(x)
		out[i] = float32(0.5 * v * (1 + math.Tanh(c*(v+0.044715*v*v*v))) * float64(b[i]))
	}
}

// attentionExactBody is attentionBody under the exact contract: scores,
// their exponentials and the weighted values stay in float64 until the
// head's output is rounded.
func (e *exec) attentionExactBody(op *backend.Op) func(lo, hi, worker int) {
	out, c := e.bufs[op.Out], &e.kv[op.Layer]
	hd, cols, scale, softcap := op.HeadDim, op.NHeads*op.HeadDim, float64(op.Scale), float64(op.Cap)
	return func(lo, hi, worker int) {
		for item := lo; item < hi; item++ {
			r, first, pos, base, qh := e.attnItem(op, c, item)
			h := item % op.NHeads
			scores := e.exactScratch[worker][:pos-first+1]
			acc := e.exactScratch[worker][len(e.exactScratch[worker])-hd:]
			maxS := math.Inf(-1)
			for j := first; j <= pos; j++ {
				at := base + (j%c.capacity)*c.kvDim
				var s float64
				if c.k16 != nil {
					s = dot64h(qh, c.k16[at:at+hd])
				} else {
					s = dot64(qh, c.k[at:at+hd])
				}
				s *= scale
				if softcap > 0 {
					s = softcap * math.Tanh(s/softcap)
				}
				scores[j-first] = s
				maxS = max(maxS, s)
			}
			clear(acc)
			var l float64
			for j := first; j <= pos; j++ {
				p := math.Exp(scores[j-first] - maxS)
				l += p
				at := base + (j%c.capacity)*c.kvDim
				if c.v16 != nil {
					for d, v := range c.v16[at : at+hd] {
						acc[d] += p * float64(quant.F16ToF32(v))
					}
				} else {
					for d, v := range c.v[at : at+hd] {
						acc[d] += p * float64(v)
					}
				}
			}
			o := out[r*cols+h*hd : r*cols+(h+1)*hd]
			for d := range o {
				o[d] = float32(acc[d] / l)
			}
		}
	}
}
