package cuda

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/sample"
	"github.com/weftlm/weft/weights"
)

// TestDeviceDraws: tokens drawn on the device (RunSampled through
// engine.StepSampled) are sample.SampleGumbel's (or, with a top-k,
// sample.SampleTopK's, with top-p or min-p alone sample.SampleNucleus's)
// draws from the logits the same plan produces, their log-probabilities
// where asked sample.TokenLogProbs' (engine.Model.Logprobs), for greedy, tempered,
// truncated and penalised rows, one row (a graph
// replay), three, and ten (plain launches), with the vocabulary split into
// many chunks.
func TestDeviceDraws(t *testing.T) {
	gpu := newGPU(t)
	defer func(c int) { drawChunk = c }(drawChunk)
	drawChunk = 48 // 11 chunks of the 512-token vocabulary, the last one short
	w, err := weights.Open(filepath.Join("..", "..", "testdata", "models", "llama3-tiny"), weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	m, err := engine.Load(w, gpu, engine.Options{Context: 64, MaxBatch: 16, Slots: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	v := m.Vocab()
	for _, rows := range []int{1, 3, 10} {
		// Each row twice: the "logits" copy runs Step, the "drawn" copy
		// StepSampled, on the same inputs, so both see the same logits.
		logitSeqs, drawnSeqs := make([]*engine.Sequence, rows), make([]*engine.Sequence, rows)
		for i := range rows {
			logitSeqs[i], _ = m.NewSequence()
			drawnSeqs[i], _ = m.NewSequence()
			if logitSeqs[i] == nil || drawnSeqs[i] == nil {
				t.Fatal("out of slots")
			}
		}
		toks := make([]int32, rows)
		for i := range toks {
			toks[i] = int32(7 + 31*i)
		}
		logits := make([]float32, rows*v)
		drawn := make([]int32, rows)
		s := make([]backend.Sampling, rows)
		history := make([][]int32, rows)
		for i := range history {
			history[i] = []int32{toks[i]}
		}
		for step := range 12 {
			for i := range s {
				s[i] = backend.Sampling{Temperature: []float32{0, 0.6, 1, 2.5}[(i+step)%4], Seed: uint64(100 + i), Step: uint64(step)}
				switch (i + step) % 3 {
				case 1: // llama.cpp's chain, and a wider one
					s[i].TopK, s[i].TopP, s[i].MinP = []int{40, backend.MaxTopK}[step%2], 0.95, 0.05
				case 2: // top-p or min-p without a top-k
					s[i].TopP, s[i].MinP = []float32{0.9, 1, 0.5}[step%3], []float32{0, 0.05, 0.01}[step%3]
				}
				if i%2 == 1 { // penalties over the last 5 tokens, favouring them
					s[i].RepeatPenalty, s[i].PresencePenalty, s[i].FrequencyPenalty, s[i].Window = 1.3, -3, 0.5, 5
					s[i].Recent = history[i][max(0, len(history[i])-5):]
				}
				if (i+step)%4 == 3 { // a logit bias: a few tokens favoured, one banned
					s[i].BiasIDs, s[i].BiasValues = []int32{3, 40, 41, 200, int32(v - 1)}, []float32{2, 5, -1, float32(math.Inf(-1)), 3}
				}
				if (i+step)%3 != 1 { // log-probabilities, of 0 to 15 alternatives
					s[i].Logprobs, s[i].TopLogprobs = true, 5*(step%4)
				}
			}
			if err := m.Step(logitSeqs, toks, logits); err != nil {
				t.Fatal(err)
			}
			if err := m.StepSampled(drawnSeqs, toks, s, drawn); err != nil {
				t.Fatal(err)
			}
			for i := range rows {
				want, err := sample.Draw(s[i]).Sample(logits[i*v : (i+1)*v])
				if err != nil {
					t.Fatal(err)
				}
				if drawn[i] != want {
					t.Fatalf("%d rows, step %d, row %d (%+v): drawn %d, sample %d", rows, step, i, s[i], drawn[i], want)
				}
				lp, top, ok := m.Logprobs(i)
				if ok != s[i].Logprobs {
					t.Fatalf("%d rows, step %d, row %d: log-probabilities %v, asked %v", rows, step, i, ok, s[i].Logprobs)
				}
				if ok {
					wantLP, wantTop := sample.TokenLogProbs(logits[i*v:(i+1)*v], drawn[i], s[i].TopLogprobs, nil)
					same := lpClose(lp, wantLP) && len(top) == len(wantTop)
					for k := 0; same && k < len(top); k++ {
						same = top[k].ID == wantTop[k].ID && lpClose(top[k].Logprob, wantTop[k].LogProb)
					}
					if !same {
						t.Fatalf("%d rows, step %d, row %d (%+v): log-probabilities %v %v, host %v %v", rows, step, i, s[i], lp, top, wantLP, wantTop)
					}
				}
				history[i] = append(history[i], drawn[i])
			}
			copy(toks, drawn)
		}
		for i := range rows {
			logitSeqs[i].Close()
			drawnSeqs[i].Close()
		}
	}
}

// TestPipelinedDraws: decode steps queued ahead of the host (IssueSampled,
// then IssueNext and WaitSampled a step: the device feeds each row its
// draw, one position further, and draws again without the host between)
// draw what StepSampled draws with the host feeding the draws back, for
// one row (graph replays), three, and ten (plain launches); other runs
// fail while steps are in flight, and the pipeline's misuse is an error.
func TestPipelinedDraws(t *testing.T) {
	gpu := newGPU(t)
	w, err := weights.Open(filepath.Join("..", "..", "testdata", "models", "llama3-tiny"), weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	load := func() *engine.Model {
		m, err := engine.Load(w, gpu, engine.Options{Context: 64, MaxBatch: 16, Slots: 10})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	ref, m := load(), load()
	defer ref.Close()
	defer m.Close()
	if !m.Pipelined() {
		t.Fatal("the CUDA plan does not queue decode steps")
	}
	const steps = 20
	for _, rows := range []int{1, 3, 10} {
		refSeqs, seqs := make([]*engine.Sequence, rows), make([]*engine.Sequence, rows)
		toks := make([]int32, rows)
		s := make([]backend.Sampling, rows)
		for i := range rows {
			refSeqs[i], _ = ref.NewSequence()
			seqs[i], _ = m.NewSequence()
			toks[i] = int32(5 + 37*i)
			s[i] = backend.Sampling{Temperature: []float32{0, 0.7, 1.3}[i%3], Seed: uint64(40 + i), Step: uint64(i)}
			switch i % 4 {
			case 1:
				s[i].TopK, s[i].TopP, s[i].MinP = 40, 0.95, 0.05
			case 2:
				s[i].TopP, s[i].MinP = 0.9, 0.02
			}
			if i%3 == 0 { // penalties over a window the steps wrap, favouring its tokens
				s[i].RepeatPenalty, s[i].PresencePenalty, s[i].FrequencyPenalty, s[i].Window = 1.2, -4, 0.3, 6
				s[i].Recent = []int32{toks[i]}
			}
		}
		first := append([]int32(nil), toks...)
		want := make([][]int32, steps)
		history := make([][]int32, rows)
		for i := range history {
			history[i] = []int32{toks[i]}
		}
		for step := range steps {
			si := append([]backend.Sampling(nil), s...)
			for i := range si {
				si[i].Step += uint64(step)
				if si[i].Window > 0 {
					si[i].Recent = history[i][max(0, len(history[i])-si[i].Window):]
				}
			}
			want[step] = make([]int32, rows)
			if err := ref.StepSampled(refSeqs, toks, si, want[step]); err != nil {
				t.Fatal(err)
			}
			copy(toks, want[step])
			for i := range history {
				history[i] = append(history[i], toks[i])
			}
		}
		if err := m.IssueSampled(seqs, first, s); err != nil {
			t.Fatal(err)
		}
		got := make([]int32, rows)
		for step := range steps {
			if step < steps-1 {
				if err := m.IssueNext(); err != nil {
					t.Fatal(err)
				}
			}
			if err := m.WaitSampled(got); err != nil {
				t.Fatal(err)
			}
			for i := range rows {
				if got[i] != want[step][i] {
					t.Fatalf("%d rows, step %d, row %d: pipelined draw %d, stepped %d", rows, step, i, got[i], want[step][i])
				}
			}
		}
		for i := range rows {
			refSeqs[i].Close()
			seqs[i].Close()
		}
	}

	// The executable's own rules, under the engine's.
	x, err := gpu.Compile(headProgram(t, "Q8_0", 1000, 256, 0)) // 4 rows, 2 slots, 32 positions
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	e := x.(*exec)
	b := &backend.Batch{Tokens: []int32{1, 2}, Pos: []int32{0, 0}, Slots: []int32{0, 1}, Selected: []int32{0, 1}}
	two := []backend.Sampling{{}, {Temperature: 1}}
	ids := make([]int32, 2)
	if err := e.IssueNext(); err == nil {
		t.Error("IssueNext with nothing issued succeeded")
	}
	if err := e.WaitSampled(ids); err == nil {
		t.Error("WaitSampled with nothing issued succeeded")
	}
	if err := e.IssueSampled(&backend.Batch{Tokens: []int32{1, 2}, Pos: []int32{0, 1}, Slots: []int32{0, 0}, Selected: []int32{1}}, two[:1]); err == nil {
		t.Error("a prefill batch was issued")
	}
	if err := e.IssueSampled(b, two); err != nil {
		t.Fatal(err)
	}
	if err := e.IssueNext(); err != nil {
		t.Fatal(err)
	}
	if err := e.IssueNext(); err == nil {
		t.Error("a third step in flight was accepted")
	}
	if err := e.Run(b, make([]float32, 2*1000)); err == nil {
		t.Error("Run with steps in flight succeeded")
	}
	if err := e.RunSampled(b, two, ids); err == nil {
		t.Error("RunSampled with steps in flight succeeded")
	}
	if err := e.WaitSampled(ids[:1]); err == nil {
		t.Error("WaitSampled into the wrong number of rows succeeded")
	}
	// A decode step issued with one in flight waits for its staging
	// memory, and the draws come out in order.
	if err := e.WaitSampled(ids); err != nil {
		t.Fatal(err)
	}
	if err := e.IssueSampled(&backend.Batch{Tokens: []int32{7, 8}, Pos: []int32{2, 2}, Slots: []int32{0, 1}, Selected: []int32{0, 1}}, two); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := e.WaitSampled(ids); err != nil {
			t.Fatal(err)
		}
	}
	if e.chain.inFlight() != 0 {
		t.Errorf("%d steps in flight after every wait", e.chain.inFlight())
	}
	if err := e.Run(b, make([]float32, 2*1000)); err != nil {
		t.Fatal(err)
	}
	if err := e.IssueNext(); err == nil {
		t.Error("IssueNext after Run succeeded")
	}
	// The context's end: positions 30 and 31 run, 32 does not.
	if err := e.IssueSampled(&backend.Batch{Tokens: []int32{7, 8}, Pos: []int32{30, 29}, Slots: []int32{0, 1}, Selected: []int32{0, 1}}, two); err != nil {
		t.Fatal(err)
	}
	if err := e.IssueNext(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := e.WaitSampled(ids); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.IssueNext(); err == nil {
		t.Error("a step past the context was issued")
	}
}

// TestTopKDraws: the device's top-k draws are sample.SampleTopK's, its
// top-p and min-p draws without a top-k sample.SampleNucleus's (cuts that
// fall inside runs of equal logits among them), and the plain ones
// sample.SampleGumbel's, on logits made to be hard: few levels
// (ties across chunks), -0 beside +0, NaN, ±Inf, rows with fewer finite
// logits than k and none at all, every top-k, top-p and min-p setting,
// penalties over windows of up to backend.MaxWindow tokens (repeats among
// them), logit biases (bans among them) on the same tokens,
// and chunks of 4 tokens (a merge of 375 chunks' candidates in rounds), 48
// and 2048 (one chunk). The logits are an F32 embedding table's rows,
// chosen by the batch's tokens, so they reach the draws as written.
func TestTopKDraws(t *testing.T) {
	gpu := newGPU(t)
	defer func(c int) { drawChunk = c }(drawChunk)
	const vocab, rows = 1500, 6
	rng := rand.New(rand.NewPCG(3, 9))
	table := make([]float32, vocab*vocab)
	for r := range vocab {
		row := table[r*vocab : (r+1)*vocab]
		levels, finite := 1+rng.IntN(30), 100
		switch r % 10 {
		case 0:
			finite = 0 // every logit -Inf or NaN
		case 1:
			finite = 1 // a handful of finite logits, fewer than k
		}
		for i := range row {
			switch x := rng.IntN(100); {
			case x >= finite:
				row[i] = float32(math.Inf(-1))
				if x%2 == 0 {
					row[i] = float32(math.NaN())
				}
			case x < 2:
				row[i] = float32(math.Inf(-1))
			case x < 4:
				row[i] = float32(math.NaN())
			case x == 4 && r%7 == 0:
				row[i] = float32(math.Inf(1))
			case x == 5:
				row[i] = float32(math.Copysign(0, -1))
			case x == 6:
				row[i] = 0
			default:
				row[i] = float32(rng.IntN(levels))*0.41 - 4
			}
		}
		if r%10 == 1 {
			for _, i := range rng.Perm(vocab)[:3] {
				row[i] = float32(rng.IntN(4))
			}
		}
	}
	for _, chunk := range []int{4, 48, 2048} {
		drawChunk = chunk
		ex, err := gpu.Compile(tableLogits(t, table, vocab, rows))
		if err != nil {
			t.Fatal(err)
		}
		e := ex.(*exec)
		out := make([]int32, rows)
		s := make([]backend.Sampling, rows)
		for trial := range 60 {
			bt := tokenBatch(rng, rows, vocab)
			for i := range s {
				s[i] = backend.Sampling{Temperature: []float32{0, 0.05, 0.8, 2.5}[rng.IntN(4)], Seed: uint64(trial), Step: uint64(i)}
				if rng.IntN(3) == 0 { // a logit bias over up to MaxBias tokens
					for id := 0; id < vocab && len(s[i].BiasIDs) < backend.MaxBias; id += 1 + rng.IntN(30) {
						s[i].BiasIDs = append(s[i].BiasIDs, int32(id))
						s[i].BiasValues = append(s[i].BiasValues, []float32{-3, 0.5, 4, float32(math.Inf(-1))}[rng.IntN(4)])
					}
				}
				if rng.IntN(3) == 0 { // penalties over a window of the vocabulary
					s[i].RepeatPenalty = []float32{0, 1, 1.1, 3}[rng.IntN(4)]
					s[i].PresencePenalty, s[i].FrequencyPenalty = []float32{0, -2, 1}[rng.IntN(3)], []float32{0, 0.5, -1}[rng.IntN(3)]
					s[i].Window = 1 + rng.IntN(backend.MaxWindow)
					s[i].Recent = s[i].Recent[:0]
					for range rng.IntN(s[i].Window + 1) {
						s[i].Recent = append(s[i].Recent, int32(rng.IntN(20))*int32(vocab/20)+int32(rng.IntN(3)))
					}
				}
				switch rng.IntN(6) {
				case 0:
				case 1, 2: // top-p or min-p without a top-k
					s[i].TopP = []float32{0, 1, 0.999, 0.95, 0.5, 0.1, 1e-6}[rng.IntN(7)]
					s[i].MinP = []float32{0, 0, 0.05, 0.5, 1}[rng.IntN(5)]
				default:
					s[i].TopK = []int{1, 2, 7, 40, backend.MaxTopK}[rng.IntN(5)]
					s[i].TopP = []float32{1, 0.95, 0.5, 0.1}[rng.IntN(4)]
					s[i].MinP = []float32{0, 0.05, 0.5, 1}[rng.IntN(4)]
				}
			}
			err := e.RunSampled(bt, s, out)
			for i, tok := range bt.Tokens {
				x := s[i]
				want, werr := sample.Draw(x).Sample(table[int(tok)*vocab : int(tok+1)*vocab])
				switch {
				case werr != nil && (err == nil || out[i] >= 0):
					t.Fatalf("chunk %d, trial %d, row %d (token %d, %+v): drawn %d (%v) where the host finds %v", chunk, trial, i, tok, x, out[i], err, werr)
				case werr == nil && out[i] != want:
					t.Fatalf("chunk %d, trial %d, row %d (token %d, %+v): drawn %d, sample %d", chunk, trial, i, tok, x, out[i], want)
				}
			}
		}
		ex.Close()
	}
}

// TestDrawCost times the draw kernel alone, a measuring aid that checks
// nothing: with WEFT_DRAW_COST=1 it launches the draws back to back on
// one row of a 128,256-token vocabulary (a Llama 3 one), greedy,
// tempered, with top-k chains and with top-p or min-p alone (the nucleus
// launches with the draw), at draw chunks of 512 (the default)
// and 2048, and logs µs a draw.
func TestDrawCost(t *testing.T) {
	if os.Getenv("WEFT_DRAW_COST") == "" {
		t.Skip("set WEFT_DRAW_COST=1 to time the draws")
	}
	gpu := newGPU(t)
	defer func(c int) { drawChunk = c }(drawChunk)
	for _, chunk := range []int{512, 2048} {
		drawChunk = chunk
		x, err := gpu.Compile(headProgram(t, "Q8_0", 128256, 256, 0))
		if err != nil {
			t.Fatal(err)
		}
		e := x.(*exec)
		b := &backend.Batch{Tokens: []int32{1}, Pos: []int32{0}, Slots: []int32{0}, Selected: []int32{0}}
		out := make([]int32, 1)
		recent := make([]int32, 64)
		for i := range recent {
			recent[i] = int32(i * 97)
		}
		for _, s := range []backend.Sampling{{}, {Temperature: 0.8}, {Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05},
			{Temperature: 0.8, TopK: backend.MaxTopK, TopP: 1}, {Temperature: 1, TopP: 0.9}, {Temperature: 0.8, TopP: 0.95, MinP: 0.05},
			{Temperature: 0.8, MinP: 0.05}, {Temperature: 0.8, TopK: 40, TopP: 0.9, RepeatPenalty: 1.1, Window: 64, Recent: recent},
			{Temperature: 0.8, TopK: 40, TopP: 0.9, BiasIDs: recent, BiasValues: make([]float32, len(recent))}} {
			if err := e.RunSampled(b, []backend.Sampling{s}, out); err != nil {
				t.Fatal(err)
			}
			runtime.LockOSThread()
			if err := e.be.current(); err != nil {
				t.Fatal(err)
			}
			runtime.UnlockOSThread() // current locks once more
			const n = 500
			start := time.Now()
			for range n {
				if err := e.launchDraws(1, drawOut([]backend.Sampling{s}), e.stream, false); err != nil {
					t.Fatal(err)
				}
			}
			if r := e.be.drv.cuCtxSynchronize(); r != 0 {
				t.Fatal(e.be.drv.err(r))
			}
			t.Logf("chunk %d, T %g k %d p %g m %g, repeat %g over %d, %d biased: %.1f µs a draw", chunk, s.Temperature, s.TopK, s.TopP, s.MinP,
				s.RepeatPenalty, len(s.Recent), len(s.BiasIDs), float64(time.Since(start).Microseconds())/n)
			if s.Nucleus() {
				// Each launch of a nucleus draw alone: nucleus_max, the
				// passes, draw.
				ds, c := e.draw, &e.sys
				for k, fn := range append(ds.nucFns[:], ds.fn) {
					params := uintptr(unsafe.Pointer(&ds.params[0]))
					if k < len(ds.nucFns) {
						params = uintptr(unsafe.Pointer(&ds.nucParams[k][0]))
					}
					start := time.Now()
					for range n {
						*c = callArgs{fn, uintptr(ds.chunks), 1, 1, drawThreads, 1, 1, 0, e.stream, params, 0}
						if r := c.call(e.be.drv.launchKernel, 11); r != 0 {
							t.Fatal(e.be.drv.err(r))
						}
					}
					if r := e.be.drv.cuCtxSynchronize(); r != 0 {
						t.Fatal(e.be.drv.err(r))
					}
					t.Logf("    launch %d alone: %.1f µs", k, float64(time.Since(start).Microseconds())/n)
				}
			}
			runtime.UnlockOSThread()
		}
		x.Close()
	}
}

// tableLogits is a program of rows rows whose logits are the rows of the
// F32 embedding table (vocab × vocab) that the batch's tokens choose, so
// that they reach the draws as written.
func tableLogits(t *testing.T, table []float32, vocab, rows int) *backend.Program {
	t.Helper()
	b := newProg(t, 5, rows, 1, 64, vocab)
	x, logits := b.buf(vocab), b.buf(vocab)
	w := b.mat("F32", vocab, vocab, 1)
	data := b.p.Weights[w].Data.Bytes
	for i, v := range table {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
	}
	b.op(backend.Op{Kind: backend.OpEmbed, Out: x, W: w})
	b.op(backend.Op{Kind: backend.OpGather, Out: logits, A: x, OnSelected: true})
	b.p.Logits = logits
	return b.p
}
