package cuda

import (
	"cmp"
	"strings"
)

// Decode of one sequence multiplies a single activation row, and the
// matrix-vector kernels built for up to MVR rows a pass keep the
// registers of their widest pass. oneRow gives matrix-vector launches of
// small batches (F32, F16, BF16, Q8_0 and Q4_0 weights) a twin for
// batches of one row: the kernel compiled for one row (matvec1_*,
// matvec13_*, matvec1_glu_* or, for the 8B shape's GLU, matvec1w_glu_*).
// The float twins keep MV_BATCH1 loads in flight a lane, half a warp a
// row where the launch still fills the device (BF16 tg128 566 → 640
// tok/s on the 1B shape when they came); the quantized twins keep
// MV_BATCH and rowsPerBlock's rows (8 loads were 1-8 % slower, and again
// 8-13 % on the 8B shape in the seventh session), and the GLU twins
// MV_BATCH of each of their two rows. Float launches of long rows over
// oneRowMaxBytes keep their kernel (below).
func oneRow(pl *planned, opt planOptions) {
	calls := make([]call, 0, len(pl.calls)+64)
	for _, c := range pl.calls {
		single, ok := oneRowTwin(c, opt)
		if !ok {
			calls = append(calls, c)
			continue
		}
		c.cond = withoutOne(c.cond)
		calls = append(calls, c, single)
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

// oneRowTypes are the weight types with one-row twins, with their
// 16-byte chunks a row of k columns and whether the twin is a quantized
// type's (quant): it keeps rowsPerBlock's rows a block (and MV_BATCH loads
// in flight) rather than half a warp a row (oneRowRowsPerBlock), comes
// for launches of any size and runs oneRowQuantGrid blocks a
// multiprocessor. The K-quants (kq) have twins for every kind
// (matvec1_q*_k, matvec13_q*_k, matvec1_glu_q*_k, matvec1w_glu_q*_k, the
// GLU's where their products read Q4_0's activations, planOptions.kA32),
// and their grouped twins keep rowsPerBlock. matvec1_q*_k keeps 47-64
// registers where matvec_q*_k take 96-128 (NVRTC 11.8).
var oneRowTypes = map[string]struct {
	chunks func(k int) int
	quant  bool
	kq     bool
}{
	"f32":    {func(k int) int { return k / 4 }, false, false},
	"f16":    {func(k int) int { return k / 8 }, false, false},
	"bf16":   {func(k int) int { return k / 8 }, false, false},
	"q8_0":   {func(k int) int { return k / 16 }, true, false},
	"q4_0":   {func(k int) int { return k / 32 }, true, false},
	"q8_a":   {func(k int) int { return k / 16 }, true, false},
	"q4_k":   {func(k int) int { return k / 32 }, true, true},
	"q5_k":   {func(k int) int { return k / 32 }, true, true},
	"q6_k":   {func(k int) int { return k / 32 }, true, true},
	"q2_k":   {func(k int) int { return k / 32 }, true, true},
	"iq4_xs": {func(k int) int { return k / 32 }, true, true},
}

// oneRowQuantGrid bounds the grid of a quantized type's one-row product
// twin (matvec1_*, matvec13_*) at this many blocks a multiprocessor, twice
// mvGridPerSM: the twins need 56-72 registers a thread, so more of their
// warps fit, and more of their loads fly at once. With the twins for
// launches of every size (the GLU's too), same-run A/B on an H100 against
// twins up to oneRowMaxBytes at mvGridPerSM (tg128, tok/s, two runs):
// 8B shape Q4_0 371.2 / 370.9 against 363.5 / 363.8, Q8_0 251.5 / 252.1
// against 241.0 / 241.3; 1B shape (no launch over the limit) Q4_0 1,374 /
// 1,360 against 1,358 / 1,351, Q8_0 1,062 / 1,062 against 1,028 / 1,026.
// 12 blocks a multiprocessor: 366, 249.6, 1,348, 1,035; 16: 368.5, 250.8,
// 1,367, 1,063. The float twins keep mvGridPerSM and oneRowMaxBytes: 8B
// BF16 155.4 at 8 blocks against 155.6, and twins for every launch 149.5.
const oneRowQuantGrid = 8

// longRowChunks is the row length (16-byte chunks) from which a quantized
// one-row product (a down product) takes 2 rows a block, two warps a row,
// where its blocks then still fit the grid (oneRowQuantGrid a
// multiprocessor), rather than rowsPerBlock's 4. The 1B shape's down
// product (2,048 rows of K = 8,192) ran 512 blocks of 4 warps, each warp
// two batches of loads in turn; in 1,024 blocks each warp takes one. Same
// run on an H100, tg128 against 4 rows a block: 1B Q4_0 1,766 / 1,786
// against 1,747 / 1,750, 1B Q8_0 1,335 / 1,320 against 1,288 / 1,284, 1B
// Q4_K 1,419 / 1,413 against 1,361 / 1,363; on the 8B shape (4,096 rows,
// 2,048 blocks: past the grid) 2 rows a block lost 1-3 %, 1 row 3-9 %.
// planOptions.longRPB forces 1, 2 or 4 (WEFT_CUDA_LONG_RPB; -1 keeps
// rowsPerBlock), for comparisons.
const longRowChunks = 256

// oneRoundRPB is the rows a block of the grouped one-row products of
// Q8_0, Q4_0 and Q8_A (matvec13_*) whose groups of 4 rows (a warp a row)
// overflow one round of the grid (oneRowQuantGrid a multiprocessor):
// half a warp a row. Where a launch's groups overflow the grid, the
// blocks that take a second group issue its loads only once their first
// is summed. The 8B shape's q/k/v (6,144 rows of 4,096 columns) at 4
// rows a block is 1,536 groups on 1,056 blocks; at 8, 768 blocks take
// one each. Where 4 rows a block fit, they beat rowsPerBlock's 8 for
// short rows: the 1B shape's q/k/v (3,072 rows of 2,048 columns) in 768
// blocks rather than 384. Same runs on an H100 (WEFT_CUDA_TWIN13_RPB,
// tg128 drawn, two runs each): 8B Q4_0 477.1 / 477.2 at 8 against
// 470.6 / 470.5 at 4 (+1.4 %), 8B Q8_0 305.9 / 305.8 against 304.5 /
// 304.5 (+0.4 %); 1B Q4_0 1,952.9 / 1,952.8 at 4 against 1,935.4 /
// 1,935.8 at 8 (+0.9 %). The K-quants' grouped twins keep rowsPerBlock
// (not measured).
const oneRoundRPB = 8

// oneRowTwin is c's launch for batches of one row, if it has one.
func oneRowTwin(c call, opt planOptions) (call, bool) {
	if c.cond != small && c.cond != always {
		return call{}, false
	}
	kind, typ, ok := strings.Cut(c.kernel, "_")
	if kind == "matvec" && strings.HasPrefix(typ, "glu_") {
		kind, typ = "matvec_glu", typ[len("glu_"):]
	}
	ty, known := oneRowTypes[typ]
	if !ok || !known {
		return call{}, false
	}
	rowsPer, grid := oneRowRowsPerBlock, mvGridPerSM
	if ty.quant {
		rowsPer, grid = rowsPerBlock, oneRowQuantGrid
	}
	grid = cmp.Or(opt.twinGrid, grid)
	r := opt.twinRPB
	if kind == "matvec3" && opt.twin13RPB != 0 {
		r = opt.twin13RPB
	}
	if ty.quant && (r == 1 || r == 2 || r == 4 || r == 8) {
		rowsPer = func(int, int, int) int { return r }
	}
	chunks := ty.chunks
	t := c
	t.cond = one
	t.args = append([]arg(nil), c.args...)
	switch kind {
	case "matvec":
		// out, resid, x, ds, w, rowBytes, dOff, bias, meta, which, K, N, rpb
		n, ch := int(c.args[11].v), chunks(int(c.args[10].v))
		rpb := rowsPer(n, ch, opt.sms)
		if ty.quant && ch >= longRowChunks && opt.twinRPB == 0 {
			switch l := opt.longRPB; {
			case l == 1 || l == 2 || l == 4:
				rpb = l
			case l == 0 && rpb > 2 && int(blocks(n, 2)) <= grid*opt.sms:
				rpb = 2
			}
		}
		t.kernel, t.args[12] = "matvec1_"+typ, i32(rpb)
		t.gridX = min(blocks(n, rpb), uint32(grid*opt.sms))
	case "matvec3":
		// x, ds, rowBytes, meta, which, K, rpb, then out, w, dOff, bias, N
		// of each weight.
		n := int(c.args[11].v + c.args[16].v + c.args[21].v)
		rpb := rowsPer(n, chunks(int(c.args[5].v)), opt.sms)
		groups := func(rpb int) (g int) {
			for _, at := range []int{11, 16, 21} {
				g += (int(c.args[at].v) + rpb - 1) / rpb
			}
			return g
		}
		// mvq's twins take a warp a row where those groups fit one
		// round of the grid, else half a warp (oneRoundRPB).
		if ty.quant && !ty.kq && opt.twinRPB == 0 && opt.twin13RPB == 0 && rpb >= 4 {
			rpb = 4
			if groups(4) > grid*opt.sms {
				rpb = oneRoundRPB
			}
		}
		t.kernel, t.args[6] = "matvec13_"+typ, i32(rpb)
		t.gridX = uint32(min(groups(rpb), grid*opt.sms))
	case "matvec_glu":
		// ..., N (15)
		t.kernel = "matvec1_glu_" + typ
		if w, wide := gluTwin((int(c.args[15].v)+gluRows-1)/gluRows, opt); wide {
			t.kernel, t.block = "matvec1w_glu_"+typ, uint32(32*w)
		}
	default:
		return call{}, false
	}
	if k, limit := launchCols(t), cmp.Or(opt.oneRowMax, oneRowMaxBytes); !ty.quant && k > oneRowAnyCols && launchWeightBytes(t) > int64(limit) {
		return call{}, false
	}
	return t, true
}

// A float type's launch by rows of more than oneRowAnyCols columns has a
// one-row twin only where it reads at most oneRowMaxBytes of weights (the
// quantized types' twins come for every size since their grid doubled,
// oneRowQuantGrid). Same-run A/B on
// an H100 (tg128, twins for every launch / up to 16 MiB / none): 1B shape
// (K = 2048 but the down product) Q4_0 1,265 / 1,238 / 1,222 tok/s, Q8_0
// 973 / 953 / 952, BF16 714 / 701 / 702; 8B shape (K = 4096 and 14336)
// Q4_0 331 / 330 / 325, Q8_0 224 / 229 / 229, BF16 147 / 153 / 154.
const (
	oneRowAnyCols  = 2048
	oneRowMaxBytes = 16 << 20
)

// gluTwinKernel reports whether kernel is a one-row GLU kernel.
func gluTwinKernel(kernel string) bool {
	return strings.HasPrefix(kernel, "matvec1_glu_") || strings.HasPrefix(kernel, "matvec1w_glu_")
}

// launchCols is the columns of the weight rows a matrix-vector launch reads.
func launchCols(c call) int {
	switch {
	case gluTwinKernel(c.kernel):
		return int(c.args[14].v)
	case strings.HasPrefix(c.kernel, "matvec13_"):
		return int(c.args[5].v)
	}
	return int(c.args[10].v)
}

// launchWeightBytes is the weight bytes a matrix-vector launch reads (for
// Q8_0 and Q4_0 the quants, 6 and 11 % less than with their scales).
func launchWeightBytes(c call) int64 {
	switch {
	case gluTwinKernel(c.kernel):
		// ..., rowBytes (9), ..., N (15)
		return 2 * c.args[9].v * c.args[15].v
	case strings.HasPrefix(c.kernel, "matvec13_"):
		// x, ds, rowBytes, ..., then N of each weight at 11, 16, 21
		return c.args[2].v * (c.args[11].v + c.args[16].v + c.args[21].v)
	}
	// out, resid, x, ds, w, rowBytes (5), ..., N (11)
	return c.args[5].v * c.args[11].v
}

// oneRowRowsPerBlock is rowsPerBlock for one activation row: half a warp
// a row wherever the launch keeps two blocks per multiprocessor, so that
// rows of 8·16 chunks or more give each lane MV_BATCH1 loads at once.
func oneRowRowsPerBlock(n, chunks, sms int) int {
	if n/8 >= 2*sms {
		return 8
	}
	return rowsPerBlock(n, chunks, sms)
}

// breakChains launches the GLU kernels that also run batches of one row,
// having no one-row twin (float rows too long: the 8B shape's), without
// programmatic dependent launch, so each waits for the norm before it to
// finish before any of its blocks is placed. Under PDL a kernel's blocks
// are placed while the kernel before it still runs, and with the decode
// attention's cp.async tiles an unbroken chain of such launches ran the
// 8B shape's decode slower: BF16 146.5 tok/s against 153.9 before those
// tiles. Breaking the chain at any of the layer's norms, its rope_store
// or this GLU recovered it, before the GLU best (H100, same run, tg128:
// BF16 156.9, Q8_0 241.3, Q4_0 347.9 against 153.9, 234.7, 340.8 without
// the tiles); breaking it before the 1B shape's GLU (a twin) cost 1-2 %,
// and without the tiles no break helped. Why the placement matters is
// not known (trace.go records it). WEFT_CUDA_BREAK=0 leaves the chain
// whole and WEFT_CUDA_SERIAL (comma-separated kernel name prefixes)
// launches more kernels without PDL, for comparisons.
func breakChains(pl *planned) {
	for i := range pl.calls {
		c := &pl.calls[i]
		if strings.HasPrefix(c.kernel, "matvec_glu_") && (c.cond == small || c.cond == always) {
			c.serial = true
		}
	}
}

// gluTwin says whether a one-row GLU launch over groups groups of gluRows
// rows takes the wide kernel (matvec1w_glu_*), and with how many warps a
// block. matvec_glu's blocks of gluWarps warps are all resident up to two
// a multiprocessor; past that they had half the warps, and the 8B shape's
// GLU (448 groups on 132 multiprocessors) ran 13.6 warps a
// multiprocessor. The wide kernels fit in 64 registers, so 32 of their
// warps fit on one: they take the most warps, up to gluTwinMaxWarps, with
// which every block is resident. Same-run A/B on an H100, tg128: 8B Q4_0
// 390.1 / 393.1 tok/s against 375.0 / 374.1, Q8_0 260.7 / 260.1 against
// 252.9 / 253.5 (blocks of 4 warps at 64 registers: 365.4, 250.9). The 1B
// shape (256 groups) keeps matvec_glu's geometry: blocks of 16 warps
// lost 7 % on Q4_0. A forced count (WEFT_CUDA_GLU1_WARPS, for
// comparisons) takes the wide kernel with that many warps, rounded down
// to a power of two.
func gluTwin(groups int, opt planOptions) (warps int, wide bool) {
	sms := max(opt.sms, 1)
	if opt.glu1Warps <= 0 && groups <= 2*sms {
		return 0, false
	}
	limit := gluTwinMaxWarps
	if opt.glu1Warps > 0 {
		limit = min(opt.glu1Warps, gluTwinMaxWarps)
	}
	w := 1
	for w*2 <= limit {
		w *= 2
	}
	for opt.glu1Warps <= 0 && w > 1 && groups > sms*(32/w) {
		w /= 2
	}
	return w, true
}

// gluTwinMaxWarps is matvec.cu's GLU1_WARPS.
const gluTwinMaxWarps = 8
