package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"github.com/weftlm/weft/backend"
)

// Decode steps queued ahead of the host (backend.Pipeliner). A decode step
// with device draws ends in draw, which also writes each row's draw
// into meta as the row's next token, one position further, with its
// draw's step one further (sample.cu). The step after it then needs
// nothing from the host: IssueNext replays the same graph and draws
// again, and the host, meanwhile, waits for the step before and turns
// its draws into text. The draw kernel stores each row's draw in mapped
// page-locked memory itself (drawHost.drawn, by the parity of the row's
// draw step, so the two steps in flight keep theirs apart), or, where
// that memory is not mapped, each step in flight copies its draws into
// its own slot (drawHost.ids); each step records its own event after
// them, and WaitSampled waits for the oldest event.

// chain is an exec's queued steps.
type chain struct {
	events         [backend.MaxPipelined]uintptr // recorded after each slot's draws reach the host
	rows           [backend.MaxPipelined]int     // each slot's rows
	issued, waited uint64                        // steps issued and waited for; step k uses slot k % MaxPipelined
	// next says whether meta holds the step after the one issued last
	// (draw made it), so that IssueNext may run it: set by the
	// issues of decode steps, cleared by every other run's staging.
	next    bool
	deepest int32 // the deepest position of the step issued last
	// steps are the rows' draw steps of the step issued last, slotSteps[k]
	// those of slot k's step: where its rows' draws land in
	// drawHost.drawn.
	steps     []uint64
	slotSteps [backend.MaxPipelined][]uint64
	// lpOn[k] says whether slot k's step took log-probabilities (into
	// drawHost.lp[k]), lpTop[k] its rows' TopLogprobs (-1: none).
	lpOn  [backend.MaxPipelined]bool
	lpTop [backend.MaxPipelined][]int32
}

var errInFlight = errors.New("cuda: a run while decode steps issued are not waited for")

func (c *chain) inFlight() int { return int(c.issued - c.waited) }

func (c *chain) eventPtrs() []*uintptr {
	p := make([]*uintptr, len(c.events))
	for i := range c.events {
		p[i] = &c.events[i]
	}
	return p
}

// IssueSampled implements backend.Pipeliner.
func (e *exec) IssueSampled(b *backend.Batch, s []backend.Sampling) error {
	rows := len(b.Tokens)
	if len(b.Selected) != rows {
		return fmt.Errorf("cuda: a pipelined step selects every row: %d rows, %d selected", rows, len(b.Selected))
	}
	for i, r := range b.Selected {
		if int(r) != i {
			return fmt.Errorf("cuda: a pipelined step selects its rows in order: row %d selected as %d", r, i)
		}
	}
	c := &e.chain
	if c.inFlight() == backend.MaxPipelined {
		return fmt.Errorf("cuda: %d decode steps issued and not waited for", c.inFlight())
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if c.inFlight() > 0 {
		// The staging memory is rewritten below: the copies of the
		// steps in flight must have read it (their draws wait in their
		// slots).
		if err := e.waitEvent(c.events[(c.issued-1)%backend.MaxPipelined]); err != nil {
			return err
		}
	}
	if err := e.stageDraws(b, s); err != nil {
		return err
	}
	if c.events[0] == 0 {
		if err := e.newEvents(); err != nil {
			return err
		}
	}
	if _, err := e.replay(b, true, false); err != nil {
		return err
	}
	c.steps = c.steps[:0]
	for _, x := range s {
		c.steps = append(c.steps, x.Step)
	}
	deepest := int32(0)
	for _, p := range b.Pos {
		deepest = max(deepest, p)
	}
	return e.endStep(rows, deepest)
}

// IssueNext implements backend.Pipeliner.
func (e *exec) IssueNext() error {
	c := &e.chain
	switch {
	case e.closed:
		return errClosed
	case !c.next:
		return errors.New("cuda: IssueNext follows a decode step issued by IssueSampled or IssueNext, with no other run between")
	case c.inFlight() == backend.MaxPipelined:
		return fmt.Errorf("cuda: %d decode steps issued and not waited for", c.inFlight())
	case int(c.deepest)+1 >= e.p.Context:
		return fmt.Errorf("cuda: the next step's position %d is past the context of %d", c.deepest+1, e.p.Context)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if e.be.closed {
		return errBackendClosed
	}
	d, a := e.be.drv, &e.sys
	a[0] = e.be.ctx
	if r := a.call(d.ctxSetCurrent, 1); r != 0 {
		return fmt.Errorf("cuda: cuCtxSetCurrent: %w", d.err(r))
	}
	rows := c.rows[(c.issued-1)%backend.MaxPipelined]
	c.next = false
	for i := range c.steps {
		c.steps[i]++
	}
	if err := e.enqueue(rows, rows, e.drawOut, c.deepest+1); err != nil {
		a.call(d.ctxSync, 0)
		return err
	}
	return e.endStep(rows, c.deepest+1)
}

// endStep queues, behind a decode step of rows rows just issued with its
// draws, the draws' copy into the step's slot (where the draw kernel does
// not store them on the host itself) and the slot's event.
func (e *exec) endStep(rows int, deepest int32) error {
	c, d, a := &e.chain, e.be.drv, &e.sys
	fail := func(what string, r cuResult) error {
		a.call(d.ctxSync, 0)
		return fmt.Errorf("cuda: %s: %w", what, d.err(r))
	}
	slot := c.issued % backend.MaxPipelined
	c.slotSteps[slot] = append(c.slotSteps[slot][:0], c.steps...)
	if e.drawHost.drawnDev == 0 {
		ids := e.drawHost.ids[slot]
		*a = callArgs{uintptr(unsafe.Pointer(&ids[0])), uintptr(e.draw.ids), uintptr(4 * rows), 0}
		if r := a.call(d.dtoHAsync, 4); r != 0 {
			return fail("queueing the copy of the draws", r)
		}
	}
	c.lpOn[slot] = e.drawOut >= outLogprobs
	c.lpTop[slot] = append(c.lpTop[slot][:0], e.drawHost.lpn[:rows]...)
	if c.lpOn[slot] && e.drawHost.lpDev == 0 {
		recs := e.drawHost.lp[slot]
		*a = callArgs{uintptr(unsafe.Pointer(&recs[0])), uintptr(e.draw.recs), uintptr(lpRecBytes * 2 * rows), 0}
		if r := a.call(d.dtoHAsync, 4); r != 0 {
			return fail("queueing the copy of the log-probabilities", r)
		}
	}
	*a = callArgs{c.events[slot], 0}
	if r := a.call(d.eventRecord, 2); r != 0 {
		return fail("recording a step's end", r)
	}
	c.rows[slot], c.issued, c.next, c.deepest = rows, c.issued+1, true, deepest
	return nil
}

// WaitSampled implements backend.Pipeliner.
func (e *exec) WaitSampled(out []int32) error {
	c := &e.chain
	if c.inFlight() == 0 {
		return errors.New("cuda: no decode step issued to wait for")
	}
	slot := c.waited % backend.MaxPipelined
	n := c.rows[slot]
	if len(out) != n {
		return fmt.Errorf("cuda: %d draws to hand out, an output of %d", n, len(out))
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := e.waitEvent(c.events[slot]); err != nil {
		return err
	}
	c.waited++
	if dh := &e.drawHost; dh.drawnDev != 0 {
		for i, step := range c.slotSteps[slot] {
			out[i] = dh.drawnAt(i, step)
		}
	} else {
		copy(out, dh.ids[slot][:n])
	}
	recs := e.drawHost.lp[slot]
	if e.drawHost.lpDev != 0 {
		recs = e.drawHost.lp[0] // the kernels' own
	}
	e.handLogprobs(recs, c.slotSteps[slot], c.lpTop[slot], c.lpOn[slot])
	return checkDraws(out, nil)
}

// waitEvent waits for ev; the caller has locked its OS thread. A failure
// is a failed step: everything queued is waited for and forgotten.
func (e *exec) waitEvent(ev uintptr) error {
	d, a := e.be.drv, &e.sys
	a[0] = e.be.ctx
	r := a.call(d.ctxSetCurrent, 1)
	if r == 0 {
		*a = callArgs{ev}
		r = a.call(d.eventSync, 1)
	}
	if r != 0 {
		a.call(d.ctxSync, 0)
		e.chain.waited, e.chain.next = e.chain.issued, false
		return fmt.Errorf("cuda: running a decode step: %w", d.err(r))
	}
	return nil
}

// newEvents creates the steps' events; the caller has locked its OS
// thread.
func (e *exec) newEvents() error {
	if err := e.be.current(); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	runtime.UnlockOSThread() // current locks once more
	d := e.be.drv
	for i := range e.chain.events {
		if r := d.cuEventCreate(&e.chain.events[i], 2); r != 0 { // CU_EVENT_DISABLE_TIMING
			for _, ev := range e.chain.events[:i] {
				d.cuEventDestroy(ev)
			}
			e.chain.events = [backend.MaxPipelined]uintptr{}
			return fmt.Errorf("cuda: cuEventCreate: %w", d.err(r))
		}
	}
	return nil
}

var _ backend.Pipeliner = (*exec)(nil)
