package engine

import (
	"errors"
	"fmt"

	"github.com/weftlm/weft/backend"
)

// Pipelined decode: IssueSampled queues a decode step with its draws,
// IssueNext the step after it, fed those draws, and WaitSampled hands the
// draws out, oldest first. On a backend.Pipeliner the device runs step
// n+1 while the host turns step n's draw into text, so no host round trip
// stands between two steps; elsewhere each step runs when it is issued,
// with the same draws.

// issued is a decode step issued and not yet handed out.
type issued struct {
	slots []int32            // the rows' cache slots
	pos   []int32            // the position each row was fed at
	s     []backend.Sampling // the rows' draws
	// win holds the rows' penalty windows (s[i].Recent), copied: the
	// step after it, where the backend does not queue steps, draws over
	// them and the draw.
	win    [][]int32
	draws  []int32       // the draws, once landed
	lp     []rowLogprobs // their log-probabilities, where s asks
	landed bool          // draws hold the step's draws (or err its failure)
	err    error
	// chained says the step after this one was issued by IssueNext, so
	// its rows were fed these draws: landing records them as held.
	chained bool
}

// pipeline is a model's issued steps: a ring of MaxPipelined+1 entries,
// so that the step issued last stays readable (for IssueNext) after it is
// handed out.
type pipeline struct {
	ring      [backend.MaxPipelined + 1]issued
	head, n   int
	last      int         // the entry issued last
	seqs      []*Sequence // its rows
	next      bool        // IssueNext may follow it: no other run since
	pipeliner backend.Pipeliner
	// dev is the pipeliner that runs the steps issued since the last
	// IssueSampled, nil where they run as they are issued: those that ask
	// for log-probabilities of a pipeliner that does not report them.
	dev backend.Pipeliner
}

// Pipelined reports whether the backend queues decode steps ahead of the
// host (IssueNext runs on the device without waiting for the step before
// it), rather than running each step as it is issued.
func (m *Model) Pipelined() bool { return m.pipe.pipeliner != nil }

// IssueSampled queues the decode step StepSampled(seqs, tokens, s, ·)
// would run and returns before its draws are known; WaitSampled hands
// them out. At most backend.MaxPipelined steps are issued and not handed
// out. Any other use of the model waits for the issued steps first.
func (m *Model) IssueSampled(seqs []*Sequence, tokens []int32, s []backend.Sampling) error {
	if err := checkSamplings(s, len(seqs)); err != nil {
		return err
	}
	p := &m.pipe
	return m.step(seqs, tokens, func(b *backend.Batch) error {
		// Under mu, with the steps issued before landed (step settles).
		if p.n == backend.MaxPipelined {
			return fmt.Errorf("engine: %d decode steps issued and not waited for", p.n)
		}
		e := p.push(len(seqs))
		copy(e.s, s)
		for i, x := range s {
			e.win[i] = append(e.win[i][:0], x.Recent...)
			e.s[i].Recent = e.win[i]
		}
		e.fill(seqs)
		p.dev = p.pipeliner
		if _, ok := p.dev.(backend.LogprobSampler); !ok && wantsLogprobs(s) {
			p.dev = nil
		}
		var err error
		if p.dev != nil {
			err = p.dev.IssueSampled(b, s)
		} else {
			e.landed = true
			err = m.draw(b, s, e.draws, e.lp)
		}
		if err != nil {
			p.n--
			return err
		}
		p.seqs, p.next = append(p.seqs[:0], seqs...), true
		return nil
	})
}

// IssueNext queues the decode step after the one issued last (by
// IssueSampled or IssueNext, with no other run of the model since): the
// same sequences, each fed its draw of that step, drawn with the same
// temperature and seed and a Step one further.
func (m *Model) IssueNext() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := &m.pipe
	switch {
	case m.closed:
		return ErrClosed
	case !p.next:
		return errors.New("engine: IssueNext follows a step issued by IssueSampled or IssueNext, with no other run between")
	case p.n == backend.MaxPipelined:
		return fmt.Errorf("engine: %d decode steps issued and not waited for", p.n)
	}
	for i, s := range p.seqs {
		if s.done {
			return fmt.Errorf("engine: sequence %d is closed", i)
		}
		if s.pos+1 > m.ctx {
			return &ContextError{Have: s.pos, Add: 1, Context: m.ctx}
		}
	}
	prev := &p.ring[p.last]
	if p.dev == nil && prev.err != nil {
		return prev.err
	}
	e := p.push(len(p.seqs))
	for i := range e.s {
		e.s[i] = prev.s[i]
		e.s[i].Step++
		// The window the step's draw sees: the one before, and the token
		// fed (the device keeps its own).
		e.win[i] = append(e.win[i][:0], prev.s[i].Recent...)
		if p.dev == nil && prev.s[i].Penalizes() {
			w := append(e.win[i], prev.draws[i])
			if over := len(w) - e.s[i].Window; over > 0 {
				w = w[:copy(w, w[over:])] // in place, so the buffer keeps its room
			}
			e.win[i] = w
		}
		e.s[i].Recent = e.win[i]
	}
	e.fill(p.seqs)
	for _, s := range p.seqs {
		s.feeding()
	}
	var err error
	if p.dev != nil {
		err = p.dev.IssueNext()
	} else {
		// Each step ran as it was issued: the tokens are known.
		b := &m.batch
		b.Tokens, b.Pos, b.Slots, b.Selected = b.Tokens[:0], b.Pos[:0], b.Slots[:0], b.Selected[:0]
		for i, s := range p.seqs {
			b.Tokens = append(b.Tokens, prev.draws[i])
			b.Pos = append(b.Pos, int32(s.pos))
			b.Slots = append(b.Slots, int32(s.slot))
			b.Selected = append(b.Selected, int32(i))
		}
		e.landed = true
		err = m.draw(b, e.s, e.draws, e.lp)
	}
	if err != nil {
		p.n--
		p.next = false
		return err
	}
	for _, s := range p.seqs {
		s.pos++
	}
	prev.chained = true
	if prev.landed {
		m.hold(prev)
	}
	return nil
}

// WaitSampled waits for the oldest step issued and not yet handed out and
// writes its draws into out ([rows]).
func (m *Model) WaitSampled(out []int32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := &m.pipe
	if p.n == 0 {
		return errors.New("engine: no decode step issued to wait for")
	}
	e := &p.ring[p.head]
	if len(out) != len(e.draws) {
		return fmt.Errorf("engine: %d draws to hand out, an output of %d", len(e.draws), len(out))
	}
	if !e.landed {
		m.land(e)
	}
	p.head, p.n = (p.head+1)%len(p.ring), p.n-1
	copy(out, e.draws)
	m.lp = sizeLogprobs(m.lp, len(e.lp))
	for i, r := range e.lp {
		m.lp[i].on, m.lp[i].lp, m.lp[i].top = r.on, r.lp, append(m.lp[i].top[:0], r.top...)
	}
	return e.err
}

// DropIssued waits for every step issued and not handed out, and forgets
// their draws (after a failure, or when they are not wanted). The
// sequences stay where the steps left them: their caches hold the tokens
// the steps fed.
func (m *Model) DropIssued() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.settle()
	m.pipe.head, m.pipe.n = 0, 0
}

// settle lands every issued step (the caller holds mu, and is about to run
// something else on the plan); IssueNext may not follow.
func (m *Model) settle() {
	p := &m.pipe
	p.next = false
	for i := range p.n {
		if e := &p.ring[(p.head+i)%len(p.ring)]; !e.landed {
			m.land(e)
		}
	}
}

// land waits for e, the oldest step not landed (the caller holds mu).
func (m *Model) land(e *issued) {
	e.landed = true
	dev := m.pipe.dev
	if e.err = dev.WaitSampled(e.draws); e.err != nil {
		m.pipe.next = false
		return
	}
	ls, _ := dev.(backend.LogprobSampler)
	readLogprobs(ls, e.s, e.lp)
	if e.chained {
		m.hold(e)
	}
}

// hold records e's draws as the tokens the step after it fed.
func (m *Model) hold(e *issued) {
	if m.held == nil {
		return
	}
	for i, slot := range e.slots {
		h, at := m.held[slot], int(e.pos[i])+1
		if e.err == nil && len(h) == at {
			m.held[slot] = append(h, e.draws[i])
		} else if len(h) > at || e.err != nil {
			m.held[slot] = h[:min(len(h), at)]
		}
	}
}

// push takes the next ring entry, sized for rows rows, as the step issued
// last.
func (p *pipeline) push(rows int) *issued {
	p.last = (p.head + p.n) % len(p.ring)
	e := &p.ring[p.last]
	if cap(e.draws) < rows {
		*e = issued{slots: make([]int32, rows), pos: make([]int32, rows), s: make([]backend.Sampling, rows), draws: make([]int32, rows),
			win: make([][]int32, rows), lp: sizeLogprobs(nil, rows)}
		for i := range e.win {
			e.win[i] = make([]int32, 0, backend.MaxWindow+1) // room for a window and the draw
		}
	}
	e.landed, e.err, e.chained = false, nil, false
	e.slots, e.pos, e.s, e.draws, e.win, e.lp = e.slots[:rows], e.pos[:rows], e.s[:rows], e.draws[:rows], e.win[:rows], e.lp[:rows]
	p.n++
	return e
}

// fill records e's rows: seqs, each fed at its position.
func (e *issued) fill(seqs []*Sequence) {
	for i, s := range seqs {
		e.slots[i], e.pos[i] = int32(s.slot), int32(s.pos)
	}
}
