package cuda

import (
	"path/filepath"
	"testing"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/sample"
	"github.com/weftlm/weft/weights"
)

// TestDeviceDraws: tokens drawn on the device (RunSampled through
// engine.StepSampled) are sample.SampleGumbel's draws from the logits the
// same plan produces, for greedy and tempered rows, one row (a graph
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
		for step := range 12 {
			for i := range s {
				s[i] = backend.Sampling{Temperature: []float32{0, 0.6, 1, 2.5}[(i+step)%4], Seed: uint64(100 + i), Step: uint64(step)}
			}
			if err := m.Step(logitSeqs, toks, logits); err != nil {
				t.Fatal(err)
			}
			if err := m.StepSampled(drawnSeqs, toks, s, drawn); err != nil {
				t.Fatal(err)
			}
			for i := range rows {
				want, err := sample.SampleGumbel(logits[i*v:(i+1)*v], s[i].Temperature, s[i].Seed, s[i].Step)
				if err != nil {
					t.Fatal(err)
				}
				if drawn[i] != want {
					t.Fatalf("%d rows, step %d, row %d (T=%v): drawn %d, SampleGumbel %d", rows, step, i, s[i].Temperature, drawn[i], want)
				}
			}
			copy(toks, drawn)
		}
		for i := range rows {
			logitSeqs[i].Close()
			drawnSeqs[i].Close()
		}
	}
}
