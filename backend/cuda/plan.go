package cuda

import (
	"fmt"

	"github.com/weftlm/weft/backend"
)

// The plan is the device-independent half of Compile: every op checked
// against the program (the same checks as the CPU backend) and turned into
// a kernel launch whose arguments name buffers, weights and caches rather
// than device addresses. Binding (exec.go) resolves the names once the
// memory exists. Keeping this half free of driver calls lets it be tested
// on machines without a GPU.

// Weight storage types as kernels.cu numbers them, with the suffix of
// their embed_ and matmul_ kernels.
var weightTypes = map[string]string{
	"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0", "Q4_0": "q4_0",
}

// argKind says how a launch argument is resolved.
type argKind uint8

const (
	argBuf    argKind = iota // activation buffer id: its device address
	argWeight                // weight id: its device address, 0 for NoWeight
	argCacheK                // layer: its key cache's address
	argCacheV                // layer: its value cache's address
	argRope                  // rope table id: its inverse frequencies' address
	argMeta                  // meta + 4*v bytes (see the meta* offsets)
	argInt                   // int32 v
	argInt64                 // int64 v
	argFloat                 // float32 f
)

type arg struct {
	kind argKind
	id   int
	v    int64
	f    float32
}

func buf(id backend.BufID) arg       { return arg{kind: argBuf, id: int(id)} }
func weight(id backend.WeightID) arg { return arg{kind: argWeight, id: int(id)} }
func i32(v int) arg                  { return arg{kind: argInt, v: int64(v)} }
func i64(v int) arg                  { return arg{kind: argInt64, v: int64(v)} }
func f32(v float32) arg              { return arg{kind: argFloat, f: v} }

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
)

// call is one kernel launch of the plan.
type call struct {
	op     int // index in Program.Ops
	kernel string
	gridX  uint32
	gridY  gridRows
	block  uint32
	shared uint32
	args   []arg
}

// matInfo describes a program weight as the device stores it: rows of
// rowBytes in its stored type, or a float32 vector (one row).
type matInfo struct {
	name       string
	rows, cols int
	rowBytes   int
	typ        string // weights' spelling: "F32", "Q4_0", ...
	vector     bool   // an engine-prepared float32 vector (Weight.F32)
}

// describe checks a program weight and says how it is stored.
func describe(w *backend.Weight) (matInfo, error) {
	if w.F32 != nil {
		return matInfo{name: w.Name, rows: 1, cols: len(w.F32), rowBytes: 4 * len(w.F32), typ: "F32", vector: true}, nil
	}
	t := w.Tensor
	if t == nil {
		return matInfo{}, fmt.Errorf("weight %q has neither a tensor nor float32 values", w.Name)
	}
	if _, ok := weightTypes[t.Type]; !ok || !t.HasGGML || t.MLX != nil {
		return matInfo{}, fmt.Errorf("tensor %q: type %s is not supported by the CUDA backend", w.Name, t.Type)
	}
	m := matInfo{name: w.Name, rows: int(t.Rows()), cols: int(t.Cols()), typ: t.Type}
	for _, d := range t.Shape[:max(0, len(t.Shape)-2)] {
		m.rows *= int(d)
	}
	rb, err := t.GGML.RowBytes(uint64(m.cols))
	if err != nil {
		return matInfo{}, fmt.Errorf("tensor %q: %w", w.Name, err)
	}
	m.rowBytes = int(rb)
	if len(w.Data.Bytes) != m.rows*m.rowBytes {
		return matInfo{}, fmt.Errorf("tensor %q: %d bytes, want %d for %s %v", w.Name, len(w.Data.Bytes), m.rows*m.rowBytes, t.Type, t.Shape)
	}
	return m, nil
}

const (
	elemBlock      = 256 // threads of an elementwise launch
	matmulWarps    = 8   // output columns per matmul block
	attentionWarps = 4
	maxHeadDim     = 512 // kernels.cu MAXD
)

func blocks(n, per int) uint32 { return uint32((n + per - 1) / per) }

// plan checks every op of p and returns its launches and the description
// of every weight.
func plan(p *backend.Program) ([]call, []matInfo, error) {
	if p.MaxRows <= 0 || p.Slots <= 0 || p.Context <= 0 {
		return nil, nil, fmt.Errorf("cuda: program with %d rows, %d slots and a context of %d", p.MaxRows, p.Slots, p.Context)
	}
	if p.MaxRows > 65535 {
		return nil, nil, fmt.Errorf("cuda: program of %d rows exceeds the grid limit of 65535", p.MaxRows)
	}
	if p.Logits < 0 || int(p.Logits) >= len(p.Bufs) || p.Bufs[p.Logits] != p.Vocab {
		return nil, nil, fmt.Errorf("cuda: logits buffer %d does not hold %d columns", p.Logits, p.Vocab)
	}
	mats := make([]matInfo, len(p.Weights))
	for i := range p.Weights {
		m, err := describe(&p.Weights[i])
		if err != nil {
			return nil, nil, fmt.Errorf("cuda: %w", err)
		}
		mats[i] = m
	}
	for i, r := range p.Ropes {
		if len(r.InvFreq) == 0 {
			return nil, nil, fmt.Errorf("cuda: rope table %d is empty", i)
		}
	}
	for l, c := range p.Caches {
		if c.Layer != l || c.KVDim <= 0 || c.Capacity <= 0 {
			return nil, nil, fmt.Errorf("cuda: cache %d is for layer %d with %d columns and %d positions", l, c.Layer, c.KVDim, c.Capacity)
		}
	}
	calls := make([]call, 0, len(p.Ops))
	for i := range p.Ops {
		c, err := planOp(p, mats, &p.Ops[i])
		if err != nil {
			return nil, nil, fmt.Errorf("cuda: op %d (%s, layer %d): %w", i, p.Ops[i].Kind, p.Ops[i].Layer, err)
		}
		c.op = i
		calls = append(calls, c)
	}
	return calls, mats, nil
}

// planOp is one op's launch; the checks match the CPU backend's.
func planOp(p *backend.Program, mats []matInfo, op *backend.Op) (call, error) {
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

	switch op.Kind {
	case backend.OpEmbed:
		m, err := weightOK(op.W, false)
		if err != nil {
			return call{}, err
		}
		if err := bufOK(op.Out); err != nil {
			return call{}, err
		}
		if m.vector || cols(op.Out) != m.cols {
			return call{}, fmt.Errorf("embedding %q has %d columns, buffer %d", m.name, m.cols, cols(op.Out))
		}
		if m.rows < p.Vocab {
			return call{}, fmt.Errorf("embedding %q has %d rows for a vocabulary of %d", m.name, m.rows, p.Vocab)
		}
		scale := op.Scale
		if scale == 0 {
			scale = 1
		}
		return call{kernel: "embed_" + weightTypes[m.typ], gridX: blocks(m.cols, elemBlock), gridY: gridAll, block: elemBlock,
			args: []arg{buf(op.Out), weight(op.W), meta, metaField(fieldTokens, p.MaxRows), i32(m.cols), i64(m.rowBytes), f32(scale)}}, nil

	case backend.OpRMSNorm:
		m, err := weightOK(op.W, false)
		if err != nil {
			return call{}, err
		}
		if err := bufOK(op.Out, op.A); err != nil {
			return call{}, err
		}
		if op.Group <= 0 || !m.vector || m.cols != op.Group || cols(op.A)%op.Group != 0 || cols(op.Out) != cols(op.A) {
			return call{}, fmt.Errorf("norm %q of %d (f32=%v) over groups of %d in %d columns", m.name, m.cols, m.vector, op.Group, cols(op.A))
		}
		block := uint32(min(256, (op.Group+31)/32*32))
		return call{kernel: "rmsnorm", gridX: uint32(cols(op.A) / op.Group), gridY: rows, block: block,
			args: []arg{buf(op.Out), buf(op.A), weight(op.W), meta, i32(which), i32(cols(op.A)), i32(op.Group), f32(op.Eps)}}, nil

	case backend.OpMatMul:
		m, err := weightOK(op.W, false)
		if err != nil {
			return call{}, err
		}
		bias, err := weightOK(op.Bias, true)
		if err != nil {
			return call{}, err
		}
		if err := bufOK(op.Out, op.A); err != nil {
			return call{}, err
		}
		if m.vector || m.cols != cols(op.A) || m.rows != cols(op.Out) {
			return call{}, fmt.Errorf("weight %q is %dx%d but maps %d to %d columns", m.name, m.rows, m.cols, cols(op.A), cols(op.Out))
		}
		if op.Out == op.A {
			return call{}, fmt.Errorf("matmul by %q in place", m.name)
		}
		if bias != nil && (!bias.vector || bias.cols != m.rows) {
			return call{}, fmt.Errorf("bias %q has %d values for %d outputs", bias.name, bias.cols, m.rows)
		}
		return call{kernel: "matmul_" + weightTypes[m.typ], gridX: blocks(m.rows, matmulWarps), gridY: gridOne, block: 32 * matmulWarps,
			args: []arg{buf(op.Out), buf(op.A), weight(op.W), weight(op.Bias), meta, i32(which), i32(m.cols), i32(m.rows), i64(m.rowBytes)}}, nil

	case backend.OpRope:
		if err := bufOK(op.A); err != nil {
			return call{}, err
		}
		if op.Table < 0 || op.Table >= len(p.Ropes) || len(p.Ropes[op.Table].InvFreq)*2 != op.RopeDim ||
			op.NHeads <= 0 || op.NHeads*op.HeadDim != cols(op.A) || op.RopeDim > op.HeadDim {
			return call{}, fmt.Errorf("rope table %d for %d heads of %d (rope dim %d) in %d columns", op.Table, op.NHeads, op.HeadDim, op.RopeDim, cols(op.A))
		}
		if op.OnSelected {
			return call{}, fmt.Errorf("rope on the selected rows")
		}
		neox := 0
		if op.Layout == backend.RopeNeoX {
			neox = 1
		}
		return call{kernel: "rope", gridX: 1, gridY: gridAll, block: elemBlock,
			args: []arg{buf(op.A), {kind: argRope, id: op.Table}, meta, metaField(fieldPos, p.MaxRows), i32(op.NHeads), i32(op.HeadDim), i32(op.RopeDim / 2), i32(neox)}}, nil

	case backend.OpStoreKV:
		if err := bufOK(op.A, op.B); err != nil {
			return call{}, err
		}
		if op.Layer < 0 || op.Layer >= len(p.Caches) || p.Caches[op.Layer].KVDim != cols(op.A) || cols(op.B) != cols(op.A) {
			return call{}, fmt.Errorf("kv store for layer %d of %d columns", op.Layer, cols(op.A))
		}
		c := p.Caches[op.Layer]
		return call{kernel: "store_kv", gridX: blocks(c.KVDim, elemBlock), gridY: gridAll, block: elemBlock,
			args: []arg{{kind: argCacheK, id: op.Layer}, {kind: argCacheV, id: op.Layer}, buf(op.A), buf(op.B), meta,
				metaField(fieldPos, p.MaxRows), metaField(fieldSlots, p.MaxRows), i32(c.KVDim), i32(c.Capacity)}}, nil

	case backend.OpAttention:
		if err := bufOK(op.Out, op.A); err != nil {
			return call{}, err
		}
		if op.Layer < 0 || op.Layer >= len(p.Caches) {
			return call{}, fmt.Errorf("attention over layer %d of %d", op.Layer, len(p.Caches))
		}
		c := p.Caches[op.Layer]
		if op.NKV <= 0 || op.NHeads%op.NKV != 0 || op.HeadDim <= 0 || op.HeadDim > maxHeadDim ||
			c.KVDim != op.NKV*op.HeadDim || cols(op.A) != op.NHeads*op.HeadDim || cols(op.Out) != cols(op.A) {
			return call{}, fmt.Errorf("attention of %d heads (%d kv) of %d over a %d-wide cache", op.NHeads, op.NKV, op.HeadDim, c.KVDim)
		}
		if op.Out == op.A {
			return call{}, fmt.Errorf("attention in place")
		}
		need := p.Context
		if op.Window > 0 {
			need = min(p.Context, op.Window+p.MaxRows-1)
		}
		if c.Capacity < need {
			return call{}, fmt.Errorf("ring cache of %d positions cannot hold a window of %d plus %d rows", c.Capacity, op.Window, p.MaxRows)
		}
		return call{kernel: "attention", gridX: uint32(op.NHeads), gridY: gridAll, block: 32 * attentionWarps,
			shared: uint32(4 * attentionWarps * (op.HeadDim + 2)),
			args: []arg{buf(op.Out), buf(op.A), {kind: argCacheK, id: op.Layer}, {kind: argCacheV, id: op.Layer}, meta,
				metaField(fieldPos, p.MaxRows), metaField(fieldSlots, p.MaxRows), i32(op.NHeads), i32(op.NKV), i32(op.HeadDim),
				i32(c.Capacity), f32(op.Scale), f32(op.Cap), i32(op.Window)}}, nil

	case backend.OpAdd, backend.OpGLU:
		if err := bufOK(op.Out, op.A, op.B); err != nil {
			return call{}, err
		}
		if cols(op.Out) != cols(op.A) || cols(op.B) != cols(op.A) {
			return call{}, fmt.Errorf("%s over buffers of %d, %d and %d columns", op.Kind, cols(op.Out), cols(op.A), cols(op.B))
		}
		c := call{kernel: "add", gridX: blocks(cols(op.A), elemBlock), gridY: rows, block: elemBlock,
			args: []arg{buf(op.Out), buf(op.A), buf(op.B), meta, i32(which), i32(cols(op.A))}}
		if op.Kind == backend.OpGLU {
			if op.Act != backend.ActSiLU && op.Act != backend.ActGELUTanh {
				return call{}, fmt.Errorf("unknown activation %d", op.Act)
			}
			c.kernel = "glu"
			c.args = append(c.args, i32(op.Act))
		}
		return c, nil

	case backend.OpGather:
		if err := bufOK(op.Out, op.A); err != nil {
			return call{}, err
		}
		if cols(op.Out) != cols(op.A) || op.Out == op.A {
			return call{}, fmt.Errorf("gather between buffers %d and %d of %d and %d columns", op.A, op.Out, cols(op.A), cols(op.Out))
		}
		return call{kernel: "gather", gridX: blocks(cols(op.A), elemBlock), gridY: gridSelected, block: elemBlock,
			args: []arg{buf(op.Out), buf(op.A), meta, metaField(fieldSelected, p.MaxRows), i32(cols(op.A))}}, nil

	case backend.OpSoftcap:
		if err := bufOK(op.Out, op.A); err != nil {
			return call{}, err
		}
		if !(op.Cap > 0) || cols(op.Out) != cols(op.A) {
			return call{}, fmt.Errorf("soft-cap %g from %d to %d columns", op.Cap, cols(op.A), cols(op.Out))
		}
		return call{kernel: "softcap", gridX: blocks(cols(op.A), elemBlock), gridY: rows, block: elemBlock,
			args: []arg{buf(op.Out), buf(op.A), meta, i32(which), i32(cols(op.A)), f32(op.Cap)}}, nil
	}
	return call{}, fmt.Errorf("unsupported op %s", op.Kind)
}
