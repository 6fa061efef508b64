// Package convert writes models in other formats: any model the weight
// provider opens can be written as a GGUF file with llama.cpp's names and
// conventions (at any supported element type), or as an MLX-style
// affine-quantized safetensors directory.
package convert

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/weftlm/weft/arch"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/gguf"
	"github.com/weftlm/weft/quant"
	"github.com/weftlm/weft/weights"
)

// Options control a conversion.
type Options struct {
	// Type is the element type of 2-D weight matrices (default F32).
	// Matrices whose rows are not a whole number of its blocks fall back to
	// Fallback; vectors (norms, biases) stay F32 as llama.cpp keeps them.
	Type ggml.Type
	// Fallback is used where Type does not fit (default Q8_0 for quantized
	// types, else Type's float type).
	Fallback ggml.Type
	// Name is written as general.name.
	Name string
	// Metadata is extra key-value metadata (a tokenizer, say), written
	// after the model's hyperparameters.
	Metadata []gguf.KV
}

// ggufName maps canonical names to llama.cpp's.
var ggufName = map[string]string{
	arch.TokenEmbedding: "token_embd.weight",
	arch.OutputNorm:     "output_norm.weight",
	arch.Output:         "output.weight",
	arch.RopeFreqs:      "rope_freqs.weight",
	arch.AttnNorm:       "blk.{n}.attn_norm.weight",
	arch.AttnQ:          "blk.{n}.attn_q.weight",
	arch.AttnK:          "blk.{n}.attn_k.weight",
	arch.AttnV:          "blk.{n}.attn_v.weight",
	arch.AttnOut:        "blk.{n}.attn_output.weight",
	arch.AttnQBias:      "blk.{n}.attn_q.bias",
	arch.AttnKBias:      "blk.{n}.attn_k.bias",
	arch.AttnVBias:      "blk.{n}.attn_v.bias",
	arch.AttnOutBias:    "blk.{n}.attn_output.bias",
	arch.AttnQNorm:      "blk.{n}.attn_q_norm.weight",
	arch.AttnKNorm:      "blk.{n}.attn_k_norm.weight",
	arch.AttnPostNorm:   "blk.{n}.post_attention_norm.weight",
	arch.FFNNorm:        "blk.{n}.ffn_norm.weight",
	arch.FFNGate:        "blk.{n}.ffn_gate.weight",
	arch.FFNUp:          "blk.{n}.ffn_up.weight",
	arch.FFNDown:        "blk.{n}.ffn_down.weight",
	arch.FFNPostNorm:    "blk.{n}.post_ffw_norm.weight",
}

// GGUFTensorName returns llama.cpp's name for a canonical tensor name.
func GGUFTensorName(canonical string) (string, bool) {
	if n, ok := ggufName[canonical]; ok {
		return n, true
	}
	// layers.N.rest → pattern with {n}
	rest, ok := strings.CutPrefix(canonical, "layers.")
	if !ok {
		return "", false
	}
	num, tail, ok := strings.Cut(rest, ".")
	if !ok {
		return "", false
	}
	pat, ok := ggufName["layers.{n}."+tail]
	if !ok {
		return "", false
	}
	return strings.Replace(pat, "{n}", num, 1), true
}

// WriteGGUF writes the model p as GGUF to w.
func WriteGGUF(p *weights.Provider, w io.Writer, opts Options) error {
	if p.Arch == nil {
		return fmt.Errorf("convert %s: no architecture", p.Path)
	}
	if !quant.QuantizeSupported(opts.Type) {
		return fmt.Errorf("convert %s: cannot write type %s", p.Path, opts.Type)
	}
	if opts.Fallback == 0 {
		opts.Fallback = opts.Type
		if opts.Type.Quantized() {
			opts.Fallback = ggml.Q8_0
		}
	}
	cfg, d := p.Config, p.Arch
	gw := gguf.NewWriter()
	WriteConfig(gw, cfg, d, opts)
	for _, kv := range opts.Metadata {
		gw.SetKV(kv.Key, kv.Value)
	}
	// Weights in Hugging Face layout rotate halves; llama.cpp's llama
	// kernels rotate adjacent pairs, so its converter permutes q and k.
	permute := cfg.RopeLayout == arch.RopeNeoX.String() && d.GGUFRope == arch.RopeInterleaved
	normOffset := float32(0)
	if p.Format == weights.Safetensors {
		normOffset = d.HFNormOffset
	}
	for _, t := range p.Tensors() {
		name, ok := GGUFTensorName(t.Name)
		if !ok {
			return fmt.Errorf("convert %s: no GGUF name for tensor %q", p.Path, t.Name)
		}
		vals, err := Floats(p, t)
		if err != nil {
			return err
		}
		rows, cols := int(t.Rows()), int(t.Cols())
		switch {
		case permute && strings.HasSuffix(t.Name, "attention.q.weight"), permute && strings.HasSuffix(t.Name, "attention.q.bias"):
			vals = permuteRows(vals, cfg.NHeads, rows, len(vals)/rows)
		case permute && strings.HasSuffix(t.Name, "attention.k.weight"), permute && strings.HasSuffix(t.Name, "attention.k.bias"):
			vals = permuteRows(vals, cfg.NKVHeads, rows, len(vals)/rows)
		}
		if len(t.Shape) == 1 && strings.HasSuffix(t.Name, "norm.weight") && normOffset != 0 {
			for i := range vals {
				vals[i] += normOffset
			}
		}
		typ := ggml.F32
		if len(t.Shape) == 2 {
			typ = opts.Type
			if uint64(cols)%typ.BlockSize() != 0 {
				typ = opts.Fallback
				if uint64(cols)%typ.BlockSize() != 0 {
					typ = ggml.F16
				}
			}
		}
		data, err := encode(typ, vals)
		if err != nil {
			return fmt.Errorf("convert %s: tensor %q as %s: %w", p.Path, t.Name, typ, err)
		}
		dims := make([]uint64, len(t.Shape))
		for i, s := range t.Shape {
			dims[len(t.Shape)-1-i] = uint64(s)
		}
		if err := gw.AddTensor(name, typ, dims, data); err != nil {
			return err
		}
	}
	if cfg.RopeScaling.Type == "llama3" && !p.Has(arch.RopeFreqs) {
		factors := llama3Factors(cfg)
		data, _ := encode(ggml.F32, factors)
		if err := gw.AddTensor("rope_freqs.weight", ggml.F32, []uint64{uint64(len(factors))}, data); err != nil {
			return err
		}
	}
	_, err := gw.WriteTo(w)
	return err
}

// WriteConfig writes the hyperparameters under llama.cpp's keys.
func WriteConfig(w *gguf.Writer, c weights.Config, d *arch.Descriptor, opts Options) {
	a := d.Name
	u := func(k string, v int) { w.SetKV(a+"."+k, gguf.Uint32(uint32(v))) }
	w.SetKV("general.architecture", gguf.String(a))
	if opts.Name != "" {
		w.SetKV("general.name", gguf.String(opts.Name))
	}
	u("context_length", c.ContextLength)
	u("embedding_length", c.Dim)
	u("block_count", c.NLayers)
	u("feed_forward_length", c.FFNDim)
	u("attention.head_count", c.NHeads)
	u("attention.head_count_kv", c.NKVHeads)
	if c.HeadDim != c.Dim/c.NHeads {
		u("attention.key_length", c.HeadDim)
		u("attention.value_length", c.HeadDim)
	}
	u("rope.dimension_count", c.RopeDim)
	u("vocab_size", c.VocabSize)
	w.SetKV(a+".rope.freq_base", gguf.Float32(float32(c.RopeTheta)))
	w.SetKV(a+".attention.layer_norm_rms_epsilon", gguf.Float32(float32(c.NormEps)))
	if c.RopeScaling.Type == "linear" {
		w.SetKV(a+".rope.scaling.type", gguf.String("linear"))
		w.SetKV(a+".rope.scaling.factor", gguf.Float32(float32(c.RopeScaling.Factor)))
	}
	if c.SlidingWindow > 0 && c.SlidingLayers != nil {
		u("attention.sliding_window", c.SlidingWindow)
		pattern := make([]gguf.Value, len(c.SlidingLayers))
		for i, s := range c.SlidingLayers {
			pattern[i] = gguf.Bool(s)
		}
		v, _ := gguf.ArrayOf(gguf.TypeBool, pattern)
		w.SetKV(a+".attention.sliding_window_pattern", v)
		if c.RopeLocalTheta > 0 {
			w.SetKV(a+".rope.freq_base_swa", gguf.Float32(float32(c.RopeLocalTheta)))
		}
	}
	if c.AttnSoftcap > 0 {
		w.SetKV(a+".attn_logit_softcapping", gguf.Float32(float32(c.AttnSoftcap)))
	}
	if c.FinalSoftcap > 0 {
		w.SetKV(a+".final_logit_softcapping", gguf.Float32(float32(c.FinalSoftcap)))
	}
	if c.AttnScale > 0 && math.Abs(c.AttnScale-1/math.Sqrt(float64(c.HeadDim))) > 1e-9 {
		w.SetKV(a+".attention.scale", gguf.Float32(float32(c.AttnScale)))
	}
	w.SetKV("general.file_type", gguf.Uint32(fileType(opts.Type)))
}

// fileType is llama.cpp's LLAMA_FTYPE for a uniform element type.
func fileType(t ggml.Type) uint32 {
	switch t {
	case ggml.F32:
		return 0
	case ggml.F16:
		return 1
	case ggml.Q4_0:
		return 2
	case ggml.Q4_1:
		return 3
	case ggml.Q8_0:
		return 7
	case ggml.Q5_0:
		return 8
	case ggml.Q5_1:
		return 9
	case ggml.Q2_K:
		return 10
	case ggml.Q3_K:
		return 12
	case ggml.Q4_K:
		return 15
	case ggml.Q5_K:
		return 17
	case ggml.Q6_K:
		return 18
	case ggml.IQ4_NL:
		return 25
	case ggml.IQ4_XS:
		return 30
	case ggml.BF16:
		return 32
	}
	return 0
}

// llama3Factors are the per-frequency divisors llama.cpp stores as
// rope_freqs.weight for llama 3 scaling.
func llama3Factors(c weights.Config) []float32 {
	s := c.RopeScaling
	half := c.RopeDim / 2
	lowWavelen := float64(s.OriginalCtx) / s.LowFreqFactor
	highWavelen := float64(s.OriginalCtx) / s.HighFreqFactor
	out := make([]float32, half)
	for i := range out {
		freq := 1 / math.Pow(c.RopeTheta, float64(2*i)/float64(c.RopeDim))
		wavelen := 2 * math.Pi / freq
		switch {
		case wavelen < highWavelen:
			out[i] = 1
		case wavelen > lowWavelen:
			out[i] = float32(s.Factor)
		default:
			smooth := (float64(s.OriginalCtx)/wavelen - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
			out[i] = float32(1 / ((1-smooth)/s.Factor + smooth))
		}
	}
	return out
}

// permuteRows reorders each head's rows from rotate-half order to
// adjacent pairs: within a head of 2h rows, row i < h goes to 2i and row
// h+i to 2i+1 (llama.cpp's permute for q and k).
func permuteRows(vals []float32, heads, rows, cols int) []float32 {
	out := make([]float32, len(vals))
	per := rows / heads
	half := per / 2
	for h := 0; h < heads; h++ {
		for i := 0; i < half; i++ {
			for j, src := range []int{i, half + i} {
				dst := h*per + 2*i + j
				copy(out[dst*cols:(dst+1)*cols], vals[(h*per+src)*cols:(h*per+src+1)*cols])
			}
		}
	}
	return out
}

// Floats decodes any tensor of p to float32 (MLX triples included).
func Floats(p *weights.Provider, t *weights.Tensor) ([]float32, error) {
	d, err := p.Data(t.Name)
	if err != nil {
		return nil, err
	}
	n := 1
	for _, s := range t.Shape {
		n *= int(s)
	}
	out := make([]float32, n)
	if t.MLX != nil {
		st, err := ggml.ParseType(t.MLX.ScalesType)
		if err != nil {
			return nil, err
		}
		groups := n / t.MLX.GroupSize
		scales, biases := make([]float32, groups), make([]float32, groups)
		if err := quant.Dequantize(st, d.Scales, scales); err != nil {
			return nil, fmt.Errorf("tensor %q scales: %w", t.Name, err)
		}
		if err := quant.Dequantize(st, d.Biases, biases); err != nil {
			return nil, fmt.Errorf("tensor %q biases: %w", t.Name, err)
		}
		if err := quant.MLXDequantize(t.MLX.Bits, t.MLX.GroupSize, d.Bytes, scales, biases, out); err != nil {
			return nil, fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		return out, nil
	}
	if !t.HasGGML {
		return nil, fmt.Errorf("tensor %q: type %s cannot be converted", t.Name, t.Type)
	}
	if err := quant.Dequantize(t.GGML, d.Bytes, out); err != nil {
		return nil, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	return out, nil
}

func encode(t ggml.Type, vals []float32) ([]byte, error) {
	n, err := t.RowBytes(uint64(len(vals)))
	if err != nil {
		return nil, err
	}
	out := make([]byte, n)
	return out, quant.Quantize(t, vals, out)
}
