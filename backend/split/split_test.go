package split_test

import (
	"path/filepath"
	"testing"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/backend/cpu"
	"github.com/weftlm/weft/backend/split"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/internal/testmodel"
	"github.com/weftlm/weft/weights"
)

// TestSplitMatchesSingle: a model placed over two and three CPU backends
// by layer gives exactly the logits of one backend — for prefill, decode,
// batched steps and hidden states — since only the residual stream
// crosses and every part runs the same kernels.
func TestSplitMatchesSingle(t *testing.T) {
	for _, name := range []string{"gemma3-tiny", "llama3-tiny"} {
		t.Run(name, func(t *testing.T) {
			p, err := weights.Open(filepath.Join("..", "..", "testdata", "models", name), weights.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			run := func(be backend.Backend) ([]float32, []float32) {
				m, err := engine.Load(p, be, engine.Options{Context: 64, Slots: 2, MaxBatch: 8})
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				a, _ := m.NewSequence()
				b, _ := m.NewSequence()
				prompt := []int32{3, 50, 7, 99, 120, 4, 8, 15, 16, 23, 42, 77}
				out, err := a.Forward(prompt, true)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := b.Forward([]int32{9, 8, 7}, false); err != nil {
					t.Fatal(err)
				}
				step := make([]float32, 2*m.Vocab())
				if err := m.Step([]*engine.Sequence{a, b}, []int32{5, 6}, step); err != nil {
					t.Fatal(err)
				}
				out = append(out, step...)
				keys, err := a.Keys(m.Config.NLayers - 1)
				if err != nil {
					t.Fatal(err)
				}
				return out, keys
			}
			want, wantKeys := run(cpu.New(2))
			for _, parts := range [][]split.Part{
				{{Backend: cpu.New(1), FirstLayer: 0}, {Backend: cpu.New(2), FirstLayer: 1}},
				{{Backend: cpu.New(1), FirstLayer: 0}, {Backend: cpu.New(1), FirstLayer: 1}, {Backend: cpu.New(2), FirstLayer: 2}},
			} {
				s, err := split.New(parts)
				if err != nil {
					t.Fatal(err)
				}
				got, gotKeys := run(s)
				for i := range want {
					if got[i] != want[i] {
						t.Fatalf("%s: logit %d is %g, single backend %g", s.Name(), i, got[i], want[i])
					}
				}
				for i := range wantKeys {
					if gotKeys[i] != wantKeys[i] {
						t.Fatalf("%s: key %d differs", s.Name(), i)
					}
				}
			}
		})
	}
}

func TestSplitErrors(t *testing.T) {
	if _, err := split.New(nil); err == nil {
		t.Error("no parts accepted")
	}
	if _, err := split.New([]split.Part{{Backend: cpu.New(1), FirstLayer: 1}}); err == nil {
		t.Error("a first part not at layer 0 accepted")
	}
	if _, err := split.New([]split.Part{{Backend: cpu.New(1)}, {Backend: cpu.New(1), FirstLayer: 0}}); err == nil {
		t.Error("parts not ascending accepted")
	}
	p, err := weights.Open(filepath.Join("..", "..", "testdata", "models", "qwen2-tiny"), weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s, _ := split.New([]split.Part{{Backend: cpu.New(1)}, {Backend: cpu.New(1), FirstLayer: 5}})
	if _, err := engine.Load(p, s, engine.Options{Context: 16}); err == nil {
		t.Error("a part beyond the model's 2 layers accepted")
	}
}

// TestSplitDrawsOnLastPart: when the last part draws tokens itself, so
// does the split, with the tokens the host draws from the same logits; a
// split whose last part cannot draw leaves the draw to the engine.
func TestSplitDrawsOnLastPart(t *testing.T) {
	p, err := weights.Open(filepath.Join("..", "..", "testdata", "models", "llama3-tiny"), weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	draw := func(be backend.Backend) []int32 {
		m, err := engine.Load(p, be, engine.Options{Context: 32, Slots: 1, MaxBatch: 4})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		seq, _ := m.NewSequence()
		defer seq.Close()
		tok := []int32{3}
		var got []int32
		for step := range 6 {
			if err := m.StepSampled([]*engine.Sequence{seq}, tok, []backend.Sampling{{Temperature: 1, Seed: 5, Step: uint64(step)}}, tok); err != nil {
				t.Fatal(err)
			}
			got = append(got, tok[0])
		}
		return got
	}
	want := draw(cpu.New(2))
	last := &testmodel.Drawing{Backend: cpu.New(1)}
	s, err := split.New([]split.Part{{Backend: cpu.New(1)}, {Backend: last, FirstLayer: 1}})
	if err != nil {
		t.Fatal(err)
	}
	got := draw(s)
	if last.Draws != len(want) {
		t.Errorf("the last part drew %d tokens, want %d", last.Draws, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("step %d: split drew %d, host %d", i, got[i], want[i])
		}
	}
	first := &testmodel.Drawing{Backend: cpu.New(1)}
	s, _ = split.New([]split.Part{{Backend: first}, {Backend: cpu.New(1), FirstLayer: 1}})
	draw(s)
	if first.Draws != 0 {
		t.Errorf("a first part drew %d tokens", first.Draws)
	}
}
