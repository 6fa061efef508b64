package sample

import "math"

// argmax returns the id of the largest logit, the lowest id among equals,
// or -1 when every logit is -Inf or NaN (NaN never compares greater).
func argmax(l []float32) int32 {
	best, id := float32(math.Inf(-1)), int32(-1)
	for i, v := range l {
		if v > best {
			best, id = v, int32(i)
		}
	}
	return id
}

// worse orders candidates from least to most likely: by value, then the
// higher id first, so that ties keep the lowest ids.
func worse(a, b cand) bool { return a.v < b.v || (a.v == b.v && a.id > b.id) }

// topK returns in dst (len 0, cap >= k) the k tokens with the largest
// finite logits, ties to the lowest ids, in no particular order. It keeps
// a min-heap of the best k seen so far: one comparison with the root per
// logit once the heap is full, so O(vocab + k·log k) on typical logits.
func topK(l []float32, k int, dst []cand) []cand {
	h := dst[:0]
	negInf := float32(math.Inf(-1))
	for i, v := range l {
		if len(h) < k {
			if v > negInf {
				h = append(h, cand{int32(i), v})
				siftUp(h, len(h)-1)
			}
			continue
		}
		// A later id never wins a tie, so strictly greater is the test.
		if v > h[0].v {
			h[0] = cand{int32(i), v}
			siftDown(h, 0)
		}
	}
	return h
}

func siftUp(h []cand, i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !worse(h[i], h[parent]) {
			return
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
}

func siftDown(h []cand, i int) {
	for {
		m := i
		if l := 2*i + 1; l < len(h) && worse(h[l], h[m]) {
			m = l
		}
		if r := 2*i + 2; r < len(h) && worse(h[r], h[m]) {
			m = r
		}
		if m == i {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

// underflow is the exponent below which exp() rounds to zero in float32;
// such tokens have probability 0 and are dropped.
const underflow = -104

// prob is exp((v - max)/T), the softmax numerator scaled so that the most
// probable token has exactly 1; 0 for -Inf, NaN and what underflows.
func prob(v, mx float32, invT float64) float32 {
	if v == mx {
		return 1 // also when max is +Inf, where v - max is NaN
	}
	e := (float64(v) - float64(mx)) * invT
	if !(e >= underflow) {
		return 0
	}
	return expNeg(e)
}

// expNeg returns e^x for x in [underflow, 0], rounded to float32: within
// one float32 ulp of the exact value (and equal to float32(math.Exp(x))
// for all but about 0.02% of inputs) at half math.Exp's cost, which is most
// of the softmax's. e^x = 2^k · e^r with k = round(x/ln 2), |r| <= ln(2)/2,
// and e^r by its Taylor polynomial to r^8, whose truncation error is below
// 1e-8 relative.
//
// Every product is rounded before the sum it feeds (the conversions forbid
// fused multiply-adds, which Go may use on some architectures), so the
// result is the same on every machine and on a GPU that rounds each
// operation the same way (sample.cu's exp_neg): SampleTopK depends on it.
func expNeg(x float64) float32 {
	k := int64(float64(x*math.Log2E) - 0.5) // truncation toward zero: x*log2(e) rounded, as x <= 0
	r := x - float64(float64(k)*math.Ln2)
	q := float64(r * (1. / 40320)) // Horner's rule for the Taylor polynomial, innermost first
	q = float64(r * (1./5040 + q))
	q = float64(r * (1./720 + q))
	q = float64(r * (1./120 + q))
	q = float64(r * (1./24 + q))
	q = float64(r * (1./6 + q))
	q = float64(r * (1./2 + q))
	q = float64(r * (1 + q))
	p := 1 + q
	return float32(p * math.Float64frombits(uint64(k+1023)<<52))
}

// softmaxLogits writes to dst the tokens of l, whose maximum is mx, with
// probability above 0, and returns them with their total. h, when not nil,
// receives the mass histogram (zero on entry).
func softmaxLogits(l []float32, mx float32, invT float64, dst []cand, h *massHist) ([]cand, float64) {
	total := 0.0
	for i, v := range l {
		if p := prob(v, mx, invT); p > 0 {
			dst = append(dst, cand{int32(i), p})
			total += float64(p)
			if h != nil {
				h[bucket(p)] += float64(p)
			}
		}
	}
	return dst, total
}

// softmaxCands is softmaxLogits for candidates whose values are logits,
// rewritten in place.
func softmaxCands(c []cand, invT float64, h *massHist) ([]cand, float64) {
	mx := c[0].v
	for _, x := range c[1:] {
		mx = max(mx, x.v)
	}
	n, total := 0, 0.0
	for _, x := range c {
		if p := prob(x.v, mx, invT); p > 0 {
			c[n] = cand{x.id, p}
			n++
			total += float64(p)
			if h != nil {
				h[bucket(p)] += float64(p)
			}
		}
	}
	return c[:n], total
}

// massHist is the probability mass of the candidates by bucket of their
// probability p in (0, 1]: bucket b holds p whose float32 bits lie in
// (one - (b+1)·2²⁰, one - b·2²⁰], one being the bits of 1.0: eight
// buckets per power of two, each at most 12.5% wide, the most probable
// first. Built during the softmax, it tells top-p where its boundary lies
// without ranking anything.
type massHist [oneBits>>bucketShift + 1]float64

const (
	oneBits     = 0x3f800000 // math.Float32bits(1)
	bucketShift = 20         // 23 mantissa bits - 3 kept
)

func bucket(p float32) uint32 { return (oneBits - math.Float32bits(p)) >> bucketShift }

// nucleusBounds returns bounds on the probability of the last token of the
// nucleus of target mass: every candidate above hi belongs to it, none
// below lo does. (0, 0) when rounding left the target out of reach.
func nucleusBounds(h *massHist, target float64) (lo, hi float32) {
	acc := 0.0
	for b := range h {
		if acc += h[b]; acc >= target {
			return math.Float32frombits(oneBits - uint32(b+1)<<bucketShift + 1),
				math.Float32frombits(oneBits - uint32(b)<<bucketShift)
		}
	}
	return 0, 0
}

// keepAtLeast keeps, in order, the candidates whose value is at least
// floor: min-p (the most probable token has 1) and the tokens of top-p's
// histogram buckets that may still belong to the nucleus.
func keepAtLeast(c []cand, floor float32) []cand {
	n := 0
	for _, x := range c {
		if x.v >= floor {
			c[n] = x
			n++
		}
	}
	return c[:n]
}

// sortCutoff is the size below which nucleus sorts instead of partitioning.
const sortCutoff = 24

// nucleus reorders c so that c[:m] is the smallest set of most probable
// candidates whose mass reaches target, and returns m (len(c) when the
// whole mass falls short, as rounding may make it). It is a quickselect on
// mass: partition around a pivot into greater, equal and smaller; if the
// greater part alone reaches the target the answer lies inside it,
// otherwise that part is kept whole and the search goes on below. Expected
// O(len(c)); only the last few candidates are sorted. Ties at the boundary
// are kept in the order the partition leaves them (deterministic).
//
// pivot, when positive, is the first pivot: nucleusBounds' hi, which puts
// all but the boundary bucket on the right side in one pass.
func nucleus(c []cand, target float64, pivot float32) int {
	lo, hi := 0, len(c)
	acc := 0.0 // mass of c[:lo], all kept; below target
	for hi-lo > sortCutoff {
		if pivot <= 0 {
			pivot = median3(c[lo].v, c[lo+(hi-lo)/2].v, c[hi-1].v)
		}
		gt, eq := partition3(c[lo:hi], pivot)
		gMass := mass(c[lo : lo+gt])
		switch {
		case acc+gMass >= target:
			hi = lo + gt
		case acc+gMass+mass(c[lo+gt:lo+gt+eq]) >= target:
			acc += gMass
			for i := lo + gt; i < lo+gt+eq; i++ {
				acc += float64(c[i].v)
				if acc >= target {
					return i + 1
				}
			}
			return lo + gt + eq
		default:
			acc += gMass + mass(c[lo+gt:lo+gt+eq])
			lo += gt + eq
		}
		pivot = 0
	}
	sortDesc(c[lo:hi])
	for i := lo; i < hi; i++ {
		acc += float64(c[i].v)
		if acc >= target {
			return i + 1
		}
	}
	return hi
}

func mass(c []cand) float64 {
	s := 0.0
	for _, x := range c {
		s += float64(x.v)
	}
	return s
}

func median3(a, b, c float32) float32 {
	if a > b {
		a, b = b, a
	}
	if b > c {
		b = c
	}
	if a > b {
		return a
	}
	return b
}

// partition3 reorders c into values > pivot, == pivot, < pivot and returns
// the sizes of the first two parts (Dijkstra's three-way partition).
func partition3(c []cand, pivot float32) (gt, eq int) {
	lt, i, hi := 0, 0, len(c)
	for i < hi {
		switch v := c[i].v; {
		case v > pivot:
			c[lt], c[i] = c[i], c[lt]
			lt++
			i++
		case v < pivot:
			hi--
			c[i], c[hi] = c[hi], c[i]
		default:
			i++
		}
	}
	return lt, hi - lt
}

// sortDesc sorts a few candidates from most to least likely, ties to the
// lowest id (insertion sort: c is at most sortCutoff long).
func sortDesc(c []cand) {
	for i := 1; i < len(c); i++ {
		for j := i; j > 0 && worse(c[j-1], c[j]); j-- {
			c[j-1], c[j] = c[j], c[j-1]
		}
	}
}

// draw picks a candidate with probability proportional to its value: the
// first whose running mass exceeds u times total, u in [0, 1), where
// total is the mass of c summed in order (so the last candidate's running
// mass is total, to the bit).
func draw(c []cand, total, u float64) int32 {
	target := u * total
	acc := 0.0
	for _, x := range c {
		acc += float64(x.v)
		if target < acc {
			return x.id
		}
	}
	return c[len(c)-1].id
}
