package weft

import (
	"context"
	"sync"
	"time"

	"github.com/weftlm/weft/engine"
)

// The scheduler batches decoding across requests (continuous batching): one
// goroutine owns the engine's replays. Every step samples one token for
// each decoding request and feeds them all to the model in one replay;
// prompts that have arrived fill the rest of the replay's rows, a chunk at
// a time (chunked prefill), so a long prompt slows the running streams'
// steps but never stops them. Requests join and leave between steps; a
// cancelled one leaves at the next step.

// request is one generation handed to the scheduler.
type request struct {
	ctx    context.Context
	seq    *engine.Sequence
	st     *stream
	logits []float32 // the next-token logits of this sequence
	fed    int       // prompt tokens fed so far
	kept   int       // of them, those the slot's cache already held
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
	// pipe is, in order, the requests of the decode step issued ahead
	// (follow) and not yet handed out.
	pipe []*request
}

func startScheduler(m *Model) *scheduler {
	s := &scheduler{m: m, submit: make(chan *request), quit: make(chan struct{}), done: make(chan struct{})}
	go s.loop()
	return s
}

// decodeStep runs the decode step of the live requests (active, whose
// rows seqs, toks, streams and rows are): where the backend queues steps
// and every stream draws there, through the engine's pipeline (follow),
// else as one step that waits for its draws or logits.
func (s *scheduler) decodeStep(active []*request, seqs []*engine.Sequence, toks []int32, streams []*stream, rows [][]float32, quiet bool, buf *stepBuffers) error {
	m := s.m
	if !m.eng.Pipelined() {
		return m.decodeStep(seqs, toks, streams, rows, buf)
	}
	buf.samplings = buf.samplings[:0]
	for _, st := range streams {
		d, ok := st.deviceDraw()
		if !ok {
			return m.decodeStep(seqs, toks, streams, rows, buf)
		}
		buf.samplings = append(buf.samplings, d)
	}
	if err := m.eng.IssueSampled(seqs, toks, buf.samplings); err != nil {
		return err
	}
	s.pipe = append(s.pipe[:0], active...)
	return s.follow(active, quiet, buf)
}

// follow hands each live request its draw of the step in flight, issued
// for the requests in s.pipe. If those are the live requests (active,
// in order), nothing else waits (quiet: no prompt to read) and each will
// feed its draw, the step after it is issued first, so that the device
// runs it while the host turns these draws into text; s.pipe then holds
// its requests.
func (s *scheduler) follow(active []*request, quiet bool, buf *stepBuffers) error {
	m := s.m
	same := quiet && len(active) == len(s.pipe)
	for i := 0; same && i < len(active); i++ {
		same = active[i] == s.pipe[i] && s.feedsDraw(active[i])
	}
	if same {
		if err := m.eng.IssueNext(); err != nil {
			return err
		}
	}
	if cap(buf.ids) < len(s.pipe) {
		buf.ids = make([]int32, m.eng.MaxBatch())
	}
	ids := buf.ids[:len(s.pipe)]
	if err := m.eng.WaitSampled(ids); err != nil {
		return err
	}
	j := 0
	for i, r := range s.pipe {
		if j < len(active) && active[j] == r {
			r.st.takeDraw(m.eng, i, ids[i])
			j++
		}
	}
	if !same {
		s.pipe = s.pipe[:0]
	}
	return nil
}

// feedsDraw says whether r will feed its next draw: it may go on past
// the draw of the step in flight (its length and the context allow one
// more step, as advance will judge it then) and is not cancelled.
func (s *scheduler) feedsDraw(r *request) bool {
	g := r.st.g
	return (g.MaxTokens <= 0 || r.st.generated+1 < g.MaxTokens) && r.seq.Pos()+1 < s.m.eng.Context() && r.ctx.Err() == nil
}

// dropIssued forgets the steps issued and not handed out, after a
// failure.
func (s *scheduler) dropIssued() {
	s.m.eng.DropIssued()
	s.pipe = s.pipe[:0]
}

func (s *scheduler) stop() {
	close(s.quit)
	<-s.done
}

func (s *scheduler) loop() {
	defer close(s.done)
	var active, filling []*request
	var buf stepBuffers
	var seqs []*engine.Sequence
	var toks []int32
	var streams []*stream
	var rows [][]float32
	var prompts [][]int32
	var fed []int                            // tokens of each filling request's prompt in this replay
	one := make([]int32, s.m.eng.MaxBatch()) // decode rows' tokens as one-token prompts
	end := func(err error) {
		for _, rs := range [][]*request{active, filling} {
			for _, r := range rs {
				r.out.push(item{err: err}, true)
			}
		}
	}
	for {
		// Wait for work when idle; otherwise take whoever has arrived.
		if len(active) == 0 && len(filling) == 0 {
			select {
			case r := <-s.submit:
				filling = append(filling, r)
			case <-s.quit:
				return
			}
		}
	arrivals:
		for {
			select {
			case r := <-s.submit:
				filling = append(filling, r)
			case <-s.quit:
				s.dropIssued()
				end(ErrClosed)
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
		// Prompts still being read fill the rest of the replay, a chunk at
		// a time, so a long prompt never stalls the streams already
		// decoding (chunked prefill).
		fed = fed[:0]
		budget := s.m.eng.MaxBatch() - len(seqs)
		keep := filling[:0]
		for _, r := range filling {
			if err := r.ctx.Err(); err != nil {
				r.out.push(item{err: err}, true)
				continue
			}
			keep = append(keep, r)
			n := min(budget, len(r.st.ids)-r.fed)
			budget -= n
			fed = append(fed, n)
		}
		filling = keep
		var err error
		if len(s.pipe) > 0 {
			// The step feeding toks is on the device already, issued
			// after the one whose draws advance just took.
			err = s.follow(active, len(filling) == 0, &buf)
			seqs, toks, streams, rows = seqs[:0], toks[:0], streams[:0], rows[:0]
		}
		if err == nil && len(seqs) == 0 && (len(fed) == 0 || fed[0] == 0) {
			continue
		}
		switch {
		case err != nil:
		case len(fed) == 0 || fed[0] == 0:
			if len(seqs) > 0 {
				err = s.decodeStep(active, seqs, toks, streams, rows, len(filling) == 0, &buf)
			}
		default:
			prompts = prompts[:0]
			for i := range seqs {
				one[i] = toks[i]
				prompts = append(prompts, one[i:i+1])
			}
			for i, n := range fed {
				if n > 0 {
					r := filling[i]
					seqs = append(seqs, r.seq)
					prompts = append(prompts, r.st.ids[r.fed:r.fed+n])
				}
			}
			err = s.fill(seqs, prompts, rows, filling, fed, &buf)
		}
		if err != nil {
			s.dropIssued()
			end(err)
			active, filling = active[:0], filling[:0]
			continue
		}
		// Requests whose prompt is now read start decoding.
		keep = filling[:0]
		for _, r := range filling {
			if r.fed < len(r.st.ids) {
				keep = append(keep, r)
				continue
			}
			s.m.recordPrompt(len(r.st.ids), r.kept, time.Since(r.start))
			active = append(active, r)
		}
		filling = keep
	}
}

// fill runs one replay of decode rows (the first len(rows) of seqs, one
// token each, whose logits go to rows) and prompt chunks (fed[i] tokens of
// filling[i]), and hands each request whose prompt ends here its logits.
func (s *scheduler) fill(seqs []*engine.Sequence, prompts [][]int32, rows [][]float32, filling []*request, fed []int, buf *stepBuffers) error {
	v := s.m.eng.Vocab()
	if cap(buf.logits) < len(seqs)*v {
		buf.logits = make([]float32, len(seqs)*v)
	}
	out := buf.logits[:len(seqs)*v]
	if err := s.m.eng.Prefill(seqs, prompts, out); err != nil {
		return err
	}
	row := 0
	for ; row < len(rows); row++ {
		copy(rows[row], out[row*v:(row+1)*v])
	}
	for i, n := range fed {
		if n == 0 {
			continue
		}
		r := filling[i]
		r.fed += n
		if r.fed == len(r.st.ids) {
			copy(r.logits, out[row*v:(row+1)*v])
		}
		row++
	}
	return nil
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
