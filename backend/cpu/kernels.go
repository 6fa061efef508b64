package cpu

import (
	"math"

	"github.com/weftlm/weft/backend"
)

// Each *Body returns the loop body of one op over a range of work items
// (rows, output columns or row×head pairs). Bodies read the per-run state
// (e.batch, e.rows) and write only their own items, so chunks can run in
// any order on any worker.

func (e *exec) embedBody(op *backend.Op, m *matrix) func(lo, hi, worker int) {
	out, cols, scale := e.bufs[op.Out], m.cols, op.Scale
	return func(lo, hi, _ int) {
		for r := lo; r < hi; r++ {
			dst := out[r*cols : (r+1)*cols]
			src := m.row(int(e.batch.Tokens[r]), dst)
			if &src[0] != &dst[0] {
				copy(dst, src)
			}
			if scale != 0 && scale != 1 {
				for i := range dst {
					dst[i] *= scale
				}
			}
		}
	}
}

// normBody: y = x / sqrt(mean(x²) + eps) * w over each group of Group
// columns. The sum of squares is accumulated in float64 so long rows do not
// lose precision; the scaling is done in F (float32, or float64 for the
// exact level, exact.go), each y rounded once.
func normBody[F float32 | float64](e *exec, op *backend.Op, m *matrix) func(lo, hi, worker int) {
	in, out, cols, g, w, eps := e.bufs[op.A], e.bufs[op.Out], e.p.Bufs[op.A], op.Group, m.f32, float64(op.Eps)
	return func(lo, hi, _ int) {
		for r := lo; r < hi; r++ {
			for start := r * cols; start < (r+1)*cols; start += g {
				x, y := in[start:start+g], out[start:start+g]
				inv := F(1 / math.Sqrt(dot64(x, x)/float64(g)+eps))
				for i, v := range x {
					y[i] = float32(F(v) * inv * F(w[i]))
				}
			}
		}
	}
}

// matmulBody computes output columns [lo, hi) for every row: each weight
// row is decoded once and multiplied with all the batch's rows.
func (e *exec) matmulBody(op *backend.Op, m *matrix, bias *matrix) func(lo, hi, worker int) {
	in, out, inCols, outCols := e.bufs[op.A], e.bufs[op.Out], m.cols, m.rows
	var b []float32
	if bias != nil {
		b = bias.f32
	}
	return func(lo, hi, worker int) {
		scratch := e.rowScratch[worker][:inCols]
		n := e.rowCount(op)
		for j := lo; j < hi; j++ {
			w := m.row(j, scratch)
			var bj float32
			if b != nil {
				bj = b[j]
			}
			for r := 0; r < n; r++ {
				out[r*outCols+j] = e.isa.dot(w, in[r*inCols:(r+1)*inCols]) + bj
			}
		}
	}
}

// ropeBody rotates each head's pairs by the row's angles, in F (float32,
// or float64 for the exact level: each result rounded once).
func ropeBody[F float32 | float64](e *exec, op *backend.Op) func(lo, hi, worker int) {
	buf, cols, rs := e.bufs[op.A], e.p.Bufs[op.A], &e.ropes[op.Table]
	heads, hd, half, neox := op.NHeads, op.HeadDim, op.RopeDim/2, op.Layout == backend.RopeNeoX
	return func(lo, hi, _ int) {
		for r := lo; r < hi; r++ {
			cos, sin := rs.cos[r*rs.half:(r+1)*rs.half], rs.sin[r*rs.half:(r+1)*rs.half]
			for h := 0; h < heads; h++ {
				x := buf[r*cols+h*hd : r*cols+(h+1)*hd]
				for i := 0; i < half; i++ {
					a, b := 2*i, 2*i+1
					if neox {
						a, b = i, i+half
					}
					x0, x1, c, s := F(x[a]), F(x[b]), F(cos[i]), F(sin[i])
					x[a] = float32(x0*c - x1*s)
					x[b] = float32(x0*s + x1*c)
				}
			}
		}
	}
}

func (e *exec) storeKVBody(op *backend.Op) func(lo, hi, worker int) {
	kIn, vIn, c := e.bufs[op.A], e.bufs[op.B], &e.kv[op.Layer]
	d := c.kvDim
	return func(lo, hi, _ int) {
		for r := lo; r < hi; r++ {
			at := (int(e.batch.Slots[r])*c.capacity + int(e.batch.Pos[r])%c.capacity) * d
			if c.k16 != nil {
				toF16(c.k16[at:at+d], kIn[r*d:(r+1)*d])
				toF16(c.v16[at:at+d], vIn[r*d:(r+1)*d])
				continue
			}
			copy(c.k[at:at+d], kIn[r*d:(r+1)*d])
			copy(c.v[at:at+d], vIn[r*d:(r+1)*d])
		}
	}
}

// attnItem locates work item item of an attention op: its row and head,
// the visible positions [first, pos] (a window's last ones, or all), the
// cache offset of the head's kv head in the row's slot, and the head's
// query.
func (e *exec) attnItem(op *backend.Op, c *kvCache, item int) (r, first, pos, base int, qh []float32) {
	heads, hd := op.NHeads, op.HeadDim
	r, h := item/heads, item%heads
	pos = int(e.batch.Pos[r])
	if op.Window > 0 {
		first = max(0, pos-op.Window+1)
	}
	base = int(e.batch.Slots[r])*c.capacity*c.kvDim + (h/(heads/op.NKV))*hd
	q := e.bufs[op.A]
	return r, first, pos, base, q[(r*heads+h)*hd : (r*heads+h+1)*hd]
}

// attentionBody handles one (row, head) pair per item: scores against every
// visible cached position, a softmax, and the weighted sum of values. The
// visible positions of a ring cache are at most two runs of slots.
func (e *exec) attentionBody(op *backend.Op) func(lo, hi, worker int) {
	out, c := e.bufs[op.Out], &e.kv[op.Layer]
	hd, cols, scale, softcap := op.HeadDim, op.NHeads*op.HeadDim, op.Scale, op.Cap
	k := e.isa
	return func(lo, hi, worker int) {
		for item := lo; item < hi; item++ {
			r, first, pos, base, qh := e.attnItem(op, c, item)
			h := item % op.NHeads
			scores := e.scoreScratch[worker][:pos-first+1]
			for j := first; j <= pos; {
				slot := j % c.capacity
				n := min(pos-j+1, c.capacity-slot)
				at := base + slot*c.kvDim
				if c.k16 != nil {
					k.scores16(qh, c.k16[at:], c.kvDim, scores[j-first:j-first+n], scale)
				} else {
					k.scores(qh, c.k[at:], c.kvDim, scores[j-first:j-first+n], scale)
				}
				j += n
			}
			if softcap > 0 {
				for i, s := range scores {
					scores[i] = softcap * float32(math.Tanh(float64(s/softcap)))
				}
			}
			maxS := float32(math.Inf(-1))
			for _, s := range scores {
				maxS = max(maxS, s)
			}
			inv := 1 / k.expSub(scores, maxS)
			for i := range scores {
				scores[i] *= inv
			}
			o := out[r*cols+h*hd : r*cols+(h+1)*hd]
			tmp := e.rowScratch[worker][:hd]
			for j := first; j <= pos; {
				slot := j % c.capacity
				n := min(pos-j+1, c.capacity-slot)
				at := base + slot*c.kvDim
				dst := o
				if j != first {
					dst = tmp
				}
				if c.v16 != nil {
					k.wsum16(scores[j-first:j-first+n], c.v16[at:], c.kvDim, dst)
				} else {
					k.wsum(scores[j-first:j-first+n], c.v[at:], c.kvDim, dst)
				}
				if j != first {
					for i, v := range tmp {
						o[i] += v
					}
				}
				j += n
			}
		}
	}
}

func (e *exec) addBody(op *backend.Op) func(lo, hi, worker int) {
	a, b, out, cols := e.bufs[op.A], e.bufs[op.B], e.bufs[op.Out], e.p.Bufs[op.A]
	return func(lo, hi, _ int) {
		for i := lo * cols; i < hi*cols; i++ {
			out[i] = a[i] + b[i]
		}
	}
}

func (e *exec) gluBody(op *backend.Op) func(lo, hi, worker int) {
	a, b, out, cols, gelu := e.bufs[op.A], e.bufs[op.B], e.bufs[op.Out], e.p.Bufs[op.A], op.Act == backend.ActGELUTanh
	fn := e.isa.siluMul
	if gelu {
		fn = e.isa.geluMul
	}
	// One call a row: the vector kernels leave a row's last len%8
	// elements to the portable code, which rounds differently, so a call
	// over several rows would make the result depend on how the rows were
	// shared out between workers (their number).
	return func(lo, hi, _ int) {
		for r := lo; r < hi; r++ {
			fn(a[r*cols:(r+1)*cols], b[r*cols:(r+1)*cols], out[r*cols:(r+1)*cols])
		}
	}
}

func (e *exec) gatherBody(op *backend.Op) func(lo, hi, worker int) {
	in, out, cols := e.bufs[op.A], e.bufs[op.Out], e.p.Bufs[op.A]
	return func(lo, hi, _ int) {
		for i := lo; i < hi; i++ {
			r := int(e.batch.Selected[i])
			copy(out[i*cols:(i+1)*cols], in[r*cols:(r+1)*cols])
		}
	}
}

func (e *exec) softcapBody(op *backend.Op) func(lo, hi, worker int) {
	in, out, cols, c := e.bufs[op.A], e.bufs[op.Out], e.p.Bufs[op.A], float64(op.Cap)
	return func(lo, hi, _ int) {
		for i := lo * cols; i < hi*cols; i++ {
			out[i] = float32(c * math.Tanh(float64(in[i])/c))
		}
	}
}
