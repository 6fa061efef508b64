// Package split places one Program on several backends by layer: the
// embedding and the first layers on the first backend, later layer ranges
// on the next ones, and the output head with the last. Between parts only
// the residual stream crosses, one [rows, dim] copy per boundary per
// replay. Model code does not change: it still emits one Program.
package split

import (
	"errors"
	"fmt"
	"strings"

	"github.com/weftlm/weft/backend"
)

// Part is a backend and the first layer it runs; a part runs layers up to
// the next part's first layer (the last part to the end, with the head).
type Part struct {
	Backend    backend.Backend
	FirstLayer int
}

// Backend is a placement over several backends.
type Backend struct {
	parts []Part
	// Observe, when set before Compile, sees the residual stream
	// ([rows, dim]) after every part but the last, with the first layer
	// of the part that comes next — for per-layer comparisons (weft check).
	Observe func(nextLayer int, x []float32)
}

// New returns a placement. Parts must start at layer 0 and ascend.
func New(parts []Part) (*Backend, error) {
	if len(parts) == 0 {
		return nil, errors.New("split: no parts")
	}
	if parts[0].FirstLayer != 0 {
		return nil, fmt.Errorf("split: the first part starts at layer %d, want 0", parts[0].FirstLayer)
	}
	for i := 1; i < len(parts); i++ {
		if parts[i].FirstLayer <= parts[i-1].FirstLayer {
			return nil, fmt.Errorf("split: part %d starts at layer %d, not after part %d's %d", i, parts[i].FirstLayer, i-1, parts[i-1].FirstLayer)
		}
	}
	return &Backend{parts: parts}, nil
}

// Name lists the parts: "cpu[0-11]+cuda:0[12-]".
func (s *Backend) Name() string {
	var b strings.Builder
	for i, p := range s.parts {
		if i > 0 {
			b.WriteString("+")
		}
		last := ""
		if i+1 < len(s.parts) {
			last = fmt.Sprint(s.parts[i+1].FirstLayer - 1)
		}
		fmt.Fprintf(&b, "%s[%d-%s]", p.Backend.Name(), p.FirstLayer, last)
	}
	return b.String()
}

// Supports reports whether every part supports the type (a simplification:
// each part only needs its own layers' types, which Compile checks).
func (s *Backend) Supports(t string) bool {
	for _, p := range s.parts {
		if !p.Backend.Supports(t) {
			return false
		}
	}
	return true
}

// Close closes every part's backend.
func (s *Backend) Close() error {
	var first error
	for _, p := range s.parts {
		if err := p.Backend.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

type exec struct {
	p        *backend.Program
	firsts   []int // each part's first layer
	observe  func(int, []float32)
	parts    []backend.Exec
	transfer []float32 // [MaxRows, Dim]: the residual stream between parts
	all      []int32   // 0..MaxRows-1, to select every row
	inner    backend.Batch
}

// Compile splits the program and compiles each part on its backend.
func (s *Backend) Compile(p *backend.Program) (backend.Exec, error) {
	nLayers := len(p.Caches)
	if s.parts[len(s.parts)-1].FirstLayer >= nLayers {
		return nil, fmt.Errorf("split: the last part starts at layer %d of a %d-layer model", s.parts[len(s.parts)-1].FirstLayer, nLayers)
	}
	e := &exec{p: p, transfer: make([]float32, p.MaxRows*p.Bufs[p.Residual]), observe: s.Observe}
	for i := range p.MaxRows {
		e.all = append(e.all, int32(i))
	}
	for i, part := range s.parts {
		lo, hi := part.FirstLayer, nLayers
		if i+1 < len(s.parts) {
			hi = s.parts[i+1].FirstLayer
		}
		sub, err := subProgram(p, lo, hi, i == 0, i == len(s.parts)-1)
		if err != nil {
			e.Close()
			return nil, err
		}
		x, err := part.Backend.Compile(sub)
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("split: part %d (%s, layers %d-%d): %w", i, part.Backend.Name(), lo, hi-1, err)
		}
		if _, ok := x.(backend.RowWriter); i > 0 && !ok {
			x.Close()
			e.Close()
			return nil, fmt.Errorf("split: the %s backend cannot receive the residual stream", part.Backend.Name())
		}
		e.parts = append(e.parts, x)
		e.firsts = append(e.firsts, lo)
	}
	if _, ok := e.parts[len(e.parts)-1].(backend.Sampler); ok {
		return samplingExec{e}, nil
	}
	return e, nil
}

// samplingExec is a split whose last part draws tokens itself.
type samplingExec struct{ *exec }

// RunSampled runs the parts as Run does and lets the last one draw.
func (e samplingExec) RunSampled(b *backend.Batch, s []backend.Sampling, out []int32) error {
	return e.run(b, func(last backend.Exec) error { return last.(backend.Sampler).RunSampled(b, s, out) })
}

// subProgram keeps the ops of layers [lo, hi) — plus the embedding for
// the first part and the trailing output ops for the last — and only the
// weights they use. A part that is not last hands back its residual
// stream as its "hidden" output.
func subProgram(p *backend.Program, lo, hi int, first, last bool) (*backend.Program, error) {
	sub := *p
	sub.Ops = nil
	sub.Weights = nil
	remap := map[backend.WeightID]backend.WeightID{}
	use := func(id backend.WeightID) backend.WeightID {
		if id == backend.NoWeight {
			return id
		}
		if n, ok := remap[id]; ok {
			return n
		}
		sub.Weights = append(sub.Weights, p.Weights[id])
		remap[id] = backend.WeightID(len(sub.Weights) - 1)
		return remap[id]
	}
	seenLayer := false
	for _, op := range p.Ops {
		keep := false
		switch {
		case op.Layer >= 0:
			seenLayer = true
			keep = op.Layer >= lo && op.Layer < hi
		case !seenLayer:
			keep = first // the embedding
		default:
			keep = last // the output head
		}
		if !keep {
			continue
		}
		if op.Kind != backend.OpRope && op.Kind != backend.OpStoreKV && op.Kind != backend.OpAttention &&
			op.Kind != backend.OpAdd && op.Kind != backend.OpGLU && op.Kind != backend.OpGather && op.Kind != backend.OpSoftcap {
			op.W = use(op.W)
			op.Bias = use(op.Bias)
		}
		sub.Ops = append(sub.Ops, op)
	}
	// Caches of other parts' layers take no memory here.
	sub.Caches = append([]backend.Cache(nil), p.Caches...)
	for l := range sub.Caches {
		if l < lo || l >= hi {
			sub.Caches[l].Capacity = 0
		}
	}
	if !last {
		sub.Hidden, sub.Dim = p.Residual, p.Bufs[p.Residual]
	}
	return &sub, nil
}

// Run replays the parts in order, carrying the residual stream across.
func (e *exec) Run(b *backend.Batch, out []float32) error {
	return e.run(b, func(last backend.Exec) error { return last.Run(b, out) })
}

// run replays every part but the last, then hands the last to finish.
func (e *exec) run(b *backend.Batch, finish func(last backend.Exec) error) error {
	if err := e.p.Validate(b); err != nil {
		return err
	}
	rows := len(b.Tokens)
	dim := e.p.Bufs[e.p.Residual]
	x := e.transfer[:rows*dim]
	for i, part := range e.parts {
		if i > 0 {
			if e.observe != nil {
				e.observe(e.firsts[i], x)
			}
			if err := part.(backend.RowWriter).WriteRows(e.p.Residual, x); err != nil {
				return err
			}
		}
		if i == len(e.parts)-1 {
			return finish(part)
		}
		e.inner = backend.Batch{Tokens: b.Tokens, Pos: b.Pos, Slots: b.Slots, Selected: e.all[:rows], HiddenOnly: true}
		if err := part.Run(&e.inner, x); err != nil {
			return err
		}
	}
	return nil
}

// ReadKeys reads from whichever part holds the layer.
func (e *exec) ReadKeys(layer, slot, pos, n int, dst []float32) error {
	for _, part := range e.parts {
		kr, ok := part.(backend.KeyReader)
		if !ok {
			continue
		}
		if err := kr.ReadKeys(layer, slot, pos, n, dst); err == nil {
			return nil
		}
	}
	return fmt.Errorf("split: no part can read layer %d's keys", layer)
}

// Close closes every part.
func (e *exec) Close() error {
	var first error
	for _, x := range e.parts {
		if err := x.Close(); err != nil && first == nil {
			first = err
		}
	}
	e.parts = nil
	return first
}
