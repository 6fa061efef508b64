package engine

import (
	"math"
	"path/filepath"
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
