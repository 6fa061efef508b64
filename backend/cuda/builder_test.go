package cuda

import (
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/quant"
	"github.com/weftlm/weft/weights"
)

// progBuilder assembles small Programs by hand for the op tests: random
// weights in any stored type, and inputs filled by embedding random
// float32 tables so both backends start from identical activations.
type progBuilder struct {
	t   testing.TB
	p   *backend.Program
	rng *rand.Rand
}

func newProg(t testing.TB, seed uint64, maxRows, slots, context, vocab int) *progBuilder {
	return &progBuilder{t: t, rng: rand.New(rand.NewPCG(seed, 7)),
		p: &backend.Program{MaxRows: maxRows, Slots: slots, Context: context, Vocab: vocab}}
}

func (b *progBuilder) buf(cols int) backend.BufID {
	b.p.Bufs = append(b.p.Bufs, cols)
	return backend.BufID(len(b.p.Bufs) - 1)
}

func (b *progBuilder) randn(n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(b.rng.NormFloat64()) * scale
	}
	return v
}

// vec adds a float32 vector weight.
func (b *progBuilder) vec(n int, mean, scale float32) backend.WeightID {
	v := b.randn(n, scale)
	for i := range v {
		v[i] += mean
	}
	b.p.Weights = append(b.p.Weights, backend.Weight{Name: "vec", F32: v})
	return backend.WeightID(len(b.p.Weights) - 1)
}

// mat adds a [rows, cols] matrix of random values stored as typ.
func (b *progBuilder) mat(typ string, rows, cols int, scale float32) backend.WeightID {
	gt, err := ggml.ParseType(typ)
	if err != nil {
		b.t.Fatal(err)
	}
	rb, err := gt.RowBytes(uint64(cols))
	if err != nil {
		b.t.Fatal(err)
	}
	data := make([]byte, rows*int(rb))
	if err := quant.Quantize(gt, b.randn(rows*cols, scale), data); err != nil {
		b.t.Fatal(err)
	}
	name := typ + "-matrix"
	tensor := &weights.Tensor{Name: name, Type: typ, GGML: gt, HasGGML: true, Shape: []int64{int64(rows), int64(cols)}, Bytes: uint64(len(data))}
	b.p.Weights = append(b.p.Weights, backend.Weight{Name: name, Tensor: tensor, Data: weights.Data{Bytes: data}})
	return backend.WeightID(len(b.p.Weights) - 1)
}

// fill emits an embedding of a random float32 table into out, so out holds
// random values chosen by the batch's tokens.
func (b *progBuilder) fill(out backend.BufID, scale float32) {
	w := b.mat("F32", b.p.Vocab, b.p.Bufs[out], scale)
	b.op(backend.Op{Kind: backend.OpEmbed, Out: out, W: w})
}

func (b *progBuilder) op(op backend.Op) {
	if op.Bias == 0 && op.Kind == backend.OpMatMul {
		b.t.Fatal("set Bias (NoWeight for none)")
	}
	b.p.Ops = append(b.p.Ops, op)
}

func (b *progBuilder) rope(dim int, theta float64) int {
	inv := make([]float64, dim/2)
	for i := range inv {
		inv[i] = 1 / math.Pow(theta, float64(2*i)/float64(dim))
	}
	b.p.Ropes = append(b.p.Ropes, backend.RopeTable{InvFreq: inv})
	return len(b.p.Ropes) - 1
}

func (b *progBuilder) cache(kvDim, capacity int) {
	b.p.Caches = append(b.p.Caches, backend.Cache{Layer: len(b.p.Caches), KVDim: kvDim, Capacity: capacity})
}

// newGPU opens device 0, or skips the test when there is none. With
// WEFT_CUDA_REQUIRE=1 a missing GPU fails the test instead, so a device
// run cannot pass by skipping.
func newGPU(t testing.TB) *Backend {
	t.Helper()
	be, err := New(0)
	if err != nil {
		if os.Getenv("WEFT_CUDA_REQUIRE") == "1" {
			t.Fatalf("WEFT_CUDA_REQUIRE=1 but no GPU backend: %v", err)
		}
		t.Skipf("no CUDA device: %s", strings.SplitN(err.Error(), "\n", 2)[0])
	}
	t.Cleanup(func() {
		if err := be.Close(); err != nil {
			t.Error(err)
		}
	})
	return be
}

// q8kGPU is gpu where its K-quant products read Q8_K records as the
// CPU's do, else device 0 opened again so that they do (kActQ8K), closed
// at t's end.
func q8kGPU(t *testing.T, gpu *Backend) *Backend {
	if !gpu.kA32() {
		return gpu
	}
	saved := kActQ8K
	kActQ8K = true
	defer func() { kActQ8K = saved }()
	return newGPU(t)
}

// openSequence opens the model at path on be with opts and a sequence of
// it, all closed at t's end.
func openSequence(t *testing.T, path string, be backend.Backend, opts engine.Options) (*engine.Model, *engine.Sequence) {
	t.Helper()
	w, err := weights.Open(path, weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	m, err := engine.Load(w, be, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	seq, err := m.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seq.Close() })
	return m, seq
}

// dequantized is matrix w as float32, by package quant.
func (b *progBuilder) dequantized(w backend.WeightID) []float32 {
	tensor := b.p.Weights[w].Tensor
	out := make([]float32, tensor.Rows()*tensor.Cols())
	if err := quant.Dequantize(tensor.GGML, b.p.Weights[w].Data.Bytes, out); err != nil {
		b.t.Fatal(err)
	}
	return out
}

// tokenBatch is rows tokens drawn from [0, vocab) at positions 0, 1, … of
// slot 0, every row selected.
func tokenBatch(rng *rand.Rand, rows, vocab int) *backend.Batch {
	bt := &backend.Batch{}
	for r := range rows {
		bt.Tokens = append(bt.Tokens, int32(rng.IntN(vocab)))
		bt.Pos = append(bt.Pos, int32(r))
		bt.Slots = append(bt.Slots, 0)
		bt.Selected = append(bt.Selected, int32(r))
	}
	return bt
}

// embedProduct builds the program of the matrix-vector tests: an
// embedding of a random [vocab, k] table (row 3 all zeros, so that row's
// block scales are 0; edit may change more) into a buffer, then its
// product by a random typ matrix [n, k] into the logits. It returns the
// table and the matrix.
func (b *progBuilder) embedProduct(typ string, vocab, n, k int, edit func(table []float32)) ([]float32, backend.WeightID) {
	a, out := b.buf(k), b.buf(n)
	table := b.randn(vocab*k, 1)
	for i := range k {
		table[3*k+i] = 0
	}
	if edit != nil {
		edit(table)
	}
	tw := b.mat("F32", vocab, k, 1)
	copy(b.p.Weights[tw].Data.Bytes, f32Bytes(table))
	b.op(backend.Op{Kind: backend.OpEmbed, Out: a, W: tw})
	w := b.mat(typ, n, k, 0.5)
	b.op(backend.Op{Kind: backend.OpMatMul, Out: out, A: a, W: w, Bias: backend.NoWeight})
	b.p.Logits = out
	return table, w
}
