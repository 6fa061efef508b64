package weft

import (
	"context"
)

// AttentionInspection holds the keys attention sees after a prefill.
type AttentionInspection struct {
	Tokens  []int32
	Layers  int
	KVHeads int
	HeadDim int
	Sliding []bool // per layer: a sliding-window layer
	keys    [][]float32
}

// Keys returns the post-RoPE key vector of one layer, KV head and
// position ([HeadDim]).
func (a *AttentionInspection) Keys(layer, head, pos int) []float32 {
	row := a.keys[layer][pos*a.KVHeads*a.HeadDim:]
	return row[head*a.HeadDim : (head+1)*a.HeadDim]
}

// InspectAttention prefills prompt and returns the cached keys of every
// layer and KV head after RoPE, as attention reads them. Sliding-window
// layers keep only their window; their keys are given for the positions
// they still hold and the call fails if the prompt is longer than a ring
// can hold.
func (m *Model) InspectAttention(ctx context.Context, prompt string) (*AttentionInspection, error) {
	g := m.genOptions(nil)
	ids, err := m.encode(prompt, g)
	if err != nil {
		return nil, err
	}
	seq, release, err := m.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	logits := make([]float32, m.eng.Vocab())
	if err := m.prefill(ctx, seq, ids, logits); err != nil {
		return nil, err
	}
	c := m.eng.Config
	a := &AttentionInspection{Tokens: ids, Layers: c.NLayers, KVHeads: c.NKVHeads, HeadDim: c.HeadDim,
		Sliding: c.SlidingLayers}
	for l := range c.NLayers {
		k, err := seq.Keys(l)
		if err != nil {
			return nil, err
		}
		a.keys = append(a.keys, k)
	}
	return a, nil
}
