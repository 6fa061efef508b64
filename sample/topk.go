package sample

import (
	"errors"
	"fmt"
	"math"
)

// MaxDrawTopK is the largest top-k of a chain that SampleTopK draws, and so
// the largest that a Sampler reports through Device: the GPU draws such a
// chain by sorting a vocabulary chunk's best MaxDrawTopK logits at a time.
const MaxDrawTopK = 64

// SampleTopK draws a token from the chain temperature, top-k, top-p and
// min-p by a procedure that a device can follow to the bit from the logits
// alone (the GPU backend does), for a top-k of k:
//
//  1. the k largest finite logits, ranked from the largest, ties to the
//     lowest id;
//  2. each one's probability p = e^((v - max)/T) as the Sampler computes it
//     (float64, rounded to float32; the first has exactly 1), summed in
//     rank order in float64 into the total;
//  3. top-p keeps the shortest prefix of the ranking whose running sum (in
//     rank order) reaches topP times the total (all of it when topP is 1
//     or the sum falls short by rounding);
//  4. min-p then keeps those with p >= minP, and tokens with p = 0 go;
//  5. the token is the kept one with the largest v/T + g_i, where g_i =
//     GumbelNoise(seed, step, i), in float32 as SampleGumbel computes it,
//     ties to the lowest id.
//
// Step 5 draws from the kept tokens' probabilities renormalised, so the
// chain's distribution is the usual one; only the random numbers differ
// from the Sampler's other chains. k must lie in [1, MaxDrawTopK], the
// temperature be positive and finite, topP in (0, 1], minP in [0, 1]. NaN
// and -Inf logits are never drawn; ErrNoCandidates when no logit is finite.
func SampleTopK(logits []float32, temperature float32, k int, topP, minP float32, seed, step uint64) (int32, error) {
	switch {
	case len(logits) == 0:
		return 0, errors.New("sample: SampleTopK: no logits")
	case !(temperature > 0) || math.IsInf(float64(temperature), 1):
		return 0, fmt.Errorf("sample: SampleTopK: temperature %v, want a positive finite value", temperature)
	case k < 1 || k > MaxDrawTopK:
		return 0, fmt.Errorf("sample: SampleTopK: top-k %d outside [1, %d]", k, MaxDrawTopK)
	case !(topP > 0 && topP <= 1):
		return 0, fmt.Errorf("sample: SampleTopK: top-p %v outside (0, 1]", topP)
	case !(minP >= 0 && minP <= 1):
		return 0, fmt.Errorf("sample: SampleTopK: min-p %v outside [0, 1]", minP)
	}
	var buf [MaxDrawTopK]cand
	c := topK(logits, k, buf[:0])
	if len(c) == 0 {
		return 0, ErrNoCandidates
	}
	sortDesc(c)
	var p [MaxDrawTopK]float32
	n := kept(c, p[:len(c)], temperature, topP)
	skey := stepKey(seed, step)
	best, id := float32(0), int32(-1)
	for i, x := range c[:n] {
		if p[i] == 0 || p[i] < minP {
			continue
		}
		// Candidates run from the largest logit, not by id, so ties go to
		// the lower id explicitly.
		if score := x.v/temperature + gumbelAt(skey, int(x.id)); id < 0 || score > best || score == best && x.id < id {
			best, id = score, x.id
		}
	}
	return id, nil
}

// kept writes to p the probabilities of the ranked candidates c (steps 2
// and 3 of SampleTopK) and returns how many top-p keeps.
func kept(c []cand, p []float32, temperature, topP float32) int {
	invT := 1 / float64(temperature)
	mx := c[0].v
	total := 0.0
	for i, x := range c {
		p[i] = prob(x.v, mx, invT)
		total += float64(p[i])
	}
	if topP >= 1 {
		return len(c)
	}
	target := float64(topP) * total
	acc := 0.0
	for i := range c {
		if acc += float64(p[i]); acc >= target {
			return i + 1
		}
	}
	return len(c)
}
