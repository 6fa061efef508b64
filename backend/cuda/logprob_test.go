package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/sample"
)

// TestLpRecLayout: lpRec is sample.cu's lp_rec byte for byte.
func TestLpRecLayout(t *testing.T) {
	var r lpRec
	if got := unsafe.Sizeof(r); got != lpRecBytes {
		t.Errorf("lpRec is %d bytes, lp_rec %d", got, lpRecBytes)
	}
	for _, f := range []struct {
		name      string
		got, want uintptr
	}{{"drawn", unsafe.Offsetof(r.drawn), 8}, {"n", unsafe.Offsetof(r.n), 16},
		{"ids", unsafe.Offsetof(r.ids), 24}, {"vals", unsafe.Offsetof(r.vals), 104}} {
		if f.got != f.want {
			t.Errorf("lpRec.%s at %d, lp_rec's at %d", f.name, f.got, f.want)
		}
	}
}

// lpClose reports whether a device log-probability agrees with the host's:
// the same infinity or NaN, else within 2e-6 plus 1e-6 relative (the
// log-sum-exp is summed in another order, and each side rounds its
// log-probability to float32).
func lpClose(got, want float32) bool {
	g, w := float64(got), float64(want)
	switch {
	case math.IsNaN(w) || math.IsInf(w, 0):
		return got == want || math.IsNaN(g) && math.IsNaN(w)
	}
	return math.Abs(g-w) <= 2e-6+1e-6*math.Abs(w)
}

// checkDraw compares row i's device draw id with sample.Draw's of its raw
// logits, and its log-probabilities with sample.TokenLogProbs'.
func checkDraw(t *testing.T, e *exec, i int, raw []float32, id int32, s backend.Sampling, what string) {
	t.Helper()
	if want, _ := sample.Draw(s).Sample(raw); id != want {
		t.Fatalf("%s, row %d: drawn %d, sample %d", what, i, id, want)
	}
	top := make([]backend.TokenLogprob, backend.MaxTopLogprobs)
	lp, n := e.Logprobs(i, top)
	if !s.Logprobs {
		if n != 0 || !math.IsNaN(float64(lp)) {
			t.Fatalf("%s: row %d asked for no log-probabilities and has %v and %d tokens", what, i, lp, n)
		}
		return
	}
	wantLP, wantTop := sample.TokenLogProbs(raw, id, s.TopLogprobs, nil)
	if !lpClose(lp, wantLP) {
		t.Fatalf("%s: row %d (%+v): drawn %d, log p %v, host %v", what, i, s, id, lp, wantLP)
	}
	if n != len(wantTop) {
		t.Fatalf("%s: row %d: %d top tokens, host %d (%v)", what, i, n, len(wantTop), wantTop)
	}
	for k, w := range wantTop {
		if g := top[k]; g.ID != w.ID || !lpClose(g.Logprob, w.LogProb) {
			t.Fatalf("%s: row %d: top %d is %d (%v), host %d (%v)", what, i, k, g.ID, g.Logprob, w.ID, w.LogProb)
		}
	}
}

// TestDrawLogprobs: the log-probabilities that draws report
// (backend.LogprobSampler) are sample.TokenLogProbs' of the raw logits
// (before bias and penalties) and the draw, for rows that ask, beside
// rows that do not, of every kind of draw (greedy, tempered, top-k,
// top-p and min-p, biased and penalised, where the drawn token's raw
// logit is the one adjust saved); on logits made to be hard (ties across
// chunks, ±0, NaN, ±Inf, rows with few finite logits); at chunks of 4
// tokens (375 chunks' lists merged in groups), 48 and 512; run at once
// (RunSampled) and queued (IssueSampled, IssueNext, WaitSampled: each
// step's records handed out with its draws); the records written into
// mapped host memory, and copied there (WEFT_CUDA_MAPPED_DRAWS=0).
func TestDrawLogprobs(t *testing.T) {
	gpu := newGPU(t)
	defer func(c int) { drawChunk = c }(drawChunk)
	const vocab, rows = 1500, 6
	rng := rand.New(rand.NewPCG(5, 11))
	table := make([]float32, vocab*vocab)
	for r := range vocab {
		row := table[r*vocab : (r+1)*vocab]
		levels := 1 + rng.IntN(40)
		for i := range row {
			switch x := rng.IntN(200); {
			case x < 3:
				row[i] = float32(math.Inf(-1))
			case x < 5:
				row[i] = float32(math.NaN())
			case x == 5 && r%50 == 7:
				row[i] = float32(math.Inf(1))
			case x == 6:
				row[i] = float32(math.Copysign(0, -1))
			default:
				row[i] = float32(rng.IntN(levels))*0.37 - 6 + float32(rng.NormFloat64())*float32(r%3)
			}
		}
		if r%25 == 3 { // few finite logits
			for i := range row {
				if rng.IntN(100) > 1 {
					row[i] = float32(math.Inf(-1))
				}
			}
		}
	}
	randomSampling := func(trial, i int) backend.Sampling {
		s := backend.Sampling{Temperature: []float32{0, 0.7, 1.5}[rng.IntN(3)], Seed: uint64(trial), Step: uint64(i)}
		switch rng.IntN(4) {
		case 1:
			s.TopK, s.TopP, s.MinP = []int{1, 40, backend.MaxTopK}[rng.IntN(3)], 0.95, 0.05
		case 2:
			s.TopP, s.MinP = []float32{0.9, 0.5}[rng.IntN(2)], []float32{0, 0.05}[rng.IntN(2)]
		}
		if rng.IntN(3) == 0 { // a bias on tokens the draws like, bans among them
			for id := rng.IntN(5); id < vocab && len(s.BiasIDs) < backend.MaxBias; id += 1 + rng.IntN(10) {
				s.BiasIDs = append(s.BiasIDs, int32(id))
				s.BiasValues = append(s.BiasValues, []float32{-3, 6, 12, float32(math.Inf(-1))}[rng.IntN(4)])
			}
		}
		if rng.IntN(3) == 0 { // penalties that favour a window of few tokens
			s.RepeatPenalty, s.PresencePenalty, s.FrequencyPenalty = 0.5, -8, -1
			s.Window = 1 + rng.IntN(backend.MaxWindow)
			for range rng.IntN(s.Window + 1) {
				s.Recent = append(s.Recent, int32(rng.IntN(vocab/50))*50+int32(rng.IntN(5)))
			}
		}
		if rng.IntN(5) > 0 {
			s.Logprobs, s.TopLogprobs = true, rng.IntN(backend.MaxTopLogprobs+1)
		}
		return s
	}
	// randomBatch is a batch of 1 to rows random tokens and their draws.
	randomBatch := func(trial int) (*backend.Batch, []backend.Sampling) {
		bt := tokenBatch(rng, 1+rng.IntN(rows), vocab)
		s := make([]backend.Sampling, len(bt.Tokens))
		for i := range s {
			s[i] = randomSampling(trial, i)
		}
		return bt, s
	}
	for _, c := range []struct {
		chunk  int
		mapped bool // the records written into mapped host memory, else copied there
	}{{4, true}, {48, true}, {512, true}, {48, false}} {
		chunk := c.chunk
		drawChunk = chunk
		if !c.mapped {
			t.Setenv("WEFT_CUDA_MAPPED_DRAWS", "0")
		}
		ex, err := gpu.Compile(tableLogits(t, table, vocab, rows))
		if err != nil {
			t.Fatal(err)
		}
		e := ex.(*exec)
		if !c.mapped && e.drawHost.lpDev != 0 {
			t.Fatal("WEFT_CUDA_MAPPED_DRAWS=0 left the records in mapped memory")
		}
		out := make([]int32, rows)
		for trial := range 40 {
			bt, s := randomBatch(trial)
			n := len(s)
			if err := e.RunSampled(bt, s, out[:n]); err != nil {
				t.Fatalf("chunk %d, trial %d: %v", chunk, trial, err)
			}
			for i, tok := range bt.Tokens {
				raw := table[int(tok)*vocab : int(tok+1)*vocab]
				checkDraw(t, e, i, raw, out[i], s[i], fmt.Sprintf("chunk %d, trial %d", chunk, trial))
			}
		}
		// Queued steps: each row fed its draw, its window gaining it.
		for trial := range 6 {
			bt, s := randomBatch(trial)
			n := len(s)
			toks, hs := slices.Clone(bt.Tokens), slices.Clone(s)
			if err := e.IssueSampled(bt, s); err != nil {
				t.Fatal(err)
			}
			for step := range 5 {
				if step < 4 {
					if err := e.IssueNext(); err != nil {
						t.Fatal(err)
					}
				}
				if err := e.WaitSampled(out[:n]); err != nil {
					t.Fatalf("chunk %d, queued trial %d, step %d: %v", chunk, trial, step, err)
				}
				for i := range n {
					raw := table[int(toks[i])*vocab : int(toks[i]+1)*vocab]
					checkDraw(t, e, i, raw, out[i], hs[i], fmt.Sprintf("chunk %d, queued trial %d, step %d", chunk, trial, step))
					toks[i] = out[i]
					if hs[i].Penalizes() {
						hs[i].Recent = append(slices.Clone(hs[i].Recent), out[i])[max(0, len(hs[i].Recent)+1-hs[i].Window):]
					}
					hs[i].Step++
				}
			}
		}
		ex.Close()
	}
}
