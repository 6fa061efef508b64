package cuda

import (
	"strings"

	"github.com/weftlm/weft/backend"
)

// A decode step of one row spends a launch, a few microseconds, on each
// whole-row norm before the grouped q/k/v product and before the gate/up
// /GLU product. foldNorms gives those products, for batches of one row,
// the norm's input and weight instead: each block normalizes and quantizes
// the row into its shared memory (norm_in, matvec.cu) before its products,
// and the norm's own launch runs only for other row counts. For more rows
// the blocks would repeat too much of the norm's work, so they keep it.
//
// It applies where the norm (rmsnorm_q8) quantizes its output for exactly
// that product (a Q8_0 or Q4_0 weight: matvec3_* or matvec_glu_*), no
// other launch for small batches runs between them, the row fits in
// shared memory, and no later op reads the norm's float output before it
// is written again.
func foldNorms(p *backend.Program, pl *planned) {
	calls := make([]call, 0, len(pl.calls)+8)
	for i := 0; i < len(pl.calls); i++ {
		n := pl.calls[i]
		k, fused, ok := foldable(p, pl, i)
		if !ok {
			calls = append(calls, n)
			continue
		}
		n.cond = withoutOne(n.cond)
		calls = append(calls, n)
		calls = append(calls, pl.calls[i+1:k]...) // launches for large batches only
		c := pl.calls[k]
		c.cond = withoutOne(c.cond)
		calls = append(calls, c, fused)
		i = k
	}
	pl.calls = calls
}

// withoutOne is c less batches of one row.
func withoutOne(c cond) cond {
	if c == small {
		return few
	}
	return notOne
}

// foldable reports whether call i is a norm foldNorms can fold into the
// product launch k after it, and returns k and that product's launch for
// one row with the norm folded in.
func foldable(p *backend.Program, pl *planned, i int) (int, call, bool) {
	n := pl.calls[i]
	// rmsnorm_q8 arguments: out, a, w, meta, which, cols, group, eps, qa, ds.
	if n.kernel != "rmsnorm_q8" || n.which != metaRows || (n.cond != small && n.cond != always) ||
		n.args[5] != n.args[6] || n.args[8] != scratch(scratchQ8) {
		return 0, call{}, false
	}
	k := i + 1
	for k < len(pl.calls) && pl.calls[k].cond == large {
		k++
	}
	if k == len(pl.calls) {
		return 0, call{}, false
	}
	c := pl.calls[k]
	if c.which != metaRows || (c.cond != small && c.cond != always) || (n.cond == small && c.cond != small) {
		return 0, call{}, false
	}
	// The argument that is the product's input, and the ops it covers.
	// matvec3_*: x, ds, rowBytes, meta, which, K, rpb, then out, w, dOff,
	// bias, N of each weight (out null where absent), then nx, nw, eps.
	// matvec_glu_*: out, gout, uout, qo, dso, x, ds, wg, wu, rowBytes,
	// dOffG, dOffU, meta, which, K, N, act, then nx, nw, eps.
	var x, kAt, ops int
	switch {
	case strings.HasPrefix(c.kernel, "matvec3_q"):
		x, kAt = 0, 5
		for _, at := range []int{7, 12, 17} {
			if c.args[at] != null {
				ops++
			}
		}
	case strings.HasPrefix(c.kernel, "matvec_glu_q"):
		x, kAt, ops = 5, 14, 3
	default:
		return 0, call{}, false
	}
	kCols := int(n.args[5].v)
	if c.args[x] != scratch(scratchQ8) || c.args[kAt] != n.args[5] || kCols%32 != 0 || kCols+kCols/32*8 > maxStaticShared {
		return 0, call{}, false
	}
	y := p.Ops[n.op].Out
	for j := c.op + ops; j < len(p.Ops); j++ {
		op := &p.Ops[j]
		if op.A == y || op.B == y {
			return 0, call{}, false
		}
		if out, ok := opOutput(op); ok && out == y {
			break
		}
	}
	// Between the norm and the product no op may read y either.
	for j := n.op + 1; j < c.op; j++ {
		if op := &p.Ops[j]; op.A == y || op.B == y {
			return 0, call{}, false
		}
	}
	fused := c
	fused.cond = one
	fused.shared = uint32(kCols + kCols/32*8)
	m := len(fused.args)
	fused.args = append(append([]arg(nil), c.args[:m-3]...), n.args[1], n.args[2], n.args[7])
	return k, fused, true
}
