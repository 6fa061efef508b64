package weights

import (
	"fmt"
	"math"
	"strings"

	"github.com/weftlm/weft/arch"
	"github.com/weftlm/weft/gguf"
)

// RopeScaling describes how RoPE frequencies are stretched for long contexts.
type RopeScaling struct {
	Type           string  `json:"type"` // "none", "linear", "llama3", "yarn"
	Factor         float64 `json:"factor,omitempty"`
	LowFreqFactor  float64 `json:"low_freq_factor,omitempty"`  // llama3
	HighFreqFactor float64 `json:"high_freq_factor,omitempty"` // llama3
	OriginalCtx    int     `json:"original_context_length,omitempty"`
}

// Config holds a model's hyperparameters, whatever file they came from.
type Config struct {
	Architecture  string  `json:"architecture"` // canonical family ("llama", "qwen2", …)
	NLayers       int     `json:"n_layers"`
	Dim           int     `json:"dim"`
	NHeads        int     `json:"n_heads"`
	NKVHeads      int     `json:"n_kv_heads"`
	HeadDim       int     `json:"head_dim"`
	FFNDim        int     `json:"ffn_dim"`
	VocabSize     int     `json:"vocab_size"`
	ContextLength int     `json:"context_length"`
	NormEps       float64 `json:"norm_eps"`

	RopeTheta      float64     `json:"rope_theta"`
	RopeLocalTheta float64     `json:"rope_local_theta,omitempty"` // sliding-window layers' base, 0 = RopeTheta
	RopeDim        int         `json:"rope_dim"`                   // rotated dimensions per head (≤ HeadDim)
	RopeScaling    RopeScaling `json:"rope_scaling"`
	// RopeLayout is the pairing RoPE must use for these weights: it depends
	// on the family and on the file's layout (see arch.Rope).
	RopeLayout string `json:"rope_layout"`

	SlidingWindow int    `json:"sliding_window,omitempty"`
	SlidingLayers []bool `json:"sliding_layers,omitempty"` // per layer: true = sliding window

	TiedEmbeddings bool `json:"tied_embeddings"`

	// AttnScale multiplies q·k; 0 means 1/sqrt(HeadDim).
	AttnScale float64 `json:"attn_scale,omitempty"`
	// Soft-capping of attention scores and final logits (0 = none).
	AttnSoftcap  float64 `json:"attn_softcap,omitempty"`
	FinalSoftcap float64 `json:"final_softcap,omitempty"`

	QuantBits      int `json:"quant_bits,omitempty"` // MLX affine quantization
	QuantGroupSize int `json:"quant_group_size,omitempty"`
}

// QDim is the width of the query projection.
func (c *Config) QDim() int { return c.NHeads * c.HeadDim }

// KVDim is the width of the key and value projections.
func (c *Config) KVDim() int { return c.NKVHeads * c.HeadDim }

// ConfigError names the field at fault.
type ConfigError struct {
	Source string // file the config came from
	Field  string
	Msg    string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("config %s: %s: %s", e.Source, e.Field, e.Msg)
}

// Validate checks that the numbers are present and consistent.
func (c *Config) Validate(source string) error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Source: source, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	const limit = 1 << 24 // no real model dimension comes near this
	for _, f := range []struct {
		name string
		v    int
	}{
		{"n_layers", c.NLayers}, {"dim", c.Dim}, {"n_heads", c.NHeads}, {"n_kv_heads", c.NKVHeads},
		{"head_dim", c.HeadDim}, {"ffn_dim", c.FFNDim}, {"vocab_size", c.VocabSize}, {"context_length", c.ContextLength},
	} {
		if f.v <= 0 {
			return bad(f.name, "missing or not positive (%d)", f.v)
		}
		if f.v > limit && f.name != "context_length" && f.name != "vocab_size" {
			return bad(f.name, "%d is implausibly large", f.v)
		}
	}
	if c.NLayers > 4096 {
		return bad("n_layers", "%d is implausibly large", c.NLayers)
	}
	if c.NHeads%c.NKVHeads != 0 {
		return bad("n_kv_heads", "%d does not divide n_heads %d", c.NKVHeads, c.NHeads)
	}
	if c.RopeDim <= 0 || c.RopeDim > c.HeadDim || c.RopeDim%2 != 0 {
		return bad("rope_dim", "%d must be even and within head_dim %d", c.RopeDim, c.HeadDim)
	}
	if !(c.NormEps > 0 && c.NormEps < 1) {
		return bad("norm_eps", "%g is not in (0, 1)", c.NormEps)
	}
	if !(c.RopeTheta > 0) || math.IsInf(c.RopeTheta, 0) {
		return bad("rope_theta", "%g is not positive", c.RopeTheta)
	}
	switch c.RopeScaling.Type {
	case "", "none":
		c.RopeScaling.Type = "none"
	case "linear", "yarn":
		if !(c.RopeScaling.Factor > 0) {
			return bad("rope_scaling.factor", "%g is not positive", c.RopeScaling.Factor)
		}
	case "llama3":
		s := c.RopeScaling
		if !(s.Factor > 0) || !(s.LowFreqFactor > 0) || !(s.HighFreqFactor > s.LowFreqFactor) || s.OriginalCtx <= 0 {
			return bad("rope_scaling", "llama3 scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0 (got %+v)", s)
		}
	default:
		return bad("rope_scaling.type", "unsupported %q", c.RopeScaling.Type)
	}
	if c.SlidingLayers != nil && len(c.SlidingLayers) != c.NLayers {
		return bad("layer_types", "%d entries for %d layers", len(c.SlidingLayers), c.NLayers)
	}
	if c.SlidingWindow < 0 {
		return bad("sliding_window", "negative (%d)", c.SlidingWindow)
	}
	if c.QuantBits != 0 && c.QuantBits != 4 && c.QuantBits != 8 {
		return bad("quantization.bits", "%d unsupported (4 or 8)", c.QuantBits)
	}
	if c.QuantBits != 0 && (c.QuantGroupSize <= 0 || c.QuantGroupSize%8 != 0) {
		return bad("quantization.group_size", "%d unsupported", c.QuantGroupSize)
	}
	return nil
}

// applySliding fills SlidingLayers from the descriptor's pattern when the
// file gave no per-layer types but does give a window.
func (c *Config) applySliding(d *arch.Descriptor) {
	if c.SlidingWindow <= 0 {
		c.SlidingLayers = nil
		return
	}
	if c.SlidingLayers == nil && d.SlidingWindowPattern > 0 {
		c.SlidingLayers = make([]bool, c.NLayers)
		for i := range c.SlidingLayers {
			c.SlidingLayers[i] = (i+1)%d.SlidingWindowPattern != 0
		}
	}
	if c.RopeLocalTheta == 0 && d.LocalRopeTheta > 0 && c.SlidingLayers != nil {
		c.RopeLocalTheta = d.LocalRopeTheta
	}
}

// configFromGGUF reads hyperparameters from GGUF metadata. Keys are looked up
// under the architecture's prefix ("llama.block_count") with a fallback to
// the bare key ("block_count").
func configFromGGUF(md gguf.Metadata, source string) (Config, *arch.Descriptor, error) {
	var c Config
	archName, ok := gguf.GetString(md, "general.architecture")
	if !ok {
		return c, nil, &ConfigError{Source: source, Field: "general.architecture", Msg: "missing"}
	}
	d, err := arch.Lookup(archName)
	if err != nil {
		return c, nil, &ConfigError{Source: source, Field: "general.architecture", Msg: err.Error()}
	}
	c.Architecture = d.Name
	var firstErr error
	get := func(key string) (gguf.Value, bool) {
		if v, ok := md.KV(archName + "." + key); ok {
			return v, true
		}
		return md.KV(key)
	}
	getInt := func(key string, required bool) int {
		v, ok := get(key)
		if !ok {
			if required && firstErr == nil {
				firstErr = &ConfigError{Source: source, Field: archName + "." + key, Msg: "missing"}
			}
			return 0
		}
		if arr, isArr := v.Array(); isArr {
			// Per-layer values (e.g. head_count_kv for some models): take
			// the first and require them all equal.
			xs, err := arr.Int64s()
			if err != nil || len(xs) == 0 {
				if firstErr == nil {
					firstErr = &ConfigError{Source: source, Field: archName + "." + key, Msg: "not an integer array"}
				}
				return 0
			}
			for _, x := range xs {
				if x != xs[0] && firstErr == nil {
					firstErr = &ConfigError{Source: source, Field: archName + "." + key, Msg: "per-layer values differ; unsupported"}
				}
			}
			return int(xs[0])
		}
		u, ok := v.Uint()
		if !ok || u > math.MaxInt32 {
			if firstErr == nil {
				firstErr = &ConfigError{Source: source, Field: archName + "." + key, Msg: fmt.Sprintf("want a non-negative integer, got %s %s", v.Type(), v)}
			}
			return 0
		}
		return int(u)
	}
	getFloat := func(key string) (float64, bool) {
		v, ok := get(key)
		if !ok {
			return 0, false
		}
		f, ok := v.Float()
		if !ok && firstErr == nil {
			firstErr = &ConfigError{Source: source, Field: archName + "." + key, Msg: fmt.Sprintf("want a number, got %s", v.Type())}
		}
		return f, ok
	}

	c.NLayers = getInt("block_count", true)
	c.Dim = getInt("embedding_length", true)
	c.NHeads = getInt("attention.head_count", true)
	c.NKVHeads = getInt("attention.head_count_kv", false)
	if c.NKVHeads == 0 {
		c.NKVHeads = c.NHeads
	}
	c.FFNDim = getInt("feed_forward_length", true)
	c.ContextLength = getInt("context_length", true)
	c.HeadDim = getInt("attention.key_length", false)
	if c.HeadDim == 0 && c.NHeads > 0 {
		c.HeadDim = c.Dim / c.NHeads
	}
	if vl := getInt("attention.value_length", false); vl != 0 && vl != c.HeadDim && firstErr == nil {
		firstErr = &ConfigError{Source: source, Field: archName + ".attention.value_length", Msg: fmt.Sprintf("%d differs from key_length %d; unsupported", vl, c.HeadDim)}
	}
	c.RopeDim = getInt("rope.dimension_count", false)
	if c.RopeDim == 0 {
		c.RopeDim = c.HeadDim
	}
	c.VocabSize = getInt("vocab_size", false)
	if c.VocabSize == 0 {
		if toks, ok := gguf.GetArray(md, "tokenizer.ggml.tokens"); ok {
			c.VocabSize = toks.Len()
		}
	}
	if eps, ok := getFloat("attention.layer_norm_rms_epsilon"); ok {
		c.NormEps = eps
	} else if firstErr == nil {
		firstErr = &ConfigError{Source: source, Field: archName + ".attention.layer_norm_rms_epsilon", Msg: "missing"}
	}
	c.RopeTheta = 10000
	if th, ok := getFloat("rope.freq_base"); ok {
		c.RopeTheta = th
	}
	if st, ok := get("rope.scaling.type"); ok {
		s, _ := st.Str()
		c.RopeScaling.Type = s
		c.RopeScaling.Factor, _ = getFloat("rope.scaling.factor")
		c.RopeScaling.OriginalCtx = getInt("rope.scaling.original_context_length", false)
	} else if f, ok := getFloat("rope.scale_linear"); ok && f != 1 {
		c.RopeScaling = RopeScaling{Type: "linear", Factor: f}
	}
	c.SlidingWindow = getInt("attention.sliding_window", false)
	if v, ok := get("attention.sliding_window_pattern"); ok && c.SlidingWindow > 0 {
		// Either a period (every Nth layer global) or one bool per layer.
		if arr, isArr := v.Array(); isArr {
			flags, err := arr.Int64s()
			if err != nil || len(flags) != c.NLayers {
				if firstErr == nil {
					firstErr = &ConfigError{Source: source, Field: archName + ".attention.sliding_window_pattern", Msg: fmt.Sprintf("want %d booleans", c.NLayers)}
				}
			} else {
				c.SlidingLayers = make([]bool, c.NLayers)
				for i, f := range flags {
					c.SlidingLayers[i] = f != 0
				}
			}
		} else if n, ok := v.Uint(); ok && n > 0 {
			c.SlidingLayers = make([]bool, c.NLayers)
			for i := range c.SlidingLayers {
				c.SlidingLayers[i] = (uint64(i)+1)%n != 0
			}
		}
	}
	if th, ok := getFloat("rope.freq_base_swa"); ok {
		c.RopeLocalTheta = th
	}
	if sc, ok := getFloat("attention.scale"); ok && sc > 0 {
		c.AttnScale = sc
	}
	c.AttnSoftcap, _ = getFloat("attn_logit_softcapping")
	c.FinalSoftcap, _ = getFloat("final_logit_softcapping")
	if firstErr != nil {
		return c, nil, firstErr
	}
	if d.AttnScaleFromConfig && c.HeadDim > 0 && c.AttnScale == 0 {
		// llama.cpp's Gemma 3 scales queries by 1/sqrt(head_dim); the HF
		// config's query_pre_attn_scalar equals head_dim for the released
		// models and is not stored in GGUF.
		c.AttnScale = 1 / math.Sqrt(float64(c.HeadDim))
	}
	c.RopeLayout = d.GGUFRope.String()
	c.applySliding(d)
	return c, d, nil
}

// hfRopeLayout is the RoPE pairing of weights in Hugging Face layout.
var hfRopeLayout = arch.RopeNeoX.String()

func lowerTrim(s string) string { return strings.ToLower(strings.TrimSpace(s)) }
