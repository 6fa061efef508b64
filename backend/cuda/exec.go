package cuda

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/weftlm/weft/backend"
)

// exec is a compiled program: device memory for its buffers, weights, rope
// tables, caches, scratch areas and batch, one prepared launch per plan
// call, and the CUDA graphs captured for small batches.
type exec struct {
	be     *Backend
	p      *backend.Program
	allocs []uint64 // every device allocation, freed by Close

	bufs    []uint64 // [MaxRows, cols] float32 each
	weights []uint64 // device layout (see kernels.cu), or float32 vectors; 0 for none
	ropes   []uint64 // float32 inverse frequencies
	kv      [][2]uint64
	scratch [numScratch]uint64
	meta    uint64  // int32 [metaArrays + 4*MaxRows]
	host    []int32 // the batch as meta holds it, staged on the host
	// The host side of a run lies in one block of page-locked memory
	// (stageHost), so that its copies are queued without waiting, in
	// order with the launches, and the run waits once, at its end: host
	// and the draws' parameters go in, the draws and small batches'
	// outputs (staged, MaxRows or smallRows rows of the widest output)
	// come out. pinned is the block, nil where it is Go memory (the
	// driver would not lock it, or WEFT_CUDA_PINNED=0).
	pinned   unsafe.Pointer
	drawHost drawHost
	drawAt   int // the draws' parameters' offset in bytes, in meta and on the host
	staged   []float32

	launches []launch
	// args holds every launch argument in an 8-byte slot (ints and floats
	// in the low bytes), params the address of each slot: a launch passes
	// the address of its first param as cuLaunchKernel's kernelParams.
	// Both are sized once so the addresses never change.
	args   []uint64
	params []uintptr

	// graphs[rows][selected][out][deep] replays every launch of a batch
	// of that shape (rows <= smallRows; out: outDevice, outHidden,
	// outStaged, or one of the drawing outputs from outDrawn on; deep: a
	// row at deepAt or past it); captured on first use
	// on stream.
	graphs [smallRows + 1][smallRows + 1][outLogprobs + numOuts][2]uintptr
	deepAt int32 // the position from which deep launches run (0: the plan has none)
	stream uintptr
	// copies is the stream an outStaged graph copies the logits on, event
	// what it forks and joins by; staging says whether it has such graphs
	// (the plan splits its logits product, splitLogits, and staged is
	// page-locked).
	copies, event uintptr
	staging       bool
	pdl           bool // capture with programmatic dependent launch
	cfg           launchConfig
	attr          launchAttr

	draw *drawState // device draws (sample.go), set up on first use
	// drawOut is the output of the draws staged last (outDrawn to
	// outFoldedNucleus: drawOut, stageDraws); drawWindows and drawBias, whether a
	// row of them has a penalty window or a logit bias for the run to
	// copy up.
	drawOut               int
	drawWindows, drawBias bool
	// lpRecs are the log-probability records of the draws handed out
	// last (RunSampled, WaitSampled), lpTop each row's TopLogprobs there
	// (-1: none asked); lpSteps is RunSampled's rows' draw steps.
	lpRecs  []lpRec
	lpTop   []int32
	lpSteps []uint64
	chain   chain // decode steps queued ahead of the host (chain.go)

	alpha, beta float32  // cuBLAS scalars, read through pointers
	sys         callArgs // arguments of the replay's driver calls
	debugSync   bool
	closed      bool
}

// launch is a bound kernel call or cuBLAS product.
type launch struct {
	op     int
	head   bool // skipped by hidden-state batches
	fn     uintptr
	gridX  uint32
	gridY  gridRows
	block  uint32
	shared uint32
	params uintptr // &params[first]
	which  int
	cond   cond
	gemm   *boundGemm
	serial bool // launched without programmatic dependent launch
	depth  depth
	kernel string // the kernel's name (or "" for a cuBLAS product)
	// copyOff and copyLen: the bytes of the logits it finishes (call).
	copyOff, copyLen int64
	rowsIf           cond // a further condition on the batch's rows (call)
	whole            bool // the product that copyLen's runs split, for outputs other than outStaged (call)
	logits           bool // it computes a one-row batch's logits (call)
	at               int  // its first argument's index in args
}

// What a run leaves where, the graphs' third index.
const (
	outDevice = iota // the outputs stay in device memory
	outHidden        // a hidden-state batch's, in device memory
	// The logits, copied into staged by the graph as its launches finish
	// them (splitLogits): a batch with one row selected, whose logits the
	// host reads.
	outStaged
	// The logits left in device memory and the selected rows' tokens
	// drawn from them (sample.go): the draws' launches follow the plan's.
	outDrawn
	// outDrawn with the cuts of top-p (nucleus_max, nucleus_pass) before
	// the draws: a row draws as sample.SampleNucleus.
	outNucleus
	// outDrawn and outNucleus with the logits changed first (adjust): a
	// row has a logit bias or penalises its recent tokens.
	outAdjusted
	outAdjustedNucleus
	// outDrawn for one selected row that draws greedily, with the draw
	// folded into the output product (its twins matvec1d_*, then
	// draw_fold: sample.go's folds).
	outFolded
	// outNucleus for one selected row without a bias or penalties, the
	// row's largest logit folded into the output product as outFolded
	// folds its draw (its twin), so that no nucleus_max launch is needed.
	outFoldedNucleus
	numOuts
	// outLogprobs plus a drawing output other than the folded ones: the
	// draws also take the log-probabilities of the rows that ask for them
	// (logprob before the other draw launches, logprob_end after them).
	outLogprobs = numOuts
)

type boundGemm struct {
	out, x, w uint64
	n, k      int
}

// splitKeys overrides attSplitKeys when set; tests lower it so that short
// caches split over several blocks.
var splitKeys int

// attentionSplitKeys is the planOptions.splitKeys to compile with:
// WEFT_CUDA_SPLIT=0 turns split decode attention off (-1), and
// WEFT_CUDA_SPLIT=N (N > 1) splits the cache in runs of N positions, for
// comparisons.
func attentionSplitKeys() int {
	if n, err := strconv.Atoi(os.Getenv("WEFT_CUDA_SPLIT")); err == nil {
		switch {
		case n == 0:
			return -1
		case n > 1:
			return n
		}
	}
	return splitKeys
}

// envInt is the integer in environment variable name, or 0.
func envInt(name string) int {
	n, _ := strconv.Atoi(os.Getenv(name))
	return n
}

// omitCalls drops the launches whose kernel name starts with one of the
// comma-separated prefixes in omit (WEFT_CUDA_OMIT): a measuring aid that
// times a decode step without a kernel class. The results are then wrong.
func omitCalls(calls []call, omit string) []call {
	return slices.DeleteFunc(calls, func(c call) bool { return hasPrefixIn(c.kernel, omit) })
}

// sameWeights (WEFT_CUDA_PROBE_SAMEW, a measuring aid: the results are
// then wrong) makes the launches whose kernel starts with one of the
// comma-separated prefixes in which ("all": every launch) read, for each
// weight argument, the first weight that the same kernel read at that
// argument with the same shape: every layer then reads layer 0's
// weights, which L2 can hold, and the step's time says what the products
// would take if DRAM served them as fast as L2 does.
func sameWeights(calls []call, mats []matInfo, which string) {
	if which == "" {
		return
	}
	type key struct {
		kernel     string
		at         int
		rows, cols int
	}
	first := map[key]int{}
	for i := range calls {
		c := &calls[i]
		if which != "all" && !hasPrefixIn(c.kernel, which) {
			continue
		}
		for a := range c.args {
			id := c.args[a].id
			if c.args[a].kind != argWeight || id < 0 || id >= len(mats) {
				continue
			}
			k := key{c.kernel, a, mats[id].rows, mats[id].cols}
			if f, ok := first[k]; ok {
				c.args[a].id = f
			} else {
				first[k] = id
			}
		}
	}
}

// serialCalls marks the launches whose kernel name starts with one of the
// comma-separated prefixes in serial (WEFT_CUDA_SERIAL) to launch without
// programmatic dependent launch, as breakChains does, for comparisons.
func serialCalls(calls []call, serial string) {
	for i := range calls {
		if hasPrefixIn(calls[i].kernel, serial) {
			calls[i].serial = true
		}
	}
}

// hasPrefixIn reports whether name starts with one of the non-empty
// comma-separated prefixes in list.
func hasPrefixIn(name, list string) bool {
	for p := range strings.SplitSeq(list, ",") {
		if p != "" && strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// envPlanOptions are the plan options the environment sets, most of them
// for comparisons (README lists them).
func envPlanOptions() planOptions {
	return planOptions{splitKeys: attentionSplitKeys(), noOneRow: os.Getenv("WEFT_CUDA_ONEROW") == "0", noKGLU: os.Getenv("WEFT_CUDA_KGLU") == "0",
		gluWarps: envInt("WEFT_CUDA_GLU_WARPS"), attnSync: os.Getenv("WEFT_CUDA_ATTN_SYNC") == "1",
		attnWide: os.Getenv("WEFT_CUDA_ATTN_GENERAL") == "1", attnLane: os.Getenv("WEFT_CUDA_ATTN_LANE") == "1",
		attnSingle: os.Getenv("WEFT_CUDA_ATTN_SINGLE") == "1", attnGroups: envInt("WEFT_CUDA_ATTN_GROUPS"),
		deepAt: envInt("WEFT_CUDA_ATTN_DEEP"), logitsSplit: envInt("WEFT_CUDA_LOGITS_SPLIT"),
		noBreak: os.Getenv("WEFT_CUDA_BREAK") == "0", noGLU: os.Getenv("WEFT_CUDA_GLU") == "0",
		oneRowMax: envInt("WEFT_CUDA_ONEROW_MAX"), normThreads: envInt("WEFT_CUDA_NORM_THREADS") / 32 * 32,
		twinGrid: min(max(envInt("WEFT_CUDA_TWIN_GRID"), 0), 16), glu1Warps: envInt("WEFT_CUDA_GLU1_WARPS"), twinRPB: envInt("WEFT_CUDA_TWIN_RPB"), twin13RPB: envInt("WEFT_CUDA_TWIN13_RPB"),
		noKGroup: os.Getenv("WEFT_CUDA_KGROUP") == "0", longRPB: envInt("WEFT_CUDA_LONG_RPB"),
		first: os.Getenv("WEFT_CUDA_FIRST")}
}

// check reports settings from the environment that name no kernel.
func (opt planOptions) check() error {
	if g := opt.attnGroups; g != 0 && g != 1 && !slices.Contains(attGroupSizes, g) {
		return fmt.Errorf("cuda: WEFT_CUDA_ATTN_GROUPS=%d: want 1 or one of %v", g, attGroupSizes)
	}
	if _, err := firstKinds(opt.first); err != nil {
		return err
	}
	return nil
}

// Compile implements backend.Backend.
func (b *Backend) Compile(p *backend.Program) (backend.Exec, error) {
	opt := envPlanOptions()
	if err := opt.check(); err != nil {
		return nil, err
	}
	opt.gemm, opt.sms, opt.mmq, opt.maxShared = b.blas != nil, b.sms, mmqOn(b.target.arch), b.sharedOptin
	opt.kA32 = b.kA32()
	if b.exact {
		// cuBLAS's f16 products and the float32 attention kernels do
		// not keep to the contract: mmq takes the large batches of
		// Q8_0 and Q4_0 products, the matrix-vector kernels the rest,
		// the one-block-a-head kernel every attention.
		opt.exact, opt.gemm, opt.mmq = true, false, b.target.arch >= 80
	}
	pl, err := plan(p, opt)
	if err != nil {
		return nil, err
	}
	pl.calls = omitCalls(pl.calls, os.Getenv("WEFT_CUDA_OMIT"))
	sameWeights(pl.calls, pl.mats, os.Getenv("WEFT_CUDA_PROBE_SAMEW"))
	serialCalls(pl.calls, os.Getenv("WEFT_CUDA_SERIAL"))
	defer runtime.UnlockOSThread()
	if err := b.current(); err != nil {
		return nil, err
	}
	e := &exec{be: b, p: p, debugSync: os.Getenv("WEFT_CUDA_SYNC") == "1", alpha: 1, deepAt: int32(pl.deepAt),
		pdl: b.target.arch >= 90 && os.Getenv("WEFT_CUDA_PDL") != "0"}
	if err := e.allocate(pl); err != nil {
		e.free()
		return nil, err
	}
	if err := e.bind(pl.calls); err != nil {
		e.free()
		return nil, err
	}
	if r := b.drv.cuStreamCreate(&e.stream, 1); r != 0 { // CU_STREAM_NON_BLOCKING: no implicit sync with the default stream
		e.free()
		return nil, fmt.Errorf("cuda: cuStreamCreate: %w", b.drv.err(r))
	}
	e.staging = e.staging && e.pinned != nil
	if e.staging {
		if r := b.drv.cuStreamCreate(&e.copies, 1); r != 0 {
			e.free()
			return nil, fmt.Errorf("cuda: cuStreamCreate: %w", b.drv.err(r))
		}
		if r := b.drv.cuEventCreate(&e.event, 2); r != 0 { // CU_EVENT_DISABLE_TIMING
			e.free()
			return nil, fmt.Errorf("cuda: cuEventCreate: %w", b.drv.err(r))
		}
	}
	return e, nil
}

// cacheElemBytes is the bytes of one cached key or value element.
func cacheElemBytes(c backend.Cache) uint64 {
	if c.F16 {
		return 2
	}
	return 4
}

// deviceBytes is the device memory a program needs, in bytes.
func deviceBytes(p *backend.Program, pl *planned) uint64 {
	var n uint64
	for _, c := range p.Bufs {
		n += uint64(4 * p.MaxRows * c)
	}
	var staging uint64
	for _, m := range pl.mats {
		n += uint64(m.rows * m.ggufRow)
		if m.quantized() {
			staging = max(staging, uint64(m.rows*m.ggufRow))
		}
	}
	for _, r := range p.Ropes {
		n += uint64(8 * len(r.InvFreq)) // float64 under WEFT_CUDA_EXACT, float32 else: counted at the larger
	}
	for _, c := range p.Caches {
		n += 2 * cacheElemBytes(c) * uint64(p.Slots) * uint64(c.Capacity) * uint64(c.KVDim)
	}
	for _, s := range pl.scratch {
		n += uint64(s)
	}
	return n + staging + uint64(4*(metaArrays+4*p.MaxRows))
}

// alloc reserves n bytes of device memory, zeroed.
func (e *exec) alloc(n uint64, what string) (uint64, error) {
	d := e.be.drv
	var ptr uint64
	if r := d.cuMemAlloc(&ptr, max(n, 4)); r != 0 {
		return 0, fmt.Errorf("cuda: allocating %d bytes for %s: %w", n, what, d.err(r))
	}
	e.allocs = append(e.allocs, ptr)
	if r := d.cuMemsetD8(ptr, 0, max(n, 4)); r != 0 {
		return 0, fmt.Errorf("cuda: clearing %s: %w", what, d.err(r))
	}
	return ptr, nil
}

// copyIn copies host bytes to device memory at ptr.
func (e *exec) copyIn(ptr uint64, b []byte, what string) error {
	if len(b) == 0 {
		return nil
	}
	d := e.be.drv
	if r := d.cuMemcpyHtoD(ptr, unsafe.Pointer(&b[0]), uint64(len(b))); r != 0 {
		return fmt.Errorf("cuda: uploading %s: %w", what, d.err(r))
	}
	return nil
}

// upload copies host bytes into a new device allocation.
func (e *exec) upload(b []byte, what string) (uint64, error) {
	ptr, err := e.alloc(uint64(len(b)), what)
	if err != nil {
		return 0, err
	}
	return ptr, e.copyIn(ptr, b, what)
}

func f32Bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

func f64Bytes(v []float64) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 8*len(v))
}

// exactOn reports whether WEFT_CUDA_EXACT=1 asks for kernels kept to the
// CPU backend's exact contract (kernels.cu's WEFT_EXACT): slower, and
// bit-identical to the CPU's exact level (WEFT_CPU_KERNELS=exact) but for
// values within a few float64 ulps of a float32 rounding boundary. Read
// when a Backend is made (its module and plans keep the answer).
func exactOn() bool { return os.Getenv("WEFT_CUDA_EXACT") == "1" }

// allocate reserves and fills the program's device memory, after checking
// that it fits.
func (e *exec) allocate(pl *planned) error {
	p, d := e.p, e.be.drv
	var free, total uint64
	if r := d.cuMemGetInfo(&free, &total); r != 0 {
		return fmt.Errorf("cuda: cuMemGetInfo: %w", d.err(r))
	}
	if need := deviceBytes(p, pl); need > free {
		return fmt.Errorf("cuda: the program needs %.2f GiB of device memory, %.2f GiB of %.2f are free", gib(need), gib(free), gib(total))
	}
	for i, c := range p.Bufs {
		ptr, err := e.alloc(uint64(4*p.MaxRows*c), fmt.Sprintf("buffer %d", i))
		if err != nil {
			return err
		}
		e.bufs = append(e.bufs, ptr)
	}
	if err := e.uploadWeights(pl.mats); err != nil {
		return err
	}
	for i, r := range p.Ropes {
		inv := make([]float32, len(r.InvFreq))
		for j, f := range r.InvFreq {
			inv[j] = float32(f)
		}
		table := f32Bytes(inv)
		if e.be.exact {
			table = f64Bytes(r.InvFreq) // kernels.cu's freq_t
		}
		ptr, err := e.upload(table, fmt.Sprintf("rope table %d", i))
		if err != nil {
			return err
		}
		e.ropes = append(e.ropes, ptr)
	}
	for _, c := range p.Caches {
		n := cacheElemBytes(c) * uint64(p.Slots) * uint64(c.Capacity) * uint64(c.KVDim)
		k, err := e.alloc(n, fmt.Sprintf("layer %d keys", c.Layer))
		if err != nil {
			return err
		}
		v, err := e.alloc(n, fmt.Sprintf("layer %d values", c.Layer))
		if err != nil {
			return err
		}
		e.kv = append(e.kv, [2]uint64{k, v})
	}
	for i, n := range pl.scratch {
		if n == 0 {
			continue
		}
		ptr, err := e.alloc(uint64(n), "scratch")
		if err != nil {
			return err
		}
		e.scratch[i] = ptr
	}
	e.stageHost()
	var err error
	e.meta, err = e.alloc(uint64(e.drawAt+drawParamBytes*p.MaxRows), "the batch")
	return err
}

// drawParamBytes is the size of a row's draw parameters (drawHost).
const drawParamBytes = 64

// drawHost is the host side of the device draws (sample.go): the
// parameters, which follow the batch at drawAt on both sides (seeds,
// steps, temperatures, top-ks, top-ps, min-ps, the penalties, the
// penalty windows' sizes, lengths and next places, the logit biases'
// lengths, then the log-probabilities' top counts, so that one copy moves
// the batch and them), the windows' tokens, the biases, the drawn ids and
// the log-probabilities' records.
type drawHost struct {
	seed, step         []uint64
	temp, topP, minP   []float32
	topK               []int32
	rep, pres, freq    []float32
	wsize, wlen, wnext []int32
	win                []int32 // [MaxRows, backend.MaxWindow]: each row's window, oldest first
	blen               []int32
	lpn                []int32                       // each row's TopLogprobs, -1 where it asks for no log-probabilities
	bias               []biasEntry                   // [MaxRows, backend.MaxBias]: each row's logit bias
	ids                [backend.MaxPipelined][]int32 // a slot a step in flight (chain.go); RunSampled uses the first
	// drawn is where the draw kernel stores row r's draw itself, at
	// 2r + (the draw's step & 1), through drawnDev, its device address:
	// no copy follows the plan (0 where the page-locked block is not
	// mapped into the device's address space, or WEFT_CUDA_MAPPED_DRAWS=0;
	// the draws are then copied into ids).
	drawn    []int32
	drawnDev uint64
	// lp holds the rows' log-probability records, row r's of a draw at
	// step t at 2r + (t & 1): where lpDev is set, the kernels write lp[0]
	// themselves through it (its device address, as drawnDev is drawn's);
	// else each step's are copied from the device into its slot's
	// (chain.go; RunSampled uses the first).
	lp    [backend.MaxPipelined][]lpRec
	lpDev uint64
}

// lpRec is a row's log-probabilities as sample.cu's logprob and
// logprob_end leave them (its lp_rec): the raw logits' log-sum-exp, the
// drawn token's raw logit and the n most probable tokens' ids and raw
// logits.
type lpRec struct {
	lse   float64
	drawn float32
	_     int32
	n     int32
	_     int32
	ids   [backend.MaxTopLogprobs]int32
	vals  [backend.MaxTopLogprobs]float32
	_     uint64
}

// lpRecBytes is sample.cu's sizeof(lp_rec).
const lpRecBytes = 192

// biasEntry is one token's logit bias, as sample.cu's adjust reads it.
type biasEntry struct {
	id int32
	v  float32
}

// stageHost lays out the host side of a run (exec.pinned) in one block of
// page-locked memory, or of Go memory where the driver does not give it.
func (e *exec) stageHost() {
	p, m := e.p, e.p.MaxRows
	metaBytes := (4*(metaArrays+4*m) + 7) &^ 7
	drawBytes := (drawParamBytes*m + 4*backend.MaxPipelined*m + 8*m + 7) &^ 7
	outFloats := min(m, smallRows) * max(p.Vocab, p.Dim)
	winAt := metaBytes + drawBytes + 4*outFloats
	biasAt := winAt + 4*backend.MaxWindow*m
	lpAt := (biasAt + 8*backend.MaxBias*m + 7) &^ 7 // lpRec holds a float64
	size := lpAt + lpRecBytes*backend.MaxPipelined*2*m
	var block unsafe.Pointer
	var dev uint64
	if os.Getenv("WEFT_CUDA_PINNED") != "0" {
		d := e.be.drv
		if r := d.cuMemHostAlloc(&block, uint64(size), 2); r != 0 { // CU_MEMHOSTALLOC_DEVICEMAP
			if r := d.cuMemHostAlloc(&block, uint64(size), 0); r != 0 {
				block = nil
			}
		}
		if block != nil && os.Getenv("WEFT_CUDA_MAPPED_DRAWS") != "0" {
			if r := d.cuMemHostGetDevicePointer(&dev, block, 0); r != 0 {
				dev = 0
			}
		}
	}
	e.pinned = block
	if block == nil {
		block = unsafe.Pointer(unsafe.SliceData(make([]uint64, (size+7)/8)))
	}
	at := func(off int) unsafe.Pointer { return unsafe.Add(block, off) }
	e.host, e.drawAt = unsafe.Slice((*int32)(block), metaArrays+4*m), metaBytes
	dh := &e.drawHost
	dh.seed = unsafe.Slice((*uint64)(at(metaBytes)), m)
	dh.step = unsafe.Slice((*uint64)(at(metaBytes+8*m)), m)
	dh.temp = unsafe.Slice((*float32)(at(metaBytes+16*m)), m)
	dh.topK = unsafe.Slice((*int32)(at(metaBytes+20*m)), m)
	dh.topP = unsafe.Slice((*float32)(at(metaBytes+24*m)), m)
	dh.minP = unsafe.Slice((*float32)(at(metaBytes+28*m)), m)
	dh.rep = unsafe.Slice((*float32)(at(metaBytes+32*m)), m)
	dh.pres = unsafe.Slice((*float32)(at(metaBytes+36*m)), m)
	dh.freq = unsafe.Slice((*float32)(at(metaBytes+40*m)), m)
	dh.wsize = unsafe.Slice((*int32)(at(metaBytes+44*m)), m)
	dh.wlen = unsafe.Slice((*int32)(at(metaBytes+48*m)), m)
	dh.wnext = unsafe.Slice((*int32)(at(metaBytes+52*m)), m)
	dh.win = unsafe.Slice((*int32)(at(winAt)), backend.MaxWindow*m)
	dh.blen = unsafe.Slice((*int32)(at(metaBytes+56*m)), m)
	dh.lpn = unsafe.Slice((*int32)(at(metaBytes+60*m)), m)
	for i := range dh.lp {
		dh.lp[i] = unsafe.Slice((*lpRec)(at(lpAt+lpRecBytes*2*i*m)), 2*m)
	}
	e.lpRecs, e.lpTop, e.lpSteps = make([]lpRec, m), make([]int32, m), make([]uint64, m)
	dh.bias = unsafe.Slice((*biasEntry)(at(biasAt)), backend.MaxBias*m)
	for i := range dh.ids {
		dh.ids[i] = unsafe.Slice((*int32)(at(metaBytes+drawParamBytes*m+4*i*m)), m)
	}
	drawnAt := metaBytes + drawParamBytes*m + 4*backend.MaxPipelined*m
	dh.drawn = unsafe.Slice((*int32)(at(drawnAt)), 2*m)
	if dev != 0 {
		dh.drawnDev = dev + uint64(drawnAt)
		dh.lpDev = dev + uint64(lpAt)
	}
	e.staged = unsafe.Slice((*float32)(at(metaBytes+drawBytes)), outFloats)
}

// uploadWeights copies every weight to the device. Q8_0 and Q4_0 tensors
// (and those stored as Q8_0, convert.go's q8Exact) pass through a staging
// allocation that the repack kernel turns into the device layout; the
// staging memory is freed at the end. K-quant tensors
// and those converted to F16 or F32 are laid out on the host, a bounded
// chunk of rows at a time.
func (e *exec) uploadWeights(mats []matInfo) error {
	d := e.be.drv
	var staging uint64
	var host []byte // converted rows on their way up (convert.go)
	defer func() {
		if staging != 0 {
			d.cuCtxSynchronize()
			d.cuMemFree(staging)
		}
	}()
	for i := range e.p.Weights {
		w, m := &e.p.Weights[i], &mats[i]
		what := fmt.Sprintf("tensor %q", m.name)
		if w.F32 != nil {
			ptr, err := e.upload(f32Bytes(w.F32), what)
			if err != nil {
				return err
			}
			e.weights = append(e.weights, ptr)
			continue
		}
		if (m.src != "" && !m.quantized()) || kLayouts[m.typ] != nil {
			ptr, err := e.uploadOnHost(w, m, &host)
			if err != nil {
				return err
			}
			e.weights = append(e.weights, ptr)
			continue
		}
		if !m.quantized() {
			ptr, err := e.upload(w.Data.Bytes, what)
			if err != nil {
				return err
			}
			e.weights = append(e.weights, ptr)
			continue
		}
		if staging == 0 {
			var most int
			for _, o := range mats {
				if o.quantized() {
					most = max(most, o.rows*o.ggufRow)
				}
			}
			if r := d.cuMemAlloc(&staging, uint64(most)); r != 0 {
				return fmt.Errorf("cuda: allocating %d bytes to stage quantized weights: %w", most, d.err(r))
			}
		}
		ptr, err := e.alloc(uint64(m.rows)*uint64(m.ggufRow), what)
		if err != nil {
			return err
		}
		e.weights = append(e.weights, ptr)
		// The copy is ordered after the previous repack on the default
		// stream, so the staging memory is free again. A q8Exact weight
		// (convert.go) is staged as Q8_0 blocks.
		if m.src != "" {
			err = e.stageQ8(staging, w, m, &host)
		} else {
			err = e.copyIn(staging, w.Data.Bytes, what)
		}
		if err != nil {
			return err
		}
		n := int64(m.rows) * int64(m.cols/32)
		args := [4]uint64{ptr, staging, uint64(n), uint64(m.dOff)}
		params := [4]uintptr{}
		for k := range args {
			params[k] = uintptr(unsafe.Pointer(&args[k]))
		}
		r := d.cuLaunchKernel(e.be.funcs["repack_"+weightTypes[m.typ]], blocks(int(n), elemBlock), 1, 1, elemBlock, 1, 1, 0, 0,
			unsafe.Pointer(&params[0]), nil)
		runtime.KeepAlive(&args)
		if r != 0 {
			return fmt.Errorf("cuda: repacking %s: %w", what, d.err(r))
		}
	}
	return nil
}

func gib(n uint64) float64 { return float64(n) / (1 << 30) }

// bind resolves every launch argument to its value and prepares the
// kernelParams arrays.
func (e *exec) bind(calls []call) error {
	n := 0
	for _, c := range calls {
		n += len(c.args)
	}
	e.args = make([]uint64, n)
	e.params = make([]uintptr, n)
	for i := range e.args {
		e.params[i] = uintptr(unsafe.Pointer(&e.args[i]))
	}
	at := 0
	for _, c := range calls {
		l := launch{op: c.op, head: e.p.Ops[c.op].Head, gridX: c.gridX, gridY: c.gridY, block: c.block, shared: c.shared,
			which: c.which, cond: c.cond, serial: c.serial, depth: c.depth, copyOff: c.copyOff, copyLen: c.copyLen,
			rowsIf: c.rowsIf, whole: c.whole, logits: c.logits, at: at}
		e.staging = e.staging || c.copyLen > 0
		if c.gemm != nil {
			g := c.gemm
			l.gemm = &boundGemm{out: e.resolve(g.out), x: e.resolve(g.x), w: e.resolve(g.w), n: g.n, k: g.k}
			e.launches = append(e.launches, l)
			continue
		}
		l.kernel = c.kernel
		fn, ok := e.be.funcs[c.kernel]
		if !ok {
			return fmt.Errorf("cuda: op %d: no kernel %s", c.op, c.kernel)
		}
		if c.shared > maxStaticShared {
			if err := e.be.optIn(fn, c.kernel, c.shared); err != nil {
				return err
			}
		}
		l.fn, l.params = fn, uintptr(unsafe.Pointer(&e.params[at]))
		e.launches = append(e.launches, l)
		for _, a := range c.args {
			e.args[at] = e.resolve(a)
			at++
		}
	}
	return nil
}

// resolve is an argument's 8-byte slot.
func (e *exec) resolve(a arg) uint64 {
	switch a.kind {
	case argBuf: // v: a byte offset into the buffer
		return e.bufs[a.id] + uint64(a.v)
	case argWeight: // v: a byte offset into the weight
		if a.id == int(backend.NoWeight) {
			return 0
		}
		return e.weights[a.id] + uint64(a.v)
	case argCacheK:
		return e.kv[a.id][0]
	case argCacheV:
		return e.kv[a.id][1]
	case argRope:
		return e.ropes[a.id]
	case argMeta:
		return e.meta + uint64(4*a.v)
	case argScratch:
		return e.scratch[a.id]
	case argNull:
		return 0
	case argInt:
		return uint64(uint32(int32(a.v)))
	case argInt64:
		return uint64(a.v)
	case argFloat:
		return uint64(math.Float32bits(a.f))
	}
	panic("cuda: unknown argument kind")
}

var errClosed = errors.New("cuda: plan is closed")

// Close implements backend.Exec.
func (e *exec) Close() error {
	if e.closed {
		return nil
	}
	e.closed = true
	defer runtime.UnlockOSThread()
	if err := e.be.current(); err != nil {
		return err
	}
	if e.chain.inFlight() > 0 {
		e.be.drv.cuCtxSynchronize() // steps issued and never waited for
	}
	return e.free()
}

// free releases the graphs, the stream and every device allocation; the
// context must be current.
func (e *exec) free() error {
	d := e.be.drv
	var errs []error
	for i := range e.graphs {
		for j := range e.graphs[i] {
			for k := range e.graphs[i][j] {
				for l, g := range e.graphs[i][j][k] {
					if g != 0 {
						if r := d.cuGraphExecDestroy(g); r != 0 {
							errs = append(errs, d.err(r))
						}
						e.graphs[i][j][k][l] = 0
					}
				}
			}
		}
	}
	for _, s := range []*uintptr{&e.stream, &e.copies} {
		if *s != 0 {
			if r := d.cuStreamDestroy(*s); r != 0 {
				errs = append(errs, d.err(r))
			}
			*s = 0
		}
	}
	for _, ev := range append([]*uintptr{&e.event}, e.chain.eventPtrs()...) {
		if *ev != 0 {
			if r := d.cuEventDestroy(*ev); r != 0 {
				errs = append(errs, d.err(r))
			}
			*ev = 0
		}
	}
	for _, ptr := range e.allocs {
		if r := d.cuMemFree(ptr); r != 0 {
			errs = append(errs, d.err(r))
		}
	}
	if e.pinned != nil {
		if r := d.cuMemFreeHost(e.pinned); r != 0 {
			errs = append(errs, d.err(r))
		}
		e.pinned = nil
	}
	e.host, e.staged, e.drawHost = nil, nil, drawHost{}
	e.allocs, e.bufs, e.weights, e.ropes, e.kv = nil, nil, nil, nil, nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cuda: freeing a plan: %w", err)
	}
	return nil
}
