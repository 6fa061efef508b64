package cuda

import (
	"slices"
	"strings"

	"github.com/weftlm/weft/backend"
)

// A step of decode ends with the output product (the vocabulary's rows,
// the largest launch of a small model's step) and then the copy of its
// logits to the host (128,256 floats for Llama 3), during which the
// device idles. splitLogits cuts the one-row output product into launches
// over consecutive runs of rows, and a graph that hands the logits to the
// host (run.go, outStaged) copies each run's logits as the next run's
// launch computes, on a second stream (capture): only the last run's copy
// is left after the product. The runs shrink (logitsShares), so that each
// copy is done before the run after it. H100, tg128: 1B shape +0.5-0.8 %,
// 8B +0.1-0.2 % (docs/performance.md). The other outputs have no copy to
// overlap and launch the product whole (call.whole): tg128 drawn, whole
// against the runs, 1B Q4_0 +1.1-1.5 %, 8B +0.2 %.
//
// logitsShares are the runs' shares of the rows, in tenths.
var logitsShares = []int{6, 3, 1}

// logitsSplitRows is the fewest rows an output product is split at
// (planOptions.logitsSplit overrides it; below 0: never).
const logitsSplitRows = 16384

// logitsTwins are the one-row product kernels splitLogits splits: their
// arguments are matvec.cu's MATVEC (out, resid, x, ds, w, rowBytes, dOff,
// bias, meta, which, K, N, rpb).
var logitsTwins = []string{"matvec1_q8_0", "matvec1_q4_0", "matvec1_f16", "matvec1_bf16", "matvec1_f32"}

// splitLogits adds, after the last launch of a batch with one row
// selected, its runs of rows (see above) when it is the one-row product of
// the selected rows into the logits buffer, of at least minRows rows, and
// marks it whole: outStaged graphs launch the runs in its place. The
// launches after it in the plan run only on other batches: large ones
// (cuBLAS, which no graph holds), or more rows selected.
func splitLogits(pl *planned, logits int, minRows int) {
	if minRows < 0 {
		return
	}
	minRows = max(minRows, 32*len(logitsShares))
	at := lastOneRow(pl)
	if at < 0 || !logitsCall(pl.calls[at], logits) || pl.calls[at].args[0].v != 0 || int(pl.calls[at].args[11].v) < minRows {
		return
	}
	last := pl.calls[at]
	a := last.args
	n, k, rpb := int(a[11].v), int(a[10].v), int(a[12].v)
	rowBytes, quant := a[5].v, last.kernel == "matvec1_q8_0" || last.kernel == "matvec1_q4_0"
	total := 0
	for _, s := range logitsShares {
		total += s
	}
	runs := make([]call, 0, len(logitsShares))
	r0 := 0
	for i, s := range logitsShares {
		r1 := n
		if i < len(logitsShares)-1 {
			r1 = r0 + n*s/total/32*32 // whole groups of any rows-a-block (1, 2, 4 or 8)
		}
		c := last
		c.args = slices.Clone(a)
		c.args[0].v += int64(4 * r0)
		c.args[4].v += int64(r0) * rowBytes
		if quant {
			// The scales lie dOff bytes after the weight's start, K/32 of
			// them (2 bytes each) a row.
			c.args[6].v += -int64(r0)*rowBytes + int64(r0)*int64(k/32)*2
		}
		if c.args[7].kind == argWeight && c.args[7].id != int(backend.NoWeight) {
			c.args[7].v += int64(4 * r0)
		}
		c.args[11].v = int64(r1 - r0)
		c.gridX = min(last.gridX, blocks(r1-r0, rpb))
		c.copyOff, c.copyLen = int64(4*r0), int64(4*(r1-r0))
		runs = append(runs, c)
		r0 = r1
	}
	pl.calls[at].whole = true
	pl.calls = slices.Concat(pl.calls[:at+1], runs, pl.calls[at+1:])
}

// lastOneRow is the index of the last call of pl that a batch with one
// row selected runs (-1: none).
func lastOneRow(pl *planned) int {
	at := len(pl.calls) - 1
	for at >= 0 && (pl.calls[at].cond == large || pl.calls[at].which == metaSelected && !pl.calls[at].cond.holds(1)) {
		at--
	}
	return at
}

// logitsCall reports whether c is a one-row product of the selected row
// into the logits buffer (from its start, or a run of it) by one of
// logitsTwins, with no residual.
func logitsCall(c call, logits int) bool {
	a := c.args
	return c.cond == one && c.which == metaSelected && slices.Contains(logitsTwins, c.kernel) && len(a) == 13 &&
		a[0].kind == argBuf && a[0].id == logits && a[1].kind == argNull
}

// markLogits marks the launch that computes a one-row batch's logits
// whole, the last of its launches but splitLogits's runs, so that a
// decode step that draws its token greedily may launch its twin, which
// draws as it stores (sample.cu's fold_draw), in its place.
func markLogits(pl *planned, logits, vocab int) {
	at := lastOneRow(pl)
	for at >= 0 && pl.calls[at].copyLen > 0 {
		at--
	}
	if at >= 0 && logitsCall(pl.calls[at], logits) && pl.calls[at].args[0].v == 0 && int(pl.calls[at].args[11].v) == vocab {
		pl.calls[at].logits = true
	}
}

// skipGather spares a batch of one row the gather of its selected rows
// (which then copies its one row), a launch a decode step: where the
// gather's output is read only by the norms right after it, each of those
// gets a twin that reads the gather's input instead, for batches of one
// row (call.rowsIf), whose one selected row is row 0; the gather and the
// norms it feeds run on the other batches.
func skipGather(pl *planned) {
	for i := 0; i < len(pl.calls); i++ {
		n := gatheredNorms(pl, i)
		if n == 0 {
			continue
		}
		in := pl.calls[i].args[1]
		twins := make([]call, 0, n)
		for j := i + 1; j <= i+n; j++ {
			if !pl.calls[j].cond.holds(1) {
				continue // a launch for large batches
			}
			t := pl.calls[j]
			t.args = slices.Clone(t.args)
			t.args[1] = in
			t.rowsIf = one
			twins = append(twins, t)
			pl.calls[j].rowsIf = notOne
		}
		pl.calls[i].rowsIf = notOne
		pl.calls = slices.Concat(pl.calls[:i+1+n], twins, pl.calls[i+1+n:])
		i += n + len(twins)
	}
}

// gatheredNorms is the number of norm launches right after launch i, a
// gather, that read its output and write neither it nor its input, where
// no later launch reads that output; 0 where launch i is no such gather.
func gatheredNorms(pl *planned, i int) int {
	g := pl.calls[i]
	if g.kernel != "gather" || len(g.args) < 2 || g.rowsIf != always {
		return 0
	}
	out, in := g.args[0], g.args[1]
	reads := func(c call) bool {
		return slices.ContainsFunc(c.args, func(a arg) bool { return a.kind == argBuf && a.id == out.id })
	}
	n := 0
	for _, c := range pl.calls[i+1:] {
		if !reads(c) {
			break
		}
		if !strings.HasPrefix(c.kernel, "rmsnorm") || c.gemm != nil || c.args[1] != out || slices.Contains(c.args[2:], out) ||
			c.args[0] == out || c.args[0] == in {
			return 0
		}
		n++
	}
	if slices.ContainsFunc(pl.calls[i+1+n:], reads) {
		return 0 // read further on: the gather stays for every batch
	}
	return n
}

// embedNormTypes are the weight types (weightTypes' suffixes) of
// kernels.cu's embed_norm_q8_* kernels.
var embedNormTypes = []string{"f32", "f16", "bf16", "q8_0", "q4_0", "q8_a"}

// fuseEmbedNorm makes an embedding and the quantizing norm right after it
// that reads its output (a decode step's first two launches) one launch,
// embed_norm_q8_*, which writes both outputs: for the batches the norm
// launch runs on (the embedding stays for the others, where a plain
// rmsnorm for large batches follows).
func fuseEmbedNorm(pl *planned) {
	for i := 0; i+1 < len(pl.calls); i++ {
		e, n := pl.calls[i], pl.calls[i+1]
		sfx, ok := strings.CutPrefix(e.kernel, "embed_")
		if !ok || !slices.Contains(embedNormTypes, sfx) || n.kernel != "rmsnorm_q8" || len(e.args) != 8 || len(n.args) != 10 ||
			n.args[1] != e.args[0] || n.args[0] == e.args[0] || n.which != metaRows || e.which != metaRows || e.rowsIf != always ||
			n.rowsIf != always || e.cond != always || (n.cond != always && n.cond != small) {
			continue
		}
		f := n
		f.kernel = "embed_norm_q8_" + sfx
		f.args = []arg{e.args[0], e.args[1], e.args[2], e.args[3], e.args[5], e.args[7],
			n.args[0], n.args[2], n.args[3], n.args[4], n.args[5], n.args[6], n.args[7], n.args[8], n.args[9]}
		if n.cond == always {
			pl.calls = slices.Concat(pl.calls[:i], []call{f}, pl.calls[i+2:])
			continue
		}
		pl.calls[i].cond = large
		pl.calls = slices.Concat(pl.calls[:i+1], []call{f}, pl.calls[i+2:])
	}
}
