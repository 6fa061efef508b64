package engine

import (
	"fmt"
	"math"

	"github.com/weftlm/weft/arch"
	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/quant"
	"github.com/weftlm/weft/weights"
)

// builder turns a descriptor, a config and the weights into the per-token
// plan. This is the only model code in weft: it reads the descriptor's
// fields once, here, so the plan it emits has no branches left.
type builder struct {
	p     *weights.Provider
	cfg   *weights.Config
	d     *arch.Descriptor
	prog  *backend.Program
	names map[string]backend.WeightID
	// normOffset is added to norm weights: Gemma in Hugging Face layout.
	normOffset float32
	progress   func(done, total int)
	total      int // tensors to prepare, for progress
}

func (b *builder) prepared() {
	if b.progress != nil {
		b.progress(min(len(b.prog.Weights), b.total), b.total)
	}
}

// activation buffers of the plan
type bufs struct {
	x, xn, q, k, v, att, o, gate, up, ffnOut, sel, selN, logits backend.BufID
}

func (b *builder) buf(cols int) backend.BufID {
	b.prog.Bufs = append(b.prog.Bufs, cols)
	return backend.BufID(len(b.prog.Bufs) - 1)
}

// matrix registers a weight by canonical name (once) for multiplication.
func (b *builder) matrix(name string) (backend.WeightID, error) {
	if id, ok := b.names[name]; ok {
		return id, nil
	}
	t, ok := b.p.Tensor(name)
	if !ok {
		return 0, fmt.Errorf("tensor %q missing", name)
	}
	d, err := b.p.Data(name)
	if err != nil {
		return 0, err
	}
	b.prog.Weights = append(b.prog.Weights, backend.Weight{Name: name, Tensor: t, Data: d})
	id := backend.WeightID(len(b.prog.Weights) - 1)
	b.names[name] = id
	b.prepared()
	return id, nil
}

// vector registers a norm weight or bias as float32 with offset added.
func (b *builder) vector(name string, offset float32) (backend.WeightID, error) {
	v, err := b.floats(name)
	if err != nil {
		return 0, err
	}
	for i := range v {
		v[i] += offset
	}
	b.prog.Weights = append(b.prog.Weights, backend.Weight{Name: name, F32: v})
	b.prepared()
	return backend.WeightID(len(b.prog.Weights) - 1), nil
}

// optionalVector is vector for tensors a file may omit.
func (b *builder) optionalVector(name string) (backend.WeightID, error) {
	if !b.p.Has(name) {
		return backend.NoWeight, nil
	}
	return b.vector(name, 0)
}

// floats decodes a small tensor to float32.
func (b *builder) floats(name string) ([]float32, error) {
	t, ok := b.p.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("tensor %q missing", name)
	}
	if !t.HasGGML || t.MLX != nil {
		return nil, fmt.Errorf("tensor %q: type %s cannot be read as floats", name, t.Type)
	}
	d, err := b.p.Data(name)
	if err != nil {
		return nil, err
	}
	n := uint64(1)
	for _, s := range t.Shape {
		n *= uint64(s)
	}
	out := make([]float32, n)
	if t.GGML == ggml.F32 || t.GGML == ggml.F16 || t.GGML == ggml.BF16 || t.GGML.Quantized() {
		if err := quant.Dequantize(t.GGML, d.Bytes, out); err != nil {
			return nil, fmt.Errorf("tensor %q: %w", name, err)
		}
		return out, nil
	}
	return nil, fmt.Errorf("tensor %q: type %s cannot be read as floats", name, t.Type)
}

// buildProgram emits the plan of a decoder-only transformer.
func buildProgram(p *weights.Provider, maxRows, slots, ctx int, progress func(done, total int)) (*backend.Program, error) {
	cfg, d := &p.Config, p.Arch
	b := &builder{p: p, cfg: cfg, d: d, names: map[string]backend.WeightID{}, progress: progress, total: len(p.Tensors()),
		prog: &backend.Program{MaxRows: maxRows, Slots: slots, Context: ctx, Vocab: cfg.VocabSize}}
	if p.Format == weights.Safetensors {
		b.normOffset = d.HFNormOffset
	}
	layout := backend.RopeInterleaved
	if cfg.RopeLayout == arch.RopeNeoX.String() {
		layout = backend.RopeNeoX
	}
	hd := cfg.HeadDim
	var bf bufs
	bf.x, bf.xn = b.buf(cfg.Dim), b.buf(cfg.Dim)
	bf.q, bf.k, bf.v = b.buf(cfg.QDim()), b.buf(cfg.KVDim()), b.buf(cfg.KVDim())
	bf.att, bf.o = b.buf(cfg.QDim()), b.buf(cfg.Dim)
	bf.gate, bf.up, bf.ffnOut = b.buf(cfg.FFNDim), b.buf(cfg.FFNDim), b.buf(cfg.Dim)
	bf.sel, bf.selN, bf.logits = b.buf(cfg.Dim), b.buf(cfg.Dim), b.buf(cfg.VocabSize)

	// RoPE tables: the global one, and the local one of sliding layers.
	var factors []float32
	if p.Has(arch.RopeFreqs) {
		f, err := b.floats(arch.RopeFreqs)
		if err != nil {
			return nil, err
		}
		factors = f
	}
	global, err := ropeInvFreq(cfg.RopeDim, cfg.RopeTheta, cfg.RopeScaling, factors)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.Path, err)
	}
	b.prog.Ropes = append(b.prog.Ropes, backend.RopeTable{InvFreq: global})
	localTable := 0
	if cfg.RopeLocalTheta > 0 && cfg.SlidingLayers != nil {
		local, err := ropeInvFreq(cfg.RopeDim, cfg.RopeLocalTheta, weights.RopeScaling{}, nil)
		if err != nil {
			return nil, err
		}
		b.prog.Ropes = append(b.prog.Ropes, backend.RopeTable{InvFreq: local})
		localTable = 1
	}

	emb, err := b.matrix(arch.TokenEmbedding)
	if err != nil {
		return nil, err
	}
	embScale := float32(1)
	if d.EmbedScaleSqrtDim {
		embScale = float32(math.Sqrt(float64(cfg.Dim)))
	}
	ops := []backend.Op{{Kind: backend.OpEmbed, Layer: -1, Out: bf.x, W: emb, Scale: embScale}}
	attnScale := float32(1 / math.Sqrt(float64(hd)))
	if cfg.AttnScale > 0 {
		attnScale = float32(cfg.AttnScale)
	}
	act := backend.ActSiLU
	if d.Activation == arch.GeGLUTanh {
		act = backend.ActGELUTanh
	}

	for l := 0; l < cfg.NLayers; l++ {
		name := func(pattern string) string { return arch.Layer(pattern, l) }
		w := map[string]backend.WeightID{}
		for _, pat := range []string{arch.AttnQ, arch.AttnK, arch.AttnV, arch.AttnOut, arch.FFNGate, arch.FFNUp, arch.FFNDown} {
			if w[pat], err = b.matrix(name(pat)); err != nil {
				return nil, err
			}
		}
		for _, pat := range []string{arch.AttnNorm, arch.FFNNorm} {
			if w[pat], err = b.vector(name(pat), b.normOffset); err != nil {
				return nil, err
			}
		}
		for _, pat := range []string{arch.AttnQBias, arch.AttnKBias, arch.AttnVBias, arch.AttnOutBias} {
			if w[pat], err = b.optionalVector(name(pat)); err != nil {
				return nil, err
			}
		}
		if d.QKNorm {
			for _, pat := range []string{arch.AttnQNorm, arch.AttnKNorm} {
				if w[pat], err = b.vector(name(pat), b.normOffset); err != nil {
					return nil, err
				}
			}
		}
		if d.PostNorms {
			for _, pat := range []string{arch.AttnPostNorm, arch.FFNPostNorm} {
				if w[pat], err = b.vector(name(pat), b.normOffset); err != nil {
					return nil, err
				}
			}
		}
		eps := float32(cfg.NormEps)
		sliding := cfg.SlidingLayers != nil && cfg.SlidingLayers[l]
		window, table := 0, 0
		capacity := ctx
		if sliding {
			window, table = cfg.SlidingWindow, localTable
			capacity = min(ctx, window+maxRows-1)
		}
		b.prog.Caches = append(b.prog.Caches, backend.Cache{Layer: l, KVDim: cfg.KVDim(), Capacity: capacity})

		ops = append(ops,
			backend.Op{Kind: backend.OpRMSNorm, Layer: l, Out: bf.xn, A: bf.x, W: w[arch.AttnNorm], Eps: eps, Group: cfg.Dim},
			backend.Op{Kind: backend.OpMatMul, Layer: l, Out: bf.q, A: bf.xn, W: w[arch.AttnQ], Bias: w[arch.AttnQBias]},
			backend.Op{Kind: backend.OpMatMul, Layer: l, Out: bf.k, A: bf.xn, W: w[arch.AttnK], Bias: w[arch.AttnKBias]},
			backend.Op{Kind: backend.OpMatMul, Layer: l, Out: bf.v, A: bf.xn, W: w[arch.AttnV], Bias: w[arch.AttnVBias]},
		)
		if d.QKNorm {
			ops = append(ops,
				backend.Op{Kind: backend.OpRMSNorm, Layer: l, Out: bf.q, A: bf.q, W: w[arch.AttnQNorm], Eps: eps, Group: hd},
				backend.Op{Kind: backend.OpRMSNorm, Layer: l, Out: bf.k, A: bf.k, W: w[arch.AttnKNorm], Eps: eps, Group: hd},
			)
		}
		ops = append(ops,
			backend.Op{Kind: backend.OpRope, Layer: l, A: bf.q, Table: table, Layout: layout, NHeads: cfg.NHeads, HeadDim: hd, RopeDim: cfg.RopeDim},
			backend.Op{Kind: backend.OpRope, Layer: l, A: bf.k, Table: table, Layout: layout, NHeads: cfg.NKVHeads, HeadDim: hd, RopeDim: cfg.RopeDim},
			backend.Op{Kind: backend.OpStoreKV, Layer: l, A: bf.k, B: bf.v},
			backend.Op{Kind: backend.OpAttention, Layer: l, Out: bf.att, A: bf.q, NHeads: cfg.NHeads, NKV: cfg.NKVHeads, HeadDim: hd,
				Scale: attnScale, Cap: float32(cfg.AttnSoftcap), Window: window},
			backend.Op{Kind: backend.OpMatMul, Layer: l, Out: bf.o, A: bf.att, W: w[arch.AttnOut], Bias: w[arch.AttnOutBias]},
		)
		if d.PostNorms {
			ops = append(ops, backend.Op{Kind: backend.OpRMSNorm, Layer: l, Out: bf.o, A: bf.o, W: w[arch.AttnPostNorm], Eps: eps, Group: cfg.Dim})
		}
		ops = append(ops,
			backend.Op{Kind: backend.OpAdd, Layer: l, Out: bf.x, A: bf.x, B: bf.o},
			backend.Op{Kind: backend.OpRMSNorm, Layer: l, Out: bf.xn, A: bf.x, W: w[arch.FFNNorm], Eps: eps, Group: cfg.Dim},
			backend.Op{Kind: backend.OpMatMul, Layer: l, Out: bf.gate, A: bf.xn, W: w[arch.FFNGate], Bias: backend.NoWeight},
			backend.Op{Kind: backend.OpMatMul, Layer: l, Out: bf.up, A: bf.xn, W: w[arch.FFNUp], Bias: backend.NoWeight},
			backend.Op{Kind: backend.OpGLU, Layer: l, Out: bf.gate, A: bf.gate, B: bf.up, Act: act},
			backend.Op{Kind: backend.OpMatMul, Layer: l, Out: bf.ffnOut, A: bf.gate, W: w[arch.FFNDown], Bias: backend.NoWeight},
		)
		if d.PostNorms {
			ops = append(ops, backend.Op{Kind: backend.OpRMSNorm, Layer: l, Out: bf.ffnOut, A: bf.ffnOut, W: w[arch.FFNPostNorm], Eps: eps, Group: cfg.Dim})
		}
		ops = append(ops, backend.Op{Kind: backend.OpAdd, Layer: l, Out: bf.x, A: bf.x, B: bf.ffnOut})
	}

	outNorm, err := b.vector(arch.OutputNorm, b.normOffset)
	if err != nil {
		return nil, err
	}
	out := emb
	if p.Has(arch.Output) {
		if out, err = b.matrix(arch.Output); err != nil {
			return nil, err
		}
	}
	ops = append(ops,
		backend.Op{Kind: backend.OpGather, Layer: -1, Out: bf.sel, A: bf.x, OnSelected: true},
		backend.Op{Kind: backend.OpRMSNorm, Layer: -1, Out: bf.selN, A: bf.sel, W: outNorm, Eps: float32(cfg.NormEps), Group: cfg.Dim, OnSelected: true},
		backend.Op{Kind: backend.OpMatMul, Layer: -1, Out: bf.logits, A: bf.selN, W: out, Bias: backend.NoWeight, OnSelected: true, Head: true},
	)
	if cfg.FinalSoftcap > 0 {
		ops = append(ops, backend.Op{Kind: backend.OpSoftcap, Layer: -1, Out: bf.logits, A: bf.logits, Cap: float32(cfg.FinalSoftcap), OnSelected: true, Head: true})
	}
	b.prog.Ops = ops
	b.prog.Logits = bf.logits
	b.prog.Hidden, b.prog.Dim = bf.selN, cfg.Dim
	b.prog.Residual = bf.x
	return b.prog, nil
}
