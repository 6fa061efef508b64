package constrain

import "math"

// Masker masks the tokens that would break a JSON prefix: it knows each
// token's bytes and which tokens end generation.
type Masker struct {
	pieces []string
	eog    []bool
}

// NewMasker takes every token's text (empty for tokens that stand for no
// text, such as control tokens) and which tokens end generation.
func NewMasker(pieces []string, eog []bool) *Masker {
	return &Masker{pieces: pieces, eog: eog}
}

// Apply sets to -Inf the logits of tokens that cannot follow state: a
// token is allowed when all its bytes keep the prefix valid; an
// end-of-generation token only once the object is complete. It returns how
// many tokens stay allowed.
func (m *Masker) Apply(state *JSON, logits []float32) int {
	negInf := float32(math.Inf(-1))
	allowed := 0
	complete := state.Complete()
	for id := range logits {
		ok := false
		switch {
		case id >= len(m.pieces):
		case m.eog[id]:
			ok = complete
		case m.pieces[id] != "":
			s := *state
			ok = s.FeedString(m.pieces[id])
		}
		if ok {
			allowed++
		} else {
			logits[id] = negInf
		}
	}
	return allowed
}
