package sample

import (
	"math"
	"testing"
)

// Statistical tests: 100,000 draws per case, each token's frequency within
// ±0.01 of its exact probability (the standard error is at most 0.0016, so
// a failure is a wrong distribution, not bad luck; the seeds are fixed
// anyway), and no draw of a token the truncation drops.

const draws = 100_000

// probsLogits returns logits whose softmax at temperature 1 is probs.
func probsLogits(probs ...float64) []float32 {
	l := make([]float32, len(probs))
	for i, p := range probs {
		l[i] = float32(math.Log(p))
	}
	return l
}

// refDist is the chain's distribution computed the slow, obvious way: full
// sort, float64 softmax, prefix sums.
func refDist(l []float32, p Params) []float64 {
	order := refOrder(l)
	if p.TopK > 0 && p.TopK < len(order) {
		order = order[:p.TopK]
	}
	w := make([]float64, len(order))
	sum := 0.0
	for i, id := range order {
		w[i] = math.Exp((float64(l[id]) - float64(l[order[0]])) / float64(p.Temperature))
		sum += w[i]
	}
	keep := len(order)
	if p.TopP > 0 && p.TopP < 1 {
		acc := 0.0
		for i := range w {
			if acc += w[i] / sum; acc >= float64(p.TopP) {
				keep = i + 1
				break
			}
		}
	}
	for i := 1; i < keep; i++ {
		if w[i] < float64(p.MinP)*w[0] {
			keep = i
		}
	}
	dist := make([]float64, len(l))
	kept := 0.0
	for _, x := range w[:keep] {
		kept += x
	}
	for i, id := range order[:keep] {
		dist[id] = w[i] / kept
	}
	return dist
}

// checkFreq compares the counts of draws with want.
func checkFreq(t *testing.T, counts []int, want []float64) {
	t.Helper()
	for id, n := range counts {
		f := float64(n) / draws
		if want[id] == 0 && n > 0 {
			t.Errorf("token %d drawn %d times, but the chain drops it", id, n)
		} else if math.Abs(f-want[id]) > 0.01 {
			t.Errorf("token %d: frequency %.4f, want %.4f ± 0.01", id, f, want[id])
		}
	}
}

func TestDistribution(t *testing.T) {
	six := []float32{1, 2, 0.5, -1, 3, 0}
	known := probsLogits(0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02)
	big := randLogits(400, 1, 9)
	tests := []struct {
		name   string
		logits []float32
		p      Params
		want   []float64 // nil: refDist
	}{
		{"temperature 1", six, Params{Temperature: 1}, nil},
		{"temperature 0.5", six, Params{Temperature: 0.5}, nil},
		{"temperature 2", six, Params{Temperature: 2}, nil},
		{"top-k 3", six, Params{Temperature: 1, TopK: 3}, nil},
		{"top-k 3, temperature 0.7", six, Params{Temperature: 0.7, TopK: 3}, nil},
		{"top-p 0.75 of a known distribution", known, Params{Temperature: 1, TopP: 0.75},
			[]float64{0.4 / 0.8, 0.25 / 0.8, 0.15 / 0.8, 0, 0, 0, 0}},
		{"top-p 0.93 of a known distribution", known, Params{Temperature: 1, TopP: 0.93},
			[]float64{0.4 / 0.95, 0.25 / 0.95, 0.15 / 0.95, 0.1 / 0.95, 0.05 / 0.95, 0, 0}},
		{"min-p 0.5 of a known distribution", known, Params{Temperature: 1, MinP: 0.5},
			[]float64{0.4 / 0.65, 0.25 / 0.65, 0, 0, 0, 0, 0}},
		{"min-p 0.2 after top-p 0.93", known, Params{Temperature: 1, TopP: 0.93, MinP: 0.2},
			[]float64{0.4 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0.1 / 0.9, 0, 0, 0}},
		{"top-p over 400 tokens", big, Params{Temperature: 1, TopP: 0.8}, nil},
		{"the whole chain over 400 tokens", big, Params{Temperature: 0.8, TopK: 300, TopP: 0.9, MinP: 0.02}, nil},
		// Top-k chains of at most MaxDrawTopK draw by SampleTopK.
		{"top-k 6, top-p 0.93 of a known distribution", known, Params{Temperature: 1, TopK: 6, TopP: 0.93},
			[]float64{0.4 / 0.95, 0.25 / 0.95, 0.15 / 0.95, 0.1 / 0.95, 0.05 / 0.95, 0, 0}},
		{"top-k 7, min-p 0.2 after top-p 0.93", known, Params{Temperature: 1, TopK: 7, TopP: 0.93, MinP: 0.2},
			[]float64{0.4 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0.1 / 0.9, 0, 0, 0}},
		{"llama.cpp's defaults over 400 tokens", big, Params{Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05}, nil},
		{"top-k 64, min-p 0.2, temperature 1.3 over 400 tokens", big, Params{Temperature: 1.3, TopK: 64, MinP: 0.2}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.want
			if want == nil {
				want = refDist(tt.logits, tt.p)
			} else {
				ref := refDist(tt.logits, tt.p)
				for i := range want {
					if math.Abs(ref[i]-want[i]) > 1e-6 {
						t.Fatalf("refDist %v disagrees with the expected %v", ref, want)
					}
				}
			}
			tt.p.Seed = 1234
			s, err := New(tt.p, len(tt.logits))
			if err != nil {
				t.Fatal(err)
			}
			counts := make([]int, len(tt.logits))
			for range draws {
				tok, err := s.Sample(tt.logits, nil)
				if err != nil {
					t.Fatal(err)
				}
				counts[tok]++
			}
			checkFreq(t, counts, want)
		})
	}
}

func TestGumbelDistribution(t *testing.T) {
	six := []float32{1, 2, 0.5, -1, 3, 0}
	for _, temp := range []float32{1, 0.5, 2} {
		counts := make([]int, len(six))
		for step := range uint64(draws) {
			tok, err := SampleGumbel(six, temp, 77, step)
			if err != nil {
				t.Fatal(err)
			}
			counts[tok]++
		}
		checkFreq(t, counts, refDist(six, Params{Temperature: temp}))
	}
}
