package cuda

import "github.com/weftlm/weft/backend"

// A decode step of one row spends a launch on rope_store (rope of q and
// k, the store of k and v) before its attention. foldRope gives the split
// attention launch of one-row batches that work too (attention_split with
// invfreq set): each block rotates its query heads as it loads them, and
// the block whose run of positions holds the row's own rotates its key
// and stores it and the value. rope_store then runs for other row counts
// only. (With several rows, a row may attend to the key of a row before
// it in the same batch, which another block would be storing.)
//
// It applies where rope_store is followed by the split attention over the
// same buffers and cache, and no later op reads q or k: the folded launch
// rotates q only in shared memory and leaves k as it was.
func foldRope(p *backend.Program, pl *planned) {
	calls := make([]call, 0, len(pl.calls)+len(p.Caches))
	for i := 0; i < len(pl.calls); i++ {
		r := pl.calls[i]
		if i+1 >= len(pl.calls) {
			calls = append(calls, r)
			continue
		}
		a := pl.calls[i+1]
		fused, ok := ropeFoldable(p, r, a)
		if !ok {
			calls = append(calls, r)
			continue
		}
		r.cond, a.cond = notOne, few
		calls = append(calls, r, a, fused)
		i++
	}
	pl.calls = calls
}

// ropeFoldable reports whether the rope_store launch r and the attention
// launch a after it can be one launch for batches of one row, and returns
// that launch.
func ropeFoldable(p *backend.Program, r, a call) (call, bool) {
	// rope_store: q, k, v, kc, vc, rope, meta, pos, slots, nq, nkv, hd,
	// half, neox, cap. attention_split: out, q, kc, vc, meta, pos, slots,
	// nheads, nkv, hd, cap, scale, softcap, window, qa, ds, part, count,
	// S, kt, then kcur, vcur, invfreq, half, neox.
	if r.kernel != "rope_store" || r.cond != always || a.kernel != "attention_split" || a.cond != small ||
		r.which != metaRows || a.which != metaRows || a.op != r.op+3 ||
		a.args[1] != r.args[0] || a.args[2] != r.args[3] || a.args[3] != r.args[4] ||
		a.args[7] != r.args[9] || a.args[8] != r.args[10] || a.args[9] != r.args[11] || a.args[10] != r.args[14] {
		return call{}, false
	}
	q, k := p.Ops[r.op].A, p.Ops[r.op+1].A
	for j := a.op + 1; j < len(p.Ops); j++ {
		op := &p.Ops[j]
		if op.A == q || op.B == q || op.A == k || op.B == k {
			return call{}, false
		}
	}
	f := a
	f.cond = one
	f.args = append(append([]arg(nil), a.args[:len(a.args)-5]...), r.args[1], r.args[2], r.args[5], r.args[12], r.args[13])
	return f, true
}
