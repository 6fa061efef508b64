package weights

import (
	"strconv"
	"strings"

	"github.com/weftlm/weft/arch"
)

// nameRule maps one file naming pattern to a canonical one. {n} stands for
// the layer index. archs, when set, limits the rule to those families.
type nameRule struct {
	file      string
	canonical string
	archs     []string
}

// ggufRules follow llama.cpp's tensor names.
var ggufRules = []nameRule{
	{"token_embd.weight", arch.TokenEmbedding, nil},
	{"output_norm.weight", arch.OutputNorm, nil},
	{"output.weight", arch.Output, nil},
	{"rope_freqs.weight", arch.RopeFreqs, nil},
	{"blk.{n}.attn_norm.weight", arch.AttnNorm, nil},
	{"blk.{n}.attn_q.weight", arch.AttnQ, nil},
	{"blk.{n}.attn_k.weight", arch.AttnK, nil},
	{"blk.{n}.attn_v.weight", arch.AttnV, nil},
	{"blk.{n}.attn_output.weight", arch.AttnOut, nil},
	{"blk.{n}.attn_q.bias", arch.AttnQBias, nil},
	{"blk.{n}.attn_k.bias", arch.AttnKBias, nil},
	{"blk.{n}.attn_v.bias", arch.AttnVBias, nil},
	{"blk.{n}.attn_output.bias", arch.AttnOutBias, nil},
	{"blk.{n}.attn_q_norm.weight", arch.AttnQNorm, nil},
	{"blk.{n}.attn_k_norm.weight", arch.AttnKNorm, nil},
	{"blk.{n}.post_attention_norm.weight", arch.AttnPostNorm, nil},
	{"blk.{n}.ffn_norm.weight", arch.FFNNorm, nil},
	{"blk.{n}.ffn_gate.weight", arch.FFNGate, nil},
	{"blk.{n}.ffn_up.weight", arch.FFNUp, nil},
	{"blk.{n}.ffn_down.weight", arch.FFNDown, nil},
	{"blk.{n}.post_ffw_norm.weight", arch.FFNPostNorm, nil},
	{"blk.{n}.rope_freqs.weight", "layers.{n}.rope_freqs.weight", nil},
}

// hfRules follow transformers' module names (after prefix stripping, see
// stripHFPrefix). MLX quantized layers add ".scales" and ".biases" beside
// ".weight"; those map to the same canonical stem.
var hfRules = []nameRule{
	{"model.embed_tokens.weight", arch.TokenEmbedding, nil},
	{"model.norm.weight", arch.OutputNorm, nil},
	{"lm_head.weight", arch.Output, nil},
	{"model.layers.{n}.input_layernorm.weight", arch.AttnNorm, nil},
	{"model.layers.{n}.self_attn.q_proj.weight", arch.AttnQ, nil},
	{"model.layers.{n}.self_attn.k_proj.weight", arch.AttnK, nil},
	{"model.layers.{n}.self_attn.v_proj.weight", arch.AttnV, nil},
	{"model.layers.{n}.self_attn.o_proj.weight", arch.AttnOut, nil},
	{"model.layers.{n}.self_attn.q_proj.bias", arch.AttnQBias, nil},
	{"model.layers.{n}.self_attn.k_proj.bias", arch.AttnKBias, nil},
	{"model.layers.{n}.self_attn.v_proj.bias", arch.AttnVBias, nil},
	{"model.layers.{n}.self_attn.o_proj.bias", arch.AttnOutBias, nil},
	{"model.layers.{n}.self_attn.q_norm.weight", arch.AttnQNorm, nil},
	{"model.layers.{n}.self_attn.k_norm.weight", arch.AttnKNorm, nil},
	// Gemma names its norms differently: "post_attention_layernorm" is the
	// norm of the attention output, "pre_feedforward_layernorm" the FFN's
	// input norm. Elsewhere "post_attention_layernorm" is the FFN input norm.
	{"model.layers.{n}.post_attention_layernorm.weight", arch.FFNNorm, []string{"llama", "qwen2", "qwen3"}},
	{"model.layers.{n}.post_attention_layernorm.weight", arch.AttnPostNorm, []string{"gemma3"}},
	{"model.layers.{n}.pre_feedforward_layernorm.weight", arch.FFNNorm, []string{"gemma3"}},
	{"model.layers.{n}.post_feedforward_layernorm.weight", arch.FFNPostNorm, []string{"gemma3"}},
	{"model.layers.{n}.mlp.gate_proj.weight", arch.FFNGate, nil},
	{"model.layers.{n}.mlp.up_proj.weight", arch.FFNUp, nil},
	{"model.layers.{n}.mlp.down_proj.weight", arch.FFNDown, nil},
}

// hfPrefixes are the wrappers multimodal checkpoints put around the
// language model, mapped to the plain "model." prefix.
var hfPrefixes = []struct{ from, to string }{
	{"model.language_model.", "model."},
	{"language_model.model.", "model."},
	{"language_model.lm_head.", "lm_head."},
	{"language_model.", ""},
}

func stripHFPrefix(name string) string {
	for _, p := range hfPrefixes {
		if strings.HasPrefix(name, p.from) {
			return p.to + name[len(p.from):]
		}
	}
	return name
}

// namer resolves file names to canonical names for one family: each rule's
// {n} is matched against a decimal layer index below nLayers.
type namer struct {
	exact   map[string]string // file name (no {n}) -> canonical
	layered []nameRule        // rules with {n}
	nLayers int
}

func newNamer(rules []nameRule, family string, nLayers int) *namer {
	nm := &namer{exact: map[string]string{}, nLayers: nLayers}
	for _, r := range rules {
		if r.archs != nil && !contains(r.archs, family) {
			continue
		}
		if strings.Contains(r.file, "{n}") {
			nm.layered = append(nm.layered, r)
		} else {
			nm.exact[r.file] = r.canonical
		}
	}
	return nm
}

// canonical returns the canonical name of a file tensor name, or "".
func (nm *namer) canonical(name string) string {
	if c, ok := nm.exact[name]; ok {
		return c
	}
	for _, r := range nm.layered {
		pre, post, _ := strings.Cut(r.file, "{n}")
		if !strings.HasPrefix(name, pre) || !strings.HasSuffix(name, post) || len(name) <= len(pre)+len(post) {
			continue
		}
		digits := name[len(pre) : len(name)-len(post)]
		n, err := strconv.Atoi(digits)
		if err != nil || n < 0 || n >= nm.nLayers || strconv.Itoa(n) != digits {
			continue
		}
		return arch.Layer(r.canonical, n)
	}
	return ""
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}
