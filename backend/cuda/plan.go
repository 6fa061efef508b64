package cuda

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/weftlm/weft/backend"
)

// The plan is the device-independent half of Compile: every op checked
// against the program (the same checks as the CPU backend) and turned into
// kernel launches whose arguments name buffers, weights and caches rather
// than device addresses. Binding (exec.go) resolves the names once the
// memory exists. Keeping this half free of driver calls lets it be tested
// on machines without a GPU.
//
// A run takes one of two paths per op, by the op's row count (the batch's
// rows, or its selected rows): up to smallRows rows, matrix products are
// matrix-vector kernels reading each weight once per MVR rows (decode;
// these runs are replayed as CUDA graphs), above it they go to mmq (Q8_0
// and Q4_0 weights, int8 tensor cores) or cuBLAS on f16 operands and
// attention to the tiled kernel (prefill). Each launch carries the
// condition under which it runs.

// Weight storage types as kernels.cu numbers them, with the suffix of
// their kernels.
var weightTypes = map[string]string{
	"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0", "Q4_0": "q4_0",
	"Q4_K": "q4_k", "Q5_K": "q5_k", "Q6_K": "q6_k", "Q2_K": "q2_k", "IQ4_XS": "iq4_xs",
	// Q4_1 and Q5_1 as stored on the device (convert.go's q8Affine);
	// no GGUF type has this name, so no tensor reaches it directly.
	"Q8_A": "q8_a",
}

// argKind says how a launch argument is resolved.
type argKind uint8

const (
	argBuf     argKind = iota // activation buffer id: its device address
	argWeight                 // weight id: its device address, 0 for NoWeight
	argCacheK                 // layer: its key cache's address
	argCacheV                 // layer: its value cache's address
	argRope                   // rope table id: its inverse frequencies' address
	argMeta                   // meta + 4*v bytes (see the meta* offsets)
	argScratch                // scratch id: its address
	argNull                   // a null pointer
	argInt                    // int32 v
	argInt64                  // int64 v
	argFloat                  // float32 f
)

// Scratch areas shared by every op (they run one after another).
const (
	scratchQ8     = iota // int8 activation rows [MaxRows, K]
	scratchQ8DS          // their block scales, float2 [MaxRows, K/32]
	scratchX16           // f16 activation rows [MaxRows, K] for cuBLAS
	scratchW16           // a weight dequantized to f16 [N, K] for cuBLAS
	scratchQ8K           // int8 activation rows for K-quant weights [MaxRows, K]
	scratchQ8KRec        // their per-256 records [MaxRows, K/256] (kquant.go)
	scratchG8            // int8 rows written by a fused GLU [MaxRows, N] while it reads scratchQ8
	scratchG8DS          // their block scales
	// attention_split's partial results [smallRows, heads, splits, hd+2]
	// and its counters [smallRows, kv heads], which must read zero
	// between launches (the kernel leaves them so).
	scratchAttnPart
	scratchAttnCount
	numScratch
)

type arg struct {
	kind argKind
	id   int
	v    int64
	f    float32
}

func buf(id backend.BufID) arg       { return arg{kind: argBuf, id: int(id)} }
func weight(id backend.WeightID) arg { return arg{kind: argWeight, id: int(id)} }
func scratch(id int) arg             { return arg{kind: argScratch, id: id} }
func i32(v int) arg                  { return arg{kind: argInt, v: int64(v)} }
func i64(v int) arg                  { return arg{kind: argInt64, v: int64(v)} }
func f32(v float32) arg              { return arg{kind: argFloat, f: v} }

var null = arg{kind: argNull}

// The meta array (int32): counts, then the batch's arrays, MaxRows each.
const (
	metaRows     = 0 // rows in the batch
	metaSelected = 1 // selected rows
	metaArrays   = 4 // tokens start here (16-byte aligned)
)

// metaField is the argument pointing at meta's k-th array (0 tokens,
// 1 positions, 2 slots, 3 selected rows) or, for k < 0, at meta itself.
func metaField(k, maxRows int) arg {
	if k < 0 {
		return arg{kind: argMeta}
	}
	return arg{kind: argMeta, v: int64(metaArrays + k*maxRows)}
}

const (
	fieldTokens = iota
	fieldPos
	fieldSlots
	fieldSelected
)

// gridRows says what a launch's grid height counts.
type gridRows uint8

const (
	gridOne      gridRows = iota // 1
	gridAll                      // the batch's rows
	gridSelected                 // the selected rows
	gridTiles                    // the batch's rows in tiles of attTileRows
)

// cond says in which runs a launch takes part.
type cond uint8

const (
	always cond = iota
	small       // its row count is at most smallRows
	large       // its row count exceeds smallRows
	one         // its row count is 1 (oneRow)
	few         // its row count is 2 to smallRows
	notOne      // its row count is not 1
)

// smallRows is the most rows the matrix-vector path takes.
const smallRows = 8

// gemm describes a cuBLAS product out[rows, n] = x16[rows, k] · w16[n, k]ᵀ.
type gemm struct {
	out, x, w arg
	n, k      int
}

// call is one kernel launch (or cuBLAS product) of the plan.
type call struct {
	op     int // index in Program.Ops
	kernel string
	gridX  uint32
	gridY  gridRows
	block  uint32
	shared uint32
	args   []arg
	which  int // the row count it runs on: metaRows or metaSelected
	cond   cond
	gemm   *gemm // instead of a kernel
	// serial launches the kernel without programmatic dependent launch:
	// it starts once the launch before it has finished (breakChains).
	serial bool
	depth  depth // the batches it runs on by their rows' positions
	// copyOff and copyLen (bytes, copyLen > 0) are the part of the logits
	// buffer this launch finishes, which a graph that hands the logits to
	// the host copies once it ends (splitLogits).
	copyOff, copyLen int64
	// rowsIf is a further condition on the batch's rows (whatever which
	// says), for skipGather's twins.
	rowsIf cond
	// whole marks a product split into runs (those with copyLen > 0),
	// launched by every output but outStaged, which launches the runs
	// instead (splitLogits).
	whole bool
	// logits marks the launch that computes a one-row batch's logits
	// whole (markLogits).
	logits bool
}

// depth selects launches by how deep a batch's rows are in their caches:
// shallow launches run while every row's position is below the plan's
// deepAt, deep ones from there on (the kernels for 8B-shaped decode
// attention, planSplitAttention). A plan without them captures one graph
// a batch shape, as before.
type depth uint8

const (
	anyDepth depth = iota
	shallow
	deep
)

// holds reports whether a launch under d runs on a batch that is deep or not.
func (d depth) holds(isDeep bool) bool { return d == anyDepth || (d == deep) == isDeep }

// matInfo describes a program weight as the device stores it: rows of
// rowBytes in its stored type (for Q8_0, Q4_0 and the K-quants the quants
// of a row, with the scales from byte dOff on), or a float32 vector (one
// row). A weight of a type without kernels of its own is converted to F16
// or F32 on upload, or to Q8_0 where that loses nothing (convert.go): typ
// is then the device type and src the stored one.
type matInfo struct {
	name       string
	rows, cols int
	ggufRow    int // bytes of a row as stored in the file (converted weights: as uploaded)
	rowBytes   int
	dOff       int64
	typ        string // weights' spelling: "F32", "Q4_0", ...
	src        string // the stored type of a converted weight, else ""
	vector     bool   // an engine-prepared float32 vector (Weight.F32)
}

func (m *matInfo) quantized() bool { return m.typ == "Q8_0" || m.typ == "Q4_0" || m.typ == "Q8_A" }

// cacheKernel is the kernel named name for cache c: the kernels that read
// or write a cache come for float32 caches and, named name_h, for f16.
func cacheKernel(name string, c backend.Cache) string {
	if c.F16 {
		return name + "_h"
	}
	return name
}

// normQ8Threads is rmsnorm_q8's block for rows of cols columns: a thread
// a 16-byte chunk up to normQ8Floor threads, past that normHeld chunks a
// thread (the chunks kernels.cu's NORM_HELD keeps in registers) but never
// fewer than normQ8Floor, rounded up to a warp and at most maxNormThreads.
// force (WEFT_CUDA_NORM_THREADS, for comparisons) replaces the rule by a
// thread a chunk up to force threads, as before the rule. H100, tg128
// drawn, two rounds: Llama-3-8B's shape (1,024 chunks) Q4_0 478.0 / 478.7
// by the rule (512 threads) against 476.7 / 477.0 forced to 1,024, Q8_0
// 306.3 / 306.4 against 305.7 / 305.7 (.device/s42); forced to 256, -3.3
// %; Llama-3.2-1B's (512 chunks) 2,060 / 2,059 forced to 256 against
// 2,067 / 2,071 at 512, -12 % at 128 (.device/s41).
func normQ8Threads(cols, force int) uint32 {
	chunks := cols / 4
	t := chunks
	if force > 0 {
		t = min(t, force)
	} else if t > normQ8Floor {
		t = max(normQ8Floor, (chunks+normHeld-1)/normHeld)
	}
	return uint32(min(maxNormThreads, (t+31)/32*32))
}

const (
	normHeld    = 2   // kernels.cu NORM_HELD
	normQ8Floor = 512 // the fewest threads of a long row's rmsnorm_q8 block
)

// describe checks a program weight and says how it is stored (for the
// exact contract when exact is set: describeConverted).
func describe(w *backend.Weight, exact bool) (matInfo, error) {
	if w.F32 != nil {
		return matInfo{name: w.Name, rows: 1, cols: len(w.F32), ggufRow: 4 * len(w.F32), rowBytes: 4 * len(w.F32), typ: "F32", vector: true}, nil
	}
	t := w.Tensor
	if t == nil {
		return matInfo{}, fmt.Errorf("weight %q has neither a tensor nor float32 values", w.Name)
	}
	if _, ok := weightTypes[t.Type]; !ok || !t.HasGGML || t.MLX != nil {
		return describeConverted(w, exact)
	}
	m := matInfo{name: w.Name, rows: int(t.Rows()), cols: int(t.Cols()), typ: t.Type}
	for _, d := range t.Shape[:max(0, len(t.Shape)-2)] {
		m.rows *= int(d)
	}
	rb, err := t.GGML.RowBytes(uint64(m.cols))
	if err != nil {
		return matInfo{}, fmt.Errorf("tensor %q: %w", w.Name, err)
	}
	m.ggufRow, m.rowBytes = int(rb), int(rb)
	if len(w.Data.Bytes) != m.rows*m.ggufRow {
		return matInfo{}, fmt.Errorf("tensor %q: %d bytes, want %d for %s %v", w.Name, len(w.Data.Bytes), m.rows*m.ggufRow, t.Type, t.Shape)
	}
	switch t.Type {
	case "Q8_0":
		m.rowBytes = m.cols
	case "Q4_0":
		m.rowBytes = m.cols / 2
	default:
		if k := kLayouts[t.Type]; k != nil {
			// Q2_K takes more on the device than in the file.
			m.rowBytes, m.ggufRow = m.cols/256*k.quants, m.cols/256*k.deviceBlock()
		}
	}
	m.dOff = int64(m.rows) * int64(m.rowBytes)
	return m, nil
}

const (
	elemBlock      = 256  // threads of an elementwise launch
	maxNormThreads = 1024 // threads of a norm block, at most
	mvWarps        = 4    // kernels.cu MV_WARPS
	attentionWarps = 8    // decode attention: a warp takes every 8th position
	maxHeadDim     = 512  // kernels.cu MAXD
	attTileRows    = 8    // kernels.cu AT_ROWS
	attTileKeys    = 32   // kernels.cu AT_KT
	attTileWarps   = 8    // kernels.cu AT_WARPS
	// attention_split (attention.cu): AS_WARPS, AS_MAXS, the largest head
	// size (32·AS_ND) and query heads per kv head (AS_WARPS·AS_HPW), and
	// the cache positions per split. About 64 splits a kv head was best
	// on an H100 (tg64, 1B Q4_0 @ d4096: 64 positions a split 876 tok/s,
	// 128 802, 32 777; @ d16384: 64 splits 524, 129 512, 256 456); below
	// 64 splits, runs of 32 positions rather than 64 (a row uses one per
	// 32 positions it sees) took tg128 from an empty cache from 1,162 to
	// 1,226 tok/s (1B Q4_0) and 307.6 to 318.9 (8B Q4_0).
	attSplitWarps    = 4
	attSplitMax      = 64
	attSplitMaxDim   = 256
	attSplitMaxGroup = 16
	attSplitKeys     = 32
	// maxStaticShared is the dynamic shared memory a launch may take
	// without opting in to more.
	maxStaticShared = 48 << 10
	// maxW16Bytes bounds the f16 copy of one weight for cuBLAS; a larger
	// weight (a big vocabulary's output matrix) stays on the
	// matrix-vector path.
	maxW16Bytes = 1 << 29
)

func blocks(n, per int) uint32 { return uint32((n + per - 1) / per) }

// planOptions are the device facts the plan depends on.
type planOptions struct {
	gemm bool // cuBLAS is loaded
	sms  int  // multiprocessors, to size matrix-vector grids
	mmq  bool // products by Q8_0 and Q4_0 weights in large batches go to mmq (mmqOn)
	// exact: the kernels keep to the CPU backend's exact contract
	// (WEFT_CUDA_EXACT=1): attention runs the one-block-a-head kernel,
	// whose float64 merge takes twice the shared memory.
	exact bool
	// kA32: K-quant products read the int8 activations of Q4_0's (a
	// scale and a level sum a 32, kernels.cu's K_A32), so their inputs
	// are quantized as Q4_0's and their gate and up products fuse with
	// the GLU; false (exact, or kActQ8K): Q8_K records (kquant.go).
	kA32   bool
	noKGLU bool // K-quant gate and up stay apart from their GLU under kA32 too (WEFT_CUDA_KGLU=0, for comparisons)
	// splitKeys is the cache positions per split of decode attention
	// (0: attSplitKeys, below 0: no split kernel); tests set it low to
	// split short caches.
	splitKeys int
	noOneRow  bool // no one-row twins (WEFT_CUDA_ONEROW=0)
	gluWarps  int  // warps of a matvec_glu block (0: gluBlockWarps chooses)
	attnSync  bool // attention_split_sync for float caches (WEFT_CUDA_ATTN_SYNC=1, for comparisons)
	attnWide  bool // the general attention_split for every shape (WEFT_CUDA_ATTN_GENERAL=1, for comparisons)
	// attnLane keeps the shapes of attention_split_wN on the kernels of a
	// lane a key and whole heads a warp (WEFT_CUDA_ATTN_LANE=1, for
	// comparisons).
	attnLane bool
	// attnSingle gives attention_split_wN one tile's shared memory, so
	// that it copies each tile only when it reaches it
	// (WEFT_CUDA_ATTN_SINGLE=1, for comparisons).
	attnSingle bool
	// attnGroups is the groups of warps a block of decode attention below
	// deepAt (0: splitGroups; 1: one, as from deepAt on; 2 or 4;
	// WEFT_CUDA_ATTN_GROUPS, for comparisons).
	attnGroups int
	// maxShared is the dynamic shared memory a block may opt in to (the
	// device's; 0: maxStaticShared).
	maxShared int
	noBreak   bool   // no breakChains (WEFT_CUDA_BREAK=0, for comparisons)
	twinGrid  int    // blocks a multiprocessor for the one-row product twins (0: mvGridPerSM; WEFT_CUDA_TWIN_GRID, for comparisons)
	glu1Warps int    // warps of a one-row GLU block (0: gluTwin chooses; WEFT_CUDA_GLU1_WARPS, for comparisons)
	twinRPB   int    // rows a block of the quantized one-row product twins (1, 2, 4 or 8; else rowsPerBlock; WEFT_CUDA_TWIN_RPB, for comparisons)
	twin13RPB int    // the same for the grouped twins (matvec13_*) alone (WEFT_CUDA_TWIN13_RPB)
	first     string // the norms' and rope_store's _first twins whatever the heads (WEFT_CUDA_FIRST: 1, 0 or a list of kinds, firstKinds); "": triggerFirst's rule
	// noGLU plans gate and up as one grouped product and the GLU as its
	// own launch, not matvec_glu (WEFT_CUDA_GLU=0, for comparisons).
	noGLU     bool
	oneRowMax int // weight bytes above which a launch has no one-row twin (0: oneRowMaxBytes)
	// normThreads, a multiple of 32, bounds a norm block's threads (0:
	// maxNormThreads; WEFT_CUDA_NORM_THREADS, for comparisons).
	normThreads int
	// deepAt is the position from which 128-dim heads' decode attention
	// runs attention_split_g1d4 rather than attention_split_w2x2 (0:
	// attDeepAt, below 0: g1d4 at every position; WEFT_CUDA_ATTN_DEEP, for
	// comparisons).
	deepAt int
	// logitsSplit is the fewest rows at which the one-row output product
	// is split so that its logits' copy overlaps it (0: logitsSplitRows,
	// below 0: never; WEFT_CUDA_LOGITS_SPLIT, for comparisons and tests).
	logitsSplit int
	// noKGroup keeps each K-quant product in its own launch
	// (WEFT_CUDA_KGROUP=0, for comparisons): no matvec3_q*_k.
	noKGroup bool
	// longRPB forces the rows a block (1, 2 or 4) of the quantized one-row
	// plain products over rows of longRowChunks or more (0: 2 where their
	// blocks fit the grid, else rowsPerBlock; -1: rowsPerBlock;
	// WEFT_CUDA_LONG_RPB, for comparisons).
	longRPB int
}

// planned is a checked program: its launches, how each weight is stored
// and the size of each scratch area in bytes.
type planned struct {
	calls   []call
	mats    []matInfo
	scratch [numScratch]int64
	deepAt  int // the position from which deep launches run, where it has any (0: none)
}

// planState follows which activation the shared scratch areas hold, so
// that a run of products on one input (q, k and v; gate and up) converts
// it once.
type planState struct {
	q8, x16 *scratchHolds
	q8k     *scratchHolds // the activation scratchQ8K holds (kquant.go)
	// fuse, when set, is the condition under which the next op's output
	// feeds a product by a Q8_0 or Q4_0 weight; an op that can quantize
	// its own output for it sets fused.
	fuse  *cond
	fused bool
	fuseK bool // that product's weight is a K-quant: it reads Q8_K records
}

type scratchHolds struct {
	buf    backend.BufID
	which  int
	cond   cond
	kernel string // what filled it
	area   int    // for int8 rows: scratchQ8 or scratchG8 (their scales follow)
}

func (s *planState) holds(h *scratchHolds, buf backend.BufID, which int, c cond) bool {
	return h != nil && h.buf == buf && h.which == which && h.cond == c
}

// written forgets whatever a scratch area holds converted from buf.
func (s *planState) written(buf backend.BufID) {
	if s.q8 != nil && s.q8.buf == buf {
		s.q8 = nil
	}
	if s.x16 != nil && s.x16.buf == buf {
		s.x16 = nil
	}
	if s.q8k != nil && s.q8k.buf == buf {
		s.q8k = nil
	}
}

// plan checks every op of p and returns its launches.
func plan(p *backend.Program, opt planOptions) (*planned, error) {
	if p.MaxRows <= 0 || p.Slots <= 0 || p.Context <= 0 {
		return nil, fmt.Errorf("cuda: program with %d rows, %d slots and a context of %d", p.MaxRows, p.Slots, p.Context)
	}
	if p.MaxRows > 65535 {
		return nil, fmt.Errorf("cuda: program of %d rows exceeds the grid limit of 65535", p.MaxRows)
	}
	if p.Logits < 0 || int(p.Logits) >= len(p.Bufs) || p.Bufs[p.Logits] != p.Vocab {
		return nil, fmt.Errorf("cuda: logits buffer %d does not hold %d columns", p.Logits, p.Vocab)
	}
	if opt.sms <= 0 {
		opt.sms = 132
	}
	pl := &planned{mats: make([]matInfo, len(p.Weights))}
	for i := range p.Weights {
		m, err := describe(&p.Weights[i], opt.exact)
		if err != nil {
			return nil, fmt.Errorf("cuda: %w", err)
		}
		pl.mats[i] = m
	}
	for i, r := range p.Ropes {
		if len(r.InvFreq) == 0 {
			return nil, fmt.Errorf("cuda: rope table %d is empty", i)
		}
	}
	for l, c := range p.Caches {
		// A layer-split part keeps no cache (capacity 0) for the layers
		// other parts run.
		if c.Layer != l || c.KVDim < 0 || c.Capacity < 0 {
			return nil, fmt.Errorf("cuda: cache %d is for layer %d with %d columns and %d positions", l, c.Layer, c.KVDim, c.Capacity)
		}
	}
	st := &planState{}
	fusedAdd := -1 // the op index of an add folded into the product before it
	addCond := always
	for i := 0; i < len(p.Ops); i++ {
		op := &p.Ops[i]
		var calls []call
		var err error
		switch {
		case op.Kind == backend.OpRope && i+2 < len(p.Ops) && ropeStoreFusable(p, op, &p.Ops[i+1], &p.Ops[i+2]):
			c, err := planRopeStore(p, pl, st, i, opt)
			if err != nil {
				return nil, err
			}
			pl.calls = append(pl.calls, c)
			i += 2
			continue
		case op.Kind == backend.OpMatMul && !opt.noGLU && gluFusable(p, pl, i, opt):
			calls, err := planGLU(p, pl, st, i, opt)
			if err != nil {
				return nil, err
			}
			pl.calls = append(pl.calls, calls...)
			i += 2
			continue
		case op.Kind == backend.OpMatMul && groupable(p, pl, i, opt) > 1:
			n := groupable(p, pl, i, opt)
			calls, err := planGroup(p, pl, st, i, n, opt)
			if err != nil {
				return nil, err
			}
			pl.calls = append(pl.calls, calls...)
			i += n - 1
			continue
		case i == fusedAdd:
			// The product wrote the sum on the matrix-vector path; the
			// add still runs where the product went to cuBLAS (the
			// matrix-vector path then runs only on small counts).
			if addCond == always {
				break
			}
			calls, err = planOp(p, pl, st, op, opt, backend.BufID(-1))
			for k := range calls {
				calls[k].cond = large
			}
		case op.Kind == backend.OpMatMul && i+1 < len(p.Ops) && fusable(p, op, &p.Ops[i+1]):
			calls, err = planOp(p, pl, st, op, opt, p.Ops[i+1].Out)
			fusedAdd, addCond = i+1, always
			for _, c := range calls {
				if c.gemm != nil {
					addCond = small
				}
			}
		default:
			st.fuse, st.fused = q8Consumer(p, pl, i, opt), false
			st.fuseK = st.fuse != nil && !opt.kA32 && kLayouts[pl.mats[p.Ops[i+1].W].typ] != nil
			calls, err = planOp(p, pl, st, op, opt, backend.BufID(-1))
			if err == nil && st.fused {
				out, _ := opOutput(op)
				which := metaRows
				if op.OnSelected {
					which = metaSelected
				}
				h := &scratchHolds{buf: out, which: which, cond: *st.fuse}
				if st.fuseK {
					st.q8k = h
				} else {
					st.q8 = h
				}
			}
			st.fuse = nil
		}
		if err != nil {
			return nil, fmt.Errorf("cuda: op %d (%s, layer %d): %w", i, op.Kind, op.Layer, err)
		}
		for _, c := range calls {
			c.op = i
			pl.calls = append(pl.calls, c)
		}
	}
	skipGather(pl)
	fuseEmbedNorm(pl)
	if !opt.noOneRow {
		oneRow(pl, opt)
		splitLogits(pl, int(p.Logits), cmp.Or(opt.logitsSplit, logitsSplitRows))
		markLogits(pl, int(p.Logits), p.Vocab)
	}
	if !opt.noBreak {
		breakChains(pl)
	}
	triggerFirst(pl, opt.first)
	for _, c := range pl.calls {
		if c.kernel != "" && !builtKernels[c.kernel] {
			op := &p.Ops[c.op]
			return nil, fmt.Errorf("cuda: op %d (%s, layer %d) needs kernel %s, which kernelNames does not list", c.op, op.Kind, op.Layer, c.kernel)
		}
	}
	return pl, nil
}

// builtKernels is the set of kernelNames: the kernels a module has.
var builtKernels = func() map[string]bool {
	m := map[string]bool{}
	for _, n := range kernelNames() {
		m[n] = true
	}
	return m
}()

// q8Consumer returns the condition under which op i's output is
// quantized for the product right after it (a Q8_0, Q4_0 or K-quant
// weight reading that output), or nil when there is none.
func q8Consumer(p *backend.Program, pl *planned, i int, opt planOptions) *cond {
	if i+1 >= len(p.Ops) {
		return nil
	}
	op, next := &p.Ops[i], &p.Ops[i+1]
	out, ok := opOutput(op)
	if !ok || next.Kind != backend.OpMatMul || next.A != out || next.OnSelected != op.OnSelected ||
		out < 0 || int(out) >= len(p.Bufs) || next.W < 0 || int(next.W) >= len(pl.mats) {
		return nil
	}
	m := &pl.mats[next.W]
	if (!m.quantized() && kLayouts[m.typ] == nil) || m.cols != p.Bufs[out] {
		return nil
	}
	c := always
	if gemmUsable(m, opt) {
		c = small
	}
	return &c
}

// withQ8 is c with the quantized scratch areas appended to its arguments,
// under the kernel name kernel and the condition cond.
func withQ8(c call, kernel string, when cond) call {
	c.kernel, c.cond = kernel, when
	c.args = append(append([]arg(nil), c.args...), scratch(scratchQ8), scratch(scratchQ8DS))
	return c
}

// fusable reports whether add (the op after the product mm) adds mm's
// output to a residual the product does not read, so the matrix-vector
// kernel can do it.
func fusable(p *backend.Program, mm, add *backend.Op) bool {
	if add.Kind != backend.OpAdd || add.OnSelected != mm.OnSelected || add.Head || mm.Head {
		return false
	}
	x := add.Out
	if !(add.A == x && add.B == mm.Out) && !(add.B == x && add.A == mm.Out) {
		return false
	}
	inRange := func(id backend.BufID) bool { return id >= 0 && int(id) < len(p.Bufs) }
	return inRange(x) && inRange(mm.Out) && inRange(mm.A) && x != mm.A && x != mm.Out && p.Bufs[x] == p.Bufs[mm.Out]
}

// planOp is one op's launches; the checks match the CPU backend's. For a
// product, resid >= 0 names a residual the matrix-vector path adds the
// result to.
func planOp(p *backend.Program, pl *planned, st *planState, op *backend.Op, opt planOptions, resid backend.BufID) ([]call, error) {
	mats := pl.mats
	bufOK := func(ids ...backend.BufID) error {
		for _, id := range ids {
			if id < 0 || int(id) >= len(p.Bufs) {
				return fmt.Errorf("buffer %d out of range", id)
			}
		}
		return nil
	}
	weightOK := func(id backend.WeightID, optional bool) (*matInfo, error) {
		if id == backend.NoWeight && optional {
			return nil, nil
		}
		if id < 0 || int(id) >= len(mats) {
			return nil, fmt.Errorf("weight %d out of range", id)
		}
		return &mats[id], nil
	}
	rows, which := gridAll, metaRows
	if op.OnSelected {
		rows, which = gridSelected, metaSelected
	}
	meta := metaField(-1, p.MaxRows)
	cols := func(id backend.BufID) int { return p.Bufs[id] }
	one := func(c call) ([]call, error) {
		c.which = which
		return []call{c}, nil
	}
	if out, ok := opOutput(op); ok && out >= 0 && int(out) < len(p.Bufs) {
		defer st.written(out)
	}

	switch op.Kind {
	case backend.OpEmbed:
		m, err := weightOK(op.W, false)
		if err != nil {
			return nil, err
		}
		if err := bufOK(op.Out); err != nil {
			return nil, err
		}
		if m.vector || cols(op.Out) != m.cols {
			return nil, fmt.Errorf("embedding %q has %d columns, buffer %d", m.name, m.cols, cols(op.Out))
		}
		if m.rows < p.Vocab {
			return nil, fmt.Errorf("embedding %q has %d rows for a vocabulary of %d", m.name, m.rows, p.Vocab)
		}
		scale := op.Scale
		if scale == 0 {
			scale = 1
		}
		return one(call{kernel: "embed_" + weightTypes[m.typ], gridX: blocks(m.cols, elemBlock), gridY: gridAll, block: elemBlock,
			args: []arg{buf(op.Out), weight(op.W), i64(m.rowBytes), i64(int(m.dOff)), meta, metaField(fieldTokens, p.MaxRows), i32(m.cols), f32(scale)}})

	case backend.OpRMSNorm:
		m, err := weightOK(op.W, false)
		if err != nil {
			return nil, err
		}
		if err := bufOK(op.Out, op.A); err != nil {
			return nil, err
		}
		if op.Group <= 0 || !m.vector || m.cols != op.Group || cols(op.A)%op.Group != 0 || cols(op.Out) != cols(op.A) {
			return nil, fmt.Errorf("norm %q of %d (f32=%v) over groups of %d in %d columns", m.name, m.cols, m.vector, op.Group, cols(op.A))
		}
		block := uint32(min(cmp.Or(opt.normThreads, maxNormThreads), 1024, (op.Group+31)/32*32))
		c := call{kernel: "rmsnorm", gridX: uint32(cols(op.A) / op.Group), gridY: rows, block: block, which: which,
			args: []arg{buf(op.Out), buf(op.A), weight(op.W), meta, i32(which), i32(cols(op.A)), i32(op.Group), f32(op.Eps)}}
		if st.fuse != nil && op.Group == cols(op.A) && op.Group%32 == 0 {
			calls := fusedQ8(st, c, "rmsnorm_q8", op.Group)
			for i := range calls {
				switch calls[i].kernel {
				case "rmsnorm_q8":
					calls[i].block = normQ8Threads(op.Group, opt.normThreads)
				case "rmsnorm_q8k": // a thread 8 elements, a warp a super-block
					calls[i].block = uint32(min(cmp.Or(opt.normThreads, maxNormThreads), 1024, (op.Group/8+31)/32*32))
				}
			}
			return calls, nil
		}
		return []call{c}, nil

	case backend.OpMatMul:
		m, err := weightOK(op.W, false)
		if err != nil {
			return nil, err
		}
		bias, err := weightOK(op.Bias, true)
		if err != nil {
			return nil, err
		}
		if err := bufOK(op.Out, op.A); err != nil {
			return nil, err
		}
		if m.vector || m.cols != cols(op.A) || m.rows != cols(op.Out) {
			return nil, fmt.Errorf("weight %q is %dx%d but maps %d to %d columns", m.name, m.rows, m.cols, cols(op.A), cols(op.Out))
		}
		if op.Out == op.A {
			return nil, fmt.Errorf("matmul by %q in place", m.name)
		}
		if bias != nil && (!bias.vector || bias.cols != m.rows) {
			return nil, fmt.Errorf("bias %q has %d values for %d outputs", bias.name, bias.cols, m.rows)
		}
		calls := planMatMul(p, pl, st, op, m, which, opt, resid)
		for i := range calls {
			calls[i].which = which
		}
		if resid >= 0 {
			st.written(resid)
		}
		return calls, nil

	case backend.OpRope:
		if err := bufOK(op.A); err != nil {
			return nil, err
		}
		if op.Table < 0 || op.Table >= len(p.Ropes) || len(p.Ropes[op.Table].InvFreq)*2 != op.RopeDim ||
			op.NHeads <= 0 || op.NHeads*op.HeadDim != cols(op.A) || op.RopeDim > op.HeadDim {
			return nil, fmt.Errorf("rope table %d for %d heads of %d (rope dim %d) in %d columns", op.Table, op.NHeads, op.HeadDim, op.RopeDim, cols(op.A))
		}
		if op.OnSelected {
			return nil, fmt.Errorf("rope on the selected rows")
		}
		neox := 0
		if op.Layout == backend.RopeNeoX {
			neox = 1
		}
		return one(call{kernel: "rope", gridX: 1, gridY: gridAll, block: elemBlock,
			args: []arg{buf(op.A), {kind: argRope, id: op.Table}, meta, metaField(fieldPos, p.MaxRows), i32(op.NHeads), i32(op.HeadDim), i32(op.RopeDim / 2), i32(neox)}})

	case backend.OpStoreKV:
		if err := bufOK(op.A, op.B); err != nil {
			return nil, err
		}
		if op.Layer < 0 || op.Layer >= len(p.Caches) || p.Caches[op.Layer].KVDim != cols(op.A) || cols(op.B) != cols(op.A) ||
			p.Caches[op.Layer].Capacity <= 0 {
			return nil, fmt.Errorf("kv store for layer %d of %d columns", op.Layer, cols(op.A))
		}
		c := p.Caches[op.Layer]
		return one(call{kernel: cacheKernel("store_kv", c), gridX: blocks(c.KVDim, elemBlock), gridY: gridAll, block: elemBlock,
			args: []arg{{kind: argCacheK, id: op.Layer}, {kind: argCacheV, id: op.Layer}, buf(op.A), buf(op.B), meta,
				metaField(fieldPos, p.MaxRows), metaField(fieldSlots, p.MaxRows), i32(c.KVDim), i32(c.Capacity)}})

	case backend.OpAttention:
		calls, err := planAttention(p, pl, st, op, meta, opt)
		if err != nil {
			return nil, err
		}
		for i := range calls {
			if strings.HasPrefix(calls[i].kernel, "attention") {
				calls[i].kernel = cacheKernel(calls[i].kernel, p.Caches[op.Layer])
			}
			if opt.attnSync && strings.HasPrefix(calls[i].kernel, "attention_split") && !strings.HasSuffix(calls[i].kernel, "_h") {
				calls[i].kernel = "attention_split_sync"
			}
		}
		return calls, nil

	case backend.OpAdd, backend.OpGLU:
		if err := bufOK(op.Out, op.A, op.B); err != nil {
			return nil, err
		}
		if cols(op.Out) != cols(op.A) || cols(op.B) != cols(op.A) {
			return nil, fmt.Errorf("%s over buffers of %d, %d and %d columns", op.Kind, cols(op.Out), cols(op.A), cols(op.B))
		}
		c := call{kernel: "add", gridX: blocks(cols(op.A), elemBlock), gridY: rows, block: elemBlock,
			args: []arg{buf(op.Out), buf(op.A), buf(op.B), meta, i32(which), i32(cols(op.A))}}
		c.which = which
		if op.Kind == backend.OpGLU {
			if op.Act != backend.ActSiLU && op.Act != backend.ActGELUTanh {
				return nil, fmt.Errorf("unknown activation %d", op.Act)
			}
			c.kernel = "glu"
			c.args = append(c.args, i32(op.Act))
			if st.fuse != nil && cols(op.A)%32 == 0 {
				return fusedQ8(st, c, "glu_q8", cols(op.A)), nil
			}
		}
		return []call{c}, nil

	case backend.OpGather:
		if err := bufOK(op.Out, op.A); err != nil {
			return nil, err
		}
		if cols(op.Out) != cols(op.A) || op.Out == op.A {
			return nil, fmt.Errorf("gather between buffers %d and %d of %d and %d columns", op.A, op.Out, cols(op.A), cols(op.Out))
		}
		return one(call{kernel: "gather", gridX: blocks(cols(op.A), elemBlock), gridY: gridSelected, block: elemBlock,
			args: []arg{buf(op.Out), buf(op.A), meta, metaField(fieldSelected, p.MaxRows), i32(cols(op.A))}})

	case backend.OpSoftcap:
		if err := bufOK(op.Out, op.A); err != nil {
			return nil, err
		}
		if !(op.Cap > 0) || cols(op.Out) != cols(op.A) {
			return nil, fmt.Errorf("soft-cap %g from %d to %d columns", op.Cap, cols(op.A), cols(op.Out))
		}
		return one(call{kernel: "softcap", gridX: blocks(cols(op.A), elemBlock), gridY: rows, block: elemBlock,
			args: []arg{buf(op.Out), buf(op.A), meta, i32(which), i32(cols(op.A)), f32(op.Cap)}})
	}
	return nil, fmt.Errorf("unsupported op %s", op.Kind)
}

// fusedQ8 returns c's quantizing variant under the condition st.fuse (to
// Q8_K records when the product's weight is a K-quant; rows of cols) and,
// where that covers only small batches, c itself for the large ones.
func fusedQ8(st *planState, c call, kernel string, cols int) []call {
	st.fused = true
	calls := []call{withQ8(c, kernel, *st.fuse)}
	if st.fuseK {
		calls[0] = withQ8K(c, kernel+"k", *st.fuse, cols)
	}
	if *st.fuse == small {
		c.cond = large
		calls = append(calls, c)
	}
	return calls
}

// opOutput is the buffer an op writes, if any.
func opOutput(op *backend.Op) (backend.BufID, bool) {
	switch op.Kind {
	case backend.OpRope:
		return op.A, true
	case backend.OpStoreKV:
		return 0, false
	}
	return op.Out, true
}

// firstTwins are the kernels whose _first twins (kernels.cu) let the next
// launch start before they wait for the one before them.
var firstTwins = map[string]string{"rmsnorm_q8": "rmsnorm_q8_first", "rope_store": "rope_store_first", "rope_store_h": "rope_store_first_h",
	"rmsnorm_q8k": "rmsnorm_q8k_first", "quantize_q8k": "quantize_q8k_first", "glu_q8k": "glu_q8k_first"}

// firstMaxHeadDim is the widest attention head for which triggerFirst
// takes the _first twins.
const firstMaxHeadDim = 64

// triggerFirst gives the norms that quantize and rope_store their _first
// twins where every rope_store of the plan rotates heads of at most
// firstMaxHeadDim dims (mode "1" or "0", from WEFT_CUDA_FIRST, forces
// the twins or not). A kernel let the next one start only once its own
// dependency wait returned, so the product after a norm was placed, and
// issued its early weight loads, a placement's latency after the product
// before the norm had finished; the twins trigger first, and the next
// kernel's own wait still waits for the whole grid, so only placement
// moves. On an H100 (tg64 drawn from d positions, or tg128, two runs
// each; measured through a compile-time mask, 4e3349c's PDL_FIRST):
// Llama-3.2-1B's shape (64-dim heads) Q4_0 tg128 2,012 / 2,014 with the
// norms against 1,935 / 1,936 without, 2,073 with rope_store too
// against 2,047; tg64 from 512 positions 1,833 against 1,737, from 2,048
// 1,601 / 1,607 against 1,517. Llama-3-8B's (128-dim heads) Q4_0 gains
// at the start (tg128 483.8 / 483.0 against 476.7 / 477.1; tg64 from 0
// 502.2 against 490.6) but loses deeper: from 512 positions 429-431
// against 442-444, from 2,048 337.5-337.8 against 363.6-363.9, the
// norms' twins alone 335.2. By kind (WEFT_CUDA_FIRST=attn, ffn, rope;
// tg64 drawn from d positions against none): on the 8B shape the norm
// before q/k/v is what loses deeper (+0.2 % from 0, +0.8 % from 128, -0.8
// % from 256 and 384, -2.4 % from 512, -8 % from 2,048, worse still with
// the deep attention), the norm before the GLU is even everywhere and
// rope_store alone -0.6 % to +0.3 %; no kind gains at every depth, so the
// 128-dim heads keep none. Batches of several rows take the same twins
// (not measured).
//
// A plan with K-quant products on Q8_K records (kA32 off: the exact
// kernels, WEFT_CUDA_KACT=q8k; matvec_k.cu: their norms are rmsnorm_q8k,
// their o product's input is quantized after the attention by
// quantize_q8k and their GLU is glu_q8k) takes other twins, whatever its
// heads: quantize_q8k's and glu_q8k's, so that the o and down products
// are placed, and issue their early weight loads, while the attention and
// the gate/up product still run; its norms and rope_store keep their
// kernels. On an H100 (tg128 drawn, two rounds; WEFT_CUDA_FIRST lists):
// Llama-3.2-1B's shape Q4_K 1,541 / 1,541 with quant and glu against
// 1,476 / 1,474 with rope (the rule before) and 1,495 / 1,503 with none,
// rope and quant 1,489 / 1,490, the norms too 1,489 / 1,512; Q6_K 1,324
// against 1,279 with rope; tg64 from 2,048 positions 1,313 with rope,
// quant and glu against 1,300 without glu. Llama-3-8B's shape Q4_K 355.3
// / 355.5 against 345.0 / 346.3 with none (quant alone 353.3 / 353.5),
// Q6_K 298.3 against 292.2 with quant; from 2,048 positions 292.4 / 292.3
// against 289.3 / 290.0 (quant alone) and 288.2 / 287.9 (none), from 512
// 332 (quant) against 327. Under kA32 a K-quant plan has Q4_0's launches
// and takes Q4_0's rule (1B Q4_K, twins of norms and rope_store against
// none: 1,850.0 against 1,850.3).
func triggerFirst(pl *planned, mode string) {
	kinds, _ := firstKinds(mode)
	if mode == "" {
		rope, narrow, kquant := false, true, false
		for _, c := range pl.calls {
			if strings.HasPrefix(c.kernel, "rope_store") {
				rope = true
				narrow = narrow && c.args[11].v <= firstMaxHeadDim
			}
			kquant = kquant || slices.Contains(kquantKernels, c.kernel)
		}
		switch {
		case kquant:
			kinds = firstKQuant
		case rope && narrow:
			kinds = firstNarrow
		}
	}
	for i := range pl.calls {
		k, ok := firstTwins[pl.calls[i].kernel]
		if ok && kinds&firstKind(pl.calls, i) != 0 {
			pl.calls[i].kernel = k
		}
	}
}

// The launches that triggerFirst may give their _first twins, as a mask.
const (
	firstAttn  = 1 << iota // a norm whose products are not a GLU's (q/k/v)
	firstFFN               // a norm before a GLU
	firstRope              // rope_store
	firstQuant             // quantize_q8k: a K-quant product's input quantized on its own (after the attention)
	firstGLU               // glu_q8k: the GLU before a K-quant down product
	firstAll   = firstAttn | firstFFN | firstRope | firstQuant | firstGLU
	// firstNarrow are the kinds that trigger first in a plan whose heads
	// have at most firstMaxHeadDim dims, firstKQuant those that do in a
	// plan with K-quant products, whatever its heads.
	firstNarrow = firstAttn | firstFFN | firstRope
	firstKQuant = firstQuant | firstGLU
)

// firstKinds parses WEFT_CUDA_FIRST: "1" (every kind), "0" (none) or a
// comma-separated list of attn, ffn, rope, quant and glu.
func firstKinds(mode string) (int, error) {
	switch mode {
	case "", "0":
		return 0, nil
	case "1":
		return firstAll, nil
	}
	m := 0
	for k := range strings.SplitSeq(mode, ",") {
		switch k {
		case "attn":
			m |= firstAttn
		case "ffn":
			m |= firstFFN
		case "rope":
			m |= firstRope
		case "quant":
			m |= firstQuant
		case "glu":
			m |= firstGLU
		default:
			return 0, fmt.Errorf("cuda: WEFT_CUDA_FIRST=%q: want 0, 1 or a list of attn, ffn, rope, quant and glu", mode)
		}
	}
	return m, nil
}

// firstKind is the kind of calls[i], a norm, rope_store, quantize_q8k or
// glu_q8k: a norm is firstFFN when a GLU kernel is among the products
// right after it, or (K-quants) right after those.
func firstKind(calls []call, i int) int {
	switch k := calls[i].kernel; {
	case strings.HasPrefix(k, "rope_store"):
		return firstRope
	case strings.HasPrefix(k, "quantize_q8k"):
		return firstQuant
	case strings.HasPrefix(k, "glu_q8k"):
		return firstGLU
	}
	j := i + 1
	for ; j < len(calls) && strings.HasPrefix(calls[j].kernel, "matvec"); j++ {
		if strings.Contains(calls[j].kernel, "_glu_") {
			return firstFFN
		}
	}
	if j > i+1 && j < len(calls) && strings.HasPrefix(calls[j].kernel, "glu") {
		return firstFFN
	}
	return firstAttn
}
