package sample

import (
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// refNucleus is SampleNucleus's procedure written the obvious way: a full
// sort of the finite logits, the masses summed in rank order, the target
// by exact rational arithmetic, then the same noise.
func refNucleus(l []float32, temp, topP, minP float32, seed, step uint64) int32 {
	order := rankedFinite(l)
	if len(order) == 0 {
		return -1
	}
	invT := 1 / float64(temp)
	mx := l[order[0]]
	n := len(order)
	if topP < 1 {
		total := new(big.Int)
		for _, id := range order {
			total.Add(total, new(big.Int).SetUint64(massOf(prob(l[id], mx, invT))))
		}
		// ⌈topP·total⌉ as a rational.
		t := new(big.Rat).Mul(new(big.Rat).SetFloat64(float64(topP)), new(big.Rat).SetInt(total))
		target := new(big.Int).Quo(t.Num(), t.Denom())
		if new(big.Rat).SetInt(target).Cmp(t) < 0 {
			target.Add(target, big.NewInt(1))
		}
		acc := new(big.Int)
		for i, id := range order {
			if acc.Add(acc, new(big.Int).SetUint64(massOf(prob(l[id], mx, invT)))); acc.Cmp(target) >= 0 {
				n = i + 1
				break
			}
		}
	}
	return refPick(l, order[:n], func(_ int, id int32) bool {
		p := prob(l[id], mx, invT)
		return p != 0 && p >= minP
	}, temp, seed, step)
}

// TestSampleNucleus: SampleNucleus against refNucleus on logits with many
// ties (a few levels, so that the cut often falls inside a run of equal
// logits), non-finite values, ±0, flat and peaked rows, at every setting
// over many steps; and its errors.
func TestSampleNucleus(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for trial := range 400 {
		n := []int{1, 2, 7, 64, 500, 3000, 20000}[trial%7]
		l := hardLogits(r, n, trial%11 == 0, trial%3 == 0, []float32{0.37, 0.001, 3, 1e-30}[r.IntN(4)])
		temp := []float32{0.05, 0.8, 1, 2.5, 100}[r.IntN(5)]
		topP := []float32{1, 0.95, 0.5, 0.1, 1e-9, 0.9999999}[r.IntN(6)]
		minP := []float32{0, 0.05, 0.5, 1}[r.IntN(4)]
		for step := range uint64(6) {
			want := refNucleus(l, temp, topP, minP, 5, step)
			got, err := SampleNucleus(l, temp, topP, minP, 5, step)
			if want < 0 {
				if !errors.Is(err, ErrNoCandidates) {
					t.Fatalf("trial %d: every logit non-finite: %d, %v", trial, got, err)
				}
				continue
			}
			if err != nil || got != want {
				t.Fatalf("trial %d (n %d, T %v, top-p %v, min-p %v) step %d: SampleNucleus = %d, %v; reference %d",
					trial, n, temp, topP, minP, step, got, err, want)
			}
		}
	}
	l := []float32{1, 2, 3}
	for _, c := range []struct{ temp, topP, minP float32 }{
		{0, 0.9, 0}, {float32(math.Inf(1)), 0.9, 0}, {float32(math.NaN()), 0.9, 0}, {1, 0, 0}, {1, 1.5, 0},
		{1, 0.9, -0.1}, {1, 0.9, 2}, {1, float32(math.NaN()), 0}, {1, 0.9, float32(math.NaN())},
	} {
		if _, err := SampleNucleus(l, c.temp, c.topP, c.minP, 1, 0); err == nil || errors.Is(err, ErrNoCandidates) {
			t.Errorf("%+v: err %v, want a parameter error", c, err)
		}
	}
	if _, err := SampleNucleus(nil, 1, 0.9, 0, 1, 0); err == nil {
		t.Error("no logits: no error")
	}
	if _, err := SampleNucleus([]float32{float32(math.NaN()), float32(math.Inf(-1))}, 1, 0.9, 0, 1, 0); !errors.Is(err, ErrNoCandidates) {
		t.Errorf("no finite logit: %v, want ErrNoCandidates", err)
	}
}

// TestNucleusCutTies: a cut inside a run of equal logits keeps the lowest
// ids of the run, as many as reach the target: one logit of 5 and ten of
// 0 at temperature 1, where each 0 weighs e⁻⁵ of the 5, so top-p 0.95
// keeps the 5 and the first three 0s (ids 0, 1, 2), 0.999 all ten.
func TestNucleusCutTies(t *testing.T) {
	l := []float32{0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0}
	for _, c := range []struct {
		topP float32
		kept []int32
	}{{0.5, []int32{3}}, {0.95, []int32{0, 1, 2, 3}}, {0.999, []int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}} {
		seen := map[int32]int{}
		for step := range uint64(5000) {
			id, err := SampleNucleus(l, 1, c.topP, 0, 77, step)
			if err != nil {
				t.Fatal(err)
			}
			seen[id]++
		}
		if len(seen) != len(c.kept) {
			t.Errorf("top-p %v: drew %v, want each of %v", c.topP, seen, c.kept)
		}
		for _, id := range c.kept {
			if seen[id] == 0 {
				t.Errorf("top-p %v: drew %v, want each of %v", c.topP, seen, c.kept)
			}
		}
	}
}

// TestNucleusCrowdedDigit: a first digit holding more tokens than the
// draw lists (5,000 logits within [1, 1.25)) takes the passes over the
// whole row, with the same draws as the reference.
func TestNucleusCrowdedDigit(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	l := make([]float32, 5000)
	for i := range l {
		l[i] = 1 + float32(r.IntN(3000))*1e-5
	}
	for _, topP := range []float32{0.9, 0.5, 0.01} {
		for step := range uint64(20) {
			want := refNucleus(l, 0.05, topP, 0, 3, step)
			if got, err := SampleNucleus(l, 0.05, topP, 0, 3, step); err != nil || got != want {
				t.Fatalf("top-p %v, step %d: SampleNucleus = %d, %v; reference %d", topP, step, got, err, want)
			}
		}
	}
}

// TestNucleusTarget: ⌈topP·total⌉ against exact rationals, for top-p's
// of every exponent (subnormals among them) and totals up to 2⁶¹.
func TestNucleusTarget(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	check := func(topP float32, total uint64) {
		t.Helper()
		x := new(big.Rat).Mul(new(big.Rat).SetFloat64(float64(topP)), new(big.Rat).SetInt(new(big.Int).SetUint64(total)))
		want := new(big.Int).Quo(x.Num(), x.Denom())
		if new(big.Rat).SetInt(want).Cmp(x) < 0 {
			want.Add(want, big.NewInt(1))
		}
		if got := nucleusTarget(topP, total); !want.IsUint64() || got != want.Uint64() {
			t.Fatalf("nucleusTarget(%v, %d) = %d, want %v", topP, total, got, want)
		}
	}
	for range 20000 {
		topP := math.Float32frombits(r.Uint32N(math.Float32bits(1)))
		if topP == 0 {
			continue
		}
		total := r.Uint64N(1<<61) + 1
		if r.IntN(4) == 0 {
			total = r.Uint64N(1000) + 1
		}
		check(topP, total)
	}
	for _, topP := range []float32{math.SmallestNonzeroFloat32, 0.5, math.Nextafter32(1, 0), 1e-20, 0.95} {
		for _, total := range []uint64{1, 2, 3, 1 << 40, 1<<61 - 1, 1 << 61} {
			check(topP, total)
		}
	}
}

// TestRankKey: keys order finite logits as float comparison does, with -0
// and +0 equal, and keyLogit inverts them.
func TestRankKey(t *testing.T) {
	vals := []float32{float32(math.Inf(-1)), -math.MaxFloat32, -3, -1e-30, -math.SmallestNonzeroFloat32,
		float32(math.Copysign(0, -1)), 0, math.SmallestNonzeroFloat32, 1e-30, 1, 3, math.MaxFloat32, float32(math.Inf(1))}
	for i, a := range vals {
		for j, b := range vals {
			ka, kb := rankKey(a), rankKey(b)
			if (a < b) != (ka < kb) || (a == b) != (ka == kb) {
				t.Errorf("rankKey(%v) = %#x, rankKey(%v) = %#x: order %d, %d", a, ka, b, kb, i, j)
			}
		}
		if got := keyLogit(rankKey(a)); got != a {
			t.Errorf("keyLogit(rankKey(%v)) = %v", a, got)
		}
	}
}
