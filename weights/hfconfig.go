package weights

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"

	"github.com/weftlm/weft/arch"
)

// maxConfigBytes bounds config.json; real ones are a few KB.
const maxConfigBytes = 16 << 20

// jsonObj is a decoded JSON object with typed, error-recording getters.
type jsonObj struct {
	m      map[string]any
	path   string // "text_config." for nested objects
	source string
	err    *error
}

func (o jsonObj) fail(key, format string, args ...any) {
	if *o.err == nil {
		*o.err = &ConfigError{Source: o.source, Field: o.path + key, Msg: fmt.Sprintf(format, args...)}
	}
}

func (o jsonObj) has(key string) bool {
	v, ok := o.m[key]
	return ok && v != nil
}

func (o jsonObj) num(key string) (float64, bool) {
	v, ok := o.m[key]
	if !ok || v == nil {
		return 0, false
	}
	n, ok := v.(json.Number)
	if !ok {
		o.fail(key, "want a number, got %T", v)
		return 0, false
	}
	f, err := n.Float64()
	if err != nil {
		o.fail(key, "bad number %s", n)
		return 0, false
	}
	return f, true
}

func (o jsonObj) int(key string) (int, bool) {
	f, ok := o.num(key)
	if !ok {
		return 0, false
	}
	if f != math.Trunc(f) || f < 0 || f > math.MaxInt32 {
		o.fail(key, "want a non-negative integer, got %v", f)
		return 0, false
	}
	return int(f), true
}

func (o jsonObj) str(key string) (string, bool) {
	v, ok := o.m[key]
	if !ok || v == nil {
		return "", false
	}
	s, ok := v.(string)
	if !ok {
		o.fail(key, "want a string, got %T", v)
	}
	return s, ok
}

func (o jsonObj) boolean(key string) (bool, bool) {
	v, ok := o.m[key]
	if !ok || v == nil {
		return false, false
	}
	b, ok := v.(bool)
	if !ok {
		o.fail(key, "want true or false, got %T", v)
	}
	return b, ok
}

func (o jsonObj) obj(key string) (jsonObj, bool) {
	v, ok := o.m[key]
	if !ok || v == nil {
		return jsonObj{}, false
	}
	m, ok := v.(map[string]any)
	if !ok {
		o.fail(key, "want an object, got %T", v)
		return jsonObj{}, false
	}
	return jsonObj{m: m, path: o.path + key + ".", source: o.source, err: o.err}, true
}

func (o jsonObj) strings(key string) ([]string, bool) {
	v, ok := o.m[key]
	if !ok || v == nil {
		return nil, false
	}
	arr, ok := v.([]any)
	if !ok {
		o.fail(key, "want an array, got %T", v)
		return nil, false
	}
	out := make([]string, len(arr))
	for i, e := range arr {
		s, ok := e.(string)
		if !ok {
			o.fail(key, "element %d is %T, want a string", i, e)
			return nil, false
		}
		out[i] = s
	}
	return out, true
}

// ParseHFConfig reads a Hugging Face config.json: the plain form, the
// multimodal form whose language model sits under "text_config", the
// transformers 5 "rope_parameters" and "layer_types", and MLX's
// "quantization" block.
func ParseHFConfig(data []byte, source string) (Config, *arch.Descriptor, error) {
	var c Config
	if len(data) > maxConfigBytes {
		return c, nil, &ConfigError{Source: source, Field: "(file)", Msg: fmt.Sprintf("%d bytes is too large for a config", len(data))}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var top map[string]any
	if err := dec.Decode(&top); err != nil {
		return c, nil, &ConfigError{Source: source, Field: "(file)", Msg: "not a JSON object: " + err.Error()}
	}
	var firstErr error
	root := jsonObj{m: top, source: source, err: &firstErr}
	o := root
	if tc, ok := root.obj("text_config"); ok {
		o = tc
	}
	mt, ok := o.str("model_type")
	if !ok {
		mt, ok = root.str("model_type")
	}
	if !ok {
		if firstErr != nil {
			return c, nil, firstErr
		}
		return c, nil, &ConfigError{Source: source, Field: o.path + "model_type", Msg: "missing"}
	}
	d, err := arch.Lookup(mt)
	if err != nil {
		return c, nil, &ConfigError{Source: source, Field: o.path + "model_type", Msg: err.Error()}
	}
	c.Architecture = d.Name

	need := func(key string) int {
		v, ok := o.int(key)
		if !ok && firstErr == nil {
			o.fail(key, "missing")
		}
		return v
	}
	c.Dim = need("hidden_size")
	c.NLayers = need("num_hidden_layers")
	c.NHeads = need("num_attention_heads")
	c.FFNDim = need("intermediate_size")
	c.VocabSize = need("vocab_size")
	c.NKVHeads = c.NHeads
	if v, ok := o.int("num_key_value_heads"); ok {
		c.NKVHeads = v
	}
	if v, ok := o.int("head_dim"); ok && v > 0 {
		c.HeadDim = v
	} else if c.NHeads > 0 {
		c.HeadDim = c.Dim / c.NHeads
	}
	c.RopeDim = c.HeadDim
	if v, ok := o.num("partial_rotary_factor"); ok {
		c.RopeDim = int(float64(c.HeadDim) * v)
	}
	c.ContextLength = need("max_position_embeddings")
	c.NormEps = 1e-6
	if v, ok := o.num("rms_norm_eps"); ok {
		c.NormEps = v
	}
	c.RopeTheta = 10000
	if v, ok := o.num("rope_theta"); ok {
		c.RopeTheta = v
	}
	if v, ok := o.num("rope_local_base_freq"); ok {
		c.RopeLocalTheta = v
	}
	if rs, ok := o.obj("rope_scaling"); ok {
		c.RopeScaling = parseRopeScaling(rs)
	}
	// transformers 5: rope_parameters holds theta and scaling, either
	// directly or per attention type.
	if rp, ok := o.obj("rope_parameters"); ok {
		full, hasFull := rp.obj("full_attention")
		if !hasFull {
			full = rp
		}
		if v, ok := full.num("rope_theta"); ok {
			c.RopeTheta = v
		}
		c.RopeScaling = parseRopeScaling(full)
		if sl, ok := rp.obj("sliding_attention"); ok {
			if v, ok := sl.num("rope_theta"); ok {
				c.RopeLocalTheta = v
			}
		}
	}
	c.TiedEmbeddings = d.TiedByDefault
	if v, ok := o.boolean("tie_word_embeddings"); ok {
		c.TiedEmbeddings = v
	} else if v, ok := root.boolean("tie_word_embeddings"); ok {
		c.TiedEmbeddings = v
	}

	useSliding := true
	if v, ok := o.boolean("use_sliding_window"); ok {
		useSliding = v
	}
	if v, ok := o.int("sliding_window"); ok && useSliding {
		c.SlidingWindow = v
	}
	if lt, ok := o.strings("layer_types"); ok && c.SlidingWindow > 0 {
		c.SlidingLayers = make([]bool, len(lt))
		for i, t := range lt {
			switch t {
			case "sliding_attention":
				c.SlidingLayers[i] = true
			case "full_attention":
			default:
				o.fail("layer_types", "element %d is %q, want sliding_attention or full_attention", i, t)
			}
		}
	} else if p, ok := o.int("sliding_window_pattern"); ok && p > 0 && c.SlidingWindow > 0 && c.NLayers > 0 {
		c.SlidingLayers = make([]bool, c.NLayers)
		for i := range c.SlidingLayers {
			c.SlidingLayers[i] = (i+1)%p != 0
		}
	} else if c.SlidingWindow > 0 && d.SlidingWindowPattern == 0 && c.SlidingWindow < c.ContextLength && c.NLayers > 0 {
		// Mistral-style: every layer uses the window.
		c.SlidingLayers = make([]bool, c.NLayers)
		for i := range c.SlidingLayers {
			c.SlidingLayers[i] = true
		}
	}
	if d.AttnScaleFromConfig {
		if v, ok := o.num("query_pre_attn_scalar"); ok && v > 0 {
			c.AttnScale = 1 / math.Sqrt(v)
		} else if c.HeadDim > 0 {
			c.AttnScale = 1 / math.Sqrt(float64(c.HeadDim))
		}
	}
	c.AttnSoftcap, _ = o.num("attn_logit_softcapping")
	c.FinalSoftcap, _ = o.num("final_logit_softcapping")

	q, ok := root.obj("quantization")
	if !ok {
		q, ok = root.obj("quantization_config")
	}
	if ok && q.has("bits") {
		c.QuantBits, _ = q.int("bits")
		c.QuantGroupSize, _ = q.int("group_size")
		if c.QuantGroupSize == 0 {
			c.QuantGroupSize = 64
		}
	}
	if firstErr != nil {
		return c, nil, firstErr
	}
	c.RopeLayout = hfRopeLayout
	c.applySliding(d)
	return c, d, nil
}

func parseRopeScaling(rs jsonObj) RopeScaling {
	var s RopeScaling
	t, ok := rs.str("rope_type")
	if !ok {
		t, _ = rs.str("type")
	}
	switch lowerTrim(t) {
	case "", "default", "none":
		s.Type = "none"
		return s
	case "llama3":
		s.Type = "llama3"
		s.LowFreqFactor, _ = rs.num("low_freq_factor")
		s.HighFreqFactor, _ = rs.num("high_freq_factor")
	case "linear":
		s.Type = "linear"
	case "yarn":
		s.Type = "yarn"
	default:
		s.Type = t // Validate rejects it by name
	}
	s.Factor, _ = rs.num("factor")
	s.OriginalCtx, _ = rs.int("original_max_position_embeddings")
	return s
}
