// Package synth makes random-weight models of real shapes: a Hugging Face
// config.json in, a GGUF file out, with llama.cpp's tensor names, the
// architecture's every tensor, and a synthetic tokenizer. They exist to
// benchmark at real sizes without downloading real weights.
package synth

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"

	"github.com/weftlm/weft/arch"
	"github.com/weftlm/weft/convert"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/gguf"
	"github.com/weftlm/weft/quant"
	"github.com/weftlm/weft/weights"
)

// Options control the random model.
type Options struct {
	Type ggml.Type // element type of the matrices (vectors stay F32)
	Seed uint64
	// Std is the standard deviation of the weights (default 0.02, the
	// usual initialisation scale, which keeps activations finite through
	// many layers).
	Std float64
	// Name is written as general.name.
	Name string
}

// tensorSpec is one tensor to generate, shape outermost first.
type tensorSpec struct {
	canonical string
	shape     []int64
	norm      bool // a norm weight: 1 + noise (Gemma: noise only, it adds 1)
}

func specs(c weights.Config, d *arch.Descriptor) []tensorSpec {
	dim, q, kv, ffn, vocab := int64(c.Dim), int64(c.QDim()), int64(c.KVDim()), int64(c.FFNDim), int64(c.VocabSize)
	shape := map[string][]int64{
		arch.AttnNorm: {dim}, arch.FFNNorm: {dim}, arch.AttnPostNorm: {dim}, arch.FFNPostNorm: {dim},
		arch.AttnQ: {q, dim}, arch.AttnK: {kv, dim}, arch.AttnV: {kv, dim}, arch.AttnOut: {dim, q},
		arch.AttnQNorm: {int64(c.HeadDim)}, arch.AttnKNorm: {int64(c.HeadDim)},
		arch.FFNGate: {ffn, dim}, arch.FFNUp: {ffn, dim}, arch.FFNDown: {dim, ffn},
		arch.AttnQBias: {q}, arch.AttnKBias: {kv}, arch.AttnVBias: {kv},
	}
	isNorm := func(p string) bool {
		return p == arch.AttnNorm || p == arch.FFNNorm || p == arch.AttnPostNorm || p == arch.FFNPostNorm || p == arch.AttnQNorm || p == arch.AttnKNorm
	}
	out := []tensorSpec{{canonical: arch.TokenEmbedding, shape: []int64{vocab, dim}}}
	for l := 0; l < c.NLayers; l++ {
		pats := append([]string{}, d.Required...)
		if d.QKVBias {
			pats = append(pats, arch.AttnQBias, arch.AttnKBias, arch.AttnVBias)
		}
		for _, p := range pats {
			out = append(out, tensorSpec{canonical: arch.Layer(p, l), shape: shape[p], norm: isNorm(p)})
		}
	}
	out = append(out, tensorSpec{canonical: arch.OutputNorm, shape: []int64{dim}, norm: true})
	if !c.TiedEmbeddings {
		out = append(out, tensorSpec{canonical: arch.Output, shape: []int64{vocab, dim}})
	}
	return out
}

// Write generates the model described by the config c and
// writes it as GGUF to w. Tensors are generated one at a time while being
// written, so memory stays near one tensor's size.
func Write(w io.Writer, c weights.Config, d *arch.Descriptor, opts Options) error {
	if opts.Std == 0 {
		opts.Std = 0.02
	}
	if c.VocabSize < 259 {
		return fmt.Errorf("synth: vocabulary of %d is smaller than the 259 tokens the synthetic tokenizer needs", c.VocabSize)
	}
	if !quant.QuantizeSupported(opts.Type) {
		return fmt.Errorf("synth: cannot write type %s", opts.Type)
	}
	// The GGUF's rope layout is the family's GGUF layout: weights are
	// random, so there is nothing to permute.
	c.RopeLayout = d.GGUFRope.String()
	gw := gguf.NewWriter()
	convert.WriteConfig(gw, c, d, convert.Options{Type: opts.Type, Name: opts.Name})
	for _, kv := range Tokenizer(c.VocabSize) {
		gw.SetKV(kv.Key, kv.Value)
	}
	for i, s := range specs(c, d) {
		name, ok := convert.GGUFTensorName(s.canonical)
		if !ok {
			return fmt.Errorf("synth: no GGUF name for %q", s.canonical)
		}
		typ := ggml.F32
		if len(s.shape) == 2 {
			typ = opts.Type
			if uint64(s.shape[1])%typ.BlockSize() != 0 {
				typ = ggml.Q8_0
				if uint64(s.shape[1])%32 != 0 {
					typ = ggml.F16
				}
			}
		}
		dims := make([]uint64, len(s.shape))
		for j, v := range s.shape {
			dims[len(s.shape)-1-j] = uint64(v)
		}
		rng := rand.New(rand.NewPCG(opts.Seed, uint64(i)))
		// Norm gains are 1 + noise (GGUF stores Gemma's as 1+w too).
		spec := s
		if err := gw.AddTensorFunc(name, typ, dims, func(out io.Writer) error {
			return fill(out, typ, spec.shape, rng, opts.Std, spec.norm)
		}); err != nil {
			return err
		}
	}
	bw := bufio.NewWriterSize(w, 4<<20)
	if _, err := gw.WriteTo(bw); err != nil {
		return err
	}
	return bw.Flush()
}

// fill writes a tensor row by row: normal(0, std) values, or offset +
// normal(0, std) for norm weights — 1 + normal(0, std) — quantized to typ.
func fill(w io.Writer, typ ggml.Type, shape []int64, rng *rand.Rand, std float64, norm bool) error {
	cols := int(shape[len(shape)-1])
	rows := 1
	for _, s := range shape[:len(shape)-1] {
		rows *= int(s)
	}
	rb, err := typ.RowBytes(uint64(cols))
	if err != nil {
		return err
	}
	// Quantize a batch of rows at a time to amortise the call.
	batch := max(1, (1<<20)/cols)
	vals := make([]float32, batch*cols)
	buf := make([]byte, batch*int(rb))
	for r := 0; r < rows; r += batch {
		n := min(batch, rows-r)
		v := vals[:n*cols]
		for i := range v {
			x := rng.NormFloat64() * std
			if norm {
				x++
			}
			v[i] = float32(x)
		}
		if err := quant.Quantize(typ, v, buf[:n*int(rb)]); err != nil {
			return err
		}
		if _, err := w.Write(buf[:n*int(rb)]); err != nil {
			return err
		}
	}
	return nil
}

// Tokenizer returns GGUF metadata for a synthetic SentencePiece-style
// vocabulary of n tokens: <unk>, <s>, </s>, the 256 byte tokens, then
// pieces "▁t3", "▁t4", … so any text encodes (by byte fallback) and every
// id decodes.
func Tokenizer(n int) []gguf.KV {
	tokens := make([]string, n)
	scores := make([]float32, n)
	types := make([]int32, n)
	tokens[0], tokens[1], tokens[2] = "<unk>", "<s>", "</s>"
	types[0], types[1], types[2] = 2, 3, 3
	for b := 0; b < 256; b++ {
		tokens[3+b] = fmt.Sprintf("<0x%02X>", b)
		types[3+b] = 6
	}
	for i := 259; i < n; i++ {
		tokens[i] = fmt.Sprintf("▁t%d", i)
		scores[i] = -float32(i)
		types[i] = 1
	}
	return []gguf.KV{
		{Key: "tokenizer.ggml.model", Value: gguf.String("llama")},
		{Key: "tokenizer.ggml.pre", Value: gguf.String("default")},
		{Key: "tokenizer.ggml.tokens", Value: gguf.Strings(tokens)},
		{Key: "tokenizer.ggml.scores", Value: gguf.Float32s(scores)},
		{Key: "tokenizer.ggml.token_type", Value: gguf.Int32s(types)},
		{Key: "tokenizer.ggml.bos_token_id", Value: gguf.Uint32(1)},
		{Key: "tokenizer.ggml.eos_token_id", Value: gguf.Uint32(2)},
		{Key: "tokenizer.ggml.unknown_token_id", Value: gguf.Uint32(0)},
		{Key: "tokenizer.ggml.add_bos_token", Value: gguf.Bool(true)},
	}
}
