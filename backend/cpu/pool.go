package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// pool is a fixed set of worker goroutines that share the chunks of one
// parallel loop at a time. Dispatching a loop allocates nothing: the loop
// body is a func value built once at compile time.
type pool struct {
	workers int
	work    chan *loop
	wg      sync.WaitGroup
	cur     loop
}

// loop is one parallel-for: chunks of [0, n) of size grain, claimed in
// order through next.
type loop struct {
	body  func(lo, hi, worker int)
	n     int
	grain int
	next  atomic.Int64
	done  sync.WaitGroup
}

func newPool(threads int) *pool {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	p := &pool{workers: threads, work: make(chan *loop)}
	for i := 1; i < threads; i++ {
		p.wg.Add(1)
		go func(worker int) {
			defer p.wg.Done()
			for l := range p.work {
				l.run(worker)
				l.done.Done()
			}
		}(i)
	}
	return p
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
	if grain < 1 {
		grain = 1
	}
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
	helpers := min(p.workers-1, (n+grain-1)/grain-1)
	l.done.Add(helpers)
	for range helpers {
		p.work <- l
	}
	l.run(0)
	l.done.Wait()
	l.body = nil
}

func (p *pool) close() {
	close(p.work)
	p.wg.Wait()
}
