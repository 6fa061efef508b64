package weft

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"
	"time"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/constrain"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/sample"
	"github.com/weftlm/weft/tokenizer"
)

// Token is one step of a generation. The last item of every generation has
// Done set, no ID, and FinishReason.
type Token struct {
	ID int32 `json:"id"`
	// Sampled marks an item that carries a generated token (every item but
	// the last does; the last does when a stop string or the full context
	// ended the generation on a sampled token).
	Sampled bool `json:"sampled,omitempty"`
	// Text is the text this step releases: whole UTF-8 characters, never
	// any part of a stop string. It may be empty (a character still
	// incomplete, or text held back while it might begin a stop string),
	// and the final item may carry text held back until then.
	Text string `json:"text"`
	// Logprob is the token's natural log-probability under the model
	// (log-softmax of the raw logits), when WithLogprobs asked for it.
	Logprob float32 `json:"logprob,omitempty"`
	// TopLogprobs are the most probable tokens at this step, when asked.
	TopLogprobs []sample.TokenLogProb `json:"top_logprobs,omitempty"`

	Done bool `json:"done,omitempty"`
	// FinishReason is "stop" (an end-of-generation token or a stop
	// string), "length" (the token limit or the context) or "cancelled".
	FinishReason string `json:"finish_reason,omitempty"`
	// Notices say what the generation did on its own: a truncated prompt,
	// a context shift.
	Notices []string `json:"notices,omitempty"`
	// CachedPromptTokens, on the final item, counts the prompt's first
	// tokens the slot's cache already held from an earlier request, which
	// were not fed again.
	CachedPromptTokens int `json:"cached_prompt_tokens,omitempty"`
}

// Overflow says what to do when a prompt does not fit the context.
type Overflow int

const (
	// OverflowError refuses a prompt longer than the context (default).
	OverflowError Overflow = iota
	// OverflowTruncate drops the oldest prompt tokens (after BOS) so the
	// prompt fits with room to generate, and says so in a notice.
	OverflowTruncate
	// OverflowShift truncates like OverflowTruncate and, when generation
	// fills the context, drops the oldest half of the tokens after BOS and
	// recomputes the rest, saying so in a notice.
	OverflowShift
)

// GenerateOptions are the settings of one generation; the With* functions
// set them.
type GenerateOptions struct {
	MaxTokens int           // 0: until an end-of-generation token or the context is full
	Sampling  sample.Params // temperature, top-k, top-p, min-p, penalties, bias, seed
	Stop      []string      // stop strings, matched across token boundaries and never emitted
	Overflow  Overflow
	Logprobs  bool // report each token's logprob
	TopN      int  // and the TopN most probable alternatives
	// JSON constrains the output to one JSON object (OpenAI's
	// response_format json_object): at every step only tokens that keep
	// the text a valid prefix may be sampled, and generation ends when the
	// object closes.
	JSON bool
	// JSONSchema, when set, constrains the output to a JSON document that
	// follows this JSON Schema (OpenAI's response_format json_schema;
	// the subset constrain.CompileSchema describes), the same way.
	JSONSchema []byte
	// Tools are tool definitions for Chat's template (WithTools).
	Tools [][]byte

	// addSpecial adds BOS (per the model) when encoding the prompt;
	// parseSpecial recognises special-token text in it (chat templates).
	addSpecial, parseSpecial bool
}

// GenerateOption sets a generation option.
type GenerateOption func(*GenerateOptions)

// WithOptions replaces all options at once (as a server does).
func WithOptions(o GenerateOptions) GenerateOption {
	return func(g *GenerateOptions) {
		add, parse := g.addSpecial, g.parseSpecial
		*g = o
		g.addSpecial, g.parseSpecial = add, parse
	}
}

// WithMaxTokens limits the generated tokens.
func WithMaxTokens(n int) GenerateOption { return func(g *GenerateOptions) { g.MaxTokens = n } }

// WithTemperature sets the sampling temperature (0: greedy).
func WithTemperature(t float32) GenerateOption {
	return func(g *GenerateOptions) { g.Sampling.Temperature = t }
}

// WithTopK keeps the k most probable tokens.
func WithTopK(k int) GenerateOption { return func(g *GenerateOptions) { g.Sampling.TopK = k } }

// WithTopP keeps the most probable tokens up to probability p.
func WithTopP(p float32) GenerateOption { return func(g *GenerateOptions) { g.Sampling.TopP = p } }

// WithMinP drops tokens less probable than p times the best.
func WithMinP(p float32) GenerateOption { return func(g *GenerateOptions) { g.Sampling.MinP = p } }

// WithRepeatPenalty penalises recently seen tokens (llama.cpp's rule).
func WithRepeatPenalty(r float32) GenerateOption {
	return func(g *GenerateOptions) { g.Sampling.RepeatPenalty = r }
}

// WithSeed fixes the random stream.
func WithSeed(seed uint64) GenerateOption { return func(g *GenerateOptions) { g.Sampling.Seed = seed } }

// WithStop ends generation at any of these strings, which are not emitted.
func WithStop(s ...string) GenerateOption {
	return func(g *GenerateOptions) { g.Stop = append(g.Stop, s...) }
}

// WithOverflow chooses what happens when the context is too small.
func WithOverflow(o Overflow) GenerateOption { return func(g *GenerateOptions) { g.Overflow = o } }

// WithJSON constrains the output to a single JSON object.
func WithJSON() GenerateOption { return func(g *GenerateOptions) { g.JSON = true } }

// WithJSONSchema constrains the output to a JSON document following
// schema (a JSON Schema document; constrain.CompileSchema says which
// keywords it takes). A schema it cannot follow fails the request.
func WithJSONSchema(schema []byte) GenerateOption {
	return func(g *GenerateOptions) { g.JSONSchema = schema }
}

// WithLogprobs reports each token's log-probability and the top n others.
func WithLogprobs(n int) GenerateOption {
	return func(g *GenerateOptions) { g.Logprobs, g.TopN = true, n }
}

// PromptTooLongError reports a prompt that does not fit the context.
type PromptTooLongError struct {
	Tokens, Context int
}

func (e *PromptTooLongError) Error() string {
	return fmt.Sprintf("weft: the prompt is %d tokens but the context holds %d (leave room to generate, or use WithOverflow)", e.Tokens, e.Context)
}

// ErrNoTokenizer is returned for text requests to a model without one.
var ErrNoTokenizer = errors.New("weft: the model has no tokenizer (it can only run token ids)")

func (m *Model) genOptions(opts []GenerateOption) GenerateOptions {
	g := GenerateOptions{addSpecial: true}
	for _, f := range opts {
		f(&g)
	}
	if g.Sampling.Seed == 0 {
		g.Sampling.Seed = m.opts.seed
	}
	return g
}

// Generate continues prompt (BOS added as the model asks; an empty prompt
// starts from BOS) and streams the tokens. Breaking out of the loop or
// cancelling ctx ends the generation within one token.
func (m *Model) Generate(ctx context.Context, prompt string, opts ...GenerateOption) iter.Seq2[Token, error] {
	g := m.genOptions(opts)
	return func(yield func(Token, error) bool) {
		if m.tok == nil {
			yield(Token{}, ErrNoTokenizer)
			return
		}
		ids := m.tok.Encode(prompt, g.addSpecial, g.parseSpecial)
		m.run(ctx, ids, g, yield)
	}
}

// GenerateTokens is Generate from token ids, fed as given.
func (m *Model) GenerateTokens(ctx context.Context, ids []int32, opts ...GenerateOption) iter.Seq2[Token, error] {
	g := m.genOptions(opts)
	return func(yield func(Token, error) bool) { m.run(ctx, append([]int32(nil), ids...), g, yield) }
}

// run is one generation on its own sequence slot, decoded by the
// scheduler together with every other live request.
func (m *Model) run(ctx context.Context, ids []int32, g GenerateOptions, yield func(Token, error) bool) {
	start := time.Now()
	st, err := m.newStream(ids, g)
	if err != nil {
		yield(Token{}, err)
		return
	}
	seq, kept, release, err := m.acquireFor(ctx, st.ids)
	if err != nil {
		yield(Token{}, err)
		return
	}
	defer release()
	st.kept = kept
	// The scheduler stops at the next step once this context ends, which
	// is how a consumer that stops reading ends the generation.
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &request{ctx: ctx, seq: seq, st: st, logits: make([]float32, m.eng.Vocab()), start: start, out: newQueue(), fed: kept, kept: kept}
	select {
	case m.sched.submit <- r:
	case <-m.sched.quit:
		yield(Token{}, ErrClosed)
		return
	case <-ctx.Done():
		yield(Token{}, ctx.Err())
		return
	}
	var buf []item
	stopped := false
	for {
		items, done := r.out.pop(buf)
		for _, it := range items {
			if stopped {
				continue
			}
			if err := parent.Err(); err != nil && it.err == nil {
				// Cancelled: tokens the scheduler made meanwhile are
				// dropped.
				it = item{err: err}
			}
			if !yield(it.tok, it.err) || it.err != nil {
				stopped = true
				cancel()
			}
		}
		buf = items
		if done {
			// The scheduler is finished with the sequence: the slot may
			// be released.
			return
		}
	}
}

// prefill feeds the prompt chunk by chunk, checking ctx between chunks.
func (m *Model) prefill(ctx context.Context, seq *engine.Sequence, ids []int32, logits []float32) error {
	chunk := m.eng.MaxBatch()
	for start := 0; start < len(ids); start += chunk {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := seq.ForwardInto(ids[start:min(start+chunk, len(ids))], false, logits); err != nil {
			return err
		}
	}
	return nil
}

// shift drops the oldest half of the tokens after BOS and recomputes the
// cache for the rest: positions are baked into cached keys, so the kept
// tokens must be fed again at their new positions.
func (m *Model) shift(ctx context.Context, seq *engine.Sequence, st *stream, logits []float32) error {
	all := st.context
	keep := 0
	if len(all) > 0 && m.tok != nil && all[0] == m.tok.BOS() {
		keep = 1
	}
	drop := (len(all) - keep) / 2
	kept := append(append([]int32{}, all[:keep]...), all[keep+drop:]...)
	if err := seq.Rewind(0); err != nil {
		return err
	}
	// The last kept token is fed by the caller's next step, so its
	// logits come out there; feed everything before it now.
	if len(kept) > 1 {
		if err := m.prefill(ctx, seq, kept[:len(kept)-1], logits); err != nil {
			return err
		}
	}
	st.context = kept
	st.notice(fmt.Sprintf("context shifted: dropped %d tokens after the first %d to make room", drop, keep))
	return nil
}

// stream is the per-generation state: sampling, stops, text decoding.
type stream struct {
	m         *Model
	g         GenerateOptions
	ids       []int32 // the prompt as fed
	context   []int32 // every token fed so far (prompt and generated)
	sampler   *sample.Sampler
	dec       textDecoder
	stops     *stopMatcher
	generated int
	notices   []string
	topBuf    []sample.TokenLogProb

	json   *constrain.JSON // the output so far, when constrained to JSON
	masker *constrain.Masker
	masked []float32 // logits with the disallowed tokens at -Inf

	// drawn is the next token when the backend drew it (see deviceDraw),
	// else -1 and next samples from the logits; drawnLP and drawnTop are
	// its log-probabilities, when asked for (takeDraw).
	drawn    int32
	drawnLP  float32
	drawnTop []sample.TokenLogProb
	kept     int // prompt tokens the slot's cache held already
}

// deviceDraw reports whether the backend may draw this stream's next
// token where the logits are, and how: a chain that needs only the logits
// and the last tokens fed (sample.Sampler.Device: greedy, a temperature
// alone, with a top-k of at most 64, or with top-p or min-p; a logit
// bias, and penalties over a short window), with log-probabilities of at
// most backend.MaxTopLogprobs alternatives, and no JSON constraint, which
// needs the logits on the host.
func (st *stream) deviceDraw() (backend.Sampling, bool) {
	d, ok := st.sampler.Device(st.context)
	if !ok || st.json != nil || st.g.Logprobs && st.g.TopN > backend.MaxTopLogprobs {
		return backend.Sampling{}, false
	}
	if st.g.Logprobs {
		d.Logprobs, d.TopLogprobs = true, max(st.g.TopN, 0)
	}
	return backend.Sampling(d), true
}

// takeDraw makes id, drawn by the backend as row i of the step handed out
// last, the stream's next token, with its log-probabilities where the
// stream asks for them.
func (st *stream) takeDraw(m *engine.Model, i int, id int32) {
	st.drawn = id
	if !st.g.Logprobs {
		return
	}
	lp, top, _ := m.Logprobs(i)
	st.drawnLP, st.drawnTop = lp, st.drawnTop[:0]
	for _, t := range top {
		st.drawnTop = append(st.drawnTop, sample.TokenLogProb{ID: t.ID, LogProb: t.Logprob})
	}
}

// textDecoder turns ids into text whole characters at a time.
type textDecoder interface {
	Add(id int32) string
	Flush() string
}

func (m *Model) newStream(ids []int32, g GenerateOptions) (*stream, error) {
	st := &stream{m: m, g: g, drawn: -1}
	ctxLen := m.eng.Context()
	if len(ids) == 0 {
		return nil, errors.New("weft: empty prompt and the model adds no BOS token; give at least one token")
	}
	if len(ids) >= ctxLen {
		if g.Overflow == OverflowError {
			return nil, &PromptTooLongError{Tokens: len(ids), Context: ctxLen}
		}
		reserve := ctxLen / 2
		if g.MaxTokens > 0 && g.MaxTokens < reserve {
			reserve = g.MaxTokens
		}
		keepHead := 0
		if m.tok != nil && ids[0] == m.tok.BOS() {
			keepHead = 1
		}
		budget := ctxLen - reserve
		drop := len(ids) - budget
		ids = append(append([]int32{}, ids[:keepHead]...), ids[keepHead+drop:]...)
		st.notice(fmt.Sprintf("prompt truncated from %d to %d tokens: dropped the %d oldest after the first %d", len(ids)+drop, len(ids), drop, keepHead))
	}
	st.ids = ids
	st.context = append(make([]int32, 0, ctxLen), ids...)
	sm, err := sample.New(g.Sampling, m.eng.Vocab())
	if err != nil {
		return nil, err
	}
	st.sampler = sm
	if m.tok != nil {
		d := m.tok.NewStreamDecoder(true)
		// After a lone BOS the first piece's leading space is the
		// SentencePiece word marker of the first word, not text.
		if m.tok.Vocab().AddSpacePrefix && ids[len(ids)-1] == m.tok.BOS() {
			st.dec = &lstripFirst{d: d}
		} else {
			st.dec = d
		}
	} else {
		st.dec = noText{}
	}
	st.stops = newStopMatcher(g.Stop)
	if g.JSON || g.JSONSchema != nil {
		if m.tok == nil {
			return nil, ErrNoTokenizer
		}
		st.json = &constrain.JSON{}
		if g.JSONSchema != nil {
			s, err := constrain.CompileSchema(g.JSONSchema)
			if err != nil {
				return nil, fmt.Errorf("weft: %w", err)
			}
			*st.json = constrain.NewSchemaJSON(s)
		}
		st.masker = m.jsonMasker()
		st.masked = make([]float32, m.eng.Vocab())
	}
	return st, nil
}

// jsonMasker builds, once, the token texts JSON-constrained sampling needs.
func (m *Model) jsonMasker() *constrain.Masker {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.masker == nil {
		v := m.eng.Vocab()
		pieces, eog := make([]string, v), make([]bool, v)
		for id := range v {
			if id < m.tok.Len() {
				eog[id] = m.tok.IsEOG(int32(id))
				if t := m.tok.Type(int32(id)); t != tokenizer.TypeControl && t != tokenizer.TypeUnknown && t != tokenizer.TypeUnused {
					pieces[id] = m.tok.Piece(int32(id))
				}
			}
		}
		m.masker = constrain.NewMasker(pieces, eog)
	}
	return m.masker
}

func (st *stream) notice(s string) { st.notices = append(st.notices, s) }

// next samples a token from logits — or takes the one the backend drew —
// and turns it into the next item.
func (st *stream) next(logits []float32) (Token, error) {
	if st.g.MaxTokens > 0 && st.generated >= st.g.MaxTokens {
		return st.finish("length"), nil
	}
	var id int32
	fromDevice := st.drawn >= 0
	if fromDevice {
		id, st.drawn = st.drawn, -1
		st.sampler.Advance()
	} else {
		pick := logits
		if st.json != nil {
			copy(st.masked, logits)
			if st.masker.Apply(st.json, st.masked) == 0 {
				return st.finish("stop"), nil
			}
			pick = st.masked
		}
		var err error
		if id, err = st.sampler.Sample(pick, st.context); err != nil {
			return Token{}, err
		}
	}
	tok := Token{ID: id, Sampled: true}
	if st.g.Logprobs {
		if fromDevice {
			tok.Logprob, st.topBuf = st.drawnLP, append(st.topBuf[:0], st.drawnTop...)
		} else {
			tok.Logprob, st.topBuf = sample.TokenLogProbs(logits, id, st.g.TopN, st.topBuf[:0])
		}
		if st.g.TopN > 0 {
			tok.TopLogprobs = append([]sample.TokenLogProb(nil), st.topBuf...)
		}
	}
	if st.m.tok != nil && st.m.tok.IsEOG(id) {
		return st.finish("stop"), nil // the end-of-generation token is not emitted
	}
	st.generated++
	st.context = append(st.context, id)
	text, stopped := st.stops.add(st.dec.Add(id))
	tok.Text = text
	if stopped {
		tok.Done, tok.FinishReason, tok.Notices, tok.CachedPromptTokens = true, "stop", st.notices, st.kept
	}
	if st.json != nil && !tok.Done {
		st.json.FeedString(st.m.tok.Piece(id))
		if st.json.Complete() {
			return st.last(tok, "stop"), nil
		}
	}
	return tok, nil
}

// finish ends the generation, releasing any held-back text.
func (st *stream) finish(reason string) Token {
	text, _ := st.stops.add(st.dec.Flush())
	return Token{Text: text + st.stops.flush(), Done: true, FinishReason: reason, Notices: st.notices, CachedPromptTokens: st.kept}
}

// last makes tok, just sampled, the final item: the context has no room
// to feed it back.
func (st *stream) last(tok Token, reason string) Token {
	end := st.finish(reason)
	end.ID, end.Sampled, end.Logprob, end.TopLogprobs = tok.ID, true, tok.Logprob, tok.TopLogprobs
	end.Text = tok.Text + end.Text
	return end
}

type noText struct{}

func (noText) Add(int32) string { return "" }
func (noText) Flush() string    { return "" }

// lstripFirst drops one leading space from the first text it releases.
type lstripFirst struct {
	d    textDecoder
	done bool
}

func (l *lstripFirst) Add(id int32) string { return l.strip(l.d.Add(id)) }
func (l *lstripFirst) Flush() string       { return l.strip(l.d.Flush()) }
func (l *lstripFirst) strip(s string) string {
	if !l.done && s != "" {
		l.done = true
		s = strings.TrimPrefix(s, " ")
	}
	return s
}

// stopMatcher holds back text that might begin a stop string and reports a
// completed one; text from the stop string on is never released.
type stopMatcher struct {
	stops   []string
	pending string
	stopped bool
}

func newStopMatcher(stops []string) *stopMatcher {
	var s []string
	for _, x := range stops {
		if x != "" {
			s = append(s, x)
		}
	}
	return &stopMatcher{stops: s}
}

// add appends text and returns what can be released, and whether a stop
// string completed (the text before it is released, the rest dropped).
func (s *stopMatcher) add(text string) (string, bool) {
	if s.stopped {
		return "", true
	}
	if len(s.stops) == 0 {
		return text, false
	}
	s.pending += text
	first := -1
	for _, stop := range s.stops {
		if i := strings.Index(s.pending, stop); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	if first >= 0 {
		out := s.pending[:first]
		s.pending, s.stopped = "", true
		return out, true
	}
	// Keep the longest tail that is a prefix of some stop string.
	hold := 0
	for _, stop := range s.stops {
		for k := min(len(stop)-1, len(s.pending)); k > hold; k-- {
			if strings.HasSuffix(s.pending, stop[:k]) {
				hold = k
				break
			}
		}
	}
	out := s.pending[:len(s.pending)-hold]
	s.pending = s.pending[len(s.pending)-hold:]
	return out, false
}

// flush releases held-back text at the end of a generation.
func (s *stopMatcher) flush() string {
	out := s.pending
	s.pending = ""
	return out
}

// stepBuffers are a decode loop's reusable step inputs and outputs.
type stepBuffers struct {
	logits    []float32
	samplings []backend.Sampling
	ids       []int32
}

// decodeStep feeds toks to seqs in one replay and readies each stream's
// next token: when every stream's draw can be made by the backend, the
// backend draws them (no logits reach the host; st.drawn), else the
// logits land in rows[i].
func (m *Model) decodeStep(seqs []*engine.Sequence, toks []int32, streams []*stream, rows [][]float32, buf *stepBuffers) error {
	buf.samplings = buf.samplings[:0]
	for _, st := range streams {
		s, ok := st.deviceDraw()
		if !ok {
			break
		}
		buf.samplings = append(buf.samplings, s)
	}
	if len(buf.samplings) == len(streams) {
		if cap(buf.ids) < len(seqs) {
			buf.ids = make([]int32, m.eng.MaxBatch())
		}
		ids := buf.ids[:len(seqs)]
		if err := m.eng.StepSampled(seqs, toks, buf.samplings, ids); err != nil {
			return err
		}
		for i, st := range streams {
			st.takeDraw(m.eng, i, ids[i])
		}
		return nil
	}
	v := m.eng.Vocab()
	if cap(buf.logits) < len(seqs)*v {
		buf.logits = make([]float32, len(seqs)*v)
	}
	out := buf.logits[:len(seqs)*v]
	if err := m.eng.Step(seqs, toks, out); err != nil {
		return err
	}
	for i := range streams {
		copy(rows[i], out[i*v:(i+1)*v])
	}
	return nil
}
