package convert

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/weftlm/weft/arch"
	"github.com/weftlm/weft/quant"
	"github.com/weftlm/weft/safetensors"
	"github.com/weftlm/weft/weights"
)

// hfName maps canonical names back to transformers' module names.
var hfName = map[string]string{
	arch.TokenEmbedding: "model.embed_tokens",
	arch.OutputNorm:     "model.norm",
	arch.Output:         "lm_head",
	arch.AttnNorm:       "model.layers.{n}.input_layernorm",
	arch.AttnQ:          "model.layers.{n}.self_attn.q_proj",
	arch.AttnK:          "model.layers.{n}.self_attn.k_proj",
	arch.AttnV:          "model.layers.{n}.self_attn.v_proj",
	arch.AttnOut:        "model.layers.{n}.self_attn.o_proj",
	arch.AttnQBias:      "model.layers.{n}.self_attn.q_proj",
	arch.AttnKBias:      "model.layers.{n}.self_attn.k_proj",
	arch.AttnVBias:      "model.layers.{n}.self_attn.v_proj",
	arch.AttnOutBias:    "model.layers.{n}.self_attn.o_proj",
	arch.AttnQNorm:      "model.layers.{n}.self_attn.q_norm",
	arch.AttnKNorm:      "model.layers.{n}.self_attn.k_norm",
	arch.FFNGate:        "model.layers.{n}.mlp.gate_proj",
	arch.FFNUp:          "model.layers.{n}.mlp.up_proj",
	arch.FFNDown:        "model.layers.{n}.mlp.down_proj",
}

// hfModule returns the module and the parameter suffix of a canonical name
// for a family (Gemma names its norms differently).
func hfModule(canonical, family string) (string, error) {
	pattern, n := canonical, ""
	if rest, ok := strings.CutPrefix(canonical, "layers."); ok {
		num, tail, _ := strings.Cut(rest, ".")
		pattern, n = "layers.{n}."+tail, num
	}
	var mod string
	switch {
	case pattern == arch.FFNNorm && family == "gemma3":
		mod = "model.layers.{n}.pre_feedforward_layernorm"
	case pattern == arch.FFNNorm:
		mod = "model.layers.{n}.post_attention_layernorm"
	case pattern == arch.AttnPostNorm:
		mod = "model.layers.{n}.post_attention_layernorm"
	case pattern == arch.FFNPostNorm:
		mod = "model.layers.{n}.post_feedforward_layernorm"
	default:
		var ok bool
		if mod, ok = hfName[pattern]; !ok {
			return "", fmt.Errorf("no Hugging Face name for tensor %q", canonical)
		}
	}
	return strings.Replace(mod, "{n}", n, 1), nil
}

// WriteMLX writes a Hugging Face model p as an MLX affine-quantized
// directory: every 2-D weight whose rows divide into groups becomes a
// packed uint32 .weight with float16 .scales and .biases; vectors stay as
// they are. config.json gains MLX's "quantization" block.
func WriteMLX(p *weights.Provider, dir string, bits, groupSize int) error {
	if p.Format != weights.Safetensors {
		return fmt.Errorf("convert %s: MLX output needs a Hugging Face source", p.Path)
	}
	raw, ok := p.ExtraMetadata()[weights.ConfigFile].(map[string]any)
	if !ok {
		return fmt.Errorf("convert %s: no config.json to copy", p.Path)
	}
	cfg := map[string]any{}
	for k, v := range raw {
		cfg[k] = v
	}
	q := map[string]any{"group_size": groupSize, "bits": bits}
	cfg["quantization"], cfg["quantization_config"] = q, q
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	w := safetensors.NewWriter()
	w.SetMetadata("format", "mlx")
	for _, t := range p.Tensors() {
		mod, err := hfModule(t.Name, p.Arch.Name)
		if err != nil {
			return fmt.Errorf("convert %s: %w", p.Path, err)
		}
		suffix := ".weight"
		if strings.HasSuffix(t.Name, ".bias") {
			suffix = ".bias"
		}
		vals, err := Floats(p, t)
		if err != nil {
			return err
		}
		if len(t.Shape) != 2 || int(t.Cols())%groupSize != 0 {
			if err := w.Add(mod+suffix, safetensors.F32, t.Shape, f32Bytes(vals)); err != nil {
				return err
			}
			continue
		}
		rows, cols := int(t.Rows()), int(t.Cols())
		packed := make([]byte, rows*quant.MLXPackedBytes(cols, bits))
		groups := cols / groupSize
		scales, biases := make([]float32, rows*groups), make([]float32, rows*groups)
		rb := quant.MLXPackedBytes(cols, bits)
		for r := 0; r < rows; r++ {
			if err := quant.MLXQuantize(bits, groupSize, vals[r*cols:(r+1)*cols], packed[r*rb:(r+1)*rb],
				scales[r*groups:(r+1)*groups], biases[r*groups:(r+1)*groups]); err != nil {
				return fmt.Errorf("convert %s: tensor %q row %d: %w", p.Path, t.Name, r, err)
			}
		}
		if err := w.Add(mod+".weight", safetensors.U32, []int64{int64(rows), int64(rb / 4)}, packed); err != nil {
			return err
		}
		if err := w.Add(mod+".scales", safetensors.F16, []int64{int64(rows), int64(groups)}, f16Bytes(scales)); err != nil {
			return err
		}
		if err := w.Add(mod+".biases", safetensors.F16, []int64{int64(rows), int64(groups)}, f16Bytes(biases)); err != nil {
			return err
		}
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), w); err != nil {
		return err
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, weights.ConfigFile), append(b, '\n'), 0o644)
}

func f32Bytes(v []float32) []byte {
	b, _ := encode(0, v) // F32 is ggml type 0
	return b
}

func f16Bytes(v []float32) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		h := quant.F32ToF16(x)
		b[2*i], b[2*i+1] = byte(h), byte(h>>8)
	}
	return b
}
