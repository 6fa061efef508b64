package cuda

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/backend/cpu"
)

// quantizeRef quantizes x (a multiple of 32 long) as quantize_q8 does:
// per block of 32, d = max|x|/127 and q = round-half-even(x·(127/max|x|)),
// in float32.
func quantizeRef(x []float32) (q []int8, d []float32) {
	q = make([]int8, len(x))
	for b := 0; b < len(x)/32; b++ {
		var amax float32
		for _, v := range x[b*32 : b*32+32] {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		d = append(d, amax/127)
		if amax == 0 {
			continue
		}
		id := 127 / amax
		for i := b * 32; i < b*32+32; i++ {
			q[i] = int8(math.RoundToEven(float64(x[i] * id)))
		}
	}
	return q, d
}

// TestQuantizedMatVec checks the dp4a kernels exactly: the reference
// quantizes the activations the same way, so the only difference left
// is float32 rounding in the sums.
func TestQuantizedMatVec(t *testing.T) {
	gpu := newGPU(t)
	const k, n, maxRows, vocab = 160, 37, 8, 37
	for _, typ := range []string{"Q8_0", "Q4_0"} {
		t.Run(typ, func(t *testing.T) {
			b := newProg(t, 5, maxRows, 1, 64, vocab)
			table, w := b.embedProduct(typ, vocab, n, k, nil)
			deq := b.dequantized(w)
			ex, err := gpu.Compile(b.p)
			if err != nil {
				t.Fatal(err)
			}
			defer ex.Close()
			rng := rand.New(rand.NewPCG(9, 9))
			for step := range 20 {
				rows := 1 + step%maxRows
				bt := tokenBatch(rng, rows, vocab)
				bt.Tokens[0] = 3
				got := make([]float32, rows*n)
				if err := ex.Run(bt, got); err != nil {
					t.Fatal(err)
				}
				want := make([]float32, rows*n)
				for r, tok := range bt.Tokens {
					q, d := quantizeRef(table[int(tok)*k : int(tok+1)*k])
					for j := range n {
						var s float64
						for blk := range k / 32 {
							var dot float64
							for i := blk * 32; i < blk*32+32; i++ {
								dot += float64(deq[j*k+i]) * float64(q[i])
							}
							s += dot * float64(d[blk])
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

// TestMatMulWithoutCuBLAS runs the product cases on the matrix-vector
// kernels alone, as on a machine where cuBLAS does not load: large
// batches then take several passes of MVR rows.
func TestMatMulWithoutCuBLAS(t *testing.T) {
	gpu := newGPU(t)
	saved := gpu.blas
	gpu.blas = nil
	defer func() { gpu.blas = saved }()
	for i, tc := range opCases() {
		if !strings.HasPrefix(tc.name, "matmul") && !strings.HasPrefix(tc.name, "fused") {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			b := newProg(t, uint64(i+1), tc.maxRows, tc.slots, tc.context, tc.vocab)
			out := b.buf(tc.vocab)
			b.p.Logits = out
			tc.build(b, out)
			compareWithCPU(t, gpu, b.p, 20, tc.selected, min(tc.tol, 3e-3))
		})
	}
}

// TestHiddenRowsAndKeys checks hidden-state batches (the head skipped),
// rows written from the host before a run, and reading cached keys back,
// against the CPU backend.
func TestHiddenRowsAndKeys(t *testing.T) {
	gpu := newGPU(t)
	p := validProgram(t)
	p.Ops[11].Head, p.Ops[12].Head = true, true
	p.Hidden, p.Dim = 6, 64
	ce, err := cpu.New(2).Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	defer ce.Close()
	ge, err := gpu.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	defer ge.Close()
	bt := &backend.Batch{Tokens: []int32{5, 9, 11}, Pos: []int32{0, 1, 2}, Slots: []int32{1, 1, 1}, Selected: []int32{0, 2}, HiddenOnly: true}
	for _, e := range []backend.Exec{ce, ge} {
		if err := e.(backend.RowWriter).WriteRows(0, make([]float32, 3*64)); err != nil {
			t.Fatal(err)
		}
	}
	want, got := make([]float32, 2*64), make([]float32, 2*64)
	if err := ce.Run(bt, want); err != nil {
		t.Fatal(err)
	}
	if err := ge.Run(bt, got); err != nil {
		t.Fatal(err)
	}
	if e := relErr(got, want); e > 2e-2 {
		t.Errorf("hidden states: relative error %.3g", e)
	}
	kw, kg := make([]float32, 3*32), make([]float32, 3*32)
	if err := ce.(backend.KeyReader).ReadKeys(0, 1, 0, 3, kw); err != nil {
		t.Fatal(err)
	}
	if err := ge.(backend.KeyReader).ReadKeys(0, 1, 0, 3, kg); err != nil {
		t.Fatal(err)
	}
	if e := relErr(kg, kw); e > 2e-2 {
		t.Errorf("keys: relative error %.3g", e)
	}
	if err := ge.(backend.KeyReader).ReadKeys(0, 1, 30, 3, kg); err == nil {
		t.Error("reading keys past the context gives no error")
	}
	if err := ge.(backend.RowWriter).WriteRows(0, make([]float32, 65)); err == nil {
		t.Error("writing 65 floats to a 64-column buffer gives no error")
	}
}
