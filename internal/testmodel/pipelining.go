package testmodel

import (
	"errors"
	"fmt"
	"slices"

	"github.com/weftlm/weft/backend"
)

// Pipelining wraps a backend so that its executables queue decode steps
// (backend.Pipeliner) as the CUDA backend does, and draw their tokens
// themselves (as Drawing's do). A queued step runs only when WaitSampled
// needs its draws, in the order the steps were issued, so a caller that
// counts on a step having run before it waits for it is caught; as on the
// device, every other run fails while steps are queued. Steps counts the
// steps run, Chained those that IssueNext queued. With Logprobs set they
// report log-probabilities too (backend.LogprobSampler), LogprobRows
// counting the rows they reported.
type Pipelining struct {
	backend.Backend
	Steps, Chained int
	Logprobs       bool
	LogprobRows    int
}

// Compile wraps the inner executable.
func (p *Pipelining) Compile(prog *backend.Program) (backend.Exec, error) {
	d := &Drawing{Backend: p.Backend}
	x, err := d.Compile(prog)
	if err != nil {
		return nil, err
	}
	e := &pipeExec{drawingExec: x.(*drawingExec), p: p}
	if p.Logprobs {
		return logprobPipe{e}, nil
	}
	return e, nil
}

// logprobPipe is a pipeExec that reports its log-probabilities.
type logprobPipe struct{ *pipeExec }

// Logprobs reports row i's log-probabilities of the draws handed out last.
func (e logprobPipe) Logprobs(i int, top []backend.TokenLogprob) (float32, int) {
	lp, n := logprobExec{e.drawingExec}.Logprobs(i, top)
	e.p.LogprobRows++
	return lp, n
}

type pipeExec struct {
	*drawingExec
	p     *Pipelining
	queue []queuedStep
	prev  queuedStep // the step run last, with its draws
	chain bool       // IssueNext may follow the step issued last
}

type queuedStep struct {
	b       backend.Batch
	s       []backend.Sampling
	draws   []int32
	chained bool // run as the step after the one before it
}

var errQueued = errors.New("testmodel: a run while decode steps are queued")

func (e *pipeExec) Run(b *backend.Batch, out []float32) error {
	if len(e.queue) > 0 {
		return errQueued
	}
	e.chain = false
	return e.drawingExec.Run(b, out)
}

func (e *pipeExec) RunSampled(b *backend.Batch, s []backend.Sampling, out []int32) error {
	if len(e.queue) > 0 {
		return errQueued
	}
	e.chain = false
	return e.drawingExec.RunSampled(b, s, out)
}

// IssueSampled queues a decode step.
func (e *pipeExec) IssueSampled(b *backend.Batch, s []backend.Sampling) error {
	if len(e.queue) == backend.MaxPipelined {
		return errors.New("testmodel: too many steps queued")
	}
	for i, r := range b.Selected {
		if int(r) != i || len(b.Selected) != len(b.Tokens) {
			return fmt.Errorf("testmodel: a pipelined step selects every row in order")
		}
	}
	q := queuedStep{b: backend.Batch{
		Tokens: slices.Clone(b.Tokens), Pos: slices.Clone(b.Pos), Slots: slices.Clone(b.Slots), Selected: slices.Clone(b.Selected),
	}, s: slices.Clone(s)}
	for i := range q.s {
		q.s[i].Recent = slices.Clone(q.s[i].Recent)
	}
	e.queue = append(e.queue, q)
	e.chain = true
	return nil
}

// IssueNext queues the step after the one issued last.
func (e *pipeExec) IssueNext() error {
	switch {
	case !e.chain:
		return errors.New("testmodel: IssueNext without a decode step issued before it")
	case len(e.queue) == backend.MaxPipelined:
		return errors.New("testmodel: too many steps queued")
	}
	e.queue = append(e.queue, queuedStep{chained: true})
	return nil
}

// WaitSampled runs the oldest queued step and hands out its draws.
func (e *pipeExec) WaitSampled(out []int32) error {
	if len(e.queue) == 0 {
		return errors.New("testmodel: no step queued")
	}
	st := e.queue[0]
	e.queue = e.queue[1:]
	if st.chained {
		p := e.prev
		st.b = backend.Batch{Tokens: p.draws, Pos: slices.Clone(p.b.Pos), Slots: p.b.Slots, Selected: p.b.Selected}
		st.s = slices.Clone(p.s)
		for i := range st.b.Pos {
			st.b.Pos[i]++
			st.s[i].Step++
			// The penalty window gains the token fed, as the device's does.
			if x := &st.s[i]; x.Penalizes() {
				w := append(slices.Clone(x.Recent), p.draws[i])
				x.Recent = w[max(0, len(w)-x.Window):]
			}
		}
		e.p.Chained++
	}
	if len(out) != len(st.b.Selected) {
		return fmt.Errorf("testmodel: %d draws, an output of %d", len(st.b.Selected), len(out))
	}
	st.draws = make([]int32, len(out))
	if err := e.drawingExec.RunSampled(&st.b, st.s, st.draws); err != nil {
		e.queue, e.chain = nil, false
		return err
	}
	e.prev = st
	e.p.Steps++
	copy(out, st.draws)
	return nil
}

var (
	_ backend.Pipeliner      = (*pipeExec)(nil)
	_ backend.LogprobSampler = logprobExec{}
	_ backend.LogprobSampler = logprobPipe{}
)
