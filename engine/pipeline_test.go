package engine

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/backend/cpu"
	"github.com/weftlm/weft/internal/testmodel"
	"github.com/weftlm/weft/weights"
)

// loadOn loads a fixture on be.
func loadOn(t *testing.T, name string, be backend.Backend, opts Options) *Model {
	t.Helper()
	p, err := weights.Open(filepath.Join("..", "testdata", "models", name), weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	m, err := Load(p, be, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// prefilled takes a sequence for each prompt, feeds the prompts, and
// returns the sequences with each one's greedy next token.
func prefilled(t *testing.T, m *Model, prompts [][]int32) ([]*Sequence, []int32) {
	t.Helper()
	seqs := make([]*Sequence, len(prompts))
	for i := range seqs {
		var err error
		if seqs[i], err = m.NewSequence(); err != nil {
			t.Fatal(err)
		}
	}
	v := m.Vocab()
	logits := make([]float32, len(prompts)*v)
	if err := m.Prefill(seqs, prompts, logits); err != nil {
		t.Fatal(err)
	}
	toks := make([]int32, len(prompts))
	for i := range toks {
		toks[i] = argmax(logits[i*v : (i+1)*v])
	}
	return seqs, toks
}

// TestPipelinedDecode: a decode loop of IssueSampled, then IssueNext and
// WaitSampled a step, draws what StepSampled draws feeding each draw back,
// on a backend that runs each step as it is issued (the CPU: the
// engine's fallback) and on one that queues them (testmodel.Pipelining:
// a step runs only when its draws are waited for); and the slots' caches
// are then known to hold the tokens fed, for a later prompt to keep.
func TestPipelinedDecode(t *testing.T) {
	prompts := [][]int32{{5, 9, 200, 17}, {7, 8}, {300, 301, 302}, {60, 61, 62, 63}}
	// The last row penalises a window of 3 tokens, which the steps' draws
	// pass through: each step's window is the history's last 3. A negative
	// presence penalty favours the window's tokens, so that the draws
	// depend on which they are.
	samplings := []backend.Sampling{{Temperature: 0}, {Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05, Seed: 7}, {Temperature: 1.5, Seed: 9, Step: 3},
		{Temperature: 0.7, RepeatPenalty: 1.5, PresencePenalty: -30, FrequencyPenalty: 0.5, Window: 3, Recent: []int32{61, 62, 63}, Seed: 5}}
	const steps = 9
	start := func(m *Model) ([]*Sequence, []int32) { return prefilled(t, m, prompts) }
	ref := loadFixture(t, "llama3-tiny", Options{Context: 64, Slots: 4, MaxBatch: 8})
	seqs, toks := start(ref)
	first := slices.Clone(toks)
	var want [][]int32
	history := slices.Clone(prompts[3])
	for step := range steps {
		s := slices.Clone(samplings)
		for i := range s {
			s[i].Step += uint64(step)
		}
		s[3].Recent = history[len(history)-3:]
		if err := ref.StepSampled(seqs, toks, s, toks); err != nil {
			t.Fatal(err)
		}
		want = append(want, slices.Clone(toks))
		history = append(history, toks[3])
	}
	pipelining := &testmodel.Pipelining{Backend: cpu.New(2)}
	for _, c := range []struct {
		name      string
		be        backend.Backend
		pipelined bool
	}{{"cpu", cpu.New(2), false}, {"queued", pipelining, true}} {
		t.Run(c.name, func(t *testing.T) {
			m := loadOn(t, "llama3-tiny", c.be, Options{Context: 64, Slots: 4, MaxBatch: 8})
			if m.Pipelined() != c.pipelined {
				t.Fatalf("Pipelined() = %v", m.Pipelined())
			}
			seqs, toks := start(m)
			if err := m.IssueSampled(seqs, toks, samplings); err != nil {
				t.Fatal(err)
			}
			got := make([]int32, len(seqs))
			for step := range steps {
				if step < steps-1 {
					if err := m.IssueNext(); err != nil {
						t.Fatal(err)
					}
				}
				if err := m.WaitSampled(got); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want[step]) {
					t.Fatalf("step %d: drew %v, want %v", step, got, want[step])
				}
			}
			if err := m.WaitSampled(got); err == nil {
				t.Error("WaitSampled with no step issued succeeded")
			}
			if !c.pipelined {
				// The loop's steady state allocates nothing.
				if err := m.IssueSampled(seqs, got, samplings); err != nil {
					t.Fatal(err)
				}
				allocs := testing.AllocsPerRun(5, func() {
					if err := m.IssueNext(); err != nil {
						t.Fatal(err)
					}
					if err := m.WaitSampled(got); err != nil {
						t.Fatal(err)
					}
				})
				if err := m.WaitSampled(got); err != nil {
					t.Fatal(err)
				}
				if allocs != 0 {
					t.Errorf("IssueNext and WaitSampled allocate %v times a step", allocs)
				}
				for _, s := range seqs {
					if err := s.Rewind(s.Pos() - 7); err != nil {
						t.Fatal(err)
					}
				}
			}
			for i, s := range seqs {
				if s.Pos() != len(prompts[i])+steps {
					t.Errorf("sequence %d at position %d, want %d", i, s.Pos(), len(prompts[i])+steps)
				}
			}
			// Every fed token is held: a prompt repeating them keeps all.
			for _, s := range seqs {
				s.Close()
			}
			for i := range prompts {
				fed := append(slices.Clone(prompts[i]), first[i])
				for _, w := range want[:steps-1] {
					fed = append(fed, w[i])
				}
				s, kept, err := m.NewSequenceFor(append(fed, 1))
				if err != nil {
					t.Fatal(err)
				}
				if kept != len(fed) {
					t.Errorf("sequence %d: a prompt of its %d tokens kept %d", i, len(fed), kept)
				}
				defer s.Close()
			}
			if c.pipelined && (pipelining.Steps != steps || pipelining.Chained != steps-1) {
				t.Errorf("the backend ran %d steps, %d chained; want %d, %d", pipelining.Steps, pipelining.Chained, steps, steps-1)
			}
		})
	}
}

// TestPipelineMisuse: the pipeline's limits and its interplay with the
// model's other runs.
func TestPipelineMisuse(t *testing.T) {
	for _, be := range []backend.Backend{cpu.New(2), &testmodel.Pipelining{Backend: cpu.New(2)}} {
		m := loadOn(t, "llama3-tiny", be, Options{Context: 16, Slots: 3, MaxBatch: 8})
		a, _ := m.NewSequence()
		b, _ := m.NewSequence()
		s := []backend.Sampling{{}}
		one := []int32{3}
		if err := m.IssueNext(); err == nil {
			t.Error("IssueNext with nothing issued succeeded")
		}
		if err := m.IssueSampled([]*Sequence{a}, one, s); err != nil {
			t.Fatal(err)
		}
		if err := m.IssueNext(); err != nil {
			t.Fatal(err)
		}
		if err := m.IssueNext(); err == nil {
			t.Errorf("%s: a third step in flight was accepted", be.Name())
		}
		// Another run lands the steps in flight; their draws are still
		// handed out, in order, and IssueNext may not follow.
		if _, err := b.Forward([]int32{1, 2}, false); err != nil {
			t.Fatal(err)
		}
		d1, d2 := make([]int32, 1), make([]int32, 1)
		if err := m.WaitSampled(d1); err != nil {
			t.Fatal(err)
		}
		if err := m.WaitSampled(d2); err != nil {
			t.Fatal(err)
		}
		// The same two steps on their own.
		c, _ := m.NewSequence()
		w1, w2 := make([]int32, 1), make([]int32, 1)
		if err := m.StepSampled([]*Sequence{c}, one, s, w1); err != nil {
			t.Fatal(err)
		}
		s2 := []backend.Sampling{{Step: 1}}
		if err := m.StepSampled([]*Sequence{c}, w1, s2, w2); err != nil {
			t.Fatal(err)
		}
		if d1[0] != w1[0] || d2[0] != w2[0] {
			t.Errorf("%s: pipelined draws %d %d, stepped %d %d", be.Name(), d1[0], d2[0], w1[0], w2[0])
		}
		if err := m.IssueNext(); err == nil {
			t.Errorf("%s: IssueNext after another run succeeded", be.Name())
		}
		// The context's end.
		if err := m.IssueSampled([]*Sequence{a}, one, s); err != nil {
			t.Fatal(err)
		}
		if err := m.WaitSampled(d1); err != nil {
			t.Fatal(err)
		}
		var err error
		for err == nil {
			if err = m.IssueNext(); err == nil {
				err = m.WaitSampled(d1)
			}
		}
		var ce *ContextError
		if !errors.As(err, &ce) || a.Pos() != 16 {
			t.Errorf("%s: at position %d: %v, want a context error at 16", be.Name(), a.Pos(), err)
		}
		// Dropped steps are waited for and forgotten; the pipeline starts
		// again.
		if err := m.IssueSampled([]*Sequence{b}, one, s); err != nil {
			t.Fatal(err)
		}
		if err := m.IssueNext(); err != nil {
			t.Fatal(err)
		}
		m.DropIssued()
		if err := m.WaitSampled(d1); err == nil {
			t.Errorf("%s: WaitSampled after DropIssued succeeded", be.Name())
		}
		if err := m.IssueNext(); err == nil {
			t.Errorf("%s: IssueNext after DropIssued succeeded", be.Name())
		}
		if b.Pos() != 4 {
			t.Errorf("%s: after two dropped steps the sequence is at %d, want 4", be.Name(), b.Pos())
		}
		if err := m.IssueSampled([]*Sequence{b}, one, s); err != nil {
			t.Fatal(err)
		}
		if err := m.WaitSampled(d1); err != nil {
			t.Fatal(err)
		}
		if err := m.IssueSampled([]*Sequence{a, a}, []int32{1, 2}, []backend.Sampling{{}, {}}); err == nil {
			t.Errorf("%s: a sequence twice in one step was accepted", be.Name())
		}
		if err := m.IssueSampled([]*Sequence{b}, one, []backend.Sampling{{Temperature: -1}}); err == nil {
			t.Errorf("%s: a negative temperature was accepted", be.Name())
		}
	}
}
