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
// allocated on the first RunSampled. The parameters (seeds, steps and
// temperatures) follow the batch in meta (exec.drawAt).
type drawState struct {
	part          uint64 // device: float2 [MaxRows, chunks]
	ids           uint64 // device: int32 [MaxRows]
	chunks        int
	partial, pick uintptr
	args          [8 + 7]uint64 // draw_partial's 8 arguments, then draw_pick's 7
	params        [8 + 7]uintptr
}

var errNoCandidate = errors.New("cuda: every logit of a row is NaN or -Inf: no token to draw")

// RunSampled implements backend.Sampler: Run, then each selected row's
// token drawn on the device by s[i] (sample.SampleGumbel's draw).
func (e *exec) RunSampled(b *backend.Batch, s []backend.Sampling, out []int32) error {
	if len(out) != len(b.Selected) {
		return fmt.Errorf("cuda: %d selected rows and %d outputs", len(b.Selected), len(out))
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if e.chain.inFlight() > 0 {
		return errInFlight
	}
	if err := e.stageDraws(b, s); err != nil {
		return err
	}
	sel := len(b.Selected)
	if _, err := e.replay(b, true, false); err != nil {
		return err
	}
	ids := e.drawHost.ids[0][:sel]
	if err := e.fetch(unsafe.Pointer(&ids[0]), e.draw.ids, 4*sel); err != nil {
		return err
	}
	copy(out, ids)
	return checkDraws(out, b.Selected)
}

// stageDraws checks a batch to draw from by s, sets the draws up on first
// use and stages their parameters on the host, for the batch's copy to
// take along. The caller has locked its OS thread.
func (e *exec) stageDraws(b *backend.Batch, s []backend.Sampling) error {
	if e.closed {
		return errClosed
	}
	if err := e.p.Validate(b); err != nil {
		return err
	}
	switch {
	case b.HiddenOnly:
		return errors.New("cuda: a hidden-state batch has no logits to draw from")
	case len(s) != len(b.Selected):
		return fmt.Errorf("cuda: %d selected rows and %d samplings", len(b.Selected), len(s))
	}
	for i, x := range s {
		if !(x.Temperature >= 0) || math.IsInf(float64(x.Temperature), 1) {
			return fmt.Errorf("cuda: row %d: temperature %v", i, x.Temperature)
		}
	}
	if e.be.closed {
		return errBackendClosed
	}
	if e.draw == nil {
		err := e.be.current()
		runtime.UnlockOSThread() // current locks once more
		if err != nil {
			return err
		}
		if err := e.newDrawState(); err != nil {
			return err
		}
	}
	dh := &e.drawHost
	for i, x := range s {
		dh.temp[i], dh.seed[i], dh.step[i] = x.Temperature, x.Seed, x.Step
	}
	return nil
}

// launchDraws queues the draws of the sel selected rows' logits on
// stream, with programmatic dependent launch where pdl is set (the draw
// kernels wait for the launch before them).
func (e *exec) launchDraws(sel int, stream uintptr, pdl bool) error {
	ds, d, c := e.draw, e.be.drv, &e.sys
	var r cuResult
	for i, k := range []struct {
		fn     uintptr
		grid   int
		params *uintptr
	}{{ds.partial, ds.chunks, &ds.params[0]}, {ds.pick, sel, &ds.params[8]}} {
		gy := sel
		if i == 1 {
			gy = 1
		}
		if pdl {
			cfg := &e.cfg
			*cfg = launchConfig{gridX: uint32(k.grid), gridY: uint32(gy), gridZ: 1, blockX: drawThreads, blockY: 1, blockZ: 1,
				stream: stream, attrs: uintptr(unsafe.Pointer(&e.attr)), numAttrs: 1}
			e.attr = launchAttr{id: attrProgrammaticSerialization}
			e.attr.value[0] = 1
			*c = callArgs{uintptr(unsafe.Pointer(cfg)), k.fn, uintptr(unsafe.Pointer(k.params)), 0}
			r = c.call(d.launchEx, 4)
		} else {
			*c = callArgs{k.fn, uintptr(k.grid), uintptr(gy), 1, drawThreads, 1, 1, 0, stream, uintptr(unsafe.Pointer(k.params)), 0}
			r = c.call(d.launchKernel, 11)
		}
		if r != 0 {
			break
		}
	}
	runtime.KeepAlive(ds)
	if r != 0 {
		return fmt.Errorf("cuda: launching the draws: %w", d.err(r))
	}
	return nil
}

// checkDraws reports a row of out without a token (selected says which
// batch row it was).
func checkDraws(out, selected []int32) error {
	for i, id := range out {
		if id < 0 {
			return fmt.Errorf("row %d: %w", selected[i], errNoCandidate)
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
	ds := &drawState{chunks: (p.Vocab + drawChunk - 1) / drawChunk, partial: partial, pick: pick}
	for _, a := range []struct {
		ptr *uint64
		n   int
	}{{&ds.part, 8 * m * ds.chunks}, {&ds.ids, 4 * m}} {
		ptr, err := e.alloc(uint64(a.n), "the draws")
		if err != nil {
			return err
		}
		*a.ptr = ptr
	}
	seed := e.meta + uint64(e.drawAt)
	field := func(k int) uint64 { return e.meta + uint64(4*(metaArrays+k*m)) }
	ds.args = [15]uint64{
		ds.part, e.bufs[p.Logits], seed + uint64(16*m), seed, seed + uint64(8*m), e.meta, uint64(uint32(p.Vocab)), uint64(uint32(drawChunk)),
		ds.ids, ds.part, e.meta, uint64(uint32(ds.chunks)), field(fieldTokens), field(fieldPos), seed + uint64(8*m),
	}
	for i := range ds.args {
		ds.params[i] = uintptr(unsafe.Pointer(&ds.args[i]))
	}
	e.draw = ds
	return nil
}

var _ backend.Sampler = (*exec)(nil)
