package cuda

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"github.com/weftlm/weft/backend"
)

// Token draws on the device (sample.cu): after the plan has written the
// selected rows' logits, draw_partial takes the best Gumbel-perturbed
// logit of each vocabulary chunk and draw_pick the best chunk per row, so
// a decode step copies one int32 a row back instead of [rows, vocab]
// floats (513 KB a row for a 128k vocabulary).

// drawChunk is the vocabulary a draw_partial block covers: enough blocks
// to spread a row over the device, few enough for draw_pick to scan.
var drawChunk = 2048 // a variable so tests can cover many chunks with a small vocabulary

// drawState is an exec's device memory and launch arguments for draws,
// allocated on the first RunSampled.
type drawState struct {
	temp, seed, step uint64 // device: float32 / uint64 / uint64 [MaxRows]
	part             uint64 // device: float2 [MaxRows, chunks]
	ids              uint64 // device: int32 [MaxRows]
	chunks           int
	hostTemp         []float32
	hostSeed         []uint64
	hostStep         []uint64
	partial, pick    uintptr
	args             [8 + 4]uint64 // draw_partial's 8 arguments, then draw_pick's 4
	params           [8 + 4]uintptr
}

var errNoCandidate = errors.New("cuda: every logit of a row is NaN or -Inf: no token to draw")

// RunSampled implements backend.Sampler: Run, then each selected row's
// token drawn on the device by s[i] (sample.SampleGumbel's draw).
func (e *exec) RunSampled(b *backend.Batch, s []backend.Sampling, out []int32) error {
	if e.closed {
		return errClosed
	}
	p := e.p
	if err := p.Validate(b); err != nil {
		return err
	}
	sel := len(b.Selected)
	switch {
	case b.HiddenOnly:
		return errors.New("cuda: a hidden-state batch has no logits to draw from")
	case len(s) != sel || len(out) != sel:
		return fmt.Errorf("cuda: %d selected rows, %d samplings and %d outputs", sel, len(s), len(out))
	}
	for i, x := range s {
		if !(x.Temperature >= 0) || math.IsInf(float64(x.Temperature), 1) {
			return fmt.Errorf("cuda: row %d: temperature %v", i, x.Temperature)
		}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if e.be.closed {
		return errBackendClosed
	}
	if err := e.replay(b); err != nil {
		return err
	}
	if e.draw == nil {
		if err := e.newDrawState(); err != nil {
			return err
		}
	}
	ds, d, c := e.draw, e.be.drv, &e.sys
	for i, x := range s {
		ds.hostTemp[i], ds.hostSeed[i], ds.hostStep[i] = x.Temperature, x.Seed, x.Step
	}
	for _, cp := range []struct {
		dst uint64
		src unsafe.Pointer
		n   int
	}{{ds.temp, unsafe.Pointer(&ds.hostTemp[0]), 4 * sel}, {ds.seed, unsafe.Pointer(&ds.hostSeed[0]), 8 * sel}, {ds.step, unsafe.Pointer(&ds.hostStep[0]), 8 * sel}} {
		*c = callArgs{uintptr(cp.dst), uintptr(cp.src), uintptr(cp.n)}
		if r := c.call(d.memcpyHtoD, 3); r != 0 {
			return fmt.Errorf("cuda: copying the draws' parameters: %w", d.err(r))
		}
	}
	*c = callArgs{ds.partial, uintptr(ds.chunks), uintptr(sel), 1, drawThreads, 1, 1, 0, 0, uintptr(unsafe.Pointer(&ds.params[0])), 0}
	if r := c.call(d.launchKernel, 11); r != 0 {
		return fmt.Errorf("cuda: draw_partial: %w", d.err(r))
	}
	*c = callArgs{ds.pick, uintptr(sel), 1, 1, drawThreads, 1, 1, 0, 0, uintptr(unsafe.Pointer(&ds.params[8])), 0}
	if r := c.call(d.launchKernel, 11); r != 0 {
		return fmt.Errorf("cuda: draw_pick: %w", d.err(r))
	}
	*c = callArgs{uintptr(unsafe.Pointer(&out[0])), uintptr(ds.ids), uintptr(4 * sel)}
	r := c.call(d.memcpyDtoH, 3)
	runtime.KeepAlive(out)
	runtime.KeepAlive(ds)
	if r != 0 {
		return fmt.Errorf("cuda: running the plan and the draws: %w", d.err(r))
	}
	for i, id := range out {
		if id < 0 {
			return fmt.Errorf("row %d: %w", b.Selected[i], errNoCandidate)
		}
	}
	return nil
}

// drawThreads is sample.cu's DRAW_THREADS.
const drawThreads = 256

// newDrawState allocates the draws' device memory and binds the two
// launches' arguments; the context must be current.
func (e *exec) newDrawState() error {
	p := e.p
	partial, ok1 := e.be.funcs["draw_partial"]
	pick, ok2 := e.be.funcs["draw_pick"]
	if !ok1 || !ok2 {
		return errors.New("cuda: the draw kernels are missing")
	}
	m := p.MaxRows
	ds := &drawState{chunks: (p.Vocab + drawChunk - 1) / drawChunk, partial: partial, pick: pick,
		hostTemp: make([]float32, m), hostSeed: make([]uint64, m), hostStep: make([]uint64, m)}
	for _, a := range []struct {
		ptr *uint64
		n   int
	}{{&ds.temp, 4 * m}, {&ds.seed, 8 * m}, {&ds.step, 8 * m}, {&ds.part, 8 * m * ds.chunks}, {&ds.ids, 4 * m}} {
		ptr, err := e.alloc(uint64(a.n), "the draws")
		if err != nil {
			return err
		}
		*a.ptr = ptr
	}
	ds.args = [12]uint64{
		ds.part, e.bufs[p.Logits], ds.temp, ds.seed, ds.step, e.meta, uint64(uint32(p.Vocab)), uint64(uint32(drawChunk)),
		ds.ids, ds.part, e.meta, uint64(uint32(ds.chunks)),
	}
	for i := range ds.args {
		ds.params[i] = uintptr(unsafe.Pointer(&ds.args[i]))
	}
	e.draw = ds
	return nil
}

var _ backend.Sampler = (*exec)(nil)
