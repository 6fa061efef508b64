package sample

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// Counter-based Gumbel noise for sampling by Gumbel-max on a device.
//
// The noise of token i at generation step `step` of stream `seed` is a pure
// function of the three numbers, so a kernel needs no RNG state and every
// thread computes its own token's noise:
//
//	key  = mix(seed + γ)               once per stream
//	skey = mix(key + (step+1)·γ)       once per step
//	h    = mix(skey + (i+1)·γ)         per token
//	u    = ((h >> 11) + 0.5) · 2⁻⁵³    uniform in (0, 1), never 0 or 1
//	g    = float32(-log(-log(u)))      log in float64
//
// where γ = 0x9e3779b97f4a7c15 and mix is SplitMix64's finaliser; all
// integer arithmetic is modulo 2⁶⁴. Each line is SplitMix64 — a Weyl
// sequence through a bijective mixer — so h is the i-th output of the
// stream keyed by skey, itself the step-th output of the stream keyed by
// key. The integers and u are exact in any language. The logarithms are
// float64 library calls, which may differ in the last bit of the double
// (Go's and CUDA's are both within 1 ulp); rounding to float32 hides that
// except when a double lands within an ulp of a float32 rounding boundary,
// about one value in 2²⁸. On 6.3 million values Go, CUDA (PyTorch on an
// H100) and glibc agreed to the bit: testdata/gumbel_cuda.py.

const gamma = 0x9e3779b97f4a7c15

// mix is SplitMix64's output function, a bijection of uint64.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// stepKey is the per-step key of the noise.
func stepKey(seed, step uint64) uint64 { return mix(mix(seed+gamma) + (step+1)*gamma) }

// gumbelAt is the noise of token i under a step key.
func gumbelAt(skey uint64, i int) float32 { return gumbelOf(tokenHash(skey, i)) }

// tokenHash is the hash h of token i under a step key.
func tokenHash(skey uint64, i int) uint64 { return mix(skey + (uint64(i)+1)*gamma) }

// gumbelOf is the noise of hash h.
func gumbelOf(h uint64) float32 {
	u := (float64(h>>11) + 0.5) * 0x1p-53
	return float32(-math.Log(-math.Log(u)))
}

// mayReach reports whether a token of hash h and scaled logit vT can score
// best or more, by a bound that needs no logarithm, so that a draw over a
// vocabulary takes the two logarithms of only the few tokens that pass.
// With u = 1 - δ, -log u >= δ, so g = -log(-log u) <= -log δ <= -E·ln 2,
// where E = ⌊log₂ δ⌋ is read off the bits of δ = N·2⁻⁵⁴ (N = 2⁵⁴ - 2k - 1
// for k = h >> 11, so that u = (k + ½)·2⁻⁵³). The margin covers the
// score's float32 roundings many times over.
func mayReach(h uint64, vT, best float32) bool {
	n := 1<<54 - 2*(h>>11) - 1
	gmax := float32(55-bits.Len64(n)) * math.Ln2
	margin := 1e-6 * (abs32(vT) + abs32(best) + 40)
	return vT+gmax+margin >= best
}

func abs32(x float32) float32 { return math.Float32frombits(math.Float32bits(x) &^ (1 << 31)) }

// GumbelNoise returns the standard Gumbel noise of token i at generation
// step step of the stream seed (see the formula above).
func GumbelNoise(seed, step uint64, i int) float32 {
	return gumbelAt(stepKey(seed, step), i)
}

// SampleGumbel draws a token from softmax(logits/temperature) by the
// Gumbel-max trick: the id maximising logits[i]/temperature + g_i in
// float32 (one division, one addition, both rounded to float32), with g_i =
// GumbelNoise(seed, step, i) and ties to the lowest id. A temperature of 0
// is greedy. It is the reference for the GPU backend's sampler; to sample
// after top-k, top-p or min-p, set the dropped logits to -Inf first. NaN
// and -Inf logits are never drawn.
func SampleGumbel(logits []float32, temperature float32, seed, step uint64) (int32, error) {
	if len(logits) == 0 {
		return 0, errors.New("sample: SampleGumbel: no logits")
	}
	if !(temperature >= 0) || math.IsInf(float64(temperature), 1) {
		return 0, fmt.Errorf("sample: SampleGumbel: temperature %v, want 0 (greedy) or a positive finite value", temperature)
	}
	if temperature == 0 {
		if id := argmax(logits); id >= 0 {
			return id, nil
		}
		return 0, ErrNoCandidates
	}
	skey := stepKey(seed, step)
	negInf := float32(math.Inf(-1))
	best, id := negInf, int32(-1)
	for i, v := range logits {
		if !(v > negInf) {
			continue
		}
		vT, h := v/temperature, tokenHash(skey, i)
		if id >= 0 && !mayReach(h, vT, best) {
			continue
		}
		if score := vT + gumbelOf(h); score > best || id < 0 {
			best, id = score, int32(i)
		}
	}
	if id < 0 {
		return 0, ErrNoCandidates
	}
	return id, nil
}
