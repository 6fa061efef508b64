// Package engine runs decoder-only transformers: it builds the per-token
// plan of a model from its weights and architecture descriptor once, hands
// it to a backend, and replays it for batches of tokens from one or several
// sequences, each with its own KV cache slot.
package engine

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/sample"
	"github.com/weftlm/weft/weights"
)

// Options configure a loaded model.
type Options struct {
	// Context is the most positions a sequence may hold (default: the
	// model's context length, capped at DefaultContext).
	Context int
	// Slots is the number of sequences that may be live at once (default 1).
	Slots int
	// MaxBatch is the most tokens one plan replay carries: the prefill
	// chunk and the widest batched decode step (default 64).
	MaxBatch int
	// Progress, when set, is told about the loading stages: "weights"
	// (done of total tensors prepared), "compile", "warmup".
	Progress func(stage string, done, total int)
	// CacheType is how the key/value cache stores its values: "f32" (the
	// default when empty) or "f16" (IEEE half floats, half the memory;
	// llama.cpp's default).
	CacheType string
}

// CacheTypes are the key/value cache types Options.CacheType takes.
var CacheTypes = []string{"f32", "f16"}

// DefaultContext caps the context when the caller names none, so a model
// trained for 128k positions does not reserve a 128k cache by default.
const DefaultContext = 4096

// DefaultBatch is the most rows one replay carries when the caller names
// no MaxBatch: the prefill chunk and the widest batched decode.
const DefaultBatch = 64

// Model is a model ready to run.
type Model struct {
	Weights *weights.Provider
	Config  weights.Config
	Backend backend.Backend

	prog *backend.Program
	exec backend.Exec

	mu     sync.Mutex // serialises plan replays and slot bookkeeping
	free   []int
	ctx    int
	batch  backend.Batch
	logits []float32 // [MaxBatch, Vocab]
	closed bool
	// held[slot] are the tokens whose keys and values the slot's cache
	// holds at positions 0, 1, …: what a later sequence in the slot may
	// keep instead of feeding again (NewSequenceFor). nil where the model
	// has ring caches (sliding windows), whose old positions are
	// overwritten.
	held [][]int32
	pipe pipeline // decode steps issued ahead of the host (pipeline.go)
	// lp are the log-probabilities of the draws handed out last
	// (Logprobs), lpBuf the host's scratch for them.
	lp    []rowLogprobs
	lpBuf []sample.TokenLogProb
}

// ErrClosed is returned by a closed model.
var ErrClosed = errors.New("engine: model is closed")

// Load builds the plan of the model in p and compiles it on be. The
// provider stays owned by the caller (Close does not close it).
func Load(p *weights.Provider, be backend.Backend, opts Options) (*Model, error) {
	if p.Arch == nil {
		return nil, fmt.Errorf("engine: %s: no architecture descriptor", p.Path)
	}
	cfg := p.Config
	if opts.CacheType != "" && !slices.Contains(CacheTypes, opts.CacheType) {
		return nil, fmt.Errorf("engine: cache type %q: want one of %s", opts.CacheType, strings.Join(CacheTypes, ", "))
	}
	ctx := opts.Context
	if ctx <= 0 {
		ctx = min(cfg.ContextLength, DefaultContext)
	}
	if ctx > cfg.ContextLength {
		return nil, fmt.Errorf("engine: context %d exceeds the model's %d positions", ctx, cfg.ContextLength)
	}
	slots := max(opts.Slots, 1)
	maxBatch := opts.MaxBatch
	if maxBatch <= 0 {
		maxBatch = DefaultBatch
	}
	// A batched decode step carries one row per live sequence.
	maxBatch = min(max(maxBatch, slots), max(ctx, slots))
	for _, t := range p.Tensors() {
		if len(t.Shape) == 2 && !be.Supports(t.Type) {
			return nil, fmt.Errorf("engine: %s: tensor %q has type %s, which the %s backend does not support", p.Path, t.Name, t.Type, be.Name())
		}
	}
	progress := opts.Progress
	if progress == nil {
		progress = func(string, int, int) {}
	}
	prog, err := buildProgram(p, maxBatch, slots, ctx, func(done, total int) { progress("weights", done, total) })
	if err != nil {
		return nil, fmt.Errorf("engine: %s: %w", p.Path, err)
	}
	for i := range prog.Caches {
		prog.Caches[i].F16 = opts.CacheType == "f16"
	}
	progress("compile", 0, 1)
	exec, err := be.Compile(prog)
	if err != nil {
		return nil, fmt.Errorf("engine: %s: %w", p.Path, err)
	}
	progress("compile", 1, 1)
	m := &Model{Weights: p, Config: cfg, Backend: be, prog: prog, exec: exec, ctx: ctx,
		logits: make([]float32, slots*cfg.VocabSize)}
	if pl, ok := exec.(backend.Pipeliner); ok {
		m.pipe.pipeliner = pl
	}
	for s := slots - 1; s >= 0; s-- {
		m.free = append(m.free, s)
	}
	ring := false
	for _, c := range prog.Caches {
		ring = ring || c.Capacity < ctx
	}
	if !ring {
		m.held = make([][]int32, slots)
	}
	m.batch = backend.Batch{
		Tokens: make([]int32, 0, maxBatch), Pos: make([]int32, 0, maxBatch),
		Slots: make([]int32, 0, maxBatch), Selected: make([]int32, 0, maxBatch),
	}
	progress("warmup", 0, 1)
	if err := m.warmUp(); err != nil {
		exec.Close()
		return nil, fmt.Errorf("engine: %s: warm-up: %w", p.Path, err)
	}
	progress("warmup", 1, 1)
	return m, nil
}

// warmUp replays the plan once so lazily mapped weights are paged in and
// every kernel has run before the first real token. The position it wrote
// is overwritten by the first real token of slot 0.
func (m *Model) warmUp() error {
	m.batch.Tokens = append(m.batch.Tokens[:0], 0)
	m.batch.Pos = append(m.batch.Pos[:0], 0)
	m.batch.Slots = append(m.batch.Slots[:0], 0)
	m.batch.Selected = append(m.batch.Selected[:0], 0)
	return m.exec.Run(&m.batch, m.scratchLogits(1))
}

// Context is the most positions a sequence may hold.
func (m *Model) Context() int { return m.ctx }

// MaxBatch is the most tokens one plan replay carries.
func (m *Model) MaxBatch() int { return m.prog.MaxRows }

// Vocab is the number of logits per position.
func (m *Model) Vocab() int { return m.Config.VocabSize }

// Slots is the number of sequences that may be live at once.
func (m *Model) Slots() int { return m.prog.Slots }

// Close frees the plan. It is idempotent and does not close the weights.
func (m *Model) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	return m.exec.Close()
}

// Sequence is one stream of tokens with its own KV cache slot.
type Sequence struct {
	m    *Model
	slot int
	pos  int
	done bool
}

// ErrNoSlot is returned when every sequence slot is in use.
var ErrNoSlot = errors.New("engine: every sequence slot is in use")

// NewSequence takes a free slot.
func (m *Model) NewSequence() (*Sequence, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	if len(m.free) == 0 {
		return nil, ErrNoSlot
	}
	s := m.free[len(m.free)-1]
	m.free = m.free[:len(m.free)-1]
	return &Sequence{m: m, slot: s}, nil
}

// NewSequenceFor takes the free slot whose cache already holds the longest
// start of prompt and returns a sequence positioned after it, with how
// many of prompt's tokens it kept; the caller feeds prompt[kept:]. At
// least the last token is left to feed, for its logits.
func (m *Model) NewSequenceFor(prompt []int32) (*Sequence, int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, 0, ErrClosed
	}
	if len(m.free) == 0 {
		return nil, 0, ErrNoSlot
	}
	best, kept := len(m.free)-1, 0
	if m.held != nil {
		// Weigh what a slot would keep against what it holds and would
		// lose: a slot that shares only the start (BOS, a system prompt)
		// with a long history of another conversation is worth less
		// than an empty one, whose taking loses nothing.
		score := func(slot, n int) int { return 3*n - len(m.held[slot]) }
		kept = commonPrefix(m.held[m.free[best]], prompt)
		for i, slot := range m.free {
			n := commonPrefix(m.held[slot], prompt)
			if s, bs := score(slot, n), score(m.free[best], kept); s > bs || s == bs && n > kept {
				best, kept = i, n
			}
		}
	}
	kept = min(kept, max(len(prompt)-1, 0))
	s := m.free[best]
	m.free = append(m.free[:best], m.free[best+1:]...)
	return &Sequence{m: m, slot: s, pos: kept}, kept, nil
}

func commonPrefix(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// feeding marks the slot's cache from the sequence's position on as about
// to change (the caller holds mu); fed records tokens as held there once
// they are in.
func (s *Sequence) feeding() {
	if h := s.m.held; h != nil {
		h[s.slot] = h[s.slot][:min(len(h[s.slot]), s.pos)]
	}
}

func (s *Sequence) fed(tokens []int32) {
	if h := s.m.held; h != nil {
		if len(h[s.slot]) == s.pos {
			h[s.slot] = append(h[s.slot], tokens...)
		} else {
			h[s.slot] = h[s.slot][:0] // out of step: keep nothing
		}
	}
	s.pos += len(tokens)
}

// Close returns the slot. It is idempotent.
func (s *Sequence) Close() {
	if s.done {
		return
	}
	s.done = true
	s.m.mu.Lock()
	s.m.free = append(s.m.free, s.slot)
	s.m.mu.Unlock()
}

// Pos is the number of tokens the sequence holds.
func (s *Sequence) Pos() int { return s.pos }

// Slot is the sequence's cache slot.
func (s *Sequence) Slot() int { return s.slot }

// Rewind forgets every token from position pos on.
func (s *Sequence) Rewind(pos int) error {
	if pos < 0 || pos > s.pos {
		return fmt.Errorf("engine: cannot rewind to %d from %d", pos, s.pos)
	}
	s.pos = pos
	return nil
}

// ContextError reports a sequence that would outgrow the context.
type ContextError struct {
	Have, Add, Context int
}

func (e *ContextError) Error() string {
	return fmt.Sprintf("engine: %d tokens plus %d new exceed the context of %d", e.Have, e.Add, e.Context)
}

// Forward feeds tokens to the sequence, in chunks of at most MaxBatch, and
// returns logits: one row per token when all is set, else only the last
// token's row. The slice is freshly allocated ([rows, Vocab]).
func (s *Sequence) Forward(tokens []int32, all bool) ([]float32, error) {
	if len(tokens) == 0 {
		return nil, errors.New("engine: no tokens to feed")
	}
	rows := 1
	if all {
		rows = len(tokens)
	}
	out := make([]float32, rows*s.m.Config.VocabSize)
	return out, s.ForwardInto(tokens, all, out)
}

// ForwardInto is Forward writing into out, which must hold the rows asked
// for. It allocates nothing.
func (s *Sequence) ForwardInto(tokens []int32, all bool, out []float32) error {
	v := s.m.Config.VocabSize
	want := v
	if all {
		want = len(tokens) * v
	}
	if len(out) != want {
		return fmt.Errorf("engine: logits buffer of %d floats, want %d", len(out), want)
	}
	_, err := s.feed(tokens, all, out)
	return err
}

// ForwardView is Forward of the last token's row without the copy into a
// caller's buffer, as llama.cpp's llama_get_logits hands out its own: the
// logits where the backend left them (host memory it owns, page-locked on
// a GPU: a backend.Viewer) or in the model's scratch. The slice is valid
// until the model runs again, for any of its sequences. It allocates
// nothing.
func (s *Sequence) ForwardView(tokens []int32) ([]float32, error) {
	return s.feed(tokens, false, nil)
}

// feed runs tokens through the sequence in chunks of at most MaxBatch:
// every row's logits into out with all set, else the last token's into
// out, or with out nil, where ForwardView finds them (returned).
func (s *Sequence) feed(tokens []int32, all bool, out []float32) ([]float32, error) {
	m := s.m
	if len(tokens) == 0 {
		return nil, errors.New("engine: no tokens to feed")
	}
	if s.done {
		return nil, errors.New("engine: sequence is closed")
	}
	if s.pos+len(tokens) > m.ctx {
		return nil, &ContextError{Have: s.pos, Add: len(tokens), Context: m.ctx}
	}
	v := m.Config.VocabSize
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	m.settle()
	s.feeding()
	var view []float32
	for start := 0; start < len(tokens); start += m.prog.MaxRows {
		chunk := tokens[start:min(start+m.prog.MaxRows, len(tokens))]
		b := &m.batch
		b.Tokens, b.Pos, b.Slots, b.Selected = b.Tokens[:0], b.Pos[:0], b.Slots[:0], b.Selected[:0]
		for i, t := range chunk {
			b.Tokens = append(b.Tokens, t)
			b.Pos = append(b.Pos, int32(s.pos+i))
			b.Slots = append(b.Slots, int32(s.slot))
			if all {
				b.Selected = append(b.Selected, int32(i))
			}
		}
		last := start+len(chunk) == len(tokens)
		if !all {
			b.Selected = append(b.Selected, int32(len(chunk)-1))
		}
		var err error
		switch vw, ok := m.exec.(backend.Viewer); {
		case all:
			err = m.exec.Run(b, out[start*v:(start+len(chunk))*v])
		case last && out != nil:
			err = m.exec.Run(b, out)
		case last && ok:
			view, err = vw.RunView(b)
		default:
			view = m.scratchLogits(1)
			err = m.exec.Run(b, view)
		}
		if err != nil {
			return nil, err
		}
		s.fed(chunk)
	}
	return view, nil
}

// Step feeds one token to each of several sequences in one batched plan
// replay (continuous batching) and writes each sequence's next-token logits
// to out ([len(seqs), Vocab]). The sequences must be distinct.
func (m *Model) Step(seqs []*Sequence, tokens []int32, out []float32) error {
	v := m.Config.VocabSize
	if len(out) != len(seqs)*v {
		return fmt.Errorf("engine: logits buffer of %d floats, want %d", len(out), len(seqs)*v)
	}
	return m.step(seqs, tokens, func(b *backend.Batch) error { return m.exec.Run(b, out) })
}

// StepSampled is Step that also chooses each sequence's next token, by
// the draw s[i] describes (sample.SampleGumbel or sample.SampleTopK), into
// out[i]. On a backend that can draw on the device (backend.Sampler) no
// logits reach the host; elsewhere the draw is made here from the logits,
// with the same result.
func (m *Model) StepSampled(seqs []*Sequence, tokens []int32, s []backend.Sampling, out []int32) error {
	if len(out) != len(seqs) {
		return fmt.Errorf("engine: %d sequences and %d outputs", len(seqs), len(out))
	}
	if err := checkSamplings(s, len(seqs)); err != nil {
		return err
	}
	return m.step(seqs, tokens, func(b *backend.Batch) error {
		m.lp = sizeLogprobs(m.lp, len(seqs))
		return m.draw(b, s, out, m.lp)
	})
}

// checkSamplings checks the draws of n sequences.
func checkSamplings(s []backend.Sampling, n int) error {
	if len(s) != n {
		return fmt.Errorf("engine: %d sequences and %d samplings", n, len(s))
	}
	for i, x := range s {
		if err := x.Check(); err != nil {
			return fmt.Errorf("engine: sequence %d: %w", i, err)
		}
	}
	return nil
}

// draw runs b and draws its selected rows' tokens by s into out, and
// their log-probabilities into lp where s asks for them: on the device
// where the backend can (backend.Sampler, and backend.LogprobSampler for
// log-probabilities), else here from the logits (the caller holds mu).
func (m *Model) draw(b *backend.Batch, s []backend.Sampling, out []int32, lp []rowLogprobs) error {
	if ds, ok := m.exec.(backend.Sampler); ok {
		ls, _ := ds.(backend.LogprobSampler)
		if ls != nil || !wantsLogprobs(s) {
			if err := ds.RunSampled(b, s, out); err != nil {
				return err
			}
			readLogprobs(ls, s, lp)
			return nil
		}
	}
	v := m.Config.VocabSize
	logits := m.scratchLogits(len(b.Selected))
	if err := m.exec.Run(b, logits); err != nil {
		return err
	}
	for i, x := range s {
		row := logits[i*v : (i+1)*v]
		id, err := sample.Draw(x).Sample(row)
		if err != nil {
			return fmt.Errorf("engine: sequence %d: %w", i, err)
		}
		out[i] = id
		hostLogprobs(row, id, x, &lp[i], &m.lpBuf)
	}
	return nil
}

// step checks a decode step, fills the batch and runs it with run, then
// advances the sequences.
func (m *Model) step(seqs []*Sequence, tokens []int32, run func(*backend.Batch) error) error {
	if len(seqs) != len(tokens) || len(seqs) == 0 {
		return fmt.Errorf("engine: %d sequences and %d tokens", len(seqs), len(tokens))
	}
	if len(seqs) > m.prog.MaxRows {
		return fmt.Errorf("engine: %d sequences exceed the batch limit %d", len(seqs), m.prog.MaxRows)
	}
	for i, s := range seqs {
		if s.m != m || s.done {
			return fmt.Errorf("engine: sequence %d is closed or belongs to another model", i)
		}
		if s.pos+1 > m.ctx {
			return &ContextError{Have: s.pos, Add: 1, Context: m.ctx}
		}
		for _, o := range seqs[:i] {
			if o == s {
				return fmt.Errorf("engine: sequence %d appears twice in one step", i)
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.settle()
	for _, s := range seqs {
		s.feeding()
	}
	b := &m.batch
	b.Tokens, b.Pos, b.Slots, b.Selected = b.Tokens[:0], b.Pos[:0], b.Slots[:0], b.Selected[:0]
	for i, s := range seqs {
		b.Tokens = append(b.Tokens, tokens[i])
		b.Pos = append(b.Pos, int32(s.pos))
		b.Slots = append(b.Slots, int32(s.slot))
		b.Selected = append(b.Selected, int32(i))
	}
	if err := run(b); err != nil {
		return err
	}
	for i, s := range seqs {
		s.fed(tokens[i : i+1])
	}
	return nil
}

// Prefill feeds each sequence its tokens, packing rows of several
// sequences into the same plan replays, and writes each sequence's
// last-token logits to out ([len(seqs), Vocab]). It is the batched,
// prefill-only path (classification, the prompts of a batch).
func (m *Model) Prefill(seqs []*Sequence, prompts [][]int32, out []float32) error {
	v := m.Config.VocabSize
	if len(seqs) != len(prompts) || len(out) != len(seqs)*v {
		return fmt.Errorf("engine: %d sequences, %d prompts, %d logits", len(seqs), len(prompts), len(out))
	}
	for i, s := range seqs {
		if s.m != m || s.done {
			return fmt.Errorf("engine: sequence %d is closed or belongs to another model", i)
		}
		if len(prompts[i]) == 0 {
			return fmt.Errorf("engine: prompt %d is empty", i)
		}
		if s.pos+len(prompts[i]) > m.ctx {
			return &ContextError{Have: s.pos, Add: len(prompts[i]), Context: m.ctx}
		}
		for _, o := range seqs[:i] {
			if o == s {
				return fmt.Errorf("engine: sequence %d appears twice", i)
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.settle()
	for _, s := range seqs {
		s.feeding()
	}
	b := &m.batch
	owner := make([]int, 0, m.prog.MaxRows) // selected row → sequence
	flush := func() error {
		if len(b.Tokens) == 0 {
			return nil
		}
		if len(b.Selected) == 0 {
			// Nothing finishes in this replay: compute one row's logits
			// into scratch and discard them.
			b.Selected = append(b.Selected, int32(len(b.Tokens)-1))
			owner = append(owner, -1)
		}
		logits := m.scratchLogits(len(b.Selected))
		if err := m.exec.Run(b, logits); err != nil {
			return err
		}
		for i, s := range owner {
			if s >= 0 {
				copy(out[s*v:(s+1)*v], logits[i*v:(i+1)*v])
			}
		}
		b.Tokens, b.Pos, b.Slots, b.Selected = b.Tokens[:0], b.Pos[:0], b.Slots[:0], b.Selected[:0]
		owner = owner[:0]
		return nil
	}
	b.Tokens, b.Pos, b.Slots, b.Selected = b.Tokens[:0], b.Pos[:0], b.Slots[:0], b.Selected[:0]
	for i, s := range seqs {
		for j, t := range prompts[i] {
			if len(b.Tokens) == m.prog.MaxRows {
				if err := flush(); err != nil {
					return err
				}
			}
			b.Tokens = append(b.Tokens, t)
			b.Pos = append(b.Pos, int32(s.pos+j))
			b.Slots = append(b.Slots, int32(s.slot))
			if j == len(prompts[i])-1 {
				b.Selected = append(b.Selected, int32(len(b.Tokens)-1))
				owner = append(owner, i)
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	for i, s := range seqs {
		s.fed(prompts[i])
	}
	return nil
}

// Hidden feeds tokens and returns every token's final normalised hidden
// state ([len(tokens), Dim]) instead of logits, for embeddings.
func (s *Sequence) Hidden(tokens []int32) ([]float32, error) {
	m := s.m
	if s.done {
		return nil, errors.New("engine: sequence is closed")
	}
	if len(tokens) == 0 {
		return nil, errors.New("engine: no tokens to feed")
	}
	if s.pos+len(tokens) > m.ctx {
		return nil, &ContextError{Have: s.pos, Add: len(tokens), Context: m.ctx}
	}
	dim := m.Config.Dim
	out := make([]float32, len(tokens)*dim)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	m.settle()
	s.feeding()
	b := &m.batch
	b.HiddenOnly = true
	defer func() { b.HiddenOnly = false }()
	for start := 0; start < len(tokens); start += m.prog.MaxRows {
		chunk := tokens[start:min(start+m.prog.MaxRows, len(tokens))]
		b.Tokens, b.Pos, b.Slots, b.Selected = b.Tokens[:0], b.Pos[:0], b.Slots[:0], b.Selected[:0]
		for i, t := range chunk {
			b.Tokens = append(b.Tokens, t)
			b.Pos = append(b.Pos, int32(s.pos+i))
			b.Slots = append(b.Slots, int32(s.slot))
			b.Selected = append(b.Selected, int32(i))
		}
		if err := m.exec.Run(b, out[start*dim:(start+len(chunk))*dim]); err != nil {
			return nil, err
		}
		s.fed(chunk)
	}
	return out, nil
}

// Keys returns the cached keys of one layer for the sequence's positions
// [0, Pos()) — after RoPE, as attention reads them — as [Pos(), KVDim].
func (s *Sequence) Keys(layer int) ([]float32, error) {
	m := s.m
	kr, ok := m.exec.(backend.KeyReader)
	if !ok {
		return nil, fmt.Errorf("engine: the %s backend cannot read back its cache", m.Backend.Name())
	}
	out := make([]float32, s.pos*m.Config.KVDim())
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	m.settle()
	if err := kr.ReadKeys(layer, s.slot, 0, s.pos, out); err != nil {
		return nil, err
	}
	return out, nil
}

// scratchLogits is rows rows of logits scratch (the caller holds mu). It
// starts at one row per slot — a decode step's most — and grows only when
// a replay selects more rows (prefill packing many short prompts), so a
// wide batch does not cost [MaxBatch, Vocab] floats of host memory up
// front (250 MiB for a 128k vocabulary at 512 rows).
func (m *Model) scratchLogits(rows int) []float32 {
	n := rows * m.Config.VocabSize
	if cap(m.logits) < n {
		m.logits = make([]float32, n)
	}
	return m.logits[:n]
}
