package server

import (
	"context"
	"sync"
)

// gate admits requests to the model: up to its parallelism run at once
// (each holds one of the model's sequence slots, so the model's own wait
// never blocks), up to maxQueue more wait in arrival order, and the rest
// are refused at once. Closing it refuses everyone still waiting.
type gate struct {
	slots   chan struct{} // a send takes a slot, a receive frees one
	closing chan struct{}

	mu       sync.Mutex
	waiting  int
	maxQueue int
	closed   bool
}

func newGate(parallel, maxQueue int) *gate {
	return &gate{slots: make(chan struct{}, parallel), closing: make(chan struct{}), maxQueue: maxQueue}
}

// enter waits for a slot. It fails with errQueueFull when the queue is
// full, errShuttingDown once the gate closes, or ctx's error when the
// client leaves first. release must be called once the request is done.
func (g *gate) enter(ctx context.Context) (release func(), err error) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, errShuttingDown
	}
	select {
	case g.slots <- struct{}{}:
		g.mu.Unlock()
		return g.release, nil
	default:
	}
	if g.waiting >= g.maxQueue {
		g.mu.Unlock()
		return nil, errQueueFull
	}
	g.waiting++
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.waiting--
		g.mu.Unlock()
	}()
	select {
	case g.slots <- struct{}{}:
		if g.isClosed() { // both were ready and select picked the slot
			g.release()
			return nil, errShuttingDown
		}
		return g.release, nil
	case <-g.closing:
		return nil, errShuttingDown
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (g *gate) release() { <-g.slots }

// close refuses every waiting and later request.
func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed = true
		close(g.closing)
	}
}

// depth returns the requests running and waiting.
func (g *gate) depth() (active, waiting int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.slots), g.waiting
}

func (g *gate) isClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}
