package sample

import (
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

var (
	inf    = float32(math.Inf(1))
	negInf = float32(math.Inf(-1))
	nan    = float32(math.NaN())
)

func TestNewValidation(t *testing.T) {
	tests := []struct {
		name  string
		p     Params
		vocab int
		field string // "" for a vocabulary error
	}{
		{"vocab zero", Params{}, 0, ""},
		{"vocab huge", Params{}, MaxVocab + 1, ""},
		{"negative temperature", Params{Temperature: -0.1}, 10, "Temperature"},
		{"NaN temperature", Params{Temperature: nan}, 10, "Temperature"},
		{"infinite temperature", Params{Temperature: inf}, 10, "Temperature"},
		{"negative top_k", Params{TopK: -1}, 10, "TopK"},
		{"negative top_p", Params{TopP: -0.5}, 10, "TopP"},
		{"top_p above 1", Params{TopP: 1.01}, 10, "TopP"},
		{"NaN top_p", Params{TopP: nan}, 10, "TopP"},
		{"negative min_p", Params{MinP: -0.01}, 10, "MinP"},
		{"min_p above 1", Params{MinP: 2}, 10, "MinP"},
		{"negative repeat penalty", Params{RepeatPenalty: -1}, 10, "RepeatPenalty"},
		{"infinite repeat penalty", Params{RepeatPenalty: inf}, 10, "RepeatPenalty"},
		{"NaN presence penalty", Params{PresencePenalty: nan}, 10, "PresencePenalty"},
		{"infinite frequency penalty", Params{FrequencyPenalty: negInf}, 10, "FrequencyPenalty"},
		{"penalty window -2", Params{PenaltyWindow: -2}, 10, "PenaltyWindow"},
		{"bias id negative", Params{LogitBias: map[int32]float32{-1: 1}}, 10, "LogitBias[-1]"},
		{"bias id past vocab", Params{LogitBias: map[int32]float32{10: 1}}, 10, "LogitBias[10]"},
		{"bias NaN", Params{LogitBias: map[int32]float32{3: nan}}, 10, "LogitBias[3]"},
		{"bias +Inf", Params{LogitBias: map[int32]float32{3: inf}}, 10, "LogitBias[3]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.p, tt.vocab)
			if err == nil {
				t.Fatal("New accepted it")
			}
			var pe *ParamError
			if tt.field == "" {
				if errors.As(err, &pe) {
					t.Fatalf("got a ParamError %v, want a vocabulary error", err)
				}
				return
			}
			if !errors.As(err, &pe) || pe.Field != tt.field {
				t.Fatalf("error %q, want a ParamError on %s", err, tt.field)
			}
		})
	}

	valid := []Params{
		{},
		{Temperature: 0.7, TopK: 40, TopP: 0.9, MinP: 0.05, RepeatPenalty: 1.1, Seed: 3},
		{TopP: 1, MinP: 1, RepeatPenalty: 0.5, PresencePenalty: -2, FrequencyPenalty: 2, PenaltyWindow: -1},
		{LogitBias: map[int32]float32{0: negInf, 9: -100, 5: 100}},
	}
	for _, p := range valid {
		if _, err := New(p, 10); err != nil {
			t.Errorf("New(%+v): %v", p, err)
		}
	}
}

func TestParamsInEffect(t *testing.T) {
	s, err := New(Params{Temperature: 1, TopK: 50, Seed: 7}, 50)
	if err != nil {
		t.Fatal(err)
	}
	got := s.Params()
	if got.TopP != 1 || got.RepeatPenalty != 1 || got.TopK != 0 || got.Seed != 7 {
		t.Errorf("Params() = %+v, want TopP 1, RepeatPenalty 1, TopK 0 (>= vocab), Seed 7", got)
	}
	r, err := New(Params{Temperature: 1}, 50)
	if err != nil {
		t.Fatal(err)
	}
	if r.Seed() == 0 || r.Params().Seed != r.Seed() {
		t.Errorf("a zero seed gave Seed() %d, Params().Seed %d", r.Seed(), r.Params().Seed)
	}
}

// TestPenalties checks the logits after bias and penalties to the bit, on
// values chosen so that every step is exact in float32.
func TestPenalties(t *testing.T) {
	tests := []struct {
		name    string
		p       Params
		logits  []float32
		history []int32
		want    []float32
	}{
		{"repeat divides positive, multiplies negative, leaves zero",
			Params{RepeatPenalty: 1.5}, []float32{3, -1, 0, 6}, []int32{0, 1, 2, 0},
			[]float32{2, -1.5, 0, 6}},
		{"presence once, frequency per occurrence",
			Params{PresencePenalty: 0.5, FrequencyPenalty: 0.25}, []float32{2, 2, 2, 2}, []int32{1, 3, 1, 1},
			[]float32{2, 2 - (0.5 + 3*0.25), 2, 2 - (0.5 + 0.25)}},
		{"repeat first, then presence and frequency (llama.cpp)",
			Params{RepeatPenalty: 2, PresencePenalty: 1, FrequencyPenalty: 0.5}, []float32{4, -4, 1}, []int32{0, 1, 1},
			[]float32{4.0/2 - (1 + 0.5), -4*2 - (1 + 2*0.5), 1}},
		{"negative penalties reward",
			Params{PresencePenalty: -1, FrequencyPenalty: -0.5}, []float32{0, 0}, []int32{1, 1},
			[]float32{0, 0 + 1 + 2*0.5}},
		{"window keeps the last tokens only",
			Params{PresencePenalty: 1, PenaltyWindow: 2}, []float32{5, 5, 5, 5}, []int32{0, 1, 2, 3},
			[]float32{5, 5, 4, 4}},
		{"whole history",
			Params{FrequencyPenalty: 1, PenaltyWindow: -1}, []float32{5, 5, 5}, append(slices.Repeat([]int32{2}, 100), 0),
			[]float32{4, 5, -95}},
		{"default window is 64",
			Params{FrequencyPenalty: 1}, []float32{9, 9, 9}, append([]int32{0, 1}, slices.Repeat([]int32{2}, 63)...),
			[]float32{9, 8, -54}},
		{"bias before penalties",
			Params{RepeatPenalty: 2, LogitBias: map[int32]float32{0: 1, 2: -4}}, []float32{-2, 1, 3}, []int32{0, 2},
			[]float32{(-2 + 1) * 2, 1, (3 - 4) * 2}},
		{"bias alone, -Inf bans",
			Params{LogitBias: map[int32]float32{1: negInf, 2: 0.5}}, []float32{1, 7, 1}, nil,
			[]float32{1, negInf, 1.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.p, len(tt.logits))
			if err != nil {
				t.Fatal(err)
			}
			in := slices.Clone(tt.logits)
			if _, err := s.Sample(in, tt.history); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(s.work, tt.want) {
				t.Errorf("logits after bias and penalties %v, want %v", s.work, tt.want)
			}
			if !slices.Equal(in, tt.logits) {
				t.Errorf("Sample changed its input: %v", in)
			}
			if s.counts != nil && slices.ContainsFunc(s.counts, func(n int32) bool { return n != 0 }) {
				t.Errorf("counts not cleared: %v", s.counts)
			}
		})
	}
}

func TestGreedy(t *testing.T) {
	tests := []struct {
		name   string
		p      Params
		logits []float32
		want   int32
	}{
		{"max", Params{}, []float32{0.1, 3, -2, 2.9}, 1},
		{"ties to the lowest id", Params{}, []float32{1, 5, 2, 5, 5}, 1},
		{"NaN never wins", Params{}, []float32{nan, -7, nan}, 1},
		{"-Inf bias bans the max", Params{LogitBias: map[int32]float32{1: negInf}}, []float32{0, 9, 8, 8}, 2},
		{"penalty moves the max", Params{RepeatPenalty: 2}, []float32{4, 3, 0}, 1},
		{"top-k, top-p and min-p keep the max", Params{TopK: 1, TopP: 0.1, MinP: 0.9}, []float32{-1, -3, -0.5}, 2},
		{"+Inf wins", Params{}, []float32{1, inf, 2, inf}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.p, len(tt.logits))
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.Sample(tt.logits, []int32{0})
			if err != nil || got != tt.want {
				t.Errorf("Sample = %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}

func TestSampleErrors(t *testing.T) {
	for _, temp := range []float32{0, 1} {
		s, err := New(Params{Temperature: temp, RepeatPenalty: 1.2, TopK: 2}, 4)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Sample(make([]float32, 3), nil); err == nil {
			t.Errorf("T=%v: short logits accepted", temp)
		}
		if _, err := s.Sample(make([]float32, 4), []int32{1, 4}); err == nil {
			t.Errorf("T=%v: history token 4 accepted with vocab 4", temp)
		}
		if slices.ContainsFunc(s.counts, func(n int32) bool { return n != 0 }) {
			t.Errorf("T=%v: counts left dirty after an error: %v", temp, s.counts)
		}
		if _, err := s.Sample([]float32{negInf, nan, negInf, nan}, nil); !errors.Is(err, ErrNoCandidates) {
			t.Errorf("T=%v: all -Inf/NaN gave %v, want ErrNoCandidates", temp, err)
		}
	}
}

func TestTopK(t *testing.T) {
	tests := []struct {
		name   string
		logits []float32
		k      int
		want   []int32 // sorted ids
	}{
		{"plain", []float32{1, 5, 3, 4, 2}, 2, []int32{1, 3}},
		{"ties keep the lowest ids", []float32{2, 7, 7, 1, 7, 7}, 3, []int32{1, 2, 4}},
		{"all tied", []float32{0, 0, 0, 0}, 2, []int32{0, 1}},
		{"ascending", []float32{0, 1, 2, 3, 4, 5, 6, 7}, 3, []int32{5, 6, 7}},
		{"skips -Inf and NaN", []float32{negInf, nan, -1, negInf}, 3, []int32{2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := topK(tt.logits, tt.k, make([]cand, 0, len(tt.logits)))
			got := ids(c)
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Errorf("topK = %v, want %v", got, tt.want)
			}
		})
	}
	// Against a full sort, on random logits with many ties.
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		n := 1 + r.IntN(300)
		l := make([]float32, n)
		for i := range l {
			l[i] = float32(r.IntN(20))
		}
		k := 1 + r.IntN(n)
		got := ids(topK(l, k, make([]cand, 0, n)))
		slices.Sort(got)
		want := refOrder(l)[:k]
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("trial %d: topK(k=%d) = %v, want %v", trial, k, got, want)
		}
	}
}

func TestSoftmax(t *testing.T) {
	l := []float32{1, 3, negInf, 3 - 300, 2, nan}
	want := []cand{{0, float32(math.Exp(-1))}, {1, 1}, {4, float32(math.Exp(-0.5))}}
	var h massHist
	got, total := softmaxLogits(l, 3, 0.5, nil, &h)
	if !slices.Equal(got, want) {
		t.Fatalf("softmaxLogits = %v, want %v (-Inf, NaN and 3-300 dropped)", got, want)
	}
	if wt := mass(want); total != wt {
		t.Errorf("total %v, want %v", total, wt)
	}
	c := []cand{{0, 1}, {1, 3}, {2, negInf}, {3, 3 - 300}, {4, 2}}
	if got, _ := softmaxCands(c, 0.5, nil); !slices.Equal(got, want) {
		t.Errorf("softmaxCands = %v, want %v", got, want)
	}
	// The histogram: p = 1 in bucket 0, e^-0.5 = 0.61 in [0.5, 1) and
	// e^-1 = 0.37 in [0.25, 0.5): eight buckets per octave.
	for b, m := range h {
		var w float64
		switch uint32(b) {
		case 0:
			w = 1
		case bucket(want[2].v):
			w = float64(want[2].v)
		case bucket(want[0].v):
			w = float64(want[0].v)
		}
		if m != w {
			t.Errorf("bucket %d holds %v, want %v", b, m, w)
		}
	}
	if b0, b2 := bucket(want[0].v), bucket(want[2].v); b2 < 1 || b2 > 8 || b0 < 9 || b0 > 16 {
		t.Errorf("buckets %d and %d, want in [1, 8] and [9, 16]", b2, b0)
	}
	if got := ids(keepAtLeast(slices.Clone(want), 0.5)); !slices.Equal(got, []int32{1, 4}) {
		t.Errorf("keepAtLeast(0.5) kept %v, want [1 4]", got)
	}
}

func TestNucleusBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for trial := range 200 {
		l := randLogits(1+r.IntN(2000), 0.5+4*r.Float64(), uint64(trial))
		var h massHist
		c, total := softmaxLogits(l, l[argmax(l)], 1, make([]cand, 0, len(l)), &h)
		target := (0.05 + 0.9*r.Float64()) * total
		lo, hi := nucleusBounds(&h, target)
		sorted := sortedDesc(c)
		acc, last := 0.0, float32(0)
		for _, x := range sorted {
			if acc += float64(x.v); acc >= target {
				last = x.v
				break
			}
		}
		if !(lo <= last && last <= hi && hi <= lo*1.126) {
			t.Fatalf("trial %d: the nucleus ends at p=%v, bounds [%v, %v]", trial, last, lo, hi)
		}
	}
}

// TestNucleus compares the quickselect nucleus with a full sort, on
// distinct probabilities (so the set is unique) and on heavy ties (so only
// its mass and size are).
func TestNucleus(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for trial := range 300 {
		n := 1 + r.IntN(3000)
		ties := trial%3 == 0
		c := make([]cand, n)
		for i := range c {
			v := r.Float32()*0.999 + 0.001
			if ties {
				v = float32(1+r.IntN(4)) / 4
			}
			c[i] = cand{int32(i), v}
		}
		top := 0.05 + 0.95*r.Float64()
		target := top * mass(c)
		sorted := sortedDesc(c)
		wantM, acc := n, 0.0
		for i, x := range sorted {
			if acc += float64(x.v); acc >= target {
				wantM = i + 1
				break
			}
		}
		pivot := float32(0)
		if trial%2 == 1 {
			pivot = r.Float32() // any first pivot must do
		}
		m := nucleus(c, target, pivot)
		if m != wantM {
			t.Fatalf("trial %d (n=%d, ties=%v, p=%.3f): kept %d, want %d", trial, n, ties, top, m, wantM)
		}
		// The kept values must be the wantM largest.
		got := make([]float32, m)
		for i, x := range c[:m] {
			got[i] = x.v
		}
		slices.Sort(got)
		want := make([]float32, m)
		for i, x := range sorted[:m] {
			want[i] = x.v
		}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("trial %d: kept values differ from the %d largest", trial, m)
		}
	}
}

func TestDraw(t *testing.T) {
	c := []cand{{7, 1}, {3, 2}, {9, 1}}
	for _, tt := range []struct {
		u    float64
		want int32
	}{{0, 7}, {0.2499, 7}, {0.25, 3}, {0.7499, 3}, {0.75, 9}, {0.9999999, 9}} {
		if got := draw(c, 4, tt.u); got != tt.want {
			t.Errorf("draw(u=%v) = %d, want %d", tt.u, got, tt.want)
		}
	}
}

// TestReproducible checks that a seed fixes the tokens, whatever
// GOMAXPROCS, and that Reset replays them.
func TestReproducible(t *testing.T) {
	const vocab = 5000
	l := randLogits(vocab, 2, 11)
	p := Params{Temperature: 0.9, TopK: 200, TopP: 0.95, MinP: 0.01, RepeatPenalty: 1.1, Seed: 42}
	run := func(s *Sampler) []int32 {
		var hist []int32
		for range 64 {
			tok, err := s.Sample(l, hist)
			if err != nil {
				t.Fatal(err)
			}
			hist = append(hist, tok)
		}
		return hist
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	s1, _ := New(p, vocab)
	a := run(s1)
	runtime.GOMAXPROCS(4)
	s2, _ := New(p, vocab)
	if b := run(s2); !slices.Equal(a, b) {
		t.Fatalf("GOMAXPROCS 1 and 4 differ:\n%v\n%v", a, b)
	}
	s2.Reset()
	if b := run(s2); !slices.Equal(a, b) {
		t.Fatalf("Reset did not replay:\n%v\n%v", a, b)
	}
	p.Seed = 43
	s3, _ := New(p, vocab)
	if b := run(s3); slices.Equal(a, b) {
		t.Fatal("seeds 42 and 43 gave the same 64 tokens")
	}
	p.Seed = 0
	s4, _ := New(p, vocab)
	p.Seed = s4.Seed()
	s5, _ := New(p, vocab)
	if a, b := run(s4), run(s5); !slices.Equal(a, b) {
		t.Fatal("the reported random seed does not replay its tokens")
	}
}

func TestNoAllocations(t *testing.T) {
	const vocab = 4096
	l := randLogits(vocab, 2, 5)
	hist := make([]int32, 300)
	for i := range hist {
		hist[i] = int32(i * 7 % vocab)
	}
	for _, p := range []Params{
		{},
		{Temperature: 0.8},
		{Temperature: 0.8, TopK: 40},
		{Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05},
		{Temperature: 0.8, TopK: 100, TopP: 0.95, MinP: 0.05},
		{Temperature: 0.8, TopP: 0.9},
		{Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05, RepeatPenalty: 1.1, PresencePenalty: 0.2,
			FrequencyPenalty: 0.1, PenaltyWindow: -1, LogitBias: map[int32]float32{3: negInf, 9: 2}},
	} {
		s, err := New(p, vocab)
		if err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(50, func() { _, _ = s.Sample(l, hist) }); n != 0 {
			t.Errorf("Sample with %+v: %v allocations per call", p, n)
		}
	}
	dst, lp := make([]TokenLogProb, 0, 20), make([]float32, vocab)
	checks := map[string]func(){
		"TopLogProbs":  func() { dst = TopLogProbs(l, 20, dst) },
		"LogSoftmax":   func() { lp = LogSoftmax(l, lp) },
		"SampleGumbel": func() { _, _ = SampleGumbel(l, 0.8, 1, 2) },
		"SampleTopK":   func() { _, _ = SampleTopK(l, 0.8, MaxDrawTopK, 0.95, 0.05, 1, 2) },
	}
	for name, f := range checks {
		if n := testing.AllocsPerRun(20, f); n != 0 {
			t.Errorf("%s: %v allocations per call", name, n)
		}
	}
}

// sortedDesc returns c sorted from most to least likely, ties to the
// lowest id.
func sortedDesc(c []cand) []cand {
	s := slices.Clone(c)
	slices.SortFunc(s, func(a, b cand) int {
		switch {
		case worse(b, a):
			return -1
		case worse(a, b):
			return 1
		}
		return 0
	})
	return s
}

func ids(c []cand) []int32 {
	out := make([]int32, len(c))
	for i, x := range c {
		out[i] = x.id
	}
	return out
}

// refOrder returns the ids ordered by logit, largest first, ties to the
// lowest id: the full sort the sampler avoids.
func refOrder(l []float32) []int32 {
	order := make([]int32, len(l))
	for i := range order {
		order[i] = int32(i)
	}
	sortByLogit(l, order)
	return order
}

// sortByLogit sorts ids by their logits in l, the largest first, ties
// kept in the order given (stable).
func sortByLogit(l []float32, ids []int32) {
	slices.SortStableFunc(ids, func(a, b int32) int {
		switch {
		case l[a] > l[b]:
			return -1
		case l[a] < l[b]:
			return 1
		}
		return 0
	})
}

// randLogits returns n normal logits of standard deviation sd.
func randLogits(n int, sd float64, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 0))
	l := make([]float32, n)
	for i := range l {
		l[i] = float32(r.NormFloat64() * sd)
	}
	return l
}

func TestExpNeg(t *testing.T) {
	differ := 0
	for i := 0; i <= 1_040_000; i++ {
		x := -float64(i) / 10_000
		got, want := expNeg(x), float32(math.Exp(x))
		if got == want {
			continue
		}
		differ++
		// One float32 ulp: the next float32 towards the other value.
		if math.Nextafter32(want, got) != got {
			t.Fatalf("expNeg(%v) = %v, math.Exp gives %v: more than one ulp apart", x, got, want)
		}
	}
	if differ > 1_040_000/1000 {
		t.Errorf("%d of 1040001 values differ from float32(math.Exp) by an ulp", differ)
	}
}
