package weft

import (
	"context"
	"fmt"
	"math"
)

// Pooling turns a sequence of hidden states into one embedding.
type Pooling int

const (
	// PoolMean averages every position (default).
	PoolMean Pooling = iota
	// PoolLast takes the last position (decoder models' usual choice).
	PoolLast
	// PoolCLS takes the first position (BERT-style CLS).
	PoolCLS
)

// EmbedOptions configure Embed.
type EmbedOptions struct {
	Pooling   Pooling
	Normalize bool // scale each embedding to unit length
}

// EmbedOption sets an embedding option.
type EmbedOption func(*EmbedOptions)

// WithPooling chooses the pooling.
func WithPooling(p Pooling) EmbedOption { return func(o *EmbedOptions) { o.Pooling = p } }

// WithNormalize scales embeddings to unit L2 norm.
func WithNormalize(on bool) EmbedOption { return func(o *EmbedOptions) { o.Normalize = on } }

// Embed returns one embedding per text: the final normalised hidden
// states of its tokens (BOS added as the model asks), pooled.
func (m *Model) Embed(ctx context.Context, texts []string, opts ...EmbedOption) ([][]float32, error) {
	var o EmbedOptions
	for _, f := range opts {
		f(&o)
	}
	g := m.genOptions(nil)
	out := make([][]float32, len(texts))
	dim := m.eng.Config.Dim
	for i, text := range texts {
		ids, err := m.encode(text, g)
		if err != nil {
			return nil, fmt.Errorf("weft: text %d: %w", i, err)
		}
		seq, release, err := m.acquire(ctx)
		if err != nil {
			return nil, err
		}
		h, err := seq.Hidden(ids)
		release()
		if err != nil {
			return nil, err
		}
		e := make([]float32, dim)
		switch o.Pooling {
		case PoolLast:
			copy(e, h[(len(ids)-1)*dim:])
		case PoolCLS:
			copy(e, h[:dim])
		default:
			for r := range len(ids) {
				for j := range e {
					e[j] += h[r*dim+j]
				}
			}
			for j := range e {
				e[j] /= float32(len(ids))
			}
		}
		if o.Normalize {
			var ss float64
			for _, x := range e {
				ss += float64(x) * float64(x)
			}
			if ss > 0 {
				inv := float32(1 / math.Sqrt(ss))
				for j := range e {
					e[j] *= inv
				}
			}
		}
		out[i] = e
	}
	return out, nil
}
