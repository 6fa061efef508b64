package cpu

import (
	"fmt"

	"github.com/weftlm/weft/backend"
)

// actKey names one conversion of a matmul input: the same buffer read by
// consecutive matmuls of the same family (q, k and v; gate and up) is
// converted once.
type actKey struct {
	buf      backend.BufID
	rec, nb  int
	selected bool
}

// tileChunkBytes bounds the weight bytes one work item multiplies: small
// enough to stay in a core's L2 while every activation group of a prefill
// chunk passes over it. A decode step streams each weight once; there
// long runs of tiles per item keep each core's stream sequential and the
// claims on the shared counter rare (measured on 2 cores, 1B Q4_0 decode:
// 64 KiB items 31 tok/s, 256 KiB 38, 1 MiB 47, 4 MiB 42).
const (
	tileChunkBytes   = 256 << 10
	decodeChunkBytes = 1 << 20
)

// matmulStep compiles Out = W·A (+ Bias). Packed types run as two steps:
// converting A's rows into activation records (skipped when the previous
// matmul left the same records), then the tiles of W split over the
// workers. Other types decode W row by row.
func (e *exec) matmulStep(op *backend.Op, m, bias *matrix) (step, error) {
	f := m.format()
	if f == nil {
		return step{op: op, items: func() int { return m.rows }, grain: 8, body: e.matmulBody(op, m, bias)}, nil
	}
	if m.pk == nil {
		pk, err := pack(f, m.rows, m.cols, m.raw, e.isa.signed8, e.threads)
		if err != nil {
			return step{}, fmt.Errorf("tensor %q: %w", m.name, err)
		}
		m.pk = pk
	}
	pk, k := m.pk, e.isa
	in, out, cols := e.bufs[op.A], e.bufs[op.Out], m.cols
	full := layoutFor(f, cols, k.group)
	key := actKey{buf: op.A, rec: full.rec, nb: full.nb, selected: op.OnSelected}
	act, ok := e.acts[key]
	if !ok {
		act = make([]byte, full.bytes(e.p.MaxRows))
		e.acts[key] = act
	}
	// The group is chosen per run: a single decode row is laid out densely.
	layout := func() (actLayout, int) {
		n := e.rowCount(op)
		return layoutFor(f, cols, min(n, k.group)), n
	}
	var pre *step
	if e.lastAct == nil || *e.lastAct != key {
		pre = &step{op: op, items: func() int { return e.rowCount(op) }, grain: 4, body: func(lo, hi, _ int) {
			lay, _ := layout()
			for c := lo; c < hi; c++ {
				k.convert(lay, in[c*cols:(c+1)*cols], act, c)
			}
		}}
	}
	e.lastAct = nil
	if op.Out != op.A {
		e.lastAct = &key
	}
	var b []float32
	if bias != nil {
		b = bias.f32
	}
	ld := m.rows
	body := func(lo, hi, worker int) {
		lay, n := layout()
		pk.mulTiles(k, act, lay, n, out, ld, lo, hi, e.tileScratch[worker])
		if b != nil {
			r0, r1 := lo*tileRows, min(hi*tileRows, ld)
			for c := range n {
				o := out[c*ld+r0 : c*ld+r1]
				for j := range o {
					o[j] += b[r0+j]
				}
			}
		}
	}
	grain := func() int {
		if e.rowCount(op) <= 2 {
			return max(1, decodeChunkBytes/pk.tileBytes)
		}
		return max(1, tileChunkBytes/pk.tileBytes)
	}
	return step{op: op, items: func() int { return pk.tiles }, grainFn: grain, body: body, pre: pre}, nil
}
