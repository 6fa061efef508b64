package weft

import (
	"context"
	"sync"
	"time"

	"github.com/weftlm/weft/engine"
)

// The scheduler batches decoding across requests (continuous batching): one
// goroutine owns the engine's decode steps. A request is prefilled when it
// arrives, between steps; then every step samples one token for each live
// request and feeds them all to the model in one replay. Requests join and
// leave between steps; a cancelled one leaves at the next step.

// request is one generation handed to the scheduler.
type request struct {
	ctx    context.Context
	seq    *engine.Sequence
	st     *stream
	logits []float32 // the next-token logits of this sequence
	start  time.Time
	first  time.Time
	out    *queue
}

// queue carries a request's items from the scheduler to its reader without
// ever blocking the scheduler.
type queue struct {
	mu     sync.Mutex
	items  []item
	closed bool
	ready  chan struct{} // cap 1: something new
}

type item struct {
	tok Token
	err error
}

func newQueue() *queue { return &queue{ready: make(chan struct{}, 1)} }

func (q *queue) push(it item, last bool) {
	q.mu.Lock()
	q.items = append(q.items, it)
	q.closed = q.closed || last
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pop waits for items and returns them; done reports that nothing follows.
func (q *queue) pop(buf []item) (items []item, done bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 || q.closed {
			items = append(buf[:0], q.items...)
			q.items = q.items[:0]
			done = q.closed
			q.mu.Unlock()
			return items, done
		}
		q.mu.Unlock()
		<-q.ready
	}
}

type scheduler struct {
	m      *Model
	submit chan *request
	quit   chan struct{}
	done   chan struct{}
}

func startScheduler(m *Model) *scheduler {
	s := &scheduler{m: m, submit: make(chan *request), quit: make(chan struct{}), done: make(chan struct{})}
	go s.loop()
	return s
}

func (s *scheduler) stop() {
	close(s.quit)
	<-s.done
}

func (s *scheduler) loop() {
	defer close(s.done)
	var active []*request
	var buf stepBuffers
	var seqs []*engine.Sequence
	var toks []int32
	var streams []*stream
	var rows [][]float32
	for {
		// Wait for work when idle; otherwise take whoever has arrived.
		if len(active) == 0 {
			select {
			case r := <-s.submit:
				active = s.admit(active, r)
			case <-s.quit:
				return
			}
		}
	arrivals:
		for {
			select {
			case r := <-s.submit:
				active = s.admit(active, r)
			case <-s.quit:
				for _, r := range active {
					r.out.push(item{err: ErrClosed}, true)
				}
				return
			default:
				break arrivals
			}
		}
		// Sample each live request's next token.
		seqs, toks, streams, rows = seqs[:0], toks[:0], streams[:0], rows[:0]
		live := active[:0]
		for _, r := range active {
			if tok, keep := s.advance(r); keep {
				live = append(live, r)
				seqs, toks = append(seqs, r.seq), append(toks, tok)
				streams, rows = append(streams, r.st), append(rows, r.logits)
			}
		}
		active = live
		if len(active) == 0 {
			continue
		}
		if err := s.m.decodeStep(seqs, toks, streams, rows, &buf); err != nil {
			for _, r := range active {
				r.out.push(item{err: err}, true)
			}
			active = active[:0]
			continue
		}
	}
}

// admit prefills a new request and adds it to the live set, or ends it.
func (s *scheduler) admit(active []*request, r *request) []*request {
	if err := s.m.prefill(r.ctx, r.seq, r.st.ids, r.logits); err != nil {
		r.out.push(item{err: err}, true)
		return active
	}
	s.m.recordPrefill(len(r.st.ids), time.Since(r.start))
	return append(active, r)
}

// advance samples r's next token and queues it. It returns the token to
// feed and whether r stays live.
func (s *scheduler) advance(r *request) (int32, bool) {
	m := s.m
	if err := r.ctx.Err(); err != nil {
		m.recordGeneration(r.st.generated, r.start, r.first)
		r.out.push(item{err: err}, true)
		return 0, false
	}
	tok, err := r.st.next(r.logits)
	if err != nil {
		r.out.push(item{err: err}, true)
		return 0, false
	}
	if r.first.IsZero() {
		r.first = time.Now()
	}
	if !tok.Done && r.seq.Pos() >= m.eng.Context() {
		if r.st.g.Overflow != OverflowShift {
			tok = r.st.last(tok, "length")
		} else if err := m.shift(r.ctx, r.seq, r.st, r.logits); err != nil {
			r.out.push(item{err: err}, true)
			return 0, false
		}
	}
	if tok.Done {
		m.recordGeneration(r.st.generated, r.start, r.first)
		r.out.push(item{tok: tok}, true)
		return 0, false
	}
	r.out.push(item{tok: tok}, false)
	return tok.ID, true
}
