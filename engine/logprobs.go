package engine

import (
	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/sample"
)

// Log-probabilities of drawn tokens: a draw whose backend.Sampling sets
// Logprobs reports its token's log-probability and the TopLogprobs most
// probable tokens' under the row's raw logits. A backend.LogprobSampler
// computes them where the logits are; on any other backend a step that
// asks for them runs with the logits brought to the host, and they are
// computed here (sample.TokenLogProbs).

// rowLogprobs is one row's log-probabilities: on says the row asked.
type rowLogprobs struct {
	on  bool
	lp  float32
	top []backend.TokenLogprob // room for backend.MaxTopLogprobs
}

// Logprobs returns row i's log-probabilities of the draws handed out last
// (by StepSampled or WaitSampled): the drawn token's, and the most
// probable tokens', most probable first (valid until the next step). ok
// is false where the row's Sampling did not set Logprobs.
func (m *Model) Logprobs(i int) (lp float32, top []backend.TokenLogprob, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if i < 0 || i >= len(m.lp) || !m.lp[i].on {
		return 0, nil, false
	}
	r := &m.lp[i]
	return r.lp, r.top, true
}

// wantsLogprobs reports whether a row of s asks for log-probabilities.
func wantsLogprobs(s []backend.Sampling) bool {
	for _, x := range s {
		if x.Logprobs {
			return true
		}
	}
	return false
}

// sizeLogprobs returns dst with room for n rows.
func sizeLogprobs(dst []rowLogprobs, n int) []rowLogprobs {
	for len(dst) < n {
		dst = append(dst, rowLogprobs{top: make([]backend.TokenLogprob, 0, backend.MaxTopLogprobs)})
	}
	return dst[:n]
}

// readLogprobs takes the rows' log-probabilities of the draws ls handed
// out last into dst; with ls nil (a backend that reports none, so no row
// asked it) every row has none.
func readLogprobs(ls backend.LogprobSampler, s []backend.Sampling, dst []rowLogprobs) {
	for i, x := range s {
		r := &dst[i]
		r.on = x.Logprobs && ls != nil
		if !r.on {
			continue
		}
		var n int
		r.lp, n = ls.Logprobs(i, r.top[:x.TopLogprobs])
		r.top = r.top[:n]
	}
}

// hostLogprobs computes row i's log-probabilities from its logits and its
// draw id into r.
func hostLogprobs(logits []float32, id int32, x backend.Sampling, r *rowLogprobs, buf *[]sample.TokenLogProb) {
	r.on = x.Logprobs
	if !r.on {
		return
	}
	var top []sample.TokenLogProb
	r.lp, top = sample.TokenLogProbs(logits, id, x.TopLogprobs, (*buf)[:0])
	*buf = top
	r.top = r.top[:len(top)]
	for k, t := range top {
		r.top[k] = backend.TokenLogprob{ID: t.ID, Logprob: t.LogProb}
	}
}
