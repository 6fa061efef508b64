package cuda

import (
	"fmt"
	"strings"

	"github.com/weftlm/weft/backend"
)

// Decode runs one kernel per launch, and a launch costs a few
// microseconds whatever it does, so consecutive products that read one
// input become one launch on the matrix-vector path: q, k and v
// (matvec3_*), and gate and up together with the GLU after them
// (matvec_glu_*), which also quantizes its output for the down product.
// K-quant weights group too (matvec3_q*_k); where they read Q4_0's int8
// activations (planOptions.kA32) their gate and up fuse with the GLU as
// well (matvec_glu_q*_k), else their GLU keeps its launch (glu_q8k).
// Each op is still checked, and planned for large batches, on its own.

// groupable returns how many products from op i on (2 or 3) can share one
// matrix-vector launch: products of one input by weights of one type and
// width, with the same batch rows and path, writing distinct buffers that
// none of them reads, none followed by a residual add it would take. It
// returns 0 or 1 when there is nothing to group.
func groupable(p *backend.Program, pl *planned, i int, opt planOptions) int {
	first := &p.Ops[i]
	m0, ok := productWeight(p, pl, first)
	if !ok || opt.noKGroup && kLayouts[m0.typ] != nil {
		return 0
	}
	n := 1
	outs := map[backend.BufID]bool{first.Out: true}
	for ; n < 3 && i+n < len(p.Ops); n++ {
		op := &p.Ops[i+n]
		m, ok := productWeight(p, pl, op)
		if !ok || op.A != first.A || op.OnSelected != first.OnSelected || op.Head != first.Head || outs[op.Out] ||
			m.typ != m0.typ || m.cols != m0.cols || gemmUsable(m, opt) != gemmUsable(m0, opt) {
			break
		}
		outs[op.Out] = true
	}
	if n > 1 && i+n < len(p.Ops) && fusable(p, &p.Ops[i+n-1], &p.Ops[i+n]) {
		n-- // the last product adds to a residual: it keeps its own launch
	}
	return n
}

// productWeight is op's weight when op is a product the matrix-vector
// path takes with a well-formed weight and buffers (planOp checks the
// rest and reports what is wrong).
func productWeight(p *backend.Program, pl *planned, op *backend.Op) (*matInfo, bool) {
	if op.Kind != backend.OpMatMul || op.W < 0 || int(op.W) >= len(pl.mats) || op.A < 0 || int(op.A) >= len(p.Bufs) ||
		op.Out < 0 || int(op.Out) >= len(p.Bufs) || op.Out == op.A {
		return nil, false
	}
	m := &pl.mats[op.W]
	if m.vector || m.cols != p.Bufs[op.A] || m.rows != p.Bufs[op.Out] {
		return nil, false
	}
	return m, true
}

// planGroup plans products i to i+n-1 (groupable) as one matvec3 launch,
// keeping each product's launches for large batches.
func planGroup(p *backend.Program, pl *planned, st *planState, i, n int, opt planOptions) ([]call, error) {
	var calls, mvs []call
	for k := i; k < i+n; k++ {
		cs, err := planOp(p, pl, st, &p.Ops[k], opt, backend.BufID(-1))
		if err != nil {
			return nil, fmt.Errorf("cuda: op %d (%s, layer %d): %w", k, p.Ops[k].Kind, p.Ops[k].Layer, err)
		}
		for _, c := range cs {
			c.op = k
			if strings.HasPrefix(c.kernel, "matvec_") && c.cond != large {
				mvs = append(mvs, c)
				continue
			}
			calls = append(calls, c)
		}
	}
	m := &pl.mats[p.Ops[i].W]
	// matvec_* arguments: out, resid, x, ds, w, rowBytes, dOff, bias, meta,
	// which, K, N, rpb.
	first := mvs[0]
	rows, groups := 0, 0
	for _, c := range mvs {
		rows += int(c.args[11].v)
	}
	rpb := rowsPerBlock(rows, m.chunks(), opt.sms)
	args := []arg{first.args[2], first.args[3], first.args[5], first.args[8], first.args[9], first.args[10], i32(rpb)}
	for k := range 3 {
		if k >= len(mvs) {
			args = append(args, null, null, i64(0), null, i32(0))
			continue
		}
		c := mvs[k]
		args = append(args, c.args[0], c.args[4], c.args[6], c.args[7], c.args[11])
		groups += (int(c.args[11].v) + rpb - 1) / rpb
	}
	calls = append(calls, call{op: i, kernel: "matvec3_" + weightTypes[m.typ], gridX: uint32(min(groups, mvGridPerSM*opt.sms)), gridY: gridOne,
		block: 32 * mvWarps, args: args, which: first.which, cond: first.cond})
	return calls, nil
}

// gluRows and gluWarps are matvec.cu's GLU_ROWS and GLU_WARPS: the
// outputs of a GLU block at a time, and its warps.
const (
	gluRows  = 32
	gluWarps = 8
)

// gluBlockWarps is the warps of a matvec_glu block for a weight of groups
// groups of gluRows rows: gluWarps where every block is resident at once
// (two blocks of gluWarps warps a multiprocessor, as its launch bounds
// allow), else half as many, so that up to twice the blocks run in one
// wave rather than leaving a second wave part full.
// A forced count (WEFT_CUDA_GLU_WARPS) is rounded down to a power of two,
// which the kernel needs: its passes must tile the block's gluRows rows.
func gluBlockWarps(groups int, opt planOptions) int {
	switch {
	case opt.gluWarps > 0:
		w := 1
		for w*2 <= min(opt.gluWarps, gluWarps) {
			w *= 2
		}
		return w
	case groups <= 2*opt.sms:
		return gluWarps
	}
	return gluWarps / 2
}

// gluFusable reports whether ops i, i+1 and i+2 are the products of one
// input by a gate and an up weight of one type and shape, without biases,
// and the GLU of their outputs, so matvec_glu can do all three. Where the
// product after the GLU quantizes its input, it must take the
// matrix-vector path on the same batches as the gate and up products.
func gluFusable(p *backend.Program, pl *planned, i int, opt planOptions) bool {
	if i+2 >= len(p.Ops) {
		return false
	}
	gate, up, glu := &p.Ops[i], &p.Ops[i+1], &p.Ops[i+2]
	mg, ok1 := productWeight(p, pl, gate)
	mu, ok2 := productWeight(p, pl, up)
	// K-quant gate and up products on Q8_K records group (matvec3_q*_k)
	// but have no GLU kernel: their GLU stays glu_q8k, which quantizes for
	// a K-quant down.
	if !ok1 || !ok2 || (kLayouts[mg.typ] != nil && (!opt.kA32 || opt.noKGLU)) || glu.Kind != backend.OpGLU || up.A != gate.A || up.Out == gate.Out || up.Out == gate.A ||
		gate.Bias != backend.NoWeight || up.Bias != backend.NoWeight || mg.typ != mu.typ || mg.cols != mu.cols || mg.rows != mu.rows ||
		up.OnSelected != gate.OnSelected || glu.OnSelected != gate.OnSelected || gate.Head || up.Head || glu.Head ||
		glu.A != gate.Out || glu.B != up.Out || glu.Out < 0 || int(glu.Out) >= len(p.Bufs) || glu.Out == gate.A ||
		(glu.Out != gate.Out && glu.Out != up.Out && p.Bufs[glu.Out] != mg.rows) {
		return false
	}
	if c := q8Consumer(p, pl, i+2, opt); c != nil && *c != mvCondOf(mg, opt) {
		return false
	}
	// With mmq the GLU quantizes its output for every batch size, a
	// launch planGLU does not keep: gate, up and GLU stay op by op.
	if mmqUsable(mg, opt) {
		return false
	}
	// A K-quant product after the GLU on Q8_K records reads rows the fused
	// kernel does not write (its glu_q8k does).
	if next := i + 3; !opt.kA32 && next < len(p.Ops) && p.Ops[next].Kind == backend.OpMatMul && p.Ops[next].A == glu.Out &&
		p.Ops[next].W >= 0 && int(p.Ops[next].W) < len(pl.mats) && kLayouts[pl.mats[p.Ops[next].W].typ] != nil {
		return false
	}
	return true
}

// mvCondOf is the condition under which products by m take the
// matrix-vector path.
func mvCondOf(m *matInfo, opt planOptions) cond {
	if gemmUsable(m, opt) {
		return small
	}
	return always
}

// planGLU plans ops i to i+2 (gluFusable) as one matvec_glu launch,
// keeping each op's launches for large batches.
func planGLU(p *backend.Program, pl *planned, st *planState, i int, opt planOptions) ([]call, error) {
	gate, up, glu := &p.Ops[i], &p.Ops[i+1], &p.Ops[i+2]
	mg := &pl.mats[gate.W]
	mvCond := mvCondOf(mg, opt)
	var calls []call
	var x, ds arg
	for k := i; k <= i+2; k++ {
		cs, err := planOp(p, pl, st, &p.Ops[k], opt, backend.BufID(-1))
		if err != nil {
			return nil, fmt.Errorf("cuda: op %d (%s, layer %d): %w", k, p.Ops[k].Kind, p.Ops[k].Layer, err)
		}
		for _, c := range cs {
			c.op = k
			if c.cond == large || c.kernel == "quantize_q8" {
				calls = append(calls, c)
				continue
			}
			if strings.HasPrefix(c.kernel, "matvec_") {
				x, ds = c.args[2], c.args[3]
			}
			if c.kernel == "glu" && mvCond == small {
				c.cond = large
				calls = append(calls, c)
			}
		}
	}
	which := metaRows
	if gate.OnSelected {
		which = metaSelected
	}
	qo, dso := null, null
	if q8Consumer(p, pl, i+2, opt) != nil && mg.rows%gluRows == 0 {
		qo, dso = scratch(scratchG8), scratch(scratchG8DS)
		pl.need(scratchG8, p.MaxRows*mg.rows)
		pl.need(scratchG8DS, p.MaxRows*mg.rows/32*8)
		st.q8 = &scratchHolds{buf: glu.Out, which: which, cond: mvCond, area: scratchG8}
	}
	gout, uout := buf(gate.Out), buf(up.Out)
	if glu.Out == gate.Out {
		gout = null
	}
	if glu.Out == up.Out {
		uout = null
	}
	groups := (mg.rows + gluRows - 1) / gluRows
	calls = append(calls, call{op: i, kernel: "matvec_glu_" + weightTypes[mg.typ], gridX: uint32(min(groups, mvGridPerSM*opt.sms)), gridY: gridOne,
		block: uint32(32 * gluBlockWarps(groups, opt)), which: which, cond: mvCond,
		args: []arg{buf(glu.Out), gout, uout, qo, dso, x, ds, weight(gate.W), weight(up.W), i64(mg.rowBytes), i64(int(mg.dOff)),
			i64(int(pl.mats[up.W].dOff)), metaField(-1, p.MaxRows), i32(which), i32(mg.cols), i32(mg.rows), i32(glu.Act)}})
	return calls, nil
}
