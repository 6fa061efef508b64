package cuda

import (
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/quant"
)

// Capture modes (CUstreamCaptureMode): relaxed lets other threads of the
// process use the driver while a graph is being captured.
const captureRelaxed = 2

// launchConfig is CUlaunchConfig, launchAttr CUlaunchAttribute (an id and
// a 64-byte value union), laid out as the C structs are on 64-bit hosts.
type launchConfig struct {
	gridX, gridY, gridZ    uint32
	blockX, blockY, blockZ uint32
	shared                 uint32
	_                      uint32
	stream                 uintptr
	attrs                  uintptr
	numAttrs               uint32
	_                      uint32
}

type launchAttr struct {
	id    uint32
	_     uint32
	value [64]byte
}

// attrProgrammaticSerialization is
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: a kernel may
// start launching while the one before it runs (programmatic dependent
// launch); the kernels wait for their inputs in pdl().
const attrProgrammaticSerialization = 6

// Run implements backend.Exec: it stages the batch into meta, runs the
// launches that apply to the batch on the default stream (a small batch
// as one graph replay) and copies the selected rows' logits, or hidden
// states, back, which waits for the kernels: through the page-locked
// staging memory where they fit, else straight into out.
func (e *exec) Run(b *backend.Batch, out []float32) error {
	src, n, err := e.output(b)
	if err != nil {
		return err
	}
	if len(out) != n {
		return fmt.Errorf("cuda: output buffer of %d floats, want %d", len(out), n)
	}
	if n <= len(e.staged) {
		rows, err := e.runStaged(b, src, n)
		copy(out, rows)
		return err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if e.be.closed {
		return errBackendClosed
	}
	if _, err := e.replay(b, false, false); err != nil {
		return err
	}
	// A synchronous copy, which waits for the launches before it.
	d, c := e.be.drv, &e.sys
	*c = callArgs{uintptr(unsafe.Pointer(&out[0])), uintptr(src), uintptr(4 * len(out))}
	r := c.call(d.memcpyDtoH, 3)
	runtime.KeepAlive(out)
	if r != 0 {
		return fmt.Errorf("cuda: running the plan: %w", d.err(r))
	}
	return nil
}

// RunView implements backend.Viewer: Run, with the rows left in the
// page-locked staging memory they are copied to (smallRows rows fit).
func (e *exec) RunView(b *backend.Batch) ([]float32, error) {
	src, n, err := e.output(b)
	if err != nil {
		return nil, err
	}
	if n > len(e.staged) {
		return nil, fmt.Errorf("cuda: %d selected rows exceed the %d a view holds", len(b.Selected), len(e.staged)/(n/len(b.Selected)))
	}
	return e.runStaged(b, src, n)
}

// output checks b for a run and says where its output rows are (the
// logits, or the hidden states) and how many floats they hold.
func (e *exec) output(b *backend.Batch) (src uint64, n int, err error) {
	if e.closed {
		return 0, 0, errClosed
	}
	if e.chain.inFlight() > 0 {
		return 0, 0, errInFlight
	}
	p := e.p
	if err := p.Validate(b); err != nil {
		return 0, 0, err
	}
	width, buf := p.Vocab, p.Logits
	if b.HiddenOnly {
		width, buf = p.Dim, p.Hidden
	}
	return e.bufs[buf], len(b.Selected) * width, nil
}

// runStaged runs b and returns the n floats at src, fetched into staged.
func (e *exec) runStaged(b *backend.Batch, src uint64, n int) ([]float32, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if e.be.closed {
		return nil, errBackendClosed
	}
	staged, err := e.replay(b, false, true)
	if err != nil {
		return nil, err
	}
	if staged {
		// The graph copied the logits into staged itself.
		if r := e.sys.call(e.be.drv.ctxSync, 0); r != 0 {
			return nil, fmt.Errorf("cuda: running the plan: %w", e.be.drv.err(r))
		}
		return e.staged[:n], nil
	}
	if err := e.fetch(unsafe.Pointer(&e.staged[0]), src, 4*n); err != nil {
		return nil, err
	}
	return e.staged[:n], nil
}

var _ backend.Viewer = (*exec)(nil)

// fetch queues the copy of n bytes at src into dst (exec's staging
// memory) behind the run's launches and waits for all of them.
func (e *exec) fetch(dst unsafe.Pointer, src uint64, n int) error {
	d, c := e.be.drv, &e.sys
	*c = callArgs{uintptr(dst), uintptr(src), uintptr(n), 0}
	if r := c.call(d.dtoHAsync, 4); r != 0 {
		c.call(d.ctxSync, 0) // the batch's copy may still be queued
		return fmt.Errorf("cuda: queueing the copy of the results: %w", d.err(r))
	}
	if r := c.call(d.ctxSync, 0); r != 0 {
		return fmt.Errorf("cuda: running the plan: %w", d.err(r))
	}
	return nil
}

// replay makes the context current, stages the batch into meta (and with
// draws set, the draws' parameters staged in drawHost after it) and issues
// the launches that apply to it on the default stream (a small batch as
// one graph replay). With stage set (the caller reads the logits from
// staged) it replays, where it can, the graph that copies them there
// itself (outStaged), and says so. The caller has validated the batch and
// locked its OS thread, and waits for the run's end (a synchronous copy
// or cuCtxSynchronize) before it stages another batch; replay itself
// waits when it fails.
func (e *exec) replay(b *backend.Batch, draws, stage bool) (staged bool, err error) {
	staged, err = e.issue(b, draws, stage)
	if err != nil {
		e.sys.call(e.be.drv.ctxSync, 0)
	}
	return staged, err
}

// issue is replay but for the wait on failure.
func (e *exec) issue(b *backend.Batch, draws, stage bool) (bool, error) {
	p := e.p
	d, c := e.be.drv, &e.sys
	c[0] = e.be.ctx
	if r := c.call(d.ctxSetCurrent, 1); r != 0 {
		return false, fmt.Errorf("cuda: cuCtxSetCurrent: %w", d.err(r))
	}
	e.chain.next = false // meta is the host's again
	rows, sel := len(b.Tokens), len(b.Selected)
	h, m := e.host, p.MaxRows
	h[metaRows], h[metaSelected] = int32(rows), int32(sel)
	copy(h[metaArrays+fieldTokens*m:], b.Tokens)
	copy(h[metaArrays+fieldPos*m:], b.Pos)
	copy(h[metaArrays+fieldSlots*m:], b.Slots)
	copy(h[metaArrays+fieldSelected*m:], b.Selected)
	// Queued: the launches below read meta after it lands, and h is not
	// written again before the run's end has been waited for.
	n := 4 * len(h)
	if draws {
		n = e.drawAt + drawParamBytes*m
	}
	*c = callArgs{uintptr(e.meta), uintptr(unsafe.Pointer(&h[0])), uintptr(n), 0}
	if r := c.call(d.htoDAsync, 4); r != 0 {
		return false, fmt.Errorf("cuda: copying the batch: %w", d.err(r))
	}
	if draws && e.drawWindows {
		win := e.drawHost.win
		*c = callArgs{uintptr(e.draw.win), uintptr(unsafe.Pointer(&win[0])), uintptr(4 * backend.MaxWindow * sel), 0}
		if r := c.call(d.htoDAsync, 4); r != 0 {
			return false, fmt.Errorf("cuda: copying the penalty windows: %w", d.err(r))
		}
	}
	if draws && e.drawBias {
		bias := e.drawHost.bias
		*c = callArgs{uintptr(e.draw.bias), uintptr(unsafe.Pointer(&bias[0])), uintptr(8 * backend.MaxBias * sel), 0}
		if r := c.call(d.htoDAsync, 4); r != 0 {
			return false, fmt.Errorf("cuda: copying the logit biases: %w", d.err(r))
		}
	}
	out := outDevice
	switch {
	case b.HiddenOnly:
		out = outHidden
	case draws:
		out = e.drawOut
	case stage && e.staging && sel == 1:
		out = outStaged
	}
	if err := e.enqueue(rows, sel, out, slices.Max(b.Pos)); err != nil {
		return false, err
	}
	return out == outStaged, nil
}

// enqueue issues the launches of a batch of rows rows, sel selected, whose
// deepest row is at position deepest, for output out: a small batch as
// one graph replay (captured on first use). meta must hold the batch, or
// be on its way there in stream order.
func (e *exec) enqueue(rows, sel, out int, deepest int32) error {
	d, c := e.be.drv, &e.sys
	deep := 0
	if e.deepAt > 0 && deepest >= e.deepAt {
		deep = 1
	}
	if rows <= smallRows && !e.debugSync {
		g := &e.graphs[rows][sel][out][deep]
		if *g == 0 {
			err := e.capture(g, rows, sel, out, deep == 1, e.pdl)
			if err != nil && e.pdl {
				// A driver or device without programmatic dependent
				// launch: capture plain launches from now on.
				e.pdl = false
				err = e.capture(g, rows, sel, out, deep == 1, false)
			}
			if err != nil {
				return err
			}
		}
		*c = callArgs{*g, 0}
		if r := c.call(d.graphLaunch, 2); r != 0 {
			return fmt.Errorf("cuda: replaying the plan for %d rows: %w", rows, d.err(r))
		}
		return nil
	}
	for i := range e.launches {
		l := e.launchFor(i, out)
		if !l.runs(rows, sel, out, deep == 1) {
			continue
		}
		r := e.launch(l, rows, sel, 0, false)
		if r == 0 && e.debugSync {
			r = d.cuCtxSynchronize()
		}
		if r != 0 {
			op := &e.p.Ops[l.op]
			return fmt.Errorf("cuda: op %d (%s, layer %d): %w", l.op, op.Kind, op.Layer, e.launchErr(l, r))
		}
	}
	if drawing(out) {
		return e.launchDraws(sel, out, 0, false)
	}
	return nil
}

// runs reports whether a launch applies to a batch of rows rows, sel
// selected, deep or not, for output out.
func (l *launch) runs(rows, sel, out int, deep bool) bool {
	if (out == outHidden && l.head) || !l.depth.holds(deep) || !l.forOutput(out) {
		return false
	}
	n := rows
	if l.which == metaSelected {
		n = sel
	}
	return l.cond.holds(n) && l.rowsIf.holds(rows)
}

// forOutput reports whether a launch takes part in runs for output out as
// far as splitLogits is concerned: the runs of a split product only in
// outStaged runs, the product whole in every other.
func (l *launch) forOutput(out int) bool {
	switch {
	case l.copyLen > 0:
		return out == outStaged
	case l.whole:
		return out != outStaged
	}
	return true
}

// holds reports whether a launch under c runs on n rows.
func (c cond) holds(n int) bool {
	switch c {
	case small:
		return n <= smallRows
	case large:
		return n > smallRows
	case one:
		return n == 1
	case few:
		return n > 1 && n <= smallRows
	case notOne:
		return n != 1
	}
	return true
}

// launch issues one kernel (or cuBLAS product) on stream; pdl launches
// it with programmatic stream serialization.
func (e *exec) launch(l *launch, rows, sel int, stream uintptr, pdl bool) cuResult {
	c := &e.sys
	n := rows
	if l.which == metaSelected {
		n = sel
	}
	if g := l.gemm; g != nil {
		be := e.be
		*c = callArgs{be.blasHandle, blasOpT, blasOpN, uintptr(g.n), uintptr(n), uintptr(g.k),
			uintptr(unsafe.Pointer(&e.alpha)), uintptr(g.w), blasR16F, uintptr(g.k), uintptr(g.x), blasR16F, uintptr(g.k),
			uintptr(unsafe.Pointer(&e.beta)), uintptr(g.out), blasR32F, uintptr(g.n), blasCompute32F, blasAlgoDefault}
		return c.call(be.blas.gemmEx, 19)
	}
	gy := uintptr(1)
	switch l.gridY {
	case gridAll:
		gy = uintptr(rows)
	case gridSelected:
		gy = uintptr(sel)
	case gridTiles:
		gy = uintptr((rows + attTileRows - 1) / attTileRows)
	}
	if pdl {
		cfg := &e.cfg
		*cfg = launchConfig{gridX: l.gridX, gridY: uint32(gy), gridZ: 1, blockX: l.block, blockY: 1, blockZ: 1, shared: l.shared,
			stream: stream, attrs: uintptr(unsafe.Pointer(&e.attr)), numAttrs: 1}
		e.attr = launchAttr{id: attrProgrammaticSerialization}
		e.attr.value[0] = 1
		*c = callArgs{uintptr(unsafe.Pointer(cfg)), l.fn, l.params, 0}
		return c.call(e.be.drv.launchEx, 4)
	}
	*c = callArgs{l.fn, uintptr(l.gridX), gy, 1, uintptr(l.block), 1, 1, uintptr(l.shared), stream, l.params, 0}
	return c.call(e.be.drv.launchKernel, 11)
}

// launchErr describes a failed launch's result.
func (e *exec) launchErr(l *launch, r cuResult) error {
	if l.gemm != nil {
		return fmt.Errorf("cublasGemmEx (%d×%d by %d): status %d", l.gemm.n, l.gemm.k, l.which, r)
	}
	return e.be.drv.err(r)
}

// capture records every launch of a batch shape into a graph on the
// exec's stream and instantiates it into *g. An outStaged graph also
// copies each part of the logits a launch finishes into staged, on the
// copies stream (forked after that launch, joined at the end), so that
// the copy runs while the launches after it do.
func (e *exec) capture(g *uintptr, rows, sel, out int, deep, pdl bool) error {
	d := e.be.drv
	if r := d.cuStreamBeginCapture(e.stream, captureRelaxed); r != 0 {
		return fmt.Errorf("cuda: starting a graph capture: %w", d.err(r))
	}
	var failed error
	var names []string
	forked := false
	for i := range e.launches {
		l := e.launchFor(i, out)
		if failed != nil {
			break
		}
		if !l.runs(rows, sel, out, deep) {
			continue
		}
		if e.be.trace != nil {
			names = append(names, l.kernel)
		}
		if l.gemm != nil {
			failed = fmt.Errorf("cuda: op %d: a cuBLAS product in a small batch", l.op)
			break
		}
		if r := e.launch(l, rows, sel, e.stream, pdl && !l.serial); r != 0 {
			op := &e.p.Ops[l.op]
			failed = fmt.Errorf("cuda: op %d (%s, layer %d): %w", l.op, op.Kind, op.Layer, d.err(r))
			break
		}
		if out == outStaged && l.copyLen > 0 && failed == nil {
			forked = true
			dst := uintptr(unsafe.Add(unsafe.Pointer(&e.staged[0]), l.copyOff))
			r := d.cuEventRecord(e.event, e.stream)
			if r == 0 {
				r = d.cuStreamWaitEvent(e.copies, e.event, 0)
			}
			if r == 0 {
				r = d.cuMemcpyDtoHAsync(dst, e.bufs[e.p.Logits]+uint64(l.copyOff), uintptr(l.copyLen), e.copies)
			}
			if r != 0 {
				failed = fmt.Errorf("cuda: capturing the logits' copy: %w", d.err(r))
			}
		}
	}
	if drawing(out) && failed == nil {
		failed = e.launchDraws(sel, out, e.stream, pdl)
	}
	if forked {
		// Join the copies stream back, as a capture must end.
		r := d.cuEventRecord(e.event, e.copies)
		if r == 0 {
			r = d.cuStreamWaitEvent(e.stream, e.event, 0)
		}
		if r != 0 && failed == nil {
			failed = fmt.Errorf("cuda: capturing the logits' copy: %w", d.err(r))
		}
	}
	var graph uintptr
	r := d.cuStreamEndCapture(e.stream, &graph)
	if failed != nil {
		if graph != 0 {
			d.cuGraphDestroy(graph)
		}
		return failed
	}
	if r != 0 {
		return fmt.Errorf("cuda: capturing the plan for %d rows: %w", rows, d.err(r))
	}
	defer d.cuGraphDestroy(graph)
	if t := e.be.trace; t != nil {
		t.names = names
	}
	if r := d.cuGraphInstantiate(g, graph, 0); r != 0 {
		*g = 0
		return fmt.Errorf("cuda: instantiating the plan for %d rows: %w", rows, d.err(r))
	}
	return nil
}

// WriteRows implements backend.RowWriter: rows of buf from src ([rows,
// cols] row-major), before the next Run.
func (e *exec) WriteRows(buf backend.BufID, src []float32) error {
	if e.closed {
		return errClosed
	}
	if buf < 0 || int(buf) >= len(e.p.Bufs) {
		return fmt.Errorf("cuda: buffer %d out of range", buf)
	}
	cols := e.p.Bufs[buf]
	if len(src) == 0 || len(src)%cols != 0 || len(src)/cols > e.p.MaxRows {
		return fmt.Errorf("cuda: %d floats for buffer %d of %d columns and %d rows", len(src), buf, cols, e.p.MaxRows)
	}
	defer runtime.UnlockOSThread()
	if err := e.be.current(); err != nil {
		return err
	}
	return e.copyIn(e.bufs[buf], f32Bytes(src), fmt.Sprintf("rows of buffer %d", buf))
}

// ReadKeys implements backend.KeyReader.
func (e *exec) ReadKeys(layer, slot, pos, n int, dst []float32) error {
	if e.closed {
		return errClosed
	}
	p := e.p
	if layer < 0 || layer >= len(e.kv) || slot < 0 || slot >= p.Slots || pos < 0 || n < 0 || pos+n > p.Context {
		return fmt.Errorf("cuda: keys of layer %d slot %d positions [%d,%d) out of range", layer, slot, pos, pos+n)
	}
	c := p.Caches[layer]
	if len(dst) != n*c.KVDim {
		return fmt.Errorf("cuda: key buffer of %d floats, want %d", len(dst), n*c.KVDim)
	}
	if n > c.Capacity {
		return fmt.Errorf("cuda: layer %d keeps only the last %d positions", layer, c.Capacity)
	}
	if n == 0 || c.KVDim == 0 {
		return nil
	}
	defer runtime.UnlockOSThread()
	if err := e.be.current(); err != nil {
		return err
	}
	d := e.be.drv
	size := cacheElemBytes(c)
	var half []uint16
	if c.F16 {
		half = make([]uint16, c.KVDim)
	}
	for i := 0; i < n; i++ {
		at := uint64((slot*c.Capacity+(pos+i)%c.Capacity)*c.KVDim) * size
		row := dst[i*c.KVDim : (i+1)*c.KVDim]
		to := unsafe.Pointer(&row[0])
		if half != nil {
			to = unsafe.Pointer(&half[0])
		}
		if r := d.cuMemcpyDtoH(to, e.kv[layer][0]+at, size*uint64(c.KVDim)); r != 0 {
			return fmt.Errorf("cuda: reading layer %d's keys: %w", layer, d.err(r))
		}
		for j, h := range half {
			row[j] = quant.F16ToF32(h)
		}
	}
	return nil
}

var (
	_ backend.RowWriter = (*exec)(nil)
	_ backend.KeyReader = (*exec)(nil)
)
