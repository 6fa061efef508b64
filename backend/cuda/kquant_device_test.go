package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/weftlm/weft/backend"
)

// TestKQuantMatVec checks the K-quant decode kernels against quant's
// dequantization and a float64 product of activations quantized as the
// GPU reads them (per 32 under kA32, else as Q8_K): only float32 rounding
// in the sums remains.
func TestKQuantMatVec(t *testing.T) {
	gpu := newGPU(t)
	const k, n, maxRows, vocab = 768, 37, 8, 37
	for _, typ := range []string{"Q4_K", "Q5_K", "Q6_K", "Q2_K", "IQ4_XS"} {
		t.Run(typ, func(t *testing.T) {
			b := newProg(t, 5, maxRows, 1, 64, vocab)
			// Row 5 gets a negative element of largest magnitude.
			table, w := b.embedProduct(typ, vocab, n, k, func(table []float32) { table[5*k+300] = -40 })
			deq := b.dequantized(w)
			ex, err := gpu.Compile(b.p)
			if err != nil {
				t.Fatal(err)
			}
			defer ex.Close()
			rng := rand.New(rand.NewPCG(9, 9))
			for step := range 16 {
				rows := 1 + step%maxRows
				bt := tokenBatch(rng, rows, vocab)
				bt.Tokens[0] = int32(3 + 2*(step%2))
				got := make([]float32, rows*n)
				if err := ex.Run(bt, got); err != nil {
					t.Fatal(err)
				}
				// The activations as the GPU's product reads them: Q4_0's
				// int8 records (kA32) or Q8_K's.
				want := make([]float32, rows*n)
				for r, tok := range bt.Tokens {
					x := table[int(tok)*k : int(tok+1)*k]
					a := quantizeQ8Ref(x)
					if !gpu.kA32() {
						q, d, _ := quantizeQ8KRef(x)
						for i := range a {
							a[i] = float32(q[i]) * d[i/256]
						}
					}
					for j := range n {
						var s float64
						for i := range k {
							s += float64(deq[j*k+i]) * float64(a[i])
						}
						want[r*n+j] = float32(s)
					}
				}
				if e := relErr(got, want); e > 1e-5 {
					t.Fatalf("step %d (%d rows): relative error %.3g\n got %v\nwant %v", step, rows, e, got[:8], want[:8])
				}
			}
		})
	}
}

// kquantCases are op cases for the K-quants, the types stored as another
// on upload and MLX weights, against the CPU backend. Their products agree
// to float32 rounding on the matrix-vector path where both backends
// quantize the activations alike (per 256 as Q8_K for K-quants under the
// exact contract or WEFT_CUDA_KACT=q8k, per 32 for the legacy types) and
// to f16 rounding on cuBLAS; MLX weights, converted to f16, to their
// rounding. K-quant products on Q4_0's activations (kA32, the default)
// read per-32 levels where the CPU reads per-256 ones: kTol, the two
// roundings' difference (~0.6 % of ‖y‖ for these uniform inputs); their
// sums are checked to float32 rounding by TestKQuantMatVec.
func kquantCases() []opCase {
	// Under kA32 a chain that quantizes twice before a K-quant product
	// moves further: the CPU's per-256 levels of a GLU's heavy-tailed
	// outputs are coarse (H100: fused-gateup up to 2.7e-2). TestKQuantGLU
	// checks the fused GLU against its own rounding to 1e-3.
	kTol, kChainTol := 1e-5, 3e-3
	if !exactOn() && !kActQ8K {
		kTol, kChainTol = 2e-2, 5e-2
	}
	var cases []opCase
	matmul := func(name string, maxRows, k, out int, tol float64, w func(b *progBuilder, n, k int) backend.WeightID, bias bool) opCase {
		return opCase{name: name, maxRows: maxRows, slots: 1, context: 64, vocab: out, tol: tol,
			build: func(b *progBuilder, o backend.BufID) {
				a := b.buf(k)
				b.fill(a, 1)
				bb := backend.NoWeight
				if bias {
					bb = b.vec(out, 0, 1)
				}
				b.op(backend.Op{Kind: backend.OpMatMul, Out: o, A: a, W: w(b, out, k), Bias: bb})
			}}
	}
	ggmlMat := func(typ string) func(b *progBuilder, n, k int) backend.WeightID {
		return func(b *progBuilder, n, k int) backend.WeightID { return b.mat(typ, n, k, 0.5) }
	}
	// Every type with kernels of its own, and those stored without loss as
	// one that has (Q5_0 as Q8_0, Q4_1 and Q5_1 as Q8_A, Q3_K as Q6_K):
	// int8 activations on both backends.
	for _, typ := range []string{"Q4_K", "Q5_K", "Q6_K", "Q2_K", "IQ4_XS", "Q5_0", "Q4_1", "Q5_1", "Q3_K"} {
		tol := 1e-5
		if kLayouts[typ] != nil || typ == "Q3_K" { // Q3_K: as Q6_K
			tol = kTol
		}
		cases = append(cases,
			opCase{name: "embed/" + typ, maxRows: 5, slots: 1, context: 64, vocab: 512, tol: 1e-7,
				build: func(b *progBuilder, out backend.BufID) {
					b.op(backend.Op{Kind: backend.OpEmbed, Out: out, W: b.mat(typ, 512, 512, 1), Scale: 1.7})
				}},
			matmul("matmul/"+typ, 7, 768, 45, tol, ggmlMat(typ), typ == "Q5_K"),
			matmul("matmul/"+typ+"/vec", 8, 256, 33, tol, ggmlMat(typ), false),
			matmul("matmul/"+typ+"/large", 40, 512, 45, max(tol, 3e-3), ggmlMat(typ), typ != "Q5_K"),
			opCase{name: "fused/" + typ, maxRows: 8, slots: 1, context: 64, vocab: 40, tol: tol,
				build: func(b *progBuilder, out backend.BufID) {
					x, m := b.buf(512), b.buf(40)
					b.fill(x, 1)
					b.fill(out, 1)
					b.op(backend.Op{Kind: backend.OpMatMul, Out: m, A: x, W: b.mat(typ, 40, 512, 0.5), Bias: backend.NoWeight})
					b.op(backend.Op{Kind: backend.OpAdd, Out: out, A: out, B: m})
				}})
	}
	// Every matrix-vector block shape: 8 rows a block looping over more
	// groups than the grid has blocks, 4, 2 and 1.
	for _, wc := range []struct {
		typ  string
		n, k int
	}{{"Q4_K", 4300, 256}, {"Q6_K", 1100, 2048}, {"Q5_K", 600, 1024}, {"Q6_K", 200, 512}} {
		cases = append(cases, matmul(fmt.Sprintf("matmul/%s/%dx%d", wc.typ, wc.n, wc.k), 8, wc.k, wc.n, kTol, ggmlMat(wc.typ), false))
	}
	// Grouped K-quant products (matvec3_q*_k, matvec13_q*_k for one row):
	// q, k and v of odd row counts, with biases; then a norm, gate and up
	// grouped, their GLU quantized for a down product of another K type.
	for _, typ := range []string{"Q4_K", "Q5_K", "Q6_K", "Q2_K", "IQ4_XS"} {
		cases = append(cases, opCase{name: "fused-group/" + typ, maxRows: 5, slots: 1, context: 64, vocab: 45, tol: kTol,
			build: func(b *progBuilder, out backend.BufID) {
				a, q, k, v, k2, v2 := b.buf(512), b.buf(45), b.buf(29), b.buf(29), b.buf(45), b.buf(45)
				b.fill(a, 1)
				b.op(backend.Op{Kind: backend.OpMatMul, Out: q, A: a, W: b.mat(typ, 45, 512, 0.5), Bias: b.vec(45, 0, 1)})
				b.op(backend.Op{Kind: backend.OpMatMul, Out: k, A: a, W: b.mat(typ, 29, 512, 0.5), Bias: backend.NoWeight})
				b.op(backend.Op{Kind: backend.OpMatMul, Out: v, A: a, W: b.mat(typ, 29, 512, 0.5), Bias: b.vec(29, 0, 1)})
				b.op(backend.Op{Kind: backend.OpMatMul, Out: k2, A: k, W: b.mat("F32", 45, 29, 0.5), Bias: backend.NoWeight})
				b.op(backend.Op{Kind: backend.OpAdd, Out: out, A: q, B: k2})
				b.op(backend.Op{Kind: backend.OpMatMul, Out: v2, A: v, W: b.mat("F32", 45, 29, 0.5), Bias: backend.NoWeight})
				b.op(backend.Op{Kind: backend.OpAdd, Out: out, A: out, B: v2})
			}})
		down := map[string]string{"Q4_K": "Q6_K", "Q6_K": "Q4_K"}[typ]
		if down == "" {
			down = typ
		}
		cases = append(cases, opCase{name: "fused-gateup/" + typ + "/" + down, maxRows: 6, slots: 1, context: 64, vocab: 37, tol: kChainTol,
			build: func(b *progBuilder, out backend.BufID) {
				x, xn, g, u := b.buf(256), b.buf(256), b.buf(768), b.buf(768)
				b.fill(x, 1)
				b.op(backend.Op{Kind: backend.OpRMSNorm, Out: xn, A: x, W: b.vec(256, 1, 0.1), Eps: 1e-5, Group: 256})
				b.op(backend.Op{Kind: backend.OpMatMul, Out: g, A: xn, W: b.mat(typ, 768, 256, 0.5), Bias: backend.NoWeight})
				b.op(backend.Op{Kind: backend.OpMatMul, Out: u, A: xn, W: b.mat(typ, 768, 256, 0.5), Bias: backend.NoWeight})
				b.op(backend.Op{Kind: backend.OpGLU, Out: g, A: g, B: u, Act: backend.ActSiLU})
				b.op(backend.Op{Kind: backend.OpMatMul, Out: out, A: g, W: b.mat(down, 37, 768, 0.5), Bias: backend.NoWeight})
			}})
	}
	// A norm and a GLU quantize their outputs as Q8_K for the product
	// after them; attention leaves it to the product. As for fused-q8,
	// the chain moves some activations across a level. TestKQuantOps runs
	// these on a backend opened with kActQ8K, as the CPU quantizes: on
	// per-32 levels the attention amplifies the two roundings' difference
	// (H100: up to 0.28).
	for _, maxRows := range []int{5, 8} {
		cases = append(cases, opCase{name: fmt.Sprintf("fused-q8k/%d", maxRows), maxRows: maxRows, slots: 2, context: 40, vocab: 64, tol: 3e-3,
			build: func(b *progBuilder, out backend.BufID) { kChain(b, out, 40) }})
	}
	for _, bits := range []int{4, 8} {
		w := func(b *progBuilder, n, k int) backend.WeightID { return b.mlxMat(bits, 64, n, k, 0.5) }
		name := fmt.Sprintf("MLX_Q%d", bits)
		cases = append(cases, matmul("matmul/"+name, 7, 192, 45, 3e-3, w, true), matmul("matmul/"+name+"/large", 40, 192, 45, 3e-3, w, false))
	}
	return cases
}

func TestKQuantOps(t *testing.T) {
	gpu := newGPU(t)
	kgpu := q8kGPU(t, gpu)
	for i, tc := range kquantCases() {
		t.Run(tc.name, func(t *testing.T) {
			b := newProg(t, uint64(i+1), tc.maxRows, tc.slots, tc.context, tc.vocab)
			out := b.buf(tc.vocab)
			b.p.Logits = out
			tc.build(b, out)
			be := gpu
			if strings.HasPrefix(tc.name, "fused-q8k/") {
				be = kgpu
			}
			compareWithCPU(t, be, b.p, 20, tc.selected, tc.tol)
		})
	}
}

// TestKQuantGLU checks the K-quant gate and up products fused with the
// GLU (matvec_glu_q*_k and its one-row twins, on Q4_0's int8 activations:
// kA32) and the down product after them against a float64 reference that
// quantizes as the GPU does: the input and the GLU's output per 32
// (quantizeQ8Ref). The sums differ from it only in float32 order, which
// can move a GLU output across an int8 level: 1e-3. 8,704 rows are 272
// GLU groups, past two a multiprocessor on an H100: the wide twin.
func TestKQuantGLU(t *testing.T) {
	gpu := newGPU(t)
	if !gpu.kA32() {
		t.Skip("the K-quant GLU is fused only on Q4_0's int8 activations (kA32)")
	}
	const k, vocab, maxRows = 256, 40, 6
	for _, tc := range []struct {
		typ, down string
		n         int
	}{{"Q4_K", "Q6_K", 768}, {"Q5_K", "Q5_K", 512}, {"Q6_K", "Q4_K", 768}, {"Q2_K", "Q2_K", 512}, {"IQ4_XS", "IQ4_XS", 512},
		{"Q4_K", "Q4_K", 8704}, {"Q5_K", "Q6_K", 8704}} {
		t.Run(fmt.Sprintf("%s/%s/%d", tc.typ, tc.down, tc.n), func(t *testing.T) {
			b := newProg(t, 3, maxRows, 1, 64, 40)
			x, g, u, h, out := b.buf(k), b.buf(tc.n), b.buf(tc.n), b.buf(tc.n), b.buf(40)
			table := b.randn(vocab*k, 1)
			tw := b.mat("F32", vocab, k, 1)
			copy(b.p.Weights[tw].Data.Bytes, f32Bytes(table))
			wg, wu, wd := b.mat(tc.typ, tc.n, k, 0.5), b.mat(tc.typ, tc.n, k, 0.5), b.mat(tc.down, 40, tc.n, 0.5)
			b.op(backend.Op{Kind: backend.OpEmbed, Out: x, W: tw})
			b.op(backend.Op{Kind: backend.OpMatMul, Out: g, A: x, W: wg, Bias: backend.NoWeight})
			b.op(backend.Op{Kind: backend.OpMatMul, Out: u, A: x, W: wu, Bias: backend.NoWeight})
			b.op(backend.Op{Kind: backend.OpGLU, Out: h, A: g, B: u, Act: backend.ActSiLU})
			b.op(backend.Op{Kind: backend.OpMatMul, Out: out, A: h, W: wd, Bias: backend.NoWeight})
			b.p.Logits = out
			dg, du, dd := b.dequantized(wg), b.dequantized(wu), b.dequantized(wd)
			pl, err := plan(b.p, planOptions{sms: gpu.sms, kA32: true})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(pl.calls, func(c call) bool { return strings.HasPrefix(c.kernel, "matvec_glu_") }) {
				t.Fatal("gate, up and the GLU are not fused")
			}
			ex, err := gpu.Compile(b.p)
			if err != nil {
				t.Fatal(err)
			}
			defer ex.Close()
			dot := func(w []float32, row int, a []float32) float32 {
				var s float64
				for i, v := range a {
					s += float64(w[row*len(a)+i]) * float64(v)
				}
				return float32(s)
			}
			rng := rand.New(rand.NewPCG(5, 5))
			for step := range 6 {
				rows := 1 + step%maxRows
				bt := tokenBatch(rng, rows, vocab)
				got := make([]float32, rows*40)
				if err := ex.Run(bt, got); err != nil {
					t.Fatal(err)
				}
				want := make([]float32, rows*40)
				for r, tok := range bt.Tokens {
					a := quantizeQ8Ref(table[int(tok)*k : int(tok+1)*k])
					hv := make([]float32, tc.n)
					for j := range hv {
						gv, uv := float64(dot(dg, j, a)), float64(dot(du, j, a))
						hv[j] = float32(gv / (1 + math.Exp(-gv)) * uv)
					}
					hq := quantizeQ8Ref(hv)
					for j := range 40 {
						want[r*40+j] = dot(dd, j, hq)
					}
				}
				if e := relErr(got, want); e > 1e-3 {
					t.Fatalf("step %d (%d rows): relative error %.3g\n got %v\nwant %v", step, rows, e, got[:8], want[:8])
				}
			}
		})
	}
}
