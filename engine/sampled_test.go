package engine

import (
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/backend/cpu"
	"github.com/weftlm/weft/internal/testmodel"
	"github.com/weftlm/weft/sample"
	"github.com/weftlm/weft/weights"
)

// TestStepSampled: StepSampled's tokens are Step's logits drawn by
// SampleGumbel (SampleTopK for a top-k, SampleNucleus for a top-p alone),
// whether the host draws (the CPU
// backend) or the backend does (a backend.Sampler).
func TestStepSampled(t *testing.T) {
	prompts := [][]int32{{5, 9, 200, 17}, {7, 8}, {300, 301, 302}, {40, 41}, {9, 10, 11}}
	samplings := []backend.Sampling{{Temperature: 0}, {Temperature: 0.8, Seed: 7}, {Temperature: 1.5, Seed: 9},
		{Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05, Seed: 11}, {Temperature: 1, TopP: 0.9, Seed: 13}}
	run := func(m *Model, sampled bool) [][]int32 {
		seqs, toks := prefilled(t, m, prompts)
		for _, s := range seqs {
			defer s.Close()
		}
		v := m.Vocab()
		logits := make([]float32, len(prompts)*v)
		var got [][]int32
		for step := range 8 {
			s := append([]backend.Sampling(nil), samplings...)
			for i := range s {
				s[i].Step = uint64(step)
			}
			if sampled {
				if err := m.StepSampled(seqs, toks, s, toks); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := m.Step(seqs, toks, logits); err != nil {
					t.Fatal(err)
				}
				for i := range toks {
					id, err := sample.Draw(s[i]).Sample(logits[i*v : (i+1)*v])
					if err != nil {
						t.Fatal(err)
					}
					toks[i] = id
				}
			}
			got = append(got, append([]int32(nil), toks...))
		}
		return got
	}
	m := loadFixture(t, "llama3-tiny", Options{Context: 64, Slots: 5, MaxBatch: 8})
	want := run(m, false)
	host := run(m, true)

	p, err := weights.Open(filepath.Join("..", "testdata", "models", "llama3-tiny"), weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	drawing := &testmodel.Drawing{Backend: cpu.New(2)}
	dm, err := Load(p, drawing, Options{Context: 64, Slots: 5, MaxBatch: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer dm.Close()
	device := run(dm, true)
	if drawing.Draws != 8*len(prompts) {
		t.Errorf("the backend drew %d tokens, want %d", drawing.Draws, 8*len(prompts))
	}
	for step := range want {
		for i := range want[step] {
			if host[step][i] != want[step][i] || device[step][i] != want[step][i] {
				t.Fatalf("step %d sequence %d: host draw %d, backend draw %d, want %d", step, i, host[step][i], device[step][i], want[step][i])
			}
		}
	}
	seq, _ := m.NewSequence()
	defer seq.Close()
	if err := m.StepSampled([]*Sequence{seq}, []int32{1}, []backend.Sampling{{Temperature: -1}}, make([]int32, 1)); err == nil {
		t.Error("a negative temperature was accepted")
	}
	if err := m.StepSampled([]*Sequence{seq}, []int32{1}, nil, make([]int32, 1)); err == nil {
		t.Error("a missing sampling was accepted")
	}
	for _, bad := range []backend.Sampling{
		{Temperature: 1, TopK: backend.MaxTopK + 1, TopP: 1}, {Temperature: 1, TopK: -1}, {Temperature: 1, TopK: 5, TopP: 0},
		{Temperature: 1, TopK: 5, TopP: 1, MinP: 1.5}, {Temperature: float32(math.NaN())}, {Temperature: 1, TopP: 1.5},
		{Temperature: 1, RepeatPenalty: -1, Window: 4}, {Temperature: 1, PresencePenalty: float32(math.Inf(1)), Window: 4},
		{Temperature: 1, RepeatPenalty: 1.1, Window: backend.MaxWindow + 1}, {Temperature: 1, RepeatPenalty: 1.1, Window: 1, Recent: []int32{1, 2}},
		{Logprobs: true, TopLogprobs: backend.MaxTopLogprobs + 1}, {TopLogprobs: 2}, {Logprobs: true, TopLogprobs: -1},
	} {
		if err := m.StepSampled([]*Sequence{seq}, []int32{1}, []backend.Sampling{bad}, make([]int32, 1)); err == nil {
			t.Errorf("%+v was accepted", bad)
		}
	}
	if backend.MaxTopK != sample.MaxDrawTopK || backend.MaxWindow != sample.MaxDrawWindow {
		t.Errorf("backend.MaxTopK %d, sample.MaxDrawTopK %d; backend.MaxWindow %d, sample.MaxDrawWindow %d",
			backend.MaxTopK, sample.MaxDrawTopK, backend.MaxWindow, sample.MaxDrawWindow)
	}
	// The backend's reading of a draw is the sample package's.
	for _, s := range []backend.Sampling{{}, {Temperature: 1}, {Temperature: 1, TopP: 0.9}, {Temperature: 0, TopP: 0.9}, {Temperature: 1, MinP: 0.1},
		{Temperature: 1, TopK: 4, TopP: 0.9}, {Temperature: 1, TopP: 1}, {Temperature: 1, RepeatPenalty: 1.1}, {Temperature: 1, RepeatPenalty: 1.1, Window: 3},
		{RepeatPenalty: 1, Window: 3}, {PresencePenalty: -1, Window: 1}, {FrequencyPenalty: 2, Window: 8}} {
		if d := sample.Draw(s); s.Nucleus() != d.Nucleus() || s.Penalizes() != d.Penalizes() {
			t.Errorf("%+v: backend reads nucleus %v, penalties %v; sample %v, %v", s, s.Nucleus(), s.Penalizes(), d.Nucleus(), d.Penalizes())
		}
	}
}

// TestStepLogprobs: the log-probabilities of StepSampled's draws, and of
// pipelined steps' (IssueSampled, IssueNext, WaitSampled), are
// sample.TokenLogProbs of Step's logits, whether the backend reports them
// (a backend.LogprobSampler) or the engine computes them from the logits
// (the CPU backend, and Samplers that do not report them); rows that ask
// for none have none.
func TestStepLogprobs(t *testing.T) {
	prompts := [][]int32{{5, 9, 200, 17}, {7, 8}, {300, 301, 302}}
	samplings := []backend.Sampling{{Temperature: 0, Logprobs: true, TopLogprobs: 3}, {Temperature: 0.8, Seed: 7},
		{Temperature: 1, TopP: 0.9, RepeatPenalty: 1.5, Window: 8, Seed: 13, Logprobs: true, TopLogprobs: backend.MaxTopLogprobs}}
	const steps = 6
	type rowLP struct {
		ok  bool
		lp  float32
		top []backend.TokenLogprob
	}
	// want: each step's draws and log-probabilities from Step's logits.
	ref := loadFixture(t, "llama3-tiny", Options{Context: 64, Slots: 3, MaxBatch: 4})
	var want [steps][]rowLP
	var wantIDs [steps][]int32
	{
		seqs, toks := prefilled(t, ref, prompts)
		v := ref.Vocab()
		logits := make([]float32, len(prompts)*v)
		s := append([]backend.Sampling(nil), samplings...)
		for step := range steps {
			if err := ref.Step(seqs, toks, logits); err != nil {
				t.Fatal(err)
			}
			for i := range toks {
				row := logits[i*v : (i+1)*v]
				id, err := sample.Draw(s[i]).Sample(row)
				if err != nil {
					t.Fatal(err)
				}
				r := rowLP{ok: s[i].Logprobs}
				if r.ok {
					lp, top := sample.TokenLogProbs(row, id, s[i].TopLogprobs, nil)
					r.lp = lp
					for _, x := range top {
						r.top = append(r.top, backend.TokenLogprob{ID: x.ID, Logprob: x.LogProb})
					}
				}
				want[step] = append(want[step], r)
				toks[i] = id
				if s[i].Penalizes() {
					s[i].Recent = append(s[i].Recent, id)[max(0, len(s[i].Recent)+1-s[i].Window):]
				}
				s[i].Step++
			}
			wantIDs[step] = append([]int32(nil), toks...)
		}
		for _, q := range seqs {
			q.Close()
		}
	}
	p, err := weights.Open(filepath.Join("..", "testdata", "models", "llama3-tiny"), weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	lpDrawing := &testmodel.Drawing{Backend: cpu.New(2), Logprobs: true}
	lpPipe := &testmodel.Pipelining{Backend: cpu.New(2), Logprobs: true}
	for _, c := range []struct {
		name      string
		be        backend.Backend
		pipelined bool
		reported  func() int // rows the backend reported (nil: the engine computes them)
	}{
		{"cpu", cpu.New(2), false, nil},
		{"sampler", &testmodel.Drawing{Backend: cpu.New(2)}, false, nil},
		{"logprob sampler", lpDrawing, false, func() int { return lpDrawing.LogprobRows }},
		{"pipeliner", &testmodel.Pipelining{Backend: cpu.New(2)}, true, nil},
		{"logprob pipeliner", lpPipe, true, func() int { return lpPipe.LogprobRows }},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := Load(p, c.be, Options{Context: 64, Slots: 3, MaxBatch: 4})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			seqs, toks := prefilled(t, m, prompts)
			for _, q := range seqs {
				defer q.Close()
			}
			s := append([]backend.Sampling(nil), samplings...)
			check := func(step int) {
				t.Helper()
				for i := range toks {
					if toks[i] != wantIDs[step][i] {
						t.Fatalf("step %d row %d: drew %d, want %d", step, i, toks[i], wantIDs[step][i])
					}
					lp, top, ok := m.Logprobs(i)
					w := want[step][i]
					if ok != w.ok || lp != w.lp || !slices.Equal(top, w.top) {
						t.Fatalf("step %d row %d: log-probabilities %v %v %v, want %v %v %v", step, i, ok, lp, top, w.ok, w.lp, w.top)
					}
				}
			}
			if !c.pipelined {
				for step := range steps {
					if err := m.StepSampled(seqs, toks, s, toks); err != nil {
						t.Fatal(err)
					}
					check(step)
					for i := range s {
						if s[i].Penalizes() {
							s[i].Recent = append(s[i].Recent, toks[i])[max(0, len(s[i].Recent)+1-s[i].Window):]
						}
						s[i].Step++
					}
				}
			} else {
				if err := m.IssueSampled(seqs, toks, s); err != nil {
					t.Fatal(err)
				}
				for step := range steps {
					if step+1 < steps {
						if err := m.IssueNext(); err != nil {
							t.Fatal(err)
						}
					}
					if err := m.WaitSampled(toks); err != nil {
						t.Fatal(err)
					}
					check(step)
				}
			}
			if c.reported != nil && c.reported() != 2*steps {
				t.Errorf("the backend reported %d rows' log-probabilities, want %d", c.reported(), 2*steps)
			}
		})
	}
}
