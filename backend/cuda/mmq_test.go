package cuda

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/quant"
	"github.com/weftlm/weft/weights"
)

// TestMMQExact checks the int8 tensor-core products (more than smallRows
// rows) against a float64 sum over the same int8 activations: what is
// left is float32 rounding. Odd sizes cover partial tiles in every
// dimension, K of an odd number of blocks a half-empty last stage; the
// variants add a bias and a residual.
func TestMMQExact(t *testing.T) {
	gpu := newGPU(t)
	t.Setenv("WEFT_MMQ", "1")
	if !mmqOn(gpu.target.arch) {
		t.Skipf("no mma.m16n8k32 on sm_%d", gpu.target.arch)
	}
	const maxRows = 150
	for _, tc := range []struct {
		typ         string
		k, n        int
		bias, resid bool
	}{
		{"Q8_0", 96, 45, false, false}, {"Q4_0", 96, 45, true, false}, {"Q8_0", 160, 200, true, true},
		{"Q4_0", 160, 131, false, true}, {"Q8_0", 1024, 300, false, false}, {"Q4_0", 2048, 257, true, true},
	} {
		t.Run(fmt.Sprintf("%s/%dx%d", tc.typ, tc.n, tc.k), func(t *testing.T) {
			b := newProg(t, uint64(tc.k+tc.n), maxRows, 1, 256, tc.n)
			a, out := b.buf(tc.k), b.buf(tc.n)
			table := b.randn(tc.n*tc.k, 1)
			for i := range tc.k {
				table[2*tc.k+i] = 0 // a row of zeros: d = 0
			}
			ta := b.mat("F32", tc.n, tc.k, 1)
			copy(b.p.Weights[ta].Data.Bytes, f32Bytes(table))
			b.op(backend.Op{Kind: backend.OpEmbed, Out: a, W: ta})
			var base []float32
			x := out
			if tc.resid {
				x = b.buf(tc.n)
				base = b.randn(tc.n*tc.n, 1)
				tx := b.mat("F32", tc.n, tc.n, 1)
				copy(b.p.Weights[tx].Data.Bytes, f32Bytes(base))
				b.op(backend.Op{Kind: backend.OpEmbed, Out: x, W: tx})
			}
			bias := backend.NoWeight
			if tc.bias {
				bias = b.vec(tc.n, 0, 1)
			}
			w := b.mat(tc.typ, tc.n, tc.k, 0.5)
			b.op(backend.Op{Kind: backend.OpMatMul, Out: out, A: a, W: w, Bias: bias})
			if tc.resid {
				b.op(backend.Op{Kind: backend.OpAdd, Out: x, A: x, B: out})
			}
			b.p.Logits = x
			deq := b.dequantized(w)
			ex, err := gpu.Compile(b.p)
			if err != nil {
				t.Fatal(err)
			}
			defer ex.Close()
			rng := rand.New(rand.NewPCG(5, 5))
			for _, rows := range []int{9, 64, 65, maxRows, 17, 128, 129} {
				bt := tokenBatch(rng, rows, tc.n)
				bt.Tokens[rows/2] = 2
				got := make([]float32, rows*tc.n)
				if err := ex.Run(bt, got); err != nil {
					t.Fatal(err)
				}
				want := make([]float32, rows*tc.n)
				for r, tok := range bt.Tokens {
					q, d := quantizeRef(table[int(tok)*tc.k : int(tok+1)*tc.k])
					for j := range tc.n {
						var s float64
						for blk := range tc.k / 32 {
							var dot float64
							for i := blk * 32; i < blk*32+32; i++ {
								dot += float64(deq[j*tc.k+i]) * float64(q[i])
							}
							s += dot * float64(d[blk])
						}
						if tc.bias {
							s += float64(b.p.Weights[bias].F32[j])
						}
						if tc.resid {
							s += float64(base[int(tok)*tc.n+j])
						}
						want[r*tc.n+j] = float32(s)
					}
				}
				if e := relErr(got, want); e > 2e-6 {
					t.Fatalf("%d rows: relative error %.3g\n got %v\nwant %v", rows, e, got[:8], want[:8])
				} else if rows == maxRows {
					t.Logf("%d rows: relative error %.3g", rows, e)
				}
			}
		})
	}
}

// TestMMQBench times one product of 512 rows, as in a pp512 prefill, for
// the weight shapes of Llama-3.2-1B and Llama-3-8B, on mmq and on cuBLAS
// (WEFT_MMQ=0: the f16 conversions and cublasGemmEx), when
// WEFT_MMQ_BENCH=1. A run includes quantizing the rows and the copies of
// the batch and of one output row.
func TestMMQBench(t *testing.T) {
	if os.Getenv("WEFT_MMQ_BENCH") != "1" {
		t.Skip("set WEFT_MMQ_BENCH=1")
	}
	gpu := newGPU(t)
	const rows = 512
	shapes := [][2]int{{2048, 2048}, {512, 2048}, {8192, 2048}, {2048, 8192}, {4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}}
	most := 0
	for _, s := range shapes {
		most = max(most, s[0]*s[1])
	}
	rng := rand.New(rand.NewPCG(1, 1))
	values := make([]float32, most)
	for i := range values {
		values[i] = float32(rng.NormFloat64())
	}
	act := make([]float32, rows*14336)
	for i := range act {
		act[i] = float32(rng.NormFloat64())
	}
	for _, typ := range []string{"Q4_0", "Q8_0"} {
		gt, _ := ggml.ParseType(typ)
		for _, s := range shapes {
			n, k := s[0], s[1]
			rb, _ := gt.RowBytes(uint64(k))
			data := make([]byte, n*int(rb))
			if err := quant.Quantize(gt, values[:n*k], data); err != nil {
				t.Fatal(err)
			}
			tensor := &weights.Tensor{Name: "w", Type: typ, GGML: gt, HasGGML: true, Shape: []int64{int64(n), int64(k)}, Bytes: uint64(len(data))}
			p := &backend.Program{MaxRows: rows, Slots: 1, Context: rows, Vocab: n, Bufs: []int{k, n}, Logits: 1,
				Weights: []backend.Weight{{Name: "w", Tensor: tensor, Data: weights.Data{Bytes: data}}},
				Ops:     []backend.Op{{Kind: backend.OpMatMul, Out: 1, A: 0, W: 0, Bias: backend.NoWeight}}}
			bt := &backend.Batch{Selected: []int32{0}}
			for r := range rows {
				bt.Tokens = append(bt.Tokens, int32(r%n))
				bt.Pos = append(bt.Pos, int32(r))
				bt.Slots = append(bt.Slots, 0)
			}
			line := fmt.Sprintf("mmq-bench %s %5dx%5d:", typ, n, k)
			for _, variant := range []string{"1", "0"} {
				t.Setenv("WEFT_MMQ", variant)
				ex, err := gpu.Compile(p)
				if err != nil {
					t.Fatal(err)
				}
				if err := ex.(backend.RowWriter).WriteRows(0, act[:rows*k]); err != nil {
					t.Fatal(err)
				}
				out := make([]float32, n)
				var times []float64
				for i := range 13 {
					t0 := time.Now()
					if err := ex.Run(bt, out); err != nil {
						t.Fatal(err)
					}
					if i >= 3 {
						times = append(times, time.Since(t0).Seconds())
					}
				}
				ex.Close()
				slices.Sort(times)
				med := times[len(times)/2]
				line += fmt.Sprintf("  WEFT_MMQ=%q %7.1f µs %5.0f TOPS", variant, med*1e6, 2*float64(rows)*float64(n)*float64(k)/med/1e12)
			}
			fmt.Println(line)
		}
	}
}
