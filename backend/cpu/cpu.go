// Package cpu is the CPU backend: it runs a backend.Program with float32
// activations on a fixed pool of worker goroutines.
//
// Matmul weights are repacked once, at compile time, into tiles of 8 rows
// in their stored precision (pack.go). Each matmul converts its input rows
// once into what the weight's kernels read — 8-bit levels per block of 32
// (legacy types) or 256 (k-quants), as ggml does, or float32 rows — and
// the tiles are split over the workers. The kernels are chosen at start-up
// by the CPU's features: generated AVX-512 VNNI or AVX2 assembly on amd64
// (kernels_amd64.s, from asmgen), portable Go elsewhere. The environment
// variable WEFT_CPU_KERNELS names a lower level ("avx2", "go") to use
// instead, for comparisons.
package cpu

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/quant"
)

// Backend is the CPU backend.
type Backend struct {
	threads int
	isa     *isa  // nil when err is set
	err     error // a kernel level was asked for that this machine lacks
}

// New returns a CPU backend using threads workers (0: one per CPU).
func New(threads int) *Backend {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	b := &Backend{threads: threads, isa: best()}
	if name := os.Getenv("WEFT_CPU_KERNELS"); name != "" {
		b.isa, b.err = levelNamed(name)
	}
	return b
}

// NewExact is New with the exact kernel level (WEFT_CPU_KERNELS=exact;
// exact.go): results that do not depend on the order of any sum, the
// reference other backends are checked against. Slow.
func NewExact(threads int) *Backend {
	b := New(threads)
	b.isa, b.err = levelNamed("exact")
	return b
}

// Kernels names the kernel level compiled plans use ("avx512vnni", "avx2",
// "go", "exact").
func (b *Backend) Kernels() string {
	if b.isa == nil {
		return ""
	}
	return b.isa.name
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "cpu" }

// Threads is the number of workers a compiled plan uses.
func (b *Backend) Threads() int { return b.threads }

// Supports implements backend.Backend.
func (b *Backend) Supports(weightType string) bool { return supported[weightType] }

// Close implements backend.Backend.
func (b *Backend) Close() error { return nil }

// kvCache holds one layer's keys and values for every slot:
// k[slot][pos % capacity][kvDim], as float32 (k, v) or, for an F16 cache,
// as IEEE half floats (k16, v16).
type kvCache struct {
	k, v     []float32
	k16, v16 []uint16
	capacity int
	kvDim    int
}

// exec is a compiled program.
type exec struct {
	p     *backend.Program
	pool  *pool
	bufs  [][]float32 // [MaxRows * cols]
	mats  []*matrix
	kv    []kvCache
	ropes []ropeState
	ops   []step

	// scratch per worker: a decoded weight row, attention scores, a
	// partial tile's outputs.
	rowScratch   [][]float32
	scoreScratch [][]float32
	// exactScratch holds, per worker, the exact level's float64 scores
	// and a head's accumulators (exact.go).
	exactScratch [][]float64
	tileScratch  [][]float32

	isa     *isa
	threads int
	// acts holds matmul inputs converted to activation records, one
	// buffer per (input buffer, layout), shared by the ops that read it.
	acts map[actKey][]byte
	// lastAct is, while compiling, the records the previous op left valid.
	lastAct *actKey

	// per-run state read by the op bodies
	batch *backend.Batch
	rows  int
}

// step is one compiled op: how many work items it has and its body.
type step struct {
	op    *backend.Op
	items func() int
	grain int
	body  func(lo, hi, worker int)
	pre   *step // a step to run first (a matmul's input conversion)
	// grainFn, when set, replaces grain with one chosen per run.
	grainFn func() int
}

type ropeState struct {
	invFreq  []float64
	half     int
	cos, sin []float32 // [MaxRows * half], filled per run
}

// Compile implements backend.Backend.
func (b *Backend) Compile(p *backend.Program) (backend.Exec, error) {
	if b.err != nil {
		return nil, b.err
	}
	if p.MaxRows <= 0 || p.Slots <= 0 {
		return nil, fmt.Errorf("cpu: program with %d rows and %d slots", p.MaxRows, p.Slots)
	}
	e := &exec{p: p, isa: b.isa, threads: b.threads, acts: map[actKey][]byte{}}
	maxCols := 0
	for _, c := range p.Bufs {
		e.bufs = append(e.bufs, make([]float32, p.MaxRows*c))
		maxCols = max(maxCols, c)
	}
	for i := range p.Weights {
		m, err := newMatrix(&p.Weights[i])
		if err != nil {
			return nil, err
		}
		e.mats = append(e.mats, m)
		maxCols = max(maxCols, m.cols)
	}
	maxCap := 0
	for _, c := range p.Caches {
		n := p.Slots * c.Capacity * c.KVDim
		kv := kvCache{capacity: c.Capacity, kvDim: c.KVDim}
		if c.F16 {
			kv.k16, kv.v16 = make([]uint16, n), make([]uint16, n)
		} else {
			kv.k, kv.v = make([]float32, n), make([]float32, n)
		}
		e.kv = append(e.kv, kv)
		maxCap = max(maxCap, c.Capacity)
	}
	for _, r := range p.Ropes {
		half := len(r.InvFreq)
		e.ropes = append(e.ropes, ropeState{invFreq: r.InvFreq, half: half, cos: make([]float32, p.MaxRows*half), sin: make([]float32, p.MaxRows*half)})
	}
	e.pool = newPool(b.threads)
	for range b.threads {
		e.rowScratch = append(e.rowScratch, make([]float32, maxCols))
		e.scoreScratch = append(e.scoreScratch, make([]float32, maxCap))
		if e.isa.exact {
			e.exactScratch = append(e.exactScratch, make([]float64, maxCap+maxCols))
		}
		e.tileScratch = append(e.tileScratch, make([]float32, tileRows*e.isa.group))
	}
	for i := range p.Ops {
		s, err := e.compileOp(&p.Ops[i])
		if p.Ops[i].Kind != backend.OpMatMul {
			e.lastAct = nil
		}
		if err != nil {
			e.pool.close()
			return nil, fmt.Errorf("cpu: op %d (%s, layer %d): %w", i, p.Ops[i].Kind, p.Ops[i].Layer, err)
		}
		if s.pre != nil {
			e.ops = append(e.ops, *s.pre)
		}
		e.ops = append(e.ops, s)
	}
	return e, nil
}

// Close implements backend.Exec.
func (e *exec) Close() error {
	if e.pool != nil {
		e.pool.close()
		e.pool = nil
	}
	e.bufs, e.mats, e.kv = nil, nil, nil
	return nil
}

var errClosed = errors.New("cpu: plan is closed")

// Run implements backend.Exec.
func (e *exec) Run(b *backend.Batch, logits []float32) error {
	if e.pool == nil {
		return errClosed
	}
	if err := e.p.Validate(b); err != nil {
		return err
	}
	width, src := e.p.Vocab, e.p.Logits
	if b.HiddenOnly {
		width, src = e.p.Dim, e.p.Hidden
	}
	if len(logits) != len(b.Selected)*width {
		return fmt.Errorf("cpu: output buffer of %d floats, want %d", len(logits), len(b.Selected)*width)
	}
	e.batch, e.rows = b, len(b.Tokens)
	for i := range e.ropes {
		e.fillRope(&e.ropes[i])
	}
	for i := range e.ops {
		s := &e.ops[i]
		if b.HiddenOnly && s.op.Head {
			continue
		}
		grain := s.grain
		if s.grainFn != nil {
			grain = s.grainFn()
		}
		e.pool.parallel(s.items(), grain, s.body)
	}
	copy(logits, e.bufs[src][:len(logits)])
	e.batch = nil
	return nil
}

// ReadKeys implements backend.KeyReader.
func (e *exec) ReadKeys(layer, slot, pos, n int, dst []float32) error {
	if e.pool == nil {
		return errClosed
	}
	if layer < 0 || layer >= len(e.kv) || slot < 0 || slot >= e.p.Slots || pos < 0 || n < 0 || pos+n > e.p.Context {
		return fmt.Errorf("cpu: keys of layer %d slot %d positions [%d,%d) out of range", layer, slot, pos, pos+n)
	}
	c := &e.kv[layer]
	if len(dst) != n*c.kvDim {
		return fmt.Errorf("cpu: key buffer of %d floats, want %d", len(dst), n*c.kvDim)
	}
	if n > c.capacity {
		return fmt.Errorf("cpu: layer %d keeps only the last %d positions", layer, c.capacity)
	}
	for i := 0; i < n; i++ {
		at := (slot*c.capacity + (pos+i)%c.capacity) * c.kvDim
		row := dst[i*c.kvDim : (i+1)*c.kvDim]
		if c.k16 != nil {
			for j, h := range c.k16[at : at+c.kvDim] {
				row[j] = quant.F16ToF32(h)
			}
			continue
		}
		copy(row, c.k[at:at+c.kvDim])
	}
	return nil
}

// fillRope computes cos and sin of every row's angles once per run; every
// layer using the table shares them.
func (e *exec) fillRope(r *ropeState) {
	for row := 0; row < e.rows; row++ {
		pos := float64(e.batch.Pos[row])
		for i, f := range r.invFreq {
			s, c := math.Sincos(pos * f)
			r.cos[row*r.half+i] = float32(c)
			r.sin[row*r.half+i] = float32(s)
		}
	}
}

func (e *exec) rowCount(op *backend.Op) int {
	if op.OnSelected {
		return len(e.batch.Selected)
	}
	return e.rows
}

// compileOp binds an op to its buffers and weights and returns its body.
func (e *exec) compileOp(op *backend.Op) (step, error) {
	p := e.p
	bufOK := func(ids ...backend.BufID) error {
		for _, id := range ids {
			if id < 0 || int(id) >= len(p.Bufs) {
				return fmt.Errorf("buffer %d out of range", id)
			}
		}
		return nil
	}
	weightOK := func(id backend.WeightID, optional bool) (*matrix, error) {
		if id == backend.NoWeight && optional {
			return nil, nil
		}
		if id < 0 || int(id) >= len(e.mats) {
			return nil, fmt.Errorf("weight %d out of range", id)
		}
		return e.mats[id], nil
	}
	rows := func() int { return e.rowCount(op) }
	switch op.Kind {
	case backend.OpEmbed:
		m, err := weightOK(op.W, false)
		if err != nil {
			return step{}, err
		}
		if err := bufOK(op.Out); err != nil {
			return step{}, err
		}
		if p.Bufs[op.Out] != m.cols {
			return step{}, fmt.Errorf("embedding %q has %d columns, buffer %d", m.name, m.cols, p.Bufs[op.Out])
		}
		return step{op: op, items: rows, grain: 1, body: e.embedBody(op, m)}, nil
	case backend.OpRMSNorm:
		m, err := weightOK(op.W, false)
		if err != nil {
			return step{}, err
		}
		if err := bufOK(op.Out, op.A); err != nil {
			return step{}, err
		}
		if m.cols != op.Group || p.Bufs[op.A]%op.Group != 0 || p.Bufs[op.Out] != p.Bufs[op.A] || m.f32 == nil {
			return step{}, fmt.Errorf("norm %q of %d (f32=%v) over groups of %d in %d columns", m.name, m.cols, m.f32 != nil, op.Group, p.Bufs[op.A])
		}
		body := normBody[float32](e, op, m)
		if e.isa.exact {
			body = normBody[float64](e, op, m)
		}
		return step{op: op, items: rows, grain: 1, body: body}, nil
	case backend.OpMatMul:
		m, err := weightOK(op.W, false)
		if err != nil {
			return step{}, err
		}
		bias, err := weightOK(op.Bias, true)
		if err != nil {
			return step{}, err
		}
		if err := bufOK(op.Out, op.A); err != nil {
			return step{}, err
		}
		if m.cols != p.Bufs[op.A] || m.rows != p.Bufs[op.Out] {
			return step{}, fmt.Errorf("weight %q is %dx%d but maps %d to %d columns", m.name, m.rows, m.cols, p.Bufs[op.A], p.Bufs[op.Out])
		}
		if bias != nil && (bias.f32 == nil || bias.cols != m.rows) {
			return step{}, fmt.Errorf("bias %q has %d values for %d outputs", bias.name, bias.cols, m.rows)
		}
		return e.matmulStep(op, m, bias)
	case backend.OpRope:
		if err := bufOK(op.A); err != nil {
			return step{}, err
		}
		if op.Table < 0 || op.Table >= len(e.ropes) || e.ropes[op.Table].half*2 != op.RopeDim || op.NHeads*op.HeadDim != p.Bufs[op.A] || op.RopeDim > op.HeadDim {
			return step{}, fmt.Errorf("rope table %d for %d heads of %d (rope dim %d) in %d columns", op.Table, op.NHeads, op.HeadDim, op.RopeDim, p.Bufs[op.A])
		}
		body := ropeBody[float32](e, op)
		if e.isa.exact {
			body = ropeBody[float64](e, op)
		}
		return step{op: op, items: rows, grain: 1, body: body}, nil
	case backend.OpStoreKV:
		if err := bufOK(op.A, op.B); err != nil {
			return step{}, err
		}
		if op.Layer < 0 || op.Layer >= len(e.kv) || e.kv[op.Layer].kvDim != p.Bufs[op.A] || p.Bufs[op.B] != p.Bufs[op.A] {
			return step{}, fmt.Errorf("kv store for layer %d of %d columns", op.Layer, p.Bufs[op.A])
		}
		return step{op: op, items: rows, grain: 4, body: e.storeKVBody(op)}, nil
	case backend.OpAttention:
		if err := bufOK(op.Out, op.A); err != nil {
			return step{}, err
		}
		if op.Layer < 0 || op.Layer >= len(e.kv) || op.NKV <= 0 || op.NHeads%op.NKV != 0 ||
			e.kv[op.Layer].kvDim != op.NKV*op.HeadDim || p.Bufs[op.A] != op.NHeads*op.HeadDim || p.Bufs[op.Out] != p.Bufs[op.A] {
			return step{}, fmt.Errorf("attention of %d heads (%d kv) of %d over a %d-wide cache", op.NHeads, op.NKV, op.HeadDim, e.kv[op.Layer].kvDim)
		}
		need := p.Context
		if op.Window > 0 {
			need = min(p.Context, op.Window+p.MaxRows-1)
		}
		if e.kv[op.Layer].capacity < need {
			return step{}, fmt.Errorf("ring cache of %d positions cannot hold a window of %d plus %d rows", e.kv[op.Layer].capacity, op.Window, p.MaxRows)
		}
		heads := op.NHeads
		body := e.attentionBody(op)
		if e.isa.exact {
			body = e.attentionExactBody(op)
		}
		return step{op: op, items: func() int { return e.rows * heads }, grain: 1, body: body}, nil
	case backend.OpAdd, backend.OpGLU:
		if err := bufOK(op.Out, op.A, op.B); err != nil {
			return step{}, err
		}
		if p.Bufs[op.Out] != p.Bufs[op.A] || p.Bufs[op.B] != p.Bufs[op.A] {
			return step{}, fmt.Errorf("%s over buffers of %d, %d and %d columns", op.Kind, p.Bufs[op.Out], p.Bufs[op.A], p.Bufs[op.B])
		}
		if op.Kind == backend.OpAdd {
			return step{op: op, items: rows, grain: 4, body: e.addBody(op)}, nil
		}
		if op.Act != backend.ActSiLU && op.Act != backend.ActGELUTanh {
			return step{}, fmt.Errorf("unknown activation %d", op.Act)
		}
		return step{op: op, items: rows, grain: 1, body: e.gluBody(op)}, nil
	case backend.OpGather:
		if err := bufOK(op.Out, op.A); err != nil {
			return step{}, err
		}
		if p.Bufs[op.Out] != p.Bufs[op.A] {
			return step{}, fmt.Errorf("gather between %d and %d columns", p.Bufs[op.A], p.Bufs[op.Out])
		}
		return step{op: op, items: func() int { return len(e.batch.Selected) }, grain: 8, body: e.gatherBody(op)}, nil
	case backend.OpSoftcap:
		if err := bufOK(op.Out, op.A); err != nil {
			return step{}, err
		}
		if !(op.Cap > 0) {
			return step{}, fmt.Errorf("soft-cap %g", op.Cap)
		}
		return step{op: op, items: rows, grain: 1, body: e.softcapBody(op)}, nil
	}
	return step{}, fmt.Errorf("unsupported op %s", op.Kind)
}
