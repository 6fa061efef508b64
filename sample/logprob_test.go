package sample

import (
	"math"
	"slices"
	"testing"
)

func TestLogSumExp(t *testing.T) {
	tests := []struct {
		name   string
		logits []float32
		want   float64
	}{
		{"one", []float32{2}, 2},
		{"two equal", []float32{0, 0}, math.Ln2},
		{"large, no overflow", []float32{1000, 1000}, 1000 + math.Ln2},
		{"small, no underflow", []float32{-1000, -1000, -1000, -1000}, -1000 + 2*math.Ln2},
		{"mixed", []float32{1, 2, 3}, math.Log(math.E + math.E*math.E + math.E*math.E*math.E)},
		{"-Inf and NaN count as nothing", []float32{negInf, 0, nan}, 0},
		{"all -Inf", []float32{negInf, nan}, math.Inf(-1)},
		{"empty", nil, math.Inf(-1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := LogSumExp(tt.logits)
			if float32(tt.want) != got && math.Abs(float64(got)-tt.want) > 1e-6*math.Abs(tt.want) {
				t.Errorf("LogSumExp = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestLogSoftmax(t *testing.T) {
	l := []float32{1, negInf, 3, nan, -2, 3}
	dst := make([]float32, 0, 3) // too short: grown
	got := LogSoftmax(l, dst)
	sum := 0.0
	for i, v := range got {
		if (i == 1 || i == 3) != math.IsInf(float64(v), -1) {
			t.Errorf("log p[%d] = %v; -Inf exactly for the -Inf and NaN logits", i, v)
		}
		sum += math.Exp(float64(v))
	}
	if math.Abs(sum-1) > 1e-6 {
		t.Errorf("probabilities sum to %v", sum)
	}
	if d := got[2] - got[0]; math.Abs(float64(d)-2) > 1e-6 {
		t.Errorf("log p[2] - log p[0] = %v, want 2", d)
	}
	if again := LogSoftmax(l, got); &again[0] != &got[0] {
		t.Error("LogSoftmax did not reuse a large enough dst")
	}
}

func TestTopLogProbs(t *testing.T) {
	l := []float32{0.5, 2, negInf, 2, nan, -1, 3, 0.5}
	full := LogSoftmax(l, nil)
	tests := []struct {
		n    int
		want []int32
	}{
		{0, nil},
		{-3, nil},
		{1, []int32{6}},
		{3, []int32{6, 1, 3}},
		{5, []int32{6, 1, 3, 0, 7}},
		{20, []int32{6, 1, 3, 0, 7, 5}},
	}
	for _, tt := range tests {
		got := TopLogProbs(l, tt.n, make([]TokenLogProb, 0, 2))
		var ids []int32
		for _, x := range got {
			ids = append(ids, x.ID)
			if x.LogProb != full[x.ID] {
				t.Errorf("n=%d: token %d log p %v, LogSoftmax gives %v", tt.n, x.ID, x.LogProb, full[x.ID])
			}
		}
		if !slices.Equal(ids, tt.want) {
			t.Errorf("n=%d: tokens %v, want %v (most probable first, ties to the lowest id)", tt.n, ids, tt.want)
		}
	}
	if got := TopLogProbs([]float32{negInf, nan}, 3, nil); len(got) != 0 {
		t.Errorf("all -Inf/NaN gave %v", got)
	}
	// Against a full sort of random logits with ties.
	r := randLogits(5000, 3, 8)
	for i := range r {
		r[i] = float32(math.Round(float64(r[i])*4) / 4)
	}
	order := refOrder(r)
	got := TopLogProbs(r, 50, nil)
	for i, x := range got {
		if x.ID != order[i] {
			t.Fatalf("rank %d: token %d, want %d", i, x.ID, order[i])
		}
	}
}

func TestTokenLogProbs(t *testing.T) {
	l := []float32{0.5, 2, negInf, 2, nan, -1, 3, 0.5}
	full := LogSoftmax(l, nil)
	for id := range l {
		for _, n := range []int{0, 2, 20} {
			lp, top := TokenLogProbs(l, int32(id), n, nil)
			if lp != full[id] {
				t.Errorf("token %d: log p %v, LogSoftmax gives %v", id, lp, full[id])
			}
			if want := TopLogProbs(l, n, nil); !slices.Equal(top, want) {
				t.Errorf("token %d, n=%d: top %v, TopLogProbs gives %v", id, n, top, want)
			}
		}
	}
	if lp, top := TokenLogProbs([]float32{negInf, nan}, 0, 3, nil); !math.IsInf(float64(lp), -1) || len(top) != 0 {
		t.Errorf("all -Inf or NaN: log p %v, top %v; want -Inf and none", lp, top)
	}
}
