package engine

import (
	"path/filepath"
	"testing"

	"github.com/weftlm/weft/backend/cpu"
	"github.com/weftlm/weft/weights"
)

func loadFixture(t *testing.T, name string, opts Options) *Model {
	t.Helper()
	p, err := weights.Open(filepath.Join("..", "testdata", "models", name), weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	m, err := Load(p, cpu.New(2), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestBatchedPathsAgree: packing several sequences' prompts into shared
// replays (Prefill) and decoding them together (Step) gives what each
// sequence gets alone — nothing of one sequence reaches another.
func TestBatchedPathsAgree(t *testing.T) {
	m := loadFixture(t, "gemma3-tiny", Options{Context: 64, Slots: 3, MaxBatch: 8})
	prompts := [][]int32{{5, 9, 200, 17, 33, 1, 2, 3, 4, 5, 6}, {7, 8}, {300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311, 312, 313}}
	v := m.Vocab()

	// Alone: each prompt, then 6 greedy steps.
	want := make([][]float32, len(prompts))
	for i, p := range prompts {
		s, _ := m.NewSequence()
		last, err := s.Forward(p, false)
		if err != nil {
			t.Fatal(err)
		}
		for range 6 {
			want[i] = append(want[i], last...)
			if last, err = s.Forward([]int32{argmax(last)}, false); err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
	}

	seqs := make([]*Sequence, len(prompts))
	for i := range seqs {
		seqs[i], _ = m.NewSequence()
	}
	out := make([]float32, len(prompts)*v)
	if err := m.Prefill(seqs, prompts, out); err != nil {
		t.Fatal(err)
	}
	toks := make([]int32, len(prompts))
	for step := range 6 {
		for i := range prompts {
			got := out[i*v : (i+1)*v]
			if e := relErr(got, want[i][step*v:(step+1)*v]); e > 1e-5 {
				t.Fatalf("step %d sequence %d: relative error %.3g between batched and alone", step, i, e)
			}
			toks[i] = argmax(got)
		}
		if err := m.Step(seqs, toks, out); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range seqs {
		s.Close()
	}
	if _, err := m.NewSequence(); err != nil {
		t.Errorf("slots not returned: %v", err)
	}
}

func TestHiddenAndKeys(t *testing.T) {
	m := loadFixture(t, "qwen3-tiny", Options{Context: 32, MaxBatch: 4, Slots: 2})
	s, _ := m.NewSequence()
	defer s.Close()
	h, err := s.Hidden([]int32{3, 4, 5, 6, 7, 8})
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 6*m.Config.Dim {
		t.Fatalf("hidden has %d floats", len(h))
	}
	keys, err := s.Keys(1)
	if err != nil || len(keys) != 6*m.Config.KVDim() {
		t.Fatalf("keys: %d floats, %v", len(keys), err)
	}
	if _, err := s.Keys(9); err == nil {
		t.Error("keys of a layer beyond the model")
	}
	// The hidden states of the first rows do not depend on later tokens.
	s2, err := m.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	h2, _ := s2.Hidden([]int32{3, 4})
	if e := relErr(h2, h[:len(h2)]); e > 1e-6 {
		t.Errorf("causality: relative error %.3g", e)
	}
}

func TestContextErrors(t *testing.T) {
	m := loadFixture(t, "llama3-tiny", Options{Context: 8, MaxBatch: 4})
	s, _ := m.NewSequence()
	defer s.Close()
	if _, err := s.Forward(make([]int32, 9), false); err == nil || err.Error() != "engine: 0 tokens plus 9 new exceed the context of 8" {
		t.Errorf("got %v", err)
	}
	if _, err := m.NewSequence(); err != ErrNoSlot {
		t.Errorf("second sequence with one slot: %v", err)
	}
}
