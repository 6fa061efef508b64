package cuda

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"unsafe"

	"github.com/weftlm/weft/backend"
)

// exec is a compiled program: device memory for its buffers, weights, rope
// tables, caches and batch, and one prepared launch per op.
type exec struct {
	be     *Backend
	p      *backend.Program
	allocs []uint64 // every device allocation, freed by Close

	bufs    []uint64 // [MaxRows, cols] float32 each
	weights []uint64 // stored bytes, or float32 vectors; 0 for none
	ropes   []uint64 // float32 inverse frequencies
	kv      [][2]uint64
	meta    uint64  // int32 [metaArrays + 4*MaxRows]
	host    []int32 // the batch as meta holds it, staged on the host

	launches []launch
	// args holds every launch argument in an 8-byte slot (ints and floats
	// in the low bytes), params the address of each slot: a launch passes
	// the address of its first param as cuLaunchKernel's kernelParams.
	// Both are sized once so the addresses never change.
	args   []uint64
	params []uintptr

	sys       callArgs // arguments of the replay's driver calls
	debugSync bool
	closed    bool
}

// launch is a bound kernel call.
type launch struct {
	op     int
	fn     uintptr
	gridX  uint32
	gridY  gridRows
	block  uint32
	shared uint32
	params uintptr // &params[first]
}

// Compile implements backend.Backend.
func (b *Backend) Compile(p *backend.Program) (backend.Exec, error) {
	calls, mats, err := plan(p)
	if err != nil {
		return nil, err
	}
	defer runtime.UnlockOSThread()
	if err := b.current(); err != nil {
		return nil, err
	}
	e := &exec{be: b, p: p, debugSync: os.Getenv("WEFT_CUDA_SYNC") == "1"}
	if err := e.allocate(mats); err != nil {
		e.free()
		return nil, err
	}
	if err := e.bind(calls); err != nil {
		e.free()
		return nil, err
	}
	return e, nil
}

// deviceBytes is the device memory a program needs, in bytes.
func deviceBytes(p *backend.Program, mats []matInfo) uint64 {
	var n uint64
	for _, c := range p.Bufs {
		n += uint64(4 * p.MaxRows * c)
	}
	for _, m := range mats {
		n += uint64(m.rows * m.rowBytes)
	}
	for _, r := range p.Ropes {
		n += uint64(4 * len(r.InvFreq))
	}
	for _, c := range p.Caches {
		n += 2 * 4 * uint64(p.Slots) * uint64(c.Capacity) * uint64(c.KVDim)
	}
	return n + uint64(4*(metaArrays+4*p.MaxRows))
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

// upload copies host bytes into a new device allocation.
func (e *exec) upload(b []byte, what string) (uint64, error) {
	ptr, err := e.alloc(uint64(len(b)), what)
	if err != nil || len(b) == 0 {
		return ptr, err
	}
	d := e.be.drv
	if r := d.cuMemcpyHtoD(ptr, unsafe.Pointer(&b[0]), uint64(len(b))); r != 0 {
		return 0, fmt.Errorf("cuda: uploading %s: %w", what, d.err(r))
	}
	return ptr, nil
}

func f32Bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

// allocate reserves and fills the program's device memory, after checking
// that it fits.
func (e *exec) allocate(mats []matInfo) error {
	p, d := e.p, e.be.drv
	var free, total uint64
	if r := d.cuMemGetInfo(&free, &total); r != 0 {
		return fmt.Errorf("cuda: cuMemGetInfo: %w", d.err(r))
	}
	if need := deviceBytes(p, mats); need > free {
		return fmt.Errorf("cuda: the program needs %.2f GiB of device memory, %.2f GiB of %.2f are free", gib(need), gib(free), gib(total))
	}
	for i, c := range p.Bufs {
		ptr, err := e.alloc(uint64(4*p.MaxRows*c), fmt.Sprintf("buffer %d", i))
		if err != nil {
			return err
		}
		e.bufs = append(e.bufs, ptr)
	}
	for i := range p.Weights {
		w := &p.Weights[i]
		data := w.Data.Bytes
		if w.F32 != nil {
			data = f32Bytes(w.F32)
		}
		ptr, err := e.upload(data, fmt.Sprintf("tensor %q", mats[i].name))
		if err != nil {
			return err
		}
		e.weights = append(e.weights, ptr)
	}
	for i, r := range p.Ropes {
		inv := make([]float32, len(r.InvFreq))
		for j, f := range r.InvFreq {
			inv[j] = float32(f)
		}
		ptr, err := e.upload(f32Bytes(inv), fmt.Sprintf("rope table %d", i))
		if err != nil {
			return err
		}
		e.ropes = append(e.ropes, ptr)
	}
	for _, c := range p.Caches {
		n := 4 * uint64(p.Slots) * uint64(c.Capacity) * uint64(c.KVDim)
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
	e.host = make([]int32, metaArrays+4*p.MaxRows)
	var err error
	e.meta, err = e.alloc(uint64(4*len(e.host)), "the batch")
	return err
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
		fn, ok := e.be.funcs[c.kernel]
		if !ok {
			return fmt.Errorf("cuda: op %d: no kernel %s", c.op, c.kernel)
		}
		e.launches = append(e.launches, launch{op: c.op, fn: fn, gridX: c.gridX, gridY: c.gridY, block: c.block, shared: c.shared,
			params: uintptr(unsafe.Pointer(&e.params[at]))})
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
	case argBuf:
		return e.bufs[a.id]
	case argWeight:
		if a.id == int(backend.NoWeight) {
			return 0
		}
		return e.weights[a.id]
	case argCacheK:
		return e.kv[a.id][0]
	case argCacheV:
		return e.kv[a.id][1]
	case argRope:
		return e.ropes[a.id]
	case argMeta:
		return e.meta + uint64(4*a.v)
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

// Run implements backend.Exec: it stages the batch into meta, launches
// every op's kernel in order on the context's default stream and copies
// the selected rows' logits back, which waits for the kernels.
func (e *exec) Run(b *backend.Batch, logits []float32) error {
	if e.closed {
		return errClosed
	}
	p := e.p
	if err := p.Validate(b); err != nil {
		return err
	}
	if len(logits) != len(b.Selected)*p.Vocab {
		return fmt.Errorf("cuda: logits buffer of %d floats, want %d", len(logits), len(b.Selected)*p.Vocab)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d, c := e.be.drv, &e.sys
	if e.be.closed {
		return errBackendClosed
	}
	c[0] = e.be.ctx
	if r := c.call(d.ctxSetCurrent, 1); r != 0 {
		return fmt.Errorf("cuda: cuCtxSetCurrent: %w", d.err(r))
	}
	rows, sel := len(b.Tokens), len(b.Selected)
	h, m := e.host, p.MaxRows
	h[metaRows], h[metaSelected] = int32(rows), int32(sel)
	copy(h[metaArrays+fieldTokens*m:], b.Tokens)
	copy(h[metaArrays+fieldPos*m:], b.Pos)
	copy(h[metaArrays+fieldSlots*m:], b.Slots)
	copy(h[metaArrays+fieldSelected*m:], b.Selected)
	c[0], c[1], c[2] = uintptr(e.meta), uintptr(unsafe.Pointer(&h[0])), uintptr(4*len(h))
	if r := c.call(d.memcpyHtoD, 3); r != 0 {
		return fmt.Errorf("cuda: copying the batch: %w", d.err(r))
	}
	for i := range e.launches {
		l := &e.launches[i]
		gy := uintptr(1)
		switch l.gridY {
		case gridAll:
			gy = uintptr(rows)
		case gridSelected:
			gy = uintptr(sel)
		}
		*c = callArgs{l.fn, uintptr(l.gridX), gy, 1, uintptr(l.block), 1, 1, uintptr(l.shared), 0, l.params, 0}
		r := c.call(d.launchKernel, 11)
		if r == 0 && e.debugSync {
			r = d.cuCtxSynchronize()
		}
		if r != 0 {
			op := &p.Ops[l.op]
			return fmt.Errorf("cuda: op %d (%s, layer %d): %w", l.op, op.Kind, op.Layer, d.err(r))
		}
	}
	c[0], c[1], c[2] = uintptr(unsafe.Pointer(&logits[0])), uintptr(e.bufs[p.Logits]), uintptr(4*len(logits))
	r := c.call(d.memcpyDtoH, 3)
	runtime.KeepAlive(logits)
	if r != 0 {
		return fmt.Errorf("cuda: running the plan: %w", d.err(r))
	}
	return nil
}

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
	return e.free()
}

// free releases every device allocation; the context must be current.
func (e *exec) free() error {
	d := e.be.drv
	var errs []error
	for _, ptr := range e.allocs {
		if r := d.cuMemFree(ptr); r != 0 {
			errs = append(errs, d.err(r))
		}
	}
	e.allocs, e.bufs, e.weights, e.ropes, e.kv = nil, nil, nil, nil, nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cuda: freeing a plan: %w", err)
	}
	return nil
}
