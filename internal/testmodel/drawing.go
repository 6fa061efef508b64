package testmodel

import (
	"errors"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/sample"
)

// Drawing wraps a backend so that its executables draw tokens themselves
// (backend.Sampler), as the CUDA backend does on the device, by the host
// reference sample.Draw (SampleGumbel, or SampleTopK for a top-k). Draws counts the tokens they drew.
// With Logprobs set they report log-probabilities too
// (backend.LogprobSampler, by sample.TokenLogProbs), as the CUDA
// backend's do; LogprobRows counts the rows they reported.
type Drawing struct {
	backend.Backend
	Draws       int
	Logprobs    bool
	LogprobRows int
}

// Compile wraps the inner executable.
func (d *Drawing) Compile(p *backend.Program) (backend.Exec, error) {
	x, err := d.Backend.Compile(p)
	if err != nil {
		return nil, err
	}
	e := &drawingExec{Exec: x, vocab: p.Vocab, logits: make([]float32, p.MaxRows*p.Vocab), d: d}
	if d.Logprobs {
		return logprobExec{e}, nil
	}
	return e, nil
}

type drawingExec struct {
	backend.Exec
	vocab  int
	logits []float32
	d      *Drawing
	// lp and top are the log-probabilities of the draws made last, for
	// the rows that asked.
	lp  []float32
	top [][]sample.TokenLogProb
}

// logprobExec is a drawingExec that reports its log-probabilities.
type logprobExec struct{ *drawingExec }

// Logprobs reports row i's log-probabilities of the draws made last.
func (e logprobExec) Logprobs(i int, top []backend.TokenLogprob) (float32, int) {
	n := min(len(top), len(e.top[i]))
	for k, t := range e.top[i][:n] {
		top[k] = backend.TokenLogprob{ID: t.ID, Logprob: t.LogProb}
	}
	e.d.LogprobRows++
	return e.lp[i], n
}

// RunSampled runs the batch and draws each selected row's token.
func (e *drawingExec) RunSampled(b *backend.Batch, s []backend.Sampling, out []int32) error {
	v := e.vocab
	if err := e.Run(b, e.logits[:len(b.Selected)*v]); err != nil {
		return err
	}
	for i, x := range s {
		id, err := sample.Draw(x).Sample(e.logits[i*v : (i+1)*v])
		if err != nil {
			return err
		}
		out[i] = id
		e.d.Draws++
		if x.Logprobs {
			for len(e.lp) <= i {
				e.lp, e.top = append(e.lp, 0), append(e.top, nil)
			}
			e.lp[i], e.top[i] = sample.TokenLogProbs(e.logits[i*v:(i+1)*v], id, x.TopLogprobs, e.top[i])
		}
	}
	return nil
}

// WriteRows passes the residual stream on to the inner executable, so the
// wrapper can be a later part of a split.
func (e *drawingExec) WriteRows(buf backend.BufID, src []float32) error {
	w, ok := e.Exec.(backend.RowWriter)
	if !ok {
		return errors.New("testmodel: the wrapped executable cannot receive rows")
	}
	return w.WriteRows(buf, src)
}

// Viewing wraps a backend so that its executables hand out their output
// rows in place (backend.Viewer), as the CUDA backend does from its
// staging memory. Views counts the runs they made so.
type Viewing struct {
	backend.Backend
	Views int
}

// Compile wraps the inner executable.
func (v *Viewing) Compile(p *backend.Program) (backend.Exec, error) {
	x, err := v.Backend.Compile(p)
	if err != nil {
		return nil, err
	}
	return &viewingExec{Exec: x, rows: make([]float32, max(p.Vocab, p.Dim)), p: p, v: v}, nil
}

type viewingExec struct {
	backend.Exec
	rows []float32
	p    *backend.Program
	v    *Viewing
}

// RunView runs a batch of one selected row into the wrapper's own memory.
func (e *viewingExec) RunView(b *backend.Batch) ([]float32, error) {
	if len(b.Selected) != 1 {
		return nil, errors.New("testmodel: a view holds one row")
	}
	width := e.p.Vocab
	if b.HiddenOnly {
		width = e.p.Dim
	}
	if err := e.Run(b, e.rows[:width]); err != nil {
		return nil, err
	}
	e.v.Views++
	return e.rows[:width], nil
}
