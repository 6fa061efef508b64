// Package sample turns a row of logits into the next token: the sampling
// chain of weft's generation API.
//
// A Sampler applies, for each token, these stages in this order:
//
//  1. logit bias: logits[id] += LogitBias[id] (-Inf bans a token);
//  2. penalties over the last PenaltyWindow tokens of the history, once per
//     distinct token with count c > 0: the repeat penalty r divides a
//     positive logit and multiplies a negative one (llama.cpp), then
//     logit -= PresencePenalty + c·FrequencyPenalty (OpenAI);
//  3. greedy when Temperature is 0: the argmax, ties to the lowest id;
//     the stages below are skipped, as none of them can drop the argmax;
//  4. top-k: the K highest logits (ties to the lowest ids);
//  5. temperature: logits / T;
//  6. softmax over what is left;
//  7. top-p: the smallest set of most probable tokens whose probability
//     reaches TopP;
//  8. min-p: tokens whose probability is below MinP times the largest;
//  9. a draw from what is left, renormalised, with the seeded PCG stream.
//
// This is llama.cpp's default chain (penalties, top-k, top-p, min-p) with one
// difference: llama.cpp divides by the temperature last, so its top-p and
// min-p see probabilities at temperature 1; here, as in ollama and Hugging
// Face transformers, they see the probabilities that are drawn from. Top-k
// does not care where the temperature goes.
//
// # Gumbel-max
//
// Stages 5, 6 and 9 together are equivalent in distribution to
//
//	argmax_i  logits[i]/T + g_i,   g_i = -log(-log(u_i)),  u_i ~ U(0, 1)
//
// taken over the tokens that stages 4, 7 and 8 keep (or over all of them
// when those are off): the Gumbel-max trick. The GPU backend samples that
// way, without a softmax or a sort; GumbelNoise is the counter-based noise
// it uses, a pure function of (seed, step, token) that a kernel computes
// bit for bit, and SampleGumbel is the reference for that kernel. A plain
// chain — greedy or temperature alone, no truncation — is drawn that way
// by Sample too, with the draw count as step (Device, Advance), after the
// bias and the penalties, so its tokens are the same whether the host or
// a GPU draws them. So is a chain with a top-k of at most MaxDrawTopK (and
// any top-p and min-p, llama.cpp's default chain among them):
// SampleTopK ranks the k candidates, applies top-p and min-p in rank order
// with arithmetic a kernel repeats to the bit, and takes the Gumbel-max
// of those kept. So is a chain with top-p or min-p and no top-k (the
// OpenAI API's usual request): SampleNucleus counts top-p's mass in exact
// integers, finds its cut by a radix selection on the logits' bits, and
// takes the Gumbel-max of those kept. Any other chain (a top-k above
// MaxDrawTopK with top-p or min-p) draws by inverse CDF from a PCG
// stream.
//
// # Cost
//
// Nothing is allocated per token: buffers are sized to the vocabulary in
// New. Nothing sorts the vocabulary either. Top-k keeps a heap of K
// candidates in one pass over the logits. SampleNucleus reads the logits
// three times (the largest; the first digit of the cut, with an exp a
// token; the second digit, drawing among the tokens above the first's),
// then the first digit's tokens for the rest. A Gumbel draw takes
// logarithms only for the tokens that may beat the best so far. On the
// inverse-CDF path top-p builds a histogram of the probability mass during
// the softmax (eight buckets per power of two), which places its boundary
// within one bucket; one pass drops what lies below, and a quickselect on
// mass ranks only that bucket's tokens. The softmax's exp is a
// float32-accurate polynomial, not math.Exp.
package sample

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// MaxVocab bounds the vocabulary New accepts, so that a bad size cannot ask
// for a huge allocation (a Sampler holds about 16 bytes per token).
const MaxVocab = 1 << 21

// DefaultPenaltyWindow is the number of recent tokens penalised when
// Params.PenaltyWindow is 0 (llama.cpp's and ollama's repeat_last_n).
const DefaultPenaltyWindow = 64

// ErrNoCandidates is returned by Sample when every logit is -Inf or NaN
// after the logit bias and penalties, so that no token can be drawn.
var ErrNoCandidates = errors.New("sample: no token has a finite logit")

// Params configures the chain. The zero value is greedy decoding with every
// other stage off; each field's zero value means "off" (or the default
// named below), so a caller sets only what it uses.
type Params struct {
	// Temperature divides the logits before the softmax. 0 is greedy
	// decoding; otherwise it must be positive and finite.
	Temperature float32
	// TopK keeps the K most probable tokens. 0 is off; K >= vocab is off.
	TopK int
	// TopP keeps the smallest set of most probable tokens whose
	// probability reaches TopP. It must lie in (0, 1]; 1 is off, and so is
	// 0, which stands for "unset".
	TopP float32
	// MinP drops tokens whose probability is below MinP times that of the
	// most probable token. It must lie in [0, 1]; 0 is off.
	MinP float32
	// RepeatPenalty divides a positive logit of a recent token and
	// multiplies a negative one (llama.cpp's repeat_penalty). It must be
	// positive and finite; 1 is off, and so is 0, which stands for "unset".
	RepeatPenalty float32
	// PresencePenalty is subtracted once from the logit of every recent
	// token (OpenAI's presence_penalty). Any finite value; 0 is off.
	PresencePenalty float32
	// FrequencyPenalty is subtracted from the logit of a recent token once
	// per occurrence (OpenAI's frequency_penalty). Any finite value.
	FrequencyPenalty float32
	// PenaltyWindow is how many of the last tokens of the history the
	// penalties look at: 0 means DefaultPenaltyWindow, -1 the whole
	// history (at a cost per token that grows with it).
	PenaltyWindow int
	// LogitBias is added to the logits of the tokens it names before
	// anything else. A bias must be finite or -Inf (which bans the token);
	// every id must lie in [0, vocab).
	LogitBias map[int32]float32
	// Seed seeds the random stream. 0 asks for a random seed, which
	// Sampler.Seed reports so that a run can be repeated.
	Seed uint64
}

// ParamError reports a Params field that New rejects.
type ParamError struct {
	Field string // the Params field, e.g. "TopP" or "LogitBias[12]"
	Msg   string // what is wrong with its value
}

func (e *ParamError) Error() string { return "sample: Params." + e.Field + " " + e.Msg }

// Sampler holds the validated parameters, the random stream and the
// buffers of one generation. It is not safe for concurrent use; give each
// sequence its own.
type Sampler struct {
	p        Params
	vocab    int
	seed     uint64
	pcg      *rand.PCG
	rng      *rand.Rand
	window   int // tokens of history the penalties look at; -1 is all
	penalize bool
	// plain: greedy, or a temperature with no truncation. A draw is then
	// SampleGumbel's (of the logits after the bias and penalties), keyed
	// by the seed and the draw count step. topk: a temperature with a
	// top-k of at most MaxDrawTopK (and any top-p and min-p): a draw is
	// SampleTopK's, keyed the same way. nucleus: a temperature with top-p
	// or min-p and no top-k: SampleNucleus's. Any other chain (a top-k
	// above MaxDrawTopK with top-p or min-p) draws by inverse CDF.
	plain, topk, nucleus bool
	step                 uint64

	biasIDs []int32   // LogitBias as parallel slices sorted by id: no map
	biasVal []float32 // iteration on the hot path, and a fixed order

	work   []float32 // [vocab] logits after bias and penalties
	counts []int32   // [vocab] occurrences in the window; zero between calls
	cands  []cand    // [vocab] candidate tokens, with logits then probabilities
	hist   *massHist // top-p's mass histogram
}

// cand is a candidate token: its id and, depending on the stage, its logit
// or its unnormalised probability.
type cand struct {
	id int32
	v  float32
}

// New validates p and returns a Sampler for a vocabulary of vocab tokens.
func New(p Params, vocab int) (*Sampler, error) {
	if vocab <= 0 || vocab > MaxVocab {
		return nil, fmt.Errorf("sample: vocabulary size %d outside [1, %d]", vocab, MaxVocab)
	}
	if err := p.validate(vocab); err != nil {
		return nil, err
	}
	if p.TopP == 0 {
		p.TopP = 1
	}
	if p.RepeatPenalty == 0 {
		p.RepeatPenalty = 1
	}
	if p.TopK >= vocab {
		p.TopK = 0
	}
	s := &Sampler{p: p, vocab: vocab, seed: p.Seed, window: p.PenaltyWindow}
	if s.window == 0 {
		s.window = DefaultPenaltyWindow
	}
	for s.seed == 0 {
		s.seed = rand.Uint64()
	}
	s.pcg = rand.NewPCG(s.seed, pcgStream)
	s.rng = rand.New(s.pcg)

	s.penalize = p.RepeatPenalty != 1 || p.PresencePenalty != 0 || p.FrequencyPenalty != 0
	for id, b := range p.LogitBias {
		if b != 0 {
			s.biasIDs = append(s.biasIDs, id)
		}
	}
	slices.Sort(s.biasIDs)
	for _, id := range s.biasIDs {
		s.biasVal = append(s.biasVal, p.LogitBias[id])
	}
	if s.penalize || len(s.biasIDs) > 0 {
		s.work = make([]float32, vocab)
	}
	if s.penalize {
		s.counts = make([]int32, vocab)
	}
	// Greedy ignores truncation: none of it can drop the argmax. The bias
	// and the penalties change the logits before any of these draws.
	s.plain = p.Temperature == 0 || p.TopK == 0 && p.TopP == 1 && p.MinP == 0
	s.topk = p.Temperature > 0 && p.TopK > 0 && p.TopK <= MaxDrawTopK
	s.nucleus = p.Temperature > 0 && p.TopK == 0 && !s.plain
	if p.Temperature > 0 && !s.plain && !s.topk && !s.nucleus {
		s.cands = make([]cand, 0, vocab)
		if p.TopP < 1 {
			s.hist = new(massHist)
		}
	}
	return s, nil
}

// pcgStream is the second PCG seed word; the first is the user's seed.
const pcgStream = 0x9e3779b97f4a7c15

func (p *Params) validate(vocab int) error {
	bad := func(field, format string, args ...any) error {
		return &ParamError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	finite := func(x float32) bool { return !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0) }
	switch {
	case !finite(p.Temperature) || p.Temperature < 0:
		return bad("Temperature", "= %v, want 0 (greedy) or a positive finite value", p.Temperature)
	case p.TopK < 0:
		return bad("TopK", "= %d, want 0 (off) or a positive count", p.TopK)
	case !(p.TopP >= 0 && p.TopP <= 1):
		return bad("TopP", "= %v outside (0, 1] (0 means unset)", p.TopP)
	case !(p.MinP >= 0 && p.MinP <= 1):
		return bad("MinP", "= %v outside [0, 1]", p.MinP)
	case !finite(p.RepeatPenalty) || p.RepeatPenalty < 0:
		return bad("RepeatPenalty", "= %v, want a positive finite value (1 or 0 is off)", p.RepeatPenalty)
	case !finite(p.PresencePenalty):
		return bad("PresencePenalty", "= %v, want a finite value", p.PresencePenalty)
	case !finite(p.FrequencyPenalty):
		return bad("FrequencyPenalty", "= %v, want a finite value", p.FrequencyPenalty)
	case p.PenaltyWindow < -1:
		return bad("PenaltyWindow", "= %d, want -1 (whole history), 0 (default %d) or a positive count", p.PenaltyWindow, DefaultPenaltyWindow)
	}
	for id, b := range p.LogitBias {
		if id < 0 || int(id) >= vocab {
			return bad(fmt.Sprintf("LogitBias[%d]", id), "names a token outside the vocabulary [0, %d)", vocab)
		}
		if math.IsNaN(float64(b)) || math.IsInf(float64(b), 1) {
			return bad(fmt.Sprintf("LogitBias[%d]", id), "= %v, want a finite value or -Inf", b)
		}
	}
	return nil
}

// Params returns the parameters in effect: those given to New, with unset
// TopP and RepeatPenalty read as 1, TopK >= vocab as 0, and the seed used.
func (s *Sampler) Params() Params {
	p := s.p
	p.Seed = s.seed
	return p
}

// Seed returns the seed of the random stream: Params.Seed, or the random
// seed chosen when that was 0.
func (s *Sampler) Seed() uint64 { return s.seed }

// Reset restarts the random stream from the seed, so that the same logits
// and histories give the same tokens again.
func (s *Sampler) Reset() {
	s.pcg.Seed(s.seed, pcgStream)
	s.step = 0
}

// Draw is a draw that needs nothing but the logits: when Temperature is 0,
// the argmax; with a TopK, SampleTopK's; with no TopK but a top-p or min-p
// (Nucleus), SampleNucleus's; else SampleGumbel's. Its fields are
// backend.Sampling's, so either converts to the other.
type Draw struct {
	Temperature float32
	TopK        int
	TopP, MinP  float32 // top-p in [0, 1] (0 and 1 are off), min-p in [0, 1] (0 is off)
	// The penalties (Params'; a RepeatPenalty of 0 is 1), applied first to
	// the tokens of Recent, the last at most Window (at most
	// MaxDrawWindow) tokens of the history, oldest first; Window 0 is no
	// penalty.
	RepeatPenalty, PresencePenalty, FrequencyPenalty float32
	Window                                           int
	Recent                                           []int32
	// The logit bias, added before the penalties: BiasValues[i] to the
	// logit of token BiasIDs[i] (ids ascending, at most MaxDrawBias;
	// values finite or -Inf).
	BiasIDs    []int32
	BiasValues []float32
	Seed, Step uint64
	// Logprobs asks whoever makes the draw to report its log-probability
	// and the TopLogprobs most probable tokens' (TokenLogProbs, under the
	// raw logits); Sample ignores them.
	Logprobs    bool
	TopLogprobs int
}

// MaxDrawWindow is the longest penalty window of a Draw, and MaxDrawBias
// the most biased tokens: a GPU keeps each row's window and bias beside
// its draws.
const (
	MaxDrawWindow = 256
	MaxDrawBias   = 512
)

// Penalizes reports whether d applies penalties.
func (d Draw) Penalizes() bool {
	return d.Window > 0 && (d.RepeatPenalty != 0 && d.RepeatPenalty != 1 || d.PresencePenalty != 0 || d.FrequencyPenalty != 0)
}

// Nucleus reports whether d is SampleNucleus's draw: a temperature, no
// top-k, and a top-p or a min-p.
func (d Draw) Nucleus() bool {
	return d.Temperature > 0 && d.TopK == 0 && (d.TopP > 0 && d.TopP < 1 || d.MinP > 0)
}

// Sample makes the draw from logits. The bias and the penalties change the
// logits of their tokens while it draws; logits is as it was on return.
func (d Draw) Sample(logits []float32) (int32, error) {
	pen := d.Penalizes() && len(d.Recent) > 0
	if !pen && len(d.BiasIDs) == 0 {
		return d.sample(logits)
	}
	// Each logit changed, with its value before, in order: restored in
	// reverse, a token both biased and penalised gets its own value back.
	var saved [MaxDrawBias + MaxDrawWindow]cand
	n, err := d.bias(logits, &saved)
	if err == nil && pen {
		var m int
		m, err = d.penalize(logits, (*[MaxDrawWindow]cand)(saved[n:]))
		n += m
	}
	id := int32(0)
	if err == nil {
		id, err = d.sample(logits)
	}
	for i := n - 1; i >= 0; i-- {
		logits[saved[i].id] = saved[i].v
	}
	return id, err
}

// bias adds d's logit bias to logits, keeping each changed logit's old
// value in saved, and returns how many it changed.
func (d Draw) bias(logits []float32, saved *[MaxDrawBias + MaxDrawWindow]cand) (int, error) {
	if len(d.BiasIDs) != len(d.BiasValues) || len(d.BiasIDs) > MaxDrawBias {
		return 0, fmt.Errorf("sample: a logit bias of %d ids and %d values, at most %d", len(d.BiasIDs), len(d.BiasValues), MaxDrawBias)
	}
	for i, id := range d.BiasIDs {
		b := d.BiasValues[i]
		switch {
		case id < 0 || int(id) >= len(logits) || i > 0 && id <= d.BiasIDs[i-1]:
			return i, fmt.Errorf("sample: logit bias token %d outside the vocabulary [0, %d) or out of order", id, len(logits))
		case math.IsNaN(float64(b)) || math.IsInf(float64(b), 1):
			return i, fmt.Errorf("sample: logit bias %v for token %d, want a finite value or -Inf", b, id)
		}
		saved[i] = cand{id, logits[id]}
		logits[id] += b
	}
	return len(d.BiasIDs), nil
}

// penalize applies d's penalties to logits, once per distinct token of
// Recent, keeping each changed logit's old value in saved, and returns
// how many it changed.
func (d Draw) penalize(logits []float32, saved *[MaxDrawWindow]cand) (int, error) {
	if d.Window > MaxDrawWindow || len(d.Recent) > d.Window {
		return 0, fmt.Errorf("sample: a penalty window of %d tokens holding %d, past %d", d.Window, len(d.Recent), MaxDrawWindow)
	}
	var win [MaxDrawWindow]int32
	w := win[:copy(win[:], d.Recent)]
	slices.Sort(w)
	if len(w) > 0 && (w[0] < 0 || int(w[len(w)-1]) >= len(logits)) {
		return 0, fmt.Errorf("sample: a penalty window token outside the vocabulary [0, %d)", len(logits))
	}
	r := d.RepeatPenalty
	if r == 0 {
		r = 1
	}
	n := 0
	for i := 0; i < len(w); {
		j := i + 1
		for j < len(w) && w[j] == w[i] {
			j++
		}
		id := w[i]
		saved[n] = cand{id, logits[id]}
		n++
		logits[id] = penalize(logits[id], int32(j-i), r, d.PresencePenalty, d.FrequencyPenalty)
		i = j
	}
	return n, nil
}

// sample is Sample after the bias and the penalties.
func (d Draw) sample(logits []float32) (int32, error) {
	switch {
	case d.Nucleus():
		topP := d.TopP
		if topP == 0 {
			topP = 1
		}
		return SampleNucleus(logits, d.Temperature, topP, d.MinP, d.Seed, d.Step)
	case d.TopK == 0 || d.Temperature == 0:
		return SampleGumbel(logits, d.Temperature, d.Seed, d.Step)
	}
	return SampleTopK(logits, d.Temperature, d.TopK, d.TopP, d.MinP, d.Seed, d.Step)
}

// Device reports whether the next draw may be made elsewhere — on a GPU,
// from logits that never reach the host — and how, for a sequence whose
// tokens so far are history (as Sample takes it; Recent is the part the
// penalties read, a slice of it). That holds when the chain is greedy
// (whatever its truncation), a plain temperature draw (no top-k, top-p or
// min-p), a temperature with a top-k of at most MaxDrawTopK and any top-p
// and min-p, or a temperature with top-p or min-p and no top-k; in each
// case with a logit bias of at most MaxDrawBias tokens (BiasIDs and
// BiasValues are the Sampler's: read them, do not change them) and
// penalties only over a window of at most MaxDrawWindow tokens. Sample
// draws such a chain the same way, so a token does not depend on where it
// was drawn. After a draw made elsewhere, call Advance.
func (s *Sampler) Device(history []int32) (Draw, bool) {
	d := Draw{Temperature: s.p.Temperature, Seed: s.seed, Step: s.step}
	if s.topk || s.nucleus {
		d.TopK, d.TopP, d.MinP = s.p.TopK, s.p.TopP, s.p.MinP
	}
	ok := (s.plain || s.topk || s.nucleus) && len(s.biasIDs) <= MaxDrawBias
	d.BiasIDs, d.BiasValues = s.biasIDs, s.biasVal
	if s.penalize {
		ok = ok && s.window > 0 && s.window <= MaxDrawWindow
		d.RepeatPenalty, d.PresencePenalty, d.FrequencyPenalty = s.p.RepeatPenalty, s.p.PresencePenalty, s.p.FrequencyPenalty
		d.Window, d.Recent = s.window, s.recent(history)
	}
	return d, ok
}

// Advance counts a draw made elsewhere with Device's parameters.
func (s *Sampler) Advance() { s.step++ }

// Sample returns the next token for logits ([vocab] float32, left
// unchanged) given the tokens so far (prompt and generated, oldest first;
// the penalties read its last PenaltyWindow entries). The Sampler keeps no
// history of its own: the engine owns the sequence, so a sequence that is
// truncated, restarted or forked needs nothing from the Sampler but the
// tokens. NaN logits count as -Inf. It fails only on a logits row of the
// wrong length, a token of the penalty window outside the vocabulary (the
// history is read only when a penalty is set), or when no token has a
// finite logit (ErrNoCandidates).
func (s *Sampler) Sample(logits []float32, history []int32) (int32, error) {
	if len(logits) != s.vocab {
		return 0, fmt.Errorf("sample: logits have %d entries, want the vocabulary size %d", len(logits), s.vocab)
	}
	l := logits
	if s.work != nil {
		copy(s.work, logits)
		l = s.work
		for i, id := range s.biasIDs {
			l[id] += s.biasVal[i]
		}
		if s.penalize {
			if err := s.applyPenalties(l, s.recent(history)); err != nil {
				return 0, err
			}
		}
	}
	if s.p.Temperature == 0 {
		id := argmax(l)
		if id < 0 {
			return 0, ErrNoCandidates
		}
		s.step++
		return id, nil
	}
	if s.plain {
		id, err := SampleGumbel(l, s.p.Temperature, s.seed, s.step)
		s.step++
		return id, err
	}
	if s.topk {
		id, err := SampleTopK(l, s.p.Temperature, s.p.TopK, s.p.TopP, s.p.MinP, s.seed, s.step)
		s.step++
		return id, err
	}
	if s.nucleus {
		id, err := SampleNucleus(l, s.p.Temperature, s.p.TopP, s.p.MinP, s.seed, s.step)
		s.step++
		return id, err
	}
	c, total := s.truncate(l)
	if len(c) == 0 {
		return 0, ErrNoCandidates
	}
	return draw(c, total, s.rng.Float64()), nil
}

// truncate runs stages 4 to 8 on l, the logits after bias and penalties,
// and returns the candidates left, with unnormalised probabilities, and
// their total.
func (s *Sampler) truncate(l []float32) ([]cand, float64) {
	invT := 1 / float64(s.p.Temperature)
	var h *massHist
	if s.p.TopP < 1 {
		h = s.hist
		clear(h[:])
	}
	var c []cand
	var total float64
	if s.p.TopK > 0 {
		c = topK(l, s.p.TopK, s.cands[:0])
		if len(c) == 0 {
			return nil, 0
		}
		c, total = softmaxCands(c, invT, h)
	} else {
		id := argmax(l)
		if id < 0 {
			return nil, 0
		}
		c, total = softmaxLogits(l, l[id], invT, s.cands[:0], h)
	}

	// Top-p and min-p each keep a prefix of the candidates ranked by
	// probability, so keeping both is keeping the shorter prefix, in
	// either order, provided top-p's target stays a share of the mass
	// before min-p. One pass drops what is below min-p and what the
	// histogram puts below top-p's boundary; the partition that ranks the
	// rest then starts from the histogram's bound.
	floor, pivot, target := s.p.MinP, float32(0), 0.0
	if h != nil {
		target = float64(s.p.TopP) * total
		var lo float32
		lo, pivot = nucleusBounds(h, target)
		floor = max(floor, lo)
	}
	if floor > 0 || h != nil {
		if floor > 0 {
			c = keepAtLeast(c, floor)
		}
		if h != nil {
			c = c[:nucleus(c, target, pivot)]
		}
		total = mass(c)
	}
	return c, total
}

// recent returns the part of history the penalties look at.
func (s *Sampler) recent(history []int32) []int32 {
	if s.window >= 0 && len(history) > s.window {
		return history[len(history)-s.window:]
	}
	return history
}

// applyPenalties penalises, once per distinct token of win, the logit of
// that token. counts is zero on entry and on return.
func (s *Sampler) applyPenalties(l []float32, win []int32) error {
	for i, t := range win {
		if t < 0 || int(t) >= s.vocab {
			for _, u := range win[:i] {
				s.counts[u] = 0
			}
			return fmt.Errorf("sample: history token %d outside the vocabulary [0, %d)", t, s.vocab)
		}
		s.counts[t]++
	}
	r, pres, freq := s.p.RepeatPenalty, s.p.PresencePenalty, s.p.FrequencyPenalty
	for _, t := range win {
		n := s.counts[t]
		if n == 0 {
			continue // already penalised
		}
		s.counts[t] = 0
		l[t] = penalize(l[t], n, r, pres, freq)
	}
	return nil
}

// penalize returns logit x of a token seen n > 0 times in the window.
// Every operation is rounded to float32 on its own (the conversion forbids
// a fused multiply-add), as the GPU's draws repeat it.
func penalize(x float32, n int32, repeat, presence, frequency float32) float32 {
	if x > 0 {
		x /= repeat
	} else {
		x *= repeat
	}
	return x - (presence + float32(float32(n)*frequency))
}
