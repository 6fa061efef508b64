package cuda

import (
	"cmp"
	"fmt"
	"os"
	"slices"

	"github.com/weftlm/weft/backend"
)

// need grows scratch area id to at least n bytes.
func (pl *planned) need(id, n int) {
	pl.scratch[id] = max(pl.scratch[id], int64(n))
}

func rowsOf(which int) gridRows {
	if which == metaSelected {
		return gridSelected
	}
	return gridAll
}

// rowsPerBlock picks how many output rows a matrix-vector block covers so
// that a launch has at least two blocks per multiprocessor: 8 (half a
// warp a row) where a row is at most 64 chunks of 16 bytes, so each lane
// still has several loads in flight; 4 (a warp a row); 2 or 1 (2 or 4
// warps split a row's K).
func rowsPerBlock(n, chunks, sms int) int {
	switch {
	case chunks <= 64 && n/8 >= 2*sms:
		return 8
	case n/4 >= 2*sms:
		return 4
	case n/2 >= 2*sms:
		return 2
	}
	return 1
}

// mvGridPerSM bounds a matrix-vector grid: blocks loop over their groups
// of rows, so a few blocks per multiprocessor stream the whole weight.
const mvGridPerSM = 4

// chunks is the 16-byte loads a row of m takes in the matrix-vector kernel.
func (m *matInfo) chunks() int {
	if kLayouts[m.typ] != nil { // a K-quant chunk holds 32 elements (matvec_k.cu)
		return m.cols / 32
	}
	switch m.typ {
	case "Q4_0":
		return m.cols / 32
	case "Q8_0", "Q8_A":
		return m.cols / 16
	case "F32":
		return m.cols / 4
	}
	return m.cols / 8
}

// gemmUsable reports whether cuBLAS takes products by m for large counts
// (Q8_0 and Q4_0 weights go to mmq instead where it runs).
func gemmUsable(m *matInfo, opt planOptions) bool {
	return opt.gemm && m.typ != "F32" && m.cols%8 == 0 && !mmqUsable(m, opt) &&
		(m.typ == "F16" || int64(m.rows)*int64(m.cols)*2 <= maxW16Bytes)
}

// mmq (mmq.cu) geometry: threads a block and a tile's weight rows and
// activation rows.
const (
	mmqThreads    = 256 // MQ_THREADS
	mmqWeightRows = 128 // MQ_W
	mmqRows       = 64  // 16·NT
	// mmqGridPerSM bounds an mmq grid; blocks loop over the tiles.
	mmqGridPerSM = 16
)

// mmqOn is planOptions.mmq for a device of architecture arch: products
// by Q8_0 and Q4_0 weights in large batches go to mmq, which computes
// them as the CPU does, with WEFT_MMQ=1 on sm_80 and newer (mma.m16n8k32);
// by default they go to cuBLAS as f16, which is 1.3-1.4× faster on an
// H100 (pp512 of 8B Q4_0: 13.6k against 9.8k tok/s; NOTES.md) at the cost
// of f16 rounding (KL to the CPU up to 1e-2 on the tiny fixtures, 1e-4
// with mmq). mmq becomes the default once it is the faster one.
func mmqOn(arch int) bool {
	return arch >= 80 && os.Getenv("WEFT_MMQ") == "1"
}

// mmqUsable reports whether mmq takes products by m for large counts.
func mmqUsable(m *matInfo, opt planOptions) bool {
	return opt.mmq && (m.typ == "Q8_0" || m.typ == "Q4_0") && m.cols%32 == 0
}

// mmqCall is the mmq launch of a product by m (cond large), adding to the
// residual r and the bias b where they are not null.
func mmqCall(p *backend.Program, op *backend.Op, m *matInfo, which int, opt planOptions, r, b arg) call {
	tiles := int(blocks(m.rows, mmqWeightRows)) * int(blocks(p.MaxRows, mmqRows))
	return call{kernel: "mmq_" + weightTypes[m.typ], gridX: uint32(min(tiles, mmqGridPerSM*opt.sms)), gridY: gridOne,
		block: mmqThreads, cond: large,
		args: []arg{buf(op.Out), r, scratch(scratchQ8), scratch(scratchQ8DS), weight(op.W), i64(m.rowBytes), i64(int(m.dOff)), b,
			metaField(-1, p.MaxRows), i32(which), i32(m.cols), i32(m.rows)}}
}

// q8Input returns the launch that quantizes op's input (k columns) to
// int8 rows of quantize_q8's records under condition c, none where the
// scratch already holds them, and the scratch areas that hold them.
func q8Input(p *backend.Program, pl *planned, st *planState, op *backend.Op, which, k int, c cond) (calls []call, x, ds arg) {
	if !st.holds(st.q8, op.A, which, c) {
		calls = append(calls, call{kernel: "quantize_q8", gridX: blocks(k/32, 8), gridY: rowsOf(which), block: 256, cond: c,
			args: []arg{scratch(scratchQ8), scratch(scratchQ8DS), buf(op.A), metaField(-1, p.MaxRows), i32(which), i32(k)}})
		st.q8 = &scratchHolds{buf: op.A, which: which, cond: c}
	}
	pl.need(scratchQ8, p.MaxRows*k)
	pl.need(scratchQ8DS, p.MaxRows*k/32*8)
	return calls, scratch(st.q8.area), scratch(st.q8.area + 1)
}

// planMatMul returns a checked product's launches: the matrix-vector
// kernel (after quantizing the input rows to int8 for Q8_0 and Q4_0
// weights) and, for large counts, mmq (Q8_0 and Q4_0, on the same int8
// rows) or, where cuBLAS can take the product, the f16 conversions of
// input and weight, the product and the bias. resid >= 0 names a residual
// the matrix-vector kernel and mmq add their result to.
func planMatMul(p *backend.Program, pl *planned, st *planState, op *backend.Op, m *matInfo, which int, opt planOptions, resid backend.BufID) []call {
	if kLayouts[m.typ] != nil {
		return planMatMulK(p, pl, st, op, m, which, opt, resid)
	}
	t := weightTypes[m.typ]
	meta := metaField(-1, p.MaxRows)
	k, n := m.cols, m.rows
	useGemm, useMMQ := gemmUsable(m, opt), mmqUsable(m, opt)
	mvCond, q8Cond := always, always
	if useGemm {
		mvCond, q8Cond = small, small
	}
	if useMMQ {
		mvCond = small
	}
	var calls []call
	x, ds := buf(op.A), null
	if m.quantized() {
		calls, x, ds = q8Input(p, pl, st, op, which, k, q8Cond)
	}
	rpb := rowsPerBlock(n, m.chunks(), opt.sms)
	r, b := null, null
	if resid >= 0 {
		r = buf(resid)
	}
	if op.Bias != backend.NoWeight {
		b = weight(op.Bias)
	}
	calls = append(calls, call{kernel: "matvec_" + t, gridX: min(blocks(n, rpb), uint32(mvGridPerSM*opt.sms)), gridY: gridOne, block: 32 * mvWarps, cond: mvCond,
		args: []arg{buf(op.Out), r, x, ds, weight(op.W), i64(m.rowBytes), i64(int(m.dOff)), b, meta, i32(which), i32(k), i32(n), i32(rpb)}})
	if useMMQ {
		return append(calls, mmqCall(p, op, m, which, opt, r, b))
	}
	if !useGemm {
		return calls
	}
	conv := call{kernel: "to_f16", gridX: blocks(k, elemBlock), gridY: rowsOf(which), block: elemBlock, cond: large,
		args: []arg{scratch(scratchX16), buf(op.A), meta, i32(which), i32(k)}}
	if m.quantized() {
		conv.kernel, conv.gridX, conv.block = "to_f16_q8", blocks(k/32, 8), 256
	}
	if !st.holds(st.x16, op.A, which, large) || st.x16.kernel != conv.kernel {
		calls = append(calls, conv)
		st.x16 = &scratchHolds{buf: op.A, which: which, cond: large, kernel: conv.kernel}
	}
	pl.need(scratchX16, p.MaxRows*k*2)
	w := weight(op.W)
	if m.typ != "F16" {
		calls = append(calls, call{kernel: "deq_f16_" + t, gridX: blocks(n*k/8, elemBlock), gridY: gridOne, block: elemBlock, cond: large,
			args: []arg{scratch(scratchW16), weight(op.W), i64(m.rowBytes), i64(int(m.dOff)), i32(n), i32(k)}})
		w = scratch(scratchW16)
		pl.need(scratchW16, n*k*2)
	}
	calls = append(calls, call{cond: large, gemm: &gemm{out: buf(op.Out), x: scratch(scratchX16), w: w, n: n, k: k}})
	if op.Bias != backend.NoWeight {
		calls = append(calls, call{kernel: "add_bias", gridX: blocks(n, elemBlock), gridY: rowsOf(which), block: elemBlock, cond: large,
			args: []arg{buf(op.Out), weight(op.Bias), meta, i32(which), i32(n)}})
	}
	return calls
}

// planAttention checks an attention op and returns the decode kernel and,
// where the head size suits it, the tiled kernel for large batches.
func planAttention(p *backend.Program, pl *planned, st *planState, op *backend.Op, meta arg, opt planOptions) ([]call, error) {
	for _, id := range []backend.BufID{op.Out, op.A} {
		if id < 0 || int(id) >= len(p.Bufs) {
			return nil, fmt.Errorf("buffer %d out of range", id)
		}
	}
	if op.Layer < 0 || op.Layer >= len(p.Caches) {
		return nil, fmt.Errorf("attention over layer %d of %d", op.Layer, len(p.Caches))
	}
	c := p.Caches[op.Layer]
	hd := op.HeadDim
	if op.NKV <= 0 || op.NHeads%op.NKV != 0 || hd <= 0 || hd > maxHeadDim ||
		c.KVDim != op.NKV*hd || p.Bufs[op.A] != op.NHeads*hd || p.Bufs[op.Out] != p.Bufs[op.A] {
		return nil, fmt.Errorf("attention of %d heads (%d kv) of %d over a %d-wide cache", op.NHeads, op.NKV, hd, c.KVDim)
	}
	if op.Out == op.A {
		return nil, fmt.Errorf("attention in place")
	}
	need := p.Context
	if op.Window > 0 {
		need = min(p.Context, op.Window+p.MaxRows-1)
	}
	if c.Capacity < need {
		return nil, fmt.Errorf("ring cache of %d positions cannot hold a window of %d plus %d rows", c.Capacity, op.Window, p.MaxRows)
	}
	args := []arg{buf(op.Out), buf(op.A), {kind: argCacheK, id: op.Layer}, {kind: argCacheV, id: op.Layer}, meta,
		metaField(fieldPos, p.MaxRows), metaField(fieldSlots, p.MaxRows), i32(op.NHeads), i32(op.NKV), i32(hd),
		i32(c.Capacity), f32(op.Scale), f32(op.Cap), i32(op.Window)}
	tiles := hd%4 == 0 && hd <= 128
	// The decode kernel quantizes its output for a following product; where
	// that product reads int8 rows in large batches too (mmq), a
	// quantize_q8 after the tiled kernel does it there.
	q8, ds, requant := null, null, false
	if st.fuse != nil && !st.fuseK && hd%32 == 0 {
		q8, ds, st.fused = scratch(scratchQ8), scratch(scratchQ8DS), true
		requant = tiles && *st.fuse == always
	}
	dec := call{kernel: "attention", gridX: uint32(op.NHeads), gridY: gridAll, block: 32 * attentionWarps,
		shared: uint32(4 * attentionWarps * (hd + 2)), args: append(append([]arg(nil), args...), q8, ds), which: metaRows}
	if opt.exact {
		// The only attention kernel kept to the exact contract; its
		// partials are float64.
		dec.shared *= 2
		return []call{dec}, nil
	}
	split := planSplitAttention(p, pl, op, c.Capacity, opt, append(append([]arg(nil), args...), q8, ds))
	for i := range split {
		split[i].cond = small
	}
	if !tiles {
		if split == nil {
			return []call{dec}, nil
		}
		// Batches of up to smallRows rows split over positions, larger
		// ones run the decode kernel (heads too large for the tiles).
		dec.cond = large
		return append(split, dec), nil
	}
	if split == nil {
		dec.cond = small
		split = []call{dec}
	}
	kernel, qpw := "attention_tiled_64", 4
	if hd > 64 {
		kernel, qpw = "attention_tiled_128", 2
	}
	tiled := call{kernel: kernel, gridX: uint32(op.NKV), gridY: gridTiles, block: 32 * attTileWarps, cond: large, which: metaRows,
		shared: uint32(4 * (attTileKeys*(hd+4) + attTileKeys*hd + attTileWarps*qpw*hd + attTileWarps*qpw*attTileKeys)), args: args}
	if requant {
		cols := op.NHeads * hd
		return append(split, tiled, call{kernel: "quantize_q8", gridX: blocks(cols/32, 8), gridY: gridAll, block: 256, cond: large, which: metaRows,
			args: []arg{scratch(scratchQ8), scratch(scratchQ8DS), buf(op.Out), meta, i32(metaRows), i32(cols)}}), nil
	}
	return append(split, tiled), nil
}

// planSplitAttention returns the flash-decoding launches (attention_split)
// of op for batches of up to smallRows rows, or none where its head size
// and query heads per kv head do not suit it (or opt.splitKeys < 0). The
// grid has a block per opt.splitKeys positions of the cache (at least one,
// at most attSplitMax) and kv head; a row uses one per splitKeys positions
// it sees, so a full cache gives each block about splitKeys keys and a
// short one leaves the rest idle. Heads of 128 dims get two launches, by
// depth: attention_split_w2x2 while the batch's rows are below
// opt.deepAt, attention_split_g1d4 from there on (splitShallow128).
func planSplitAttention(p *backend.Program, pl *planned, op *backend.Op, capacity int, opt planOptions, args []arg) []call {
	hd, g := op.HeadDim, op.NHeads/op.NKV
	if opt.splitKeys < 0 || hd%4 != 0 || hd > attSplitMaxDim || g > attSplitMaxGroup {
		return nil
	}
	keys := opt.splitKeys
	if keys <= 0 {
		keys = attSplitKeys
	}
	splits := min(attSplitMax, max(1, (capacity+keys-1)/keys))
	rows := min(p.MaxRows, smallRows)
	pl.need(scratchAttnPart, 4*rows*op.NHeads*splits*(hd+2))
	pl.need(scratchAttnCount, 4*rows*op.NKV)
	// Beyond 48 KiB a kernel opts in (Backend.optIn) to what the device
	// gives a block, less its static shared memory (a few bytes: as_last's
	// flag).
	limit := max(maxStaticShared, opt.maxShared-1024)
	// launch is kernel's call, with warps warps a block and smem(kt)
	// bytes of shared memory for tiles of kt keys (32, else 16), over runs
	// of keys positions, at most splits of them a row.
	launch := func(kernel string, warps int, smem func(kt int) int, keys, splits int) (call, bool) {
		kt := 32
		if smem(kt) > limit {
			kt = 16
		}
		if smem(kt) > limit {
			return call{}, false
		}
		return call{kernel: kernel, gridX: uint32(op.NKV * splits), gridY: gridAll, block: uint32(32 * warps),
			shared: uint32(smem(kt)), which: metaRows,
			args: append(slices.Clip(args), scratch(scratchAttnPart), scratch(scratchAttnCount), i32(splits), i32(kt), i32(keys))}, true
	}
	lane, ok := launch(splitKernel(g, hd, opt), attSplitWarps, func(kt int) int { return 4 * (kt*(2*hd+4) + g*hd + attSplitWarps*attSplitMax) }, keys, splits)
	if !ok {
		return nil
	}
	w, ok := splitWarpKernels[hd]
	shallowOnly := false
	if !ok && hd == 128 && opt.deepAt >= 0 {
		w, ok, shallowOnly = splitShallow128, true, true
	}
	if !ok || g > attSplitWHeads || opt.attnLane || opt.attnWide || opt.attnSync {
		return []call{lane}
	}
	// groupSmem is the shared memory of attention_split_wN with ng groups
	// of warps and tiles tiles a group (attention.cu's gsz).
	groupSmem := func(ng, tiles int) func(kt int) int {
		return func(kt int) int {
			return 4 * (ng*(tiles*kt*(2*hd+4)+attSplitWHeads*hd+2*attSplitWHeads*w.dq*32) + attSplitWHeads*attSplitMax)
		}
	}
	// Two tiles of 32 keys where they fit (the next copied while the
	// current one is computed), else one.
	db := 0
	if groupSmem(1, 2)(32) <= maxStaticShared && !opt.attnSingle {
		db = 1
	}
	wide, ok := launch(w.name, attSplitWHeads*w.dq, groupSmem(1, 1+db), keys, splits)
	if !ok {
		return []call{lane}
	}
	wide.args = append(wide.args, i32(db))
	// Below deepAt the rows run shallow (the kernel of ng groups of warps
	// a block, splitGroups, over runs of ng tiles; else wide), from deepAt
	// on deep (wide, or for 128-dim heads attention_split_g1d4). The
	// groups' tiles are of 32 keys: fewer groups where those do not fit
	// the shared memory a block may have.
	shallowCall, deepCall := wide, wide
	if shallowOnly {
		deepCall = lane
	}
	ng := cmp.Or(opt.attnGroups, splitGroups[hd])
	for ng > 1 && groupSmem(ng, 1)(32) > limit {
		ng /= 2
	}
	deepAt := cmp.Or(opt.deepAt, attDeepAt)
	if ng > 1 && opt.deepAt >= 0 && !p.Caches[op.Layer].F16 { // grouped kernels read float caches only
		gkeys := attSplitKeys * ng
		if opt.splitKeys > 0 {
			gkeys = opt.splitKeys
		}
		gsplits := min(attSplitMax, max(1, (min(capacity, deepAt)+gkeys-1)/gkeys))
		shallowCall, _ = launch(groupKernel(w, ng), attSplitWHeads*w.dq*ng, groupSmem(ng, 1), gkeys, gsplits) // fits: checked above
		shallowCall.args = append(shallowCall.args, i32(0))
	} else if !shallowOnly {
		return []call{wide} // one kernel at every depth
	}
	pl.deepAt = deepAt
	shallowCall.depth, deepCall.depth = shallow, deep
	return []call{shallowCall, deepCall}
}

// groupKernel is the name of w's kernel with ng groups of warps a block
// (attention.cu's NG: attention_split_wNgG).
func groupKernel(w splitWarpKernel, ng int) string { return fmt.Sprintf("%sg%d", w.name, ng) }

// splitGroups are the groups of warps a block of decode attention below
// the plan's deepAt (attention.cu's NG), by head size; a size not listed
// keeps one group at every depth (planOptions.attnGroups overrides it;
// WEFT_CUDA_ATTN_GROUPS). H100, tg drawn, Q4_0, groups 2 (and 4) against
// one, same calls:
//   - 8B shape (128 dims): tg128 470.8 against 461.2-461.5 (+2.0 %); tg64
//     from 0 / 128 / 256 / 512 positions +0.7 / +1.6 / -2.4 / +2.0 %
//     (4 groups: -1.2 % from 0, -3.0 % from 512).
//   - 1B shape (64 dims): tg128 1,907 (4: 1,887) against 1,934; from 256
//     and 512 positions -6 % (4: -11 %), from 64 even: its tiles are
//     cheap, and the block's extra warps and merge cost more than the
//     tiles they take off the chain.
var splitGroups = map[int]int{128: 2}

// attGroupSizes are the group counts compiled for each of
// splitWarpKernels and splitShallow128 (attention.cu's
// ATTENTION_SPLIT_W instances).
var attGroupSizes = []int{2, 4}

// splitWarpKernels are attention.cu's attention_split_wN, by head size:
// for up to attSplitWHeads query heads a kv head, N warps a query head
// (one per 32 dims), so that a warp's chain of dependent instructions is
// an N-th of a kernel whose lane holds whole dot products, and each
// scheduler has N warps (ncu of the 8B shape's attention: ~10 cycles an
// instruction in warps alone on their scheduler). Heads of 128 dims take
// splitShallow128 at short positions only: attention_split_w4 lost 9-10 %
// of tg128 2,048 positions deep (attention.cu).
var splitWarpKernels = map[int]splitWarpKernel{64: {"attention_split_w2", 2}}

// splitShallow128 is the decode attention of heads of 128 dims while a
// batch's rows are below attDeepAt: 2 warps of 64 dims a head, 8 a block.
var splitShallow128 = splitWarpKernel{"attention_split_w2x2", 2}

// attDeepAt is the position from which heads of 128 dims run
// attention_split_g1d4 instead of splitShallow128 (planOptions.deepAt).
// H100, 8B shape, w2x2 against g1d4 (tg128 from an empty cache, tg64
// from a cache of d positions): Q8_0 +1.2 % at 0, even at 512, -1 % at
// 1,024 and -1.5 % at 2,048; Q4_0 +3.6 % at 0, +1.4 % at 512, -0.8 % at
// 1,024, even at 2,048. 640 lies between the two crossovers.
const attDeepAt = 640

// splitWarpKernel is an attention_split_wN kernel and its warps a query
// head.
type splitWarpKernel struct {
	name string
	dq   int
}

// attSplitWHeads is attention.cu's AW_HEADS: the most query heads a kv
// head of attention_split_wN (its blocks have attSplitWHeads·N warps).
const attSplitWHeads = 4

// splitKernels are the attention_split kernels compiled for common shapes
// (attention.cu's attention_split_gHdN: H query heads a warp, N dims a
// lane), by heads a warp and dims a lane.
var splitKernels = map[[2]int]string{
	{1, 2}: "attention_split_g1d2", {1, 4}: "attention_split_g1d4",
	{2, 2}: "attention_split_g2d2", {2, 4}: "attention_split_g2d4",
}

// splitKernel is the attention_split kernel for g query heads a kv head
// and heads of hd: the one compiled for the fewest heads a warp and dims
// a lane that hold them, else (or with opt.attnWide) the general kernel.
// The general kernel's loops run over 4 heads and 8 dims whatever the
// shape; a shape's own kernel has a quarter of its code or less.
func splitKernel(g, hd int, opt planOptions) string {
	hpw, nd := 1, 2
	for hpw*attSplitWarps < g {
		hpw *= 2
	}
	for nd*32 < hd {
		nd *= 2
	}
	if k, ok := splitKernels[[2]int{hpw, nd}]; ok && !opt.attnWide {
		return k
	}
	return "attention_split"
}

// ropeStoreFusable reports whether rope of q, rope of k and the store of
// k and v follow each other with one table, so one rope_store launch can
// do all three.
func ropeStoreFusable(p *backend.Program, rq, rk, store *backend.Op) bool {
	return rk.Kind == backend.OpRope && store.Kind == backend.OpStoreKV && !rq.OnSelected && !rk.OnSelected &&
		rk.Table == rq.Table && rk.Layout == rq.Layout && rk.HeadDim == rq.HeadDim && rk.RopeDim == rq.RopeDim &&
		rk.A != rq.A && store.A == rk.A && store.B != rq.A && store.B != rk.A
}

// planRopeStore checks ops i, i+1 and i+2 (rope of q, rope of k, store of
// k and v) as their own launches would be, and returns the one launch
// doing all three.
func planRopeStore(p *backend.Program, pl *planned, st *planState, i int, opt planOptions) (call, error) {
	for k := i; k <= i+2; k++ {
		if _, err := planOp(p, pl, st, &p.Ops[k], opt, backend.BufID(-1)); err != nil {
			return call{}, fmt.Errorf("cuda: op %d (%s, layer %d): %w", k, p.Ops[k].Kind, p.Ops[k].Layer, err)
		}
	}
	rq, rk, store := &p.Ops[i], &p.Ops[i+1], &p.Ops[i+2]
	c := p.Caches[store.Layer]
	neox := 0
	if rq.Layout == backend.RopeNeoX {
		neox = 1
	}
	return call{op: i, kernel: cacheKernel("rope_store", c), gridX: uint32(rq.NHeads + rk.NHeads), gridY: gridAll, block: uint32(min(256, (rq.HeadDim+31)/32*32)), which: metaRows,
		args: []arg{buf(rq.A), buf(rk.A), buf(store.B), {kind: argCacheK, id: store.Layer}, {kind: argCacheV, id: store.Layer},
			{kind: argRope, id: rq.Table}, metaField(-1, p.MaxRows), metaField(fieldPos, p.MaxRows), metaField(fieldSlots, p.MaxRows),
			i32(rq.NHeads), i32(rk.NHeads), i32(rq.HeadDim), i32(rq.RopeDim / 2), i32(neox), i32(c.Capacity)}}, nil
}
