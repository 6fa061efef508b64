package cuda

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/weights"
)

// recorder is a Backend that keeps the executable it compiled last, so a
// test can reach the plan under an engine.Model.
type recorder struct {
	*Backend
	last *exec
}

func (r *recorder) Compile(p *backend.Program) (backend.Exec, error) {
	e, err := r.Backend.Compile(p)
	if x, ok := e.(*exec); ok {
		r.last = x
	}
	return e, err
}

// loadRecorded loads the model at path on a GPU and returns it with its
// plan; both are closed when t ends.
func loadRecorded(t *testing.T, path string, opts engine.Options) (*engine.Model, *exec) {
	t.Helper()
	rec := &recorder{Backend: newGPU(t)}
	w, err := weights.Open(path, weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	m, err := engine.Load(w, rec, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, rec.last
}

// TestStepOverhead measures what a one-row decode step costs beyond the
// device's own time, for the GGUF at WEFT_STEP_OVERHEAD, every step at
// one position: µs a step of ForwardInto (logits copied to the caller),
// ForwardView (logits left in the staging memory, what weft bench
// times), StepSampled (the token drawn on the device, what generation
// runs, one step at a time), pipelined (IssueNext: generation's loop
// where the backend queues steps), the graph replay alone waited for
// each step (the logits left on the device, then copied by the graph:
// outStaged), and the graph replayed back to back (the device time:
// nothing of the host between steps), also with the draws (outDrawn). A
// measuring aid: it checks nothing.
func TestStepOverhead(t *testing.T) {
	path := os.Getenv("WEFT_STEP_OVERHEAD")
	if path == "" {
		t.Skip("set WEFT_STEP_OVERHEAD to a GGUF")
	}
	m, e := loadRecorded(t, path, engine.Options{Context: 1024, MaxBatch: 64})
	seq, err := m.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	const at, steps = 64, 128
	logits := make([]float32, m.Vocab())
	tok := []int32{7}
	for range at {
		if err := seq.ForwardInto(tok, false, logits); err != nil {
			t.Fatal(err)
		}
	}
	rewind := func() {
		if err := seq.Rewind(at); err != nil {
			t.Fatal(err)
		}
	}
	timed := func(step func() error) float64 {
		start := time.Now()
		for range steps {
			rewind()
			if err := step(); err != nil {
				t.Fatal(err)
			}
		}
		return float64(time.Since(start).Microseconds()) / steps
	}
	into := timed(func() error { return seq.ForwardInto(tok, false, logits) })
	view := timed(func() error {
		_, err := seq.ForwardView(tok)
		return err
	})
	seqs, ids := []*engine.Sequence{seq}, []int32{0}
	s := []backend.Sampling{{}}
	sampled := timed(func() error { return m.StepSampled(seqs, tok, s, ids) })
	// Pipelined, as generation runs: each step queued before the host
	// reads the draws of the one before (positions at to at+steps).
	rewind()
	start := time.Now()
	if err := m.IssueSampled(seqs, tok, s); err != nil {
		t.Fatal(err)
	}
	for range steps - 1 {
		if err := m.IssueNext(); err != nil {
			t.Fatal(err)
		}
		if err := m.WaitSampled(ids); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.WaitSampled(ids); err != nil {
		t.Fatal(err)
	}
	pipelined := float64(time.Since(start).Microseconds()) / steps

	// The model's first sequence holds cache slot 0.
	b := &backend.Batch{Tokens: []int32{7}, Pos: []int32{at}, Slots: []int32{0}, Selected: []int32{0}}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d := e.be.drv
	waited := func(stage bool) float64 {
		return timed(func() error {
			if _, err := e.replay(b, false, stage); err != nil {
				return err
			}
			if r := d.cuCtxSynchronize(); r != 0 {
				return d.err(r)
			}
			return nil
		})
	}
	replay, staged := waited(false), waited(true)

	// Back to back: the graph of the logits left on the device, and the
	// one that also draws (whose draws move the position on, as the
	// pipelined steps do).
	backToBack := func(out int, draws bool) float64 {
		start := time.Now()
		if _, err := e.replay(b, draws, false); err != nil {
			t.Fatal(err)
		}
		if draws {
			out = e.drawOut // outFolded where the plan folds the draw
		}
		g := e.graphs[1][1][out][0] // at position 64: shallow
		if g == 0 {
			t.Fatalf("no graph for one row (output %d)", out)
		}
		c := &e.sys
		for range steps - 1 {
			*c = callArgs{g, 0}
			if r := c.call(d.graphLaunch, 2); r != 0 {
				t.Fatal(d.err(r))
			}
		}
		if r := d.cuCtxSynchronize(); r != 0 {
			t.Fatal(d.err(r))
		}
		return float64(time.Since(start).Microseconds()) / steps
	}
	device, drawn := backToBack(outDevice, false), backToBack(outDrawn, true)

	// Two drawing steps in one graph (the second fed by the first's
	// draws in meta), replayed back to back: against the one-step graph,
	// what the boundary between two graphs costs the device.
	if r := d.cuStreamBeginCapture(e.stream, captureRelaxed); r != 0 {
		t.Fatal(d.err(r))
	}
	for range 2 {
		for i := range e.launches {
			l := e.launchFor(i, e.drawOut)
			if l.runs(1, 1, e.drawOut, false) {
				if r := e.launch(l, 1, 1, e.stream, e.pdl && !l.serial); r != 0 {
					t.Fatal(d.err(r))
				}
			}
		}
		if err := e.launchDraws(1, e.drawOut, e.stream, e.pdl); err != nil {
			t.Fatal(err)
		}
	}
	var graph, two uintptr
	if r := d.cuStreamEndCapture(e.stream, &graph); r != 0 {
		t.Fatal(d.err(r))
	}
	if r := d.cuGraphInstantiate(&two, graph, 0); r != 0 {
		t.Fatal(d.err(r))
	}
	d.cuGraphDestroy(graph)
	defer d.cuGraphExecDestroy(two)
	start = time.Now()
	if _, err := e.replay(b, true, false); err != nil {
		t.Fatal(err)
	}
	for range steps/2 - 1 {
		e.sys = callArgs{two, 0}
		if r := e.sys.call(d.graphLaunch, 2); r != 0 {
			t.Fatal(d.err(r))
		}
	}
	if r := d.cuCtxSynchronize(); r != 0 {
		t.Fatal(d.err(r))
	}
	// steps-1 steps in pairs, and the one replay's step.
	paired := float64(time.Since(start).Microseconds()) / float64(steps-1)
	t.Logf("%s at position %d, µs a step: ForwardInto %.1f, ForwardView %.1f, StepSampled %.1f, pipelined %.1f, replay and wait %.1f "+
		"(copying the logits %.1f), back to back %.1f (drawing %.1f; two steps a graph %.1f)", filepath.Base(path), at, into, view, sampled,
		pipelined, replay, staged, device, drawn, paired)
}
