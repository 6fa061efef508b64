package sample

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// SampleNucleus draws a token from the chain temperature, top-p and min-p
// over the whole vocabulary by a procedure that a device can follow to the
// bit from the logits alone (the GPU backend does):
//
//  1. mx, the largest finite logit;
//  2. each finite logit's probability p = e^((v - mx)/T) as the Sampler
//     computes it (float64, rounded to float32; mx has exactly 1), and its
//     mass q = ⌊p·2⁴⁰⌋, an integer: top-p counts probability in units of
//     2⁻⁴⁰ of the most probable token's, so its sums are exact and the
//     same in any order (a vocabulary of 2²¹ tokens sums below 2⁶¹);
//  3. top-p ranks the tokens from the largest logit, ties (equal logits;
//     -0 and +0 are equal) to the lowest id, and keeps the shortest prefix
//     whose mass reaches ⌈topP·total⌉, computed exactly (all of them when
//     topP is 1);
//  4. min-p then keeps those with p >= minP, and tokens with p = 0 go;
//  5. the token is the kept one with the largest v/T + g_i, g_i =
//     GumbelNoise(seed, step, i), in float32 as SampleGumbel computes it,
//     ties to the lowest id.
//
// The draw is from the kept tokens' probabilities renormalised, the usual
// distribution; a token below 2⁻⁴⁰ of the most probable one weighs nothing
// in top-p's sums (and, as a nucleus never ends on a token without mass,
// is never kept when topP < 1). The temperature must be positive and
// finite, topP in (0, 1], minP in [0, 1]. NaN and -Inf logits are never
// drawn; ErrNoCandidates when no logit is finite. Nothing is allocated:
// the cut is found by a radix selection on the logits' bits (11, 11 and 10
// bits), as the device finds it.
func SampleNucleus(logits []float32, temperature, topP, minP float32, seed, step uint64) (int32, error) {
	switch {
	case len(logits) == 0:
		return 0, errors.New("sample: SampleNucleus: no logits")
	case len(logits) > MaxVocab:
		return 0, fmt.Errorf("sample: SampleNucleus: %d logits, more than %d", len(logits), MaxVocab)
	case !(temperature > 0) || math.IsInf(float64(temperature), 1):
		return 0, fmt.Errorf("sample: SampleNucleus: temperature %v, want a positive finite value", temperature)
	case !(topP > 0 && topP <= 1):
		return 0, fmt.Errorf("sample: SampleNucleus: top-p %v outside (0, 1]", topP)
	case !(minP >= 0 && minP <= 1):
		return 0, fmt.Errorf("sample: SampleNucleus: min-p %v outside [0, 1]", minP)
	}
	top := argmax(logits)
	if top < 0 {
		return 0, ErrNoCandidates
	}
	mx, invT := logits[top], 1/float64(temperature)
	cut := nucleusCut{all: true}
	if topP < 1 {
		cut = findCut(logits, mx, invT, topP)
	}
	skey := stepKey(seed, step)
	negInf := float32(math.Inf(-1))
	best, id := float32(0), int32(-1)
	ties := uint64(0)
	for i, v := range logits {
		if !(v > negInf) {
			continue
		}
		if !cut.all {
			k := rankKey(v)
			if k < cut.key {
				continue
			}
			if k == cut.key {
				// Ties at the cut keep the lowest ids: the first n met.
				if ties++; ties > cut.n {
					continue
				}
			}
		}
		if p := prob(v, mx, invT); p == 0 || p < minP {
			continue
		}
		// Tokens run by id, so a tie of scores keeps the first.
		if score := v/temperature + gumbelAt(skey, i); id < 0 || score > best {
			best, id = score, int32(i)
		}
	}
	if id < 0 {
		// Only min-p can drop every token, and it never drops mx's (p = 1).
		return 0, ErrNoCandidates
	}
	return id, nil
}

// massShift is the binary point of top-p's integer masses: q = ⌊p·2⁴⁰⌋.
const massShift = 40

// massOf is a probability's integer mass (exact: p·2⁴⁰ is exact in float64).
func massOf(p float32) uint64 { return uint64(float64(p) * (1 << massShift)) }

// rankKey orders finite logits as top-p ranks them, the larger the
// greater, -0 and +0 as one.
func rankKey(v float32) uint32 {
	if v == 0 {
		v = 0
	}
	b := math.Float32bits(v)
	if b&0x80000000 != 0 {
		return ^b
	}
	return b | 0x80000000
}

// nucleusTarget is ⌈topP·total⌉ for topP in (0, 1), exactly: topP is
// m·2⁻ˢ with an integer m below 2²⁴ and s >= 24, so the product is a
// 128-bit integer shifted right by s, rounded up.
func nucleusTarget(topP float32, total uint64) uint64 {
	b := math.Float32bits(topP)
	e, m := int(b>>23&0xff), uint64(b&0x7fffff)
	if e == 0 {
		e = 1 // subnormal
	} else {
		m |= 1 << 23
	}
	s := uint(150 - e)
	hi, lo := bits.Mul64(m, total)
	var q uint64
	var rem bool
	switch {
	case s >= 128:
		return min(1, hi|lo)
	case s >= 64:
		q, rem = hi>>(s-64), lo != 0 || hi&(1<<(s-64)-1) != 0
	default: // 24 <= s < 64, and hi < 2²¹ as m·total < 2⁸⁵
		q, rem = hi<<(64-s)|lo>>s, lo&(1<<s-1) != 0
	}
	if rem {
		q++
	}
	return q
}

// Radix selection of top-p's cut: the keys' bits from the top in digits of
// 11, 11 and 10 bits (sample.cu's NUC_*).
var nucleusDigits = [3]struct{ shift, bits uint }{{21, 11}, {10, 11}, {0, 10}}

// nucleusCut is where top-p ends: every finite token whose rankKey is
// above key, and the first n (by id) of those equal to it. all: no cut.
type nucleusCut struct {
	all bool
	key uint32
	n   uint64
}

// findCut finds the cut of top-p with target ⌈topP·total⌉ by three passes
// over the logits, each summing the masses of the tokens whose keys share
// the prefix found so far by their next digit, from the largest digit down
// to the one where the running mass reaches what is left of the target.
func findCut(l []float32, mx float32, invT float64, topP float32) nucleusCut {
	var hist [1 << 11]uint64
	negInf := float32(math.Inf(-1))
	prefix, left := uint32(0), uint64(0)
	for level, d := range nucleusDigits {
		clear(hist[:])
		for _, v := range l {
			if !(v > negInf) {
				continue
			}
			k := rankKey(v)
			if level > 0 && k>>(d.shift+d.bits) != prefix {
				continue
			}
			if q := massOf(prob(v, mx, invT)); q > 0 {
				hist[k>>d.shift&(1<<d.bits-1)] += q
			}
		}
		if level == 0 {
			total := uint64(0)
			for _, q := range hist {
				total += q
			}
			left = nucleusTarget(topP, total)
		}
		digit := 1<<d.bits - 1
		for ; digit > 0 && hist[digit] < left; digit-- {
			left -= hist[digit]
		}
		prefix = prefix<<d.bits | uint32(digit)
	}
	// The last digit holds one key: its tokens share one logit, so one
	// mass each; keep enough of them to reach what is left.
	q := massOf(prob(keyLogit(prefix), mx, invT))
	return nucleusCut{key: prefix, n: (left + q - 1) / q}
}

// keyLogit is the logit of a rankKey.
func keyLogit(k uint32) float32 {
	if k&0x80000000 != 0 {
		return math.Float32frombits(k &^ 0x80000000)
	}
	return math.Float32frombits(^k)
}
