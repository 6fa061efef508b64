package weights

import (
	"fmt"
	"slices"
	"strings"

	"github.com/weftlm/weft/arch"
)

// TensorError names the tensor at fault.
type TensorError struct {
	Source string
	Tensor string // canonical name (and the file's name in Msg when useful)
	Msg    string
}

func (e *TensorError) Error() string {
	return fmt.Sprintf("%s: tensor %q: %s", e.Source, e.Tensor, e.Msg)
}

// expectedShape returns the logical shape a canonical tensor must have, or
// nil when any shape is accepted.
func (p *Provider) expectedShape(pattern string) []int64 {
	c := &p.Config
	dim, q, kv, ffn, vocab := int64(c.Dim), int64(c.QDim()), int64(c.KVDim()), int64(c.FFNDim), int64(c.VocabSize)
	switch pattern {
	case arch.TokenEmbedding, arch.Output:
		return []int64{vocab, dim}
	case arch.OutputNorm, arch.AttnNorm, arch.FFNNorm, arch.AttnPostNorm, arch.FFNPostNorm, arch.AttnOutBias:
		return []int64{dim}
	case arch.AttnQ:
		return []int64{q, dim}
	case arch.AttnK, arch.AttnV:
		return []int64{kv, dim}
	case arch.AttnOut:
		return []int64{dim, q}
	case arch.AttnQBias:
		return []int64{q}
	case arch.AttnKBias, arch.AttnVBias:
		return []int64{kv}
	case arch.AttnQNorm, arch.AttnKNorm:
		return []int64{int64(c.HeadDim)}
	case arch.FFNGate, arch.FFNUp:
		return []int64{ffn, dim}
	case arch.FFNDown:
		return []int64{dim, ffn}
	case arch.RopeFreqs:
		return []int64{int64(c.RopeDim / 2)}
	}
	return nil
}

// check verifies that every tensor the architecture requires is present
// with the shape the config implies, and that optional ones that are
// present have the right shape too.
func (p *Provider) check() error {
	c := &p.Config
	checkOne := func(pattern, name string, required bool) error {
		t, ok := p.tensors[name]
		if !ok {
			if required {
				return &TensorError{Source: p.Path, Tensor: name, Msg: "missing"}
			}
			return nil
		}
		want := p.expectedShape(pattern)
		if want == nil {
			return nil
		}
		got := t.Shape
		// A vector may be stored as [n] or [1, n]; accept both.
		if len(want) == 1 && len(got) == 2 && got[0] == 1 {
			got = got[1:]
		}
		if !slices.Equal(got, want) {
			return &TensorError{Source: p.Path, Tensor: name, Msg: fmt.Sprintf("shape %v (file name %q), want %v from the config", t.Shape, t.FileName, want)}
		}
		return nil
	}
	for _, g := range []struct {
		name     string
		required bool
	}{{arch.TokenEmbedding, true}, {arch.OutputNorm, true}, {arch.Output, false}, {arch.RopeFreqs, false}} {
		if err := checkOne(g.name, g.name, g.required); err != nil {
			return err
		}
	}
	for n := 0; n < c.NLayers; n++ {
		for _, pat := range p.Arch.Required {
			if err := checkOne(pat, arch.Layer(pat, n), true); err != nil {
				return err
			}
		}
		for _, pat := range p.Arch.Optional {
			if err := checkOne(pat, arch.Layer(pat, n), false); err != nil {
				return err
			}
		}
	}
	// Tensors of layers beyond the config are a mismatch, not something to
	// ignore silently.
	for _, f := range p.files {
		if f.Canonical == "" && looksLikeLayerTensor(f.Name) {
			return &TensorError{Source: p.Path, Tensor: f.Name, Msg: fmt.Sprintf("not a tensor of a %d-layer %s model", c.NLayers, c.Architecture)}
		}
	}
	return nil
}

// looksLikeLayerTensor reports whether a name the rules did not map belongs
// to a transformer layer — a tensor the engine would silently ignore.
// Buffers some checkpoints carry (rotary inv_freq) are not weights.
func looksLikeLayerTensor(name string) bool {
	if strings.HasSuffix(name, "rotary_emb.inv_freq") {
		return false
	}
	name = stripHFPrefix(name)
	return strings.HasPrefix(name, "blk.") || strings.HasPrefix(name, "model.layers.")
}
