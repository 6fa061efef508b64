// Package arch describes transformer architectures as data. A Descriptor
// says everything the engine must know about a family — its activation,
// norms, RoPE style, optional tensors — so that no code elsewhere branches on
// an architecture's name.
package arch

import (
	"fmt"
	"sort"
	"strings"
)

// Activation is the feed-forward gating function.
type Activation int

const (
	// SwiGLU is silu(gate(x)) * up(x).
	SwiGLU Activation = iota
	// GeGLUTanh is gelu_tanh(gate(x)) * up(x) (Gemma).
	GeGLUTanh
)

func (a Activation) String() string {
	switch a {
	case SwiGLU:
		return "swiglu"
	case GeGLUTanh:
		return "geglu-tanh"
	}
	return fmt.Sprintf("activation(%d)", int(a))
}

// Rope is the pairing of dimensions that rotary embeddings rotate together.
type Rope int

const (
	// RopeInterleaved rotates adjacent pairs (x0,x1), (x2,x3), … — ggml's
	// "normal" mode, the layout of GGUF llama files whose q/k weights the
	// converter permuted, and of llama2.c models trained that way.
	RopeInterleaved Rope = iota
	// RopeNeoX rotates halves: (x_i, x_{i+d/2}) — transformers' rotate_half.
	RopeNeoX
)

func (r Rope) String() string {
	if r == RopeNeoX {
		return "neox"
	}
	return "interleaved"
}

// Descriptor is one architecture family.
type Descriptor struct {
	Name string // canonical family name: "llama", "qwen2", "qwen3", "gemma3"

	Activation Activation
	// HFNormOffset is added to every RMSNorm weight stored in Hugging Face
	// layout: Gemma computes x*(1+w) and stores w, while llama.cpp's
	// converter stores w+1 in GGUF files, so GGUF needs no offset.
	HFNormOffset float32
	// EmbedScaleSqrtDim multiplies embeddings by sqrt(dim) (Gemma).
	EmbedScaleSqrtDim bool
	// QKNorm applies RMSNorm per head to q and k before RoPE (Qwen3, Gemma3).
	QKNorm bool
	// PostNorms applies RMSNorm to the attention and FFN outputs before the
	// residual add (Gemma 2/3).
	PostNorms bool
	// GGUFRope is the rotary layout of this family's GGUF files; files in
	// Hugging Face layout always use RopeNeoX.
	GGUFRope Rope
	// TiedByDefault: when the output projection is absent the token
	// embedding is used (true for every family here; listed for clarity).
	TiedByDefault bool
	// SlidingWindowPattern: when the config names no per-layer attention
	// types, every Nth layer (1-based: layers N-1, 2N-1, …) is global and
	// the rest use the sliding window. 0 means all layers are global.
	SlidingWindowPattern int
	// LocalRopeTheta is the RoPE base of sliding-window layers (Gemma 3);
	// 0 means the global base.
	LocalRopeTheta float64
	// QKVBias: the family's q, k and v projections carry biases (Qwen2).
	QKVBias bool
	// AttnScaleFromConfig: the attention scale is 1/sqrt(query_pre_attn_scalar)
	// rather than 1/sqrt(head_dim) when the config gives it (Gemma).
	AttnScaleFromConfig bool

	// Required lists the canonical tensors every layer must have ({n} is the
	// layer index); Optional those a file may add (biases, QK norms).
	Required []string
	Optional []string
}

// Canonical per-layer tensor names.
const (
	TokenEmbedding = "token_embedding.weight"
	OutputNorm     = "output_norm.weight"
	Output         = "output.weight"
	RopeFreqs      = "rope_freqs.weight"

	AttnNorm     = "layers.{n}.attention_norm.weight"
	AttnQ        = "layers.{n}.attention.q.weight"
	AttnK        = "layers.{n}.attention.k.weight"
	AttnV        = "layers.{n}.attention.v.weight"
	AttnOut      = "layers.{n}.attention.output.weight"
	AttnQBias    = "layers.{n}.attention.q.bias"
	AttnKBias    = "layers.{n}.attention.k.bias"
	AttnVBias    = "layers.{n}.attention.v.bias"
	AttnOutBias  = "layers.{n}.attention.output.bias"
	AttnQNorm    = "layers.{n}.attention.q_norm.weight"
	AttnKNorm    = "layers.{n}.attention.k_norm.weight"
	AttnPostNorm = "layers.{n}.attention_post_norm.weight"
	FFNNorm      = "layers.{n}.ffn_norm.weight"
	FFNGate      = "layers.{n}.ffn.gate.weight"
	FFNUp        = "layers.{n}.ffn.up.weight"
	FFNDown      = "layers.{n}.ffn.down.weight"
	FFNPostNorm  = "layers.{n}.ffn_post_norm.weight"
)

// Layer expands a per-layer name pattern for layer n.
func Layer(pattern string, n int) string {
	return strings.Replace(pattern, "{n}", fmt.Sprint(n), 1)
}

var base = []string{AttnNorm, AttnQ, AttnK, AttnV, AttnOut, FFNNorm, FFNGate, FFNUp, FFNDown}

var registry = map[string]*Descriptor{
	"llama": {
		Name: "llama", Activation: SwiGLU, GGUFRope: RopeInterleaved, TiedByDefault: true,
		Required: base,
		Optional: []string{AttnQBias, AttnKBias, AttnVBias, AttnOutBias},
	},
	"qwen2": {
		Name: "qwen2", Activation: SwiGLU, GGUFRope: RopeNeoX, TiedByDefault: true, QKVBias: true,
		Required: base,
		Optional: []string{AttnQBias, AttnKBias, AttnVBias, AttnOutBias},
	},
	"qwen3": {
		Name: "qwen3", Activation: SwiGLU, GGUFRope: RopeNeoX, TiedByDefault: true, QKNorm: true,
		Required: append(append([]string{}, base...), AttnQNorm, AttnKNorm),
		Optional: []string{AttnQBias, AttnKBias, AttnVBias, AttnOutBias},
	},
	"gemma3": {
		Name: "gemma3", Activation: GeGLUTanh, GGUFRope: RopeNeoX, TiedByDefault: true,
		HFNormOffset: 1, EmbedScaleSqrtDim: true, QKNorm: true, PostNorms: true,
		SlidingWindowPattern: 6, LocalRopeTheta: 10000, AttnScaleFromConfig: true,
		Required: append(append([]string{}, base...), AttnQNorm, AttnKNorm, AttnPostNorm, FFNPostNorm),
	},
}

// aliases maps other names a file may give (GGUF general.architecture or HF
// model_type) to a family.
var aliases = map[string]string{
	"mistral":     "llama",
	"gemma3_text": "gemma3",
}

// Lookup returns the descriptor for an architecture name as GGUF's
// general.architecture or HF's model_type spells it.
func Lookup(name string) (*Descriptor, error) {
	if a, ok := aliases[name]; ok {
		name = a
	}
	if d, ok := registry[name]; ok {
		return d, nil
	}
	return nil, fmt.Errorf("unsupported architecture %q (supported: %s)", name, strings.Join(Names(), ", "))
}

// Names lists the supported names, aliases included.
func Names() []string {
	var out []string
	for n := range registry {
		out = append(out, n)
	}
	for n := range aliases {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
