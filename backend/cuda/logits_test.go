package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/weftlm/weft/backend"
)

// headProgram is an embedding, a norm and the engine's head (build.go):
// the selected rows gathered, normalized and multiplied by an output
// matrix of typ over vocab rows into the logits, with a softcap after it
// where softcap is set.
func headProgram(t testing.TB, typ string, vocab, k int, softcap float32) *backend.Program {
	b := newProg(t, 11, 4, 2, 32, vocab)
	x, xn, sel, seln, logits := b.buf(k), b.buf(k), b.buf(k), b.buf(k), b.buf(vocab)
	b.op(backend.Op{Kind: backend.OpEmbed, Out: x, W: b.mat("F32", vocab, k, 1)})
	b.op(backend.Op{Kind: backend.OpRMSNorm, Out: xn, A: x, W: b.vec(k, 1, 0.1), Eps: 1e-5, Group: k})
	b.op(backend.Op{Kind: backend.OpGather, Out: sel, A: xn, OnSelected: true})
	b.op(backend.Op{Kind: backend.OpRMSNorm, Out: seln, A: sel, W: b.vec(k, 1, 0.1), Eps: 1e-5, Group: k, OnSelected: true})
	b.op(backend.Op{Kind: backend.OpMatMul, Out: logits, A: seln, W: b.mat(typ, vocab, k, 0.5), Bias: backend.NoWeight,
		OnSelected: true, Head: true})
	if softcap > 0 {
		b.op(backend.Op{Kind: backend.OpSoftcap, Out: logits, A: logits, Cap: softcap, OnSelected: true, Head: true})
	}
	b.p.Logits = logits
	return b.p
}

// TestSplitLogits checks the plan half of the logits' overlapped copy:
// the one-row output product split into runs of whole groups of rows,
// each over its rows' weights, scales and logits and copying them, the
// runs covering the vocabulary in order; and no split where the product
// is too small, not the last launch, of a type without a split, or split
// is off.
func TestSplitLogits(t *testing.T) {
	for _, tc := range []struct {
		typ     string
		vocab   int
		softcap float32
		split   int
		gemm    bool // cuBLAS: launches for large batches follow the product
		runs    int
	}{
		{"Q8_0", 1000, 0, 96, false, 3}, {"Q4_0", 4099, 0, 96, false, 3}, {"BF16", 333, 0, 96, false, 3}, {"F32", 160, 0, 96, false, 3},
		{"Q8_0", 1000, 0, 96, true, 3}, {"Q4_0", 1000, 0, 96, true, 3},
		{"Q8_0", 1000, 0, 0, false, 0}, {"Q8_0", 1000, 0, -1, false, 0}, {"Q8_0", 95, 0, 1, false, 0}, {"Q8_0", 1000, 30, 96, false, 0},
		{"Q8_0", 1000, 30, 96, true, 0}, {"Q4_K", 1000, 0, 96, false, 0},
	} {
		t.Run(fmt.Sprintf("%s/%d/cap%v/split%d/gemm%v", tc.typ, tc.vocab, tc.softcap, tc.split, tc.gemm), func(t *testing.T) {
			k := 256
			p := headProgram(t, tc.typ, tc.vocab, k, tc.softcap)
			pl, err := plan(p, planOptions{sms: 4, logitsSplit: tc.split, gemm: tc.gemm})
			if err != nil {
				t.Fatal(err)
			}
			var runs []call
			for _, c := range pl.calls {
				if c.copyLen > 0 {
					runs = append(runs, c)
				}
			}
			if len(runs) != tc.runs {
				t.Fatalf("%d runs copy logits, want %d", len(runs), tc.runs)
			}
			if tc.runs == 0 {
				return
			}
			// The runs follow each other, and nothing after them runs on
			// a batch with one row selected.
			first := slices.IndexFunc(pl.calls, func(c call) bool { return c.copyLen > 0 })
			for i, c := range pl.calls[first:] {
				if i < len(runs) && c.copyLen == 0 {
					t.Errorf("launch %d of the runs copies no logits", i)
				}
				if i >= len(runs) && c.cond != large && (c.which != metaSelected || c.cond.holds(1)) {
					t.Errorf("%s under %v on %d runs after the runs", c.kernel, c.cond, c.which)
				}
			}
			quant := tc.typ == "Q8_0" || tc.typ == "Q4_0"
			m := pl.mats[runs[0].args[4].id]
			r0 := 0
			for i, c := range runs {
				n := int(c.args[11].v)
				rpb := int(c.args[12].v)
				if c.cond != one || c.which != metaSelected || c.kernel != "matvec1_"+weightTypes[m.typ] {
					t.Errorf("run %d: %s under %v on %d", i, c.kernel, c.cond, c.which)
				}
				if i < len(runs)-1 && n%32 != 0 || n <= 0 || c.gridX == 0 || int(c.gridX) > (n+rpb-1)/rpb {
					t.Errorf("run %d: %d rows in %d blocks of %d", i, n, c.gridX, rpb)
				}
				if c.args[0] != (arg{kind: argBuf, id: int(p.Logits), v: int64(4 * r0)}) || c.copyOff != int64(4*r0) || c.copyLen != int64(4*n) {
					t.Errorf("run %d: logits at %+v, copies %d+%d, want rows from %d", i, c.args[0], c.copyOff, c.copyLen, r0)
				}
				if c.args[4].v != int64(r0*m.rowBytes) {
					t.Errorf("run %d: weights from byte %d, want %d", i, c.args[4].v, int64(r0*m.rowBytes))
				}
				// Row j of the run reads the scales of row r0 + j.
				wantD := m.dOff
				if quant {
					wantD = m.dOff - int64(r0*m.rowBytes) + int64(r0*(k/32)*2)
				}
				if got := c.args[4].v + c.args[6].v; got != int64(r0*m.rowBytes)+wantD {
					t.Errorf("run %d: scales at %d, want %d", i, got, int64(r0*m.rowBytes)+wantD)
				}
				r0 += n
			}
			if r0 != tc.vocab {
				t.Errorf("the runs cover %d rows of %d", r0, tc.vocab)
			}
		})
	}
}

// TestSplitLogitsExact runs head programs with the output product split
// and not on the device: the runs compute the same sums, and the copies
// the graph makes must hand out the same logits, for every batch shape
// (one row selected of several: the split runs; several selected: they
// do not), through RunView and Run, and with device draws.
func TestSplitLogitsExact(t *testing.T) {
	gpu := newGPU(t)
	for _, typ := range []string{"Q8_0", "Q4_0", "BF16"} {
		t.Run(typ, func(t *testing.T) {
			p := headProgram(t, typ, 1000, 256, 0)
			run := func(split string) (views, runs [][]float32) {
				t.Setenv("WEFT_CUDA_LOGITS_SPLIT", split)
				ge, err := gpu.Compile(p)
				if err != nil {
					t.Fatal(err)
				}
				defer func() {
					if err := ge.Close(); err != nil {
						t.Error(err)
					}
				}()
				if e := ge.(*exec); e.staging != (split != "-1") {
					t.Fatalf("split %s: staging %v", split, e.staging)
				}
				g := &batchGen{rng: rand.New(rand.NewPCG(9, 3)), p: p, pos: make([]int, p.Slots), selected: true}
				ones := 0
				for step := range 40 {
					b := g.next()
					if len(b.Selected) == 1 {
						ones++
					}
					v, err := ge.(backend.Viewer).RunView(b)
					if err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
					views = append(views, slices.Clone(v))
					out := make([]float32, len(v))
					if err := ge.Run(b, out); err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
					runs = append(runs, out)
					// Greedy device draws (their graphs leave the logits
					// on the device) pick each row's largest logit.
					ids := make([]int32, len(b.Selected))
					if err := ge.(backend.Sampler).RunSampled(b, make([]backend.Sampling, len(ids)), ids); err != nil {
						t.Fatalf("step %d: draws: %v", step, err)
					}
					for r, id := range ids {
						row := out[r*p.Vocab : (r+1)*p.Vocab]
						if row[id] != slices.Max(row) {
							t.Fatalf("step %d row %d: drew %d (%v), the largest logit is %v", step, r, id, row[id], slices.Max(row))
						}
					}
				}
				if ones == 0 {
					t.Fatal("no batch with one row selected")
				}
				return views, runs
			}
			sv, sr := run("96")
			pv, pr := run("-1")
			for s := range sv {
				for _, got := range [][]float32{sv[s], sr[s], pr[s]} {
					for i := range got {
						if math.Float32bits(got[i]) != math.Float32bits(pv[s][i]) {
							t.Fatalf("step %d logit %d: %v, want %v", s, i, got[i], pv[s][i])
						}
					}
				}
			}
		})
	}
}
