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
	n := nucleusDraw{l: logits, mx: logits[top], invT: 1 / float64(temperature), t: temperature, minP: minP,
		skey: stepKey(seed, step), id: -1}
	if topP >= 1 {
		for i := range logits {
			n.offer(i, true)
		}
	} else {
		n.cutAndDraw(topP)
	}
	if n.id < 0 {
		// Only min-p can drop every token, and it never drops mx's (p = 1).
		return 0, ErrNoCandidates
	}
	return n.id, nil
}

// nucleusDraw is SampleNucleus's draw in progress: the best score so far
// and its token.
type nucleusDraw struct {
	l        []float32
	mx       float32
	invT     float64
	t, minP  float32
	skey     uint64
	best     float32
	id       int32
	hist     [1 << 11]uint64
	inBucket [2048]int32 // the tokens of the cut's first digit, while they fit
}

// offer considers token i for the draw: any finite logit whose
// probability is not 0 and not below min-p (needP: with a cut, tokens
// above it have p > 0, so min-p alone asks for p).
func (n *nucleusDraw) offer(i int, needP bool) {
	v := n.l[i]
	if !(v > float32(math.Inf(-1))) {
		return
	}
	if needP || n.minP > 0 {
		if p := prob(v, n.mx, n.invT); p == 0 || p < n.minP {
			return
		}
	}
	vT, h := v/n.t, tokenHash(n.skey, i)
	if n.id >= 0 && !mayReach(h, vT, n.best) {
		return
	}
	if score := vT + gumbelOf(h); n.id < 0 || score > n.best || score == n.best && int32(i) < n.id {
		n.best, n.id = score, int32(i)
	}
}

// digit finds, in hist, the digit of d.bits bits where the masses from the
// largest digit down reach left, and returns it with what is left of left
// within it.
func (n *nucleusDraw) digit(bits uint, left uint64) (uint32, uint64) {
	d := 1<<bits - 1
	for ; d > 0 && n.hist[d] < left; d-- {
		left -= n.hist[d]
	}
	return uint32(d), left
}

// cutAndDraw finds top-p's cut by a radix selection (sample.cu's
// nucleus_pass) and draws among the tokens it keeps, in three passes over
// the logits: the first digit's masses; the second digit's masses of the
// tokens within the first, listed while they fit, with the tokens above
// the first digit drawn from on the way; then the third digit over that
// list (or every token, if it overflowed) and the draw from the rest.
func (n *nucleusDraw) cutAndDraw(topP float32) {
	l, mx, fmx := n.l, n.mx, float64(n.mx)
	d0, d1, d2 := nucleusDigits[0], nucleusDigits[1], nucleusDigits[2]
	for _, v := range l {
		// prob's arithmetic, written out for speed; below e^-28 (< 2^-40)
		// a token has no mass, so its exp is not needed.
		x := (float64(v) - fmx) * n.invT
		if !(x >= -28) && v != mx { // NaN, -Inf and no mass
			continue
		}
		q := uint64(1 << massShift)
		if v != mx {
			q = massOf(expNeg(x))
		}
		n.hist[rankKey(v)>>d0.shift] += q
	}
	total := uint64(0)
	for _, q := range n.hist {
		total += q
	}
	first, left := n.digit(d0.bits, nucleusTarget(topP, total))

	clear(n.hist[:])
	listed, over := 0, false
	// The first digit's bounds as logits: rankKey is monotonic, so a
	// token's digit is above first when v >= hi and is first when lo <= v
	// < hi. first holds a token with mass, so lo is finite; hi is NaN
	// (nothing compares above it) when first holds +Inf.
	lo, hi := keyLogit((first)<<d0.shift), keyLogit((first+1)<<d0.shift)
	for i, v := range l {
		switch {
		case v >= hi:
			n.offer(i, false)
		case v >= lo:
			k := rankKey(v)
			n.hist[k>>d1.shift&(1<<d1.bits-1)] += massOf(prob(v, mx, n.invT))
			if listed < len(n.inBucket) {
				n.inBucket[listed] = int32(i)
				listed++
			} else {
				over = true
			}
		}
	}
	negInf := float32(math.Inf(-1))
	second, left := n.digit(d1.bits, left)

	// The tokens of the first digit, in id order.
	bucket := func(yield func(int, uint32) bool) {
		if !over {
			for _, i := range n.inBucket[:listed] {
				if !yield(int(i), rankKey(l[i])) {
					return
				}
			}
			return
		}
		for i, v := range l {
			if v > negInf {
				if k := rankKey(v); k>>d0.shift == first && !yield(i, k) {
					return
				}
			}
		}
	}
	prefix := first<<d1.bits | second
	clear(n.hist[:])
	for i, k := range bucket {
		if k>>d2.bits == prefix {
			n.hist[k&(1<<d2.bits-1)] += massOf(prob(l[i], mx, n.invT))
		}
	}
	third, left := n.digit(d2.bits, left)
	key := prefix<<d2.bits | third
	// The last digit holds one key: its tokens share one logit, so one
	// mass each; the cut keeps enough of them (the first by id) to reach
	// what is left.
	q := massOf(prob(keyLogit(key), mx, n.invT))
	keep := (left + q - 1) / q
	for i, k := range bucket {
		switch {
		case k > key:
			n.offer(i, false)
		case k == key && keep > 0:
			keep--
			n.offer(i, false)
		}
	}
}

// massShift is the binary point of top-p's integer masses: q = ⌊p·2⁴⁰⌋.
const massShift = 40

// massOf is a probability's integer mass (exact: p·2⁴⁰ is exact in float64,
// and below 2⁶³, so the signed conversion, cheaper than the unsigned one,
// serves).
func massOf(p float32) uint64 { return uint64(int64(float64(p) * (1 << massShift))) }

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

// keyLogit is the logit of a rankKey.
func keyLogit(k uint32) float32 {
	if k&0x80000000 != 0 {
		return math.Float32frombits(k &^ 0x80000000)
	}
	return math.Float32frombits(^k)
}
