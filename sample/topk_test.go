package sample

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// rankedFinite returns the ids of l's finite logits ranked from the
// largest, ties to the lower id.
func rankedFinite(l []float32) []int32 {
	var order []int32
	for i, v := range l {
		if v > float32(math.Inf(-1)) {
			order = append(order, int32(i))
		}
	}
	sortByLogit(l, order) // ids ascending, so ties keep the lower id first
	return order
}

// refPick is the Gumbel-max draw among the ids of l that keep accepts
// (i: the id's place in ids), ties to the lowest id; -1 when none.
func refPick(l []float32, ids []int32, keep func(i int, id int32) bool, temp float32, seed, step uint64) int32 {
	best, win := float32(0), int32(-1)
	for i, id := range ids {
		if !keep(i, id) {
			continue
		}
		score := l[id]/temp + GumbelNoise(seed, step, int(id))
		if win < 0 || score > best || score == best && id < win {
			best, win = score, id
		}
	}
	return win
}

// hardLogits returns n logits made to be hard for a draw: -Inf, NaN, +Inf
// (when inf), -0 and +0 among them, the rest normal (sd 2) when normal or
// else on a few levels scale apart, so that many tie.
func hardLogits(r *rand.Rand, n int, inf, normal bool, scale float32) []float32 {
	l := make([]float32, n)
	levels := 1 + r.IntN(40)
	for i := range l {
		switch x := r.IntN(100); {
		case x < 3:
			l[i] = float32(math.Inf(-1))
		case x < 5:
			l[i] = float32(math.NaN())
		case x == 5 && inf:
			l[i] = float32(math.Inf(1))
		case x == 6:
			l[i] = float32(math.Copysign(0, -1))
		case x == 7:
			l[i] = 0
		case normal:
			l[i] = float32(r.NormFloat64() * 2)
		default:
			l[i] = float32(r.IntN(levels))*scale - 3*scale
		}
	}
	return l
}

// refTopK is SampleTopK's procedure written the obvious way: a full sort
// of the finite logits, then the same probabilities, sums and noise.
func refTopK(l []float32, temp float32, k int, topP, minP float32, seed, step uint64) int32 {
	order := rankedFinite(l)
	if len(order) == 0 {
		return -1
	}
	order = order[:min(k, len(order))]
	invT := 1 / float64(temp)
	p := make([]float32, len(order))
	total := 0.0
	for i, id := range order {
		p[i] = prob(l[id], l[order[0]], invT)
		total += float64(p[i])
	}
	n := len(order)
	if topP < 1 {
		acc := 0.0
		for i := range p {
			if acc += float64(p[i]); acc >= float64(topP)*total {
				n = i + 1
				break
			}
		}
	}
	return refPick(l, order[:n], func(i int, _ int32) bool { return p[i] != 0 && p[i] >= minP }, temp, seed, step)
}

// TestSampleTopK: SampleTopK against refTopK on logits with many ties (a
// few levels), non-finite values, and every truncation setting, over many
// steps; and its errors.
func TestSampleTopK(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for trial := range 300 {
		n := []int{1, 2, 7, 64, 65, 500, 3000}[trial%7]
		l := hardLogits(r, n, trial%11 == 0, false, 0.37)
		k := []int{1, 2, 5, 40, MaxDrawTopK}[r.IntN(5)]
		temp := []float32{0.05, 0.8, 1, 2.5}[r.IntN(4)]
		topP := []float32{1, 0.95, 0.5, 0.1}[r.IntN(4)]
		minP := []float32{0, 0.05, 0.5, 1}[r.IntN(4)]
		for step := range uint64(8) {
			want := refTopK(l, temp, k, topP, minP, 99, step)
			got, err := SampleTopK(l, temp, k, topP, minP, 99, step)
			if want < 0 {
				if !errors.Is(err, ErrNoCandidates) {
					t.Fatalf("trial %d: every logit non-finite: %d, %v", trial, got, err)
				}
				continue
			}
			if err != nil || got != want {
				t.Fatalf("trial %d (n %d, k %d, T %v, top-p %v, min-p %v) step %d: SampleTopK = %d, %v; reference %d",
					trial, n, k, temp, topP, minP, step, got, err, want)
			}
		}
	}
	l := []float32{1, 2, 3}
	for _, c := range []struct {
		temp       float32
		k          int
		topP, minP float32
	}{
		{0, 2, 1, 0}, {float32(math.Inf(1)), 2, 1, 0}, {float32(math.NaN()), 2, 1, 0}, {1, 0, 1, 0}, {1, MaxDrawTopK + 1, 1, 0},
		{1, 2, 0, 0}, {1, 2, 1.5, 0}, {1, 2, 1, -0.1}, {1, 2, 1, 2}, {1, 2, float32(math.NaN()), 0},
	} {
		if _, err := SampleTopK(l, c.temp, c.k, c.topP, c.minP, 1, 0); err == nil || errors.Is(err, ErrNoCandidates) {
			t.Errorf("%+v: err %v, want a parameter error", c, err)
		}
	}
	if _, err := SampleTopK(nil, 1, 2, 1, 0, 1, 0); err == nil {
		t.Error("no logits: no error")
	}
}

// TestExpNegPortable pins expNeg's results, which SampleTopK's device
// twin (sample.cu's exp_neg) reproduces: an FNV-1a hash of its float32 bits
// at 200,001 points of [-104, 0], so that an edit of the formula, or a
// product fused into a sum, shows; and each within an ulp of math.Exp's.
func TestExpNegPortable(t *testing.T) {
	h := uint64(14695981039346656037)
	for i := range 200_001 {
		x := -104 * float64(i) / 200_000
		got := expNeg(x)
		if ref := float32(math.Exp(x)); math.Abs(float64(got-ref)) > float64(math.Nextafter32(ref, 2)-ref) {
			t.Fatalf("expNeg(%v) = %v, math.Exp %v", x, got, ref)
		}
		b := math.Float32bits(got)
		for range 4 {
			h = (h ^ uint64(b&0xff)) * 1099511628211
			b >>= 8
		}
	}
	if h != expNegHash {
		t.Errorf("expNeg's hash %#x, want %#x", h, uint64(expNegHash))
	}
}

const expNegHash = 0xff5cec655dd96138
