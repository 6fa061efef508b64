package cpu

import (
	"runtime"
	"sync/atomic"
)

// pool is a fixed set of worker goroutines that share the chunks of one
// parallel loop at a time. A decode step runs a few hundred short loops
// (tens of microseconds each), so waking a worker must cost far less than
// that: idle workers spin on the loop generation for a while before they
// park on a channel, and the caller spins until the helpers finish.
// Dispatching a loop allocates nothing: the loop body is a func value built
// once at compile time.
type pool struct {
	workers int
	quit    atomic.Bool
	helpers []helper
	done    chan struct{} // one receive per exiting helper
	// Each counter sits on its own cache line: idle helpers poll gen while
	// the running ones bump next and pending.
	_       [64]byte
	gen     atomic.Uint64 // bumped once per loop
	_       [56]byte
	pending atomic.Int32 // helpers still inside the current loop
	_       [60]byte
	cur     loop
}

type helper struct {
	sleeping atomic.Bool
	wake     chan struct{} // capacity 1: a wake-up is never lost
	_        [48]byte      // keep helpers' flags on separate cache lines
}

// loop is one parallel-for: chunks of [0, n) of size grain, claimed in
// order through next.
type loop struct {
	body  func(lo, hi, worker int)
	n     int
	grain int
	_     [40]byte
	next  atomic.Int64
	_     [56]byte
}

// spinLimit is how many polls of the generation an idle worker makes
// before parking: of the order of 100 µs, longer than the serial work
// between two loops of a step.
const spinLimit = 1 << 17

func newPool(threads int) *pool {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	p := &pool{workers: threads, helpers: make([]helper, threads), done: make(chan struct{}, threads)}
	for i := 1; i < threads; i++ {
		p.helpers[i].wake = make(chan struct{}, 1)
		go p.work(i, p.gen.Load())
	}
	return p
}

// work runs helper worker from generation seen on; seen is read before the
// goroutine starts, so a loop published before it first runs is not missed.
func (p *pool) work(worker int, seen uint64) {
	h := &p.helpers[worker]
	for {
		for spins := 0; p.gen.Load() == seen; spins++ {
			if spins < spinLimit {
				if spins%1024 == 1023 {
					runtime.Gosched() // let a caller that shares this thread run
				}
				continue
			}
			h.sleeping.Store(true)
			if p.gen.Load() == seen {
				<-h.wake
			}
			h.sleeping.Store(false)
			spins = 0
		}
		seen = p.gen.Load()
		if p.quit.Load() {
			p.done <- struct{}{}
			return
		}
		p.cur.run(worker)
		p.pending.Add(-1)
	}
}

func (l *loop) run(worker int) {
	for {
		lo := int(l.next.Add(int64(l.grain))) - l.grain
		if lo >= l.n {
			return
		}
		l.body(lo, min(lo+l.grain, l.n), worker)
	}
}

// parallel runs body over [0, n) in chunks of about grain items, using
// every worker and the calling goroutine (worker 0), and returns when all
// are done. body learns which worker runs it, to use that worker's scratch.
// Only one goroutine may call parallel at a time.
func (p *pool) parallel(n, grain int, body func(lo, hi, worker int)) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1)
	// Balance: at least a few chunks per worker when n allows.
	if per := (n + 4*p.workers - 1) / (4 * p.workers); per < grain {
		grain = max(1, per)
	}
	if p.workers == 1 || n <= grain {
		body(0, n, 0)
		return
	}
	l := &p.cur
	l.body, l.n, l.grain = body, n, grain
	l.next.Store(0)
	p.pending.Store(int32(p.workers - 1))
	p.start()
	l.run(0)
	for spins := 1; p.pending.Load() != 0; spins++ {
		if spins%1024 == 0 {
			runtime.Gosched() // more workers than threads: let them run
		}
	}
	l.body = nil
}

// start publishes a new generation and wakes parked helpers.
func (p *pool) start() {
	p.gen.Add(1)
	for i := 1; i < p.workers; i++ {
		if h := &p.helpers[i]; h.sleeping.Load() {
			select {
			case h.wake <- struct{}{}:
			default:
			}
		}
	}
}

func (p *pool) close() {
	p.quit.Store(true)
	p.start()
	for i := 1; i < p.workers; i++ {
		<-p.done
	}
}
