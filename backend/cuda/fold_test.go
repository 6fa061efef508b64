package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/sample"
)

// TestMarkLogits: the launch that computes a one-row batch's logits whole
// is marked for its folding twin when it is the last of its launches but
// splitLogits's runs and covers the vocabulary, and not when a soft-cap
// follows the product or its type has no twin. Where the product is
// split, outStaged runs launch the runs and every other output the whole
// product.
func TestMarkLogits(t *testing.T) {
	for _, tc := range []struct {
		typ     string
		softcap float32
		split   int
		gemm    bool
		marked  bool
		runs    int
	}{
		{"Q8_0", 0, 96, false, true, 3}, {"Q4_0", 0, -1, false, true, 0}, {"F32", 0, 96, true, true, 3}, {"BF16", 0, -1, true, true, 0},
		{"F16", 0, 96, false, true, 3}, {"Q8_0", 30, 96, false, false, 0}, {"Q4_K", 0, 96, false, false, 0}, {"Q6_K", 0, -1, false, false, 0},
	} {
		t.Run(fmt.Sprintf("%s/cap%v/split%d/gemm%v", tc.typ, tc.softcap, tc.split, tc.gemm), func(t *testing.T) {
			const vocab = 1000
			p := headProgram(t, tc.typ, vocab, 256, tc.softcap)
			pl, err := plan(p, planOptions{sms: 4, logitsSplit: tc.split, gemm: tc.gemm})
			if err != nil {
				t.Fatal(err)
			}
			var marked []int
			for i, c := range pl.calls {
				if c.logits {
					marked = append(marked, i)
				}
			}
			if got := len(marked) == 1; got != tc.marked || len(marked) > 1 {
				t.Fatalf("launches %v marked, want one: %v", marked, tc.marked)
			}
			if tc.marked {
				c := pl.calls[marked[0]]
				if !logitsCall(c, int(p.Logits)) || c.args[0].v != 0 || c.args[11].v != vocab || c.whole != (tc.runs > 0) {
					t.Errorf("launch %d (%s, logits from byte %d, %d rows, whole %v) marked", marked[0], c.kernel, c.args[0].v, c.args[11].v, c.whole)
				}
			}
			// Which launches write the logits of one selected row, by
			// output.
			for out := range numOuts {
				var runs, whole int
				for _, c := range pl.calls {
					l := launch{cond: c.cond, which: c.which, depth: c.depth, copyLen: c.copyLen, whole: c.whole, head: p.Ops[c.op].Head}
					if c.gemm != nil || !l.runs(1, 1, out, false) || !logitsCall(c, int(p.Logits)) {
						continue
					}
					if c.copyLen > 0 {
						runs++
					} else {
						whole++
					}
				}
				wantRuns, wantWhole := 0, 1
				switch {
				case out == outHidden:
					wantWhole = 0
				case out == outStaged && tc.runs > 0:
					wantRuns, wantWhole = tc.runs, 0
				}
				if !slices.Contains(logitsTwins, "matvec1_"+weightTypes[tc.typ]) {
					wantRuns, wantWhole = 0, 0 // a product logitsCall does not know
				}
				if runs != wantRuns || whole != wantWhole {
					t.Errorf("output %d: %d runs and %d whole products, want %d and %d", out, runs, whole, wantRuns, wantWhole)
				}
			}
		})
	}
}

// TestFoldedDraws: a one-row draw folded into the output product
// (outFolded: the product's twins score each logit as they store it,
// draw_fold takes the best) draws what sample.Draw draws from the logits
// Run produces, for every product type with a twin, the product whole and
// split into runs (each run's tokens offset), one row of one and one of
// three selected; with F32 the one-hot rows copy the
// matrix's columns, so the logits hold ties across the slots, -0 beside
// +0, NaN and ±Inf. The slots must be left at 0 by each draw for the next
// to be right. Decode steps queued ahead (IssueSampled, IssueNext) fold
// too, each fed the draw before. Top-p and min-p rows without a top-k
// (outFoldedNucleus) take the row's largest logit from the same twin
// rather than a nucleus_max launch, and draw as sample.Draw does, queued
// too. Tempered rows, biased ones, several rows selected, a type without
// a twin, and WEFT_CUDA_FOLD_DRAW=0 draw by the draw kernel (and
// nucleus_max).
func TestFoldedDraws(t *testing.T) {
	gpu := newGPU(t)
	const vocab, k = 1500, 256
	for _, tc := range []struct {
		typ, split, fold string
		folds            bool
	}{
		{"F32", "-1", "", true}, {"F32", "96", "", true}, {"F16", "96", "", true}, {"BF16", "-1", "", true},
		{"Q8_0", "96", "", true}, {"Q4_0", "96", "", true}, {"Q4_0", "-1", "", true}, {"Q4_K", "96", "", false},
		{"F32", "96", "0", false},
	} {
		t.Run(fmt.Sprintf("%s/split%s/fold%s", tc.typ, tc.split, tc.fold), func(t *testing.T) {
			t.Setenv("WEFT_CUDA_LOGITS_SPLIT", tc.split)
			t.Setenv("WEFT_CUDA_FOLD_DRAW", tc.fold)
			rng := rand.New(rand.NewPCG(11, 5))
			b := newProg(t, 23, 4, 1, 32, vocab)
			x, sel, logits := b.buf(k), b.buf(k), b.buf(vocab)
			emb := b.mat("F32", vocab, k, 1)
			data := b.p.Weights[emb].Data.Bytes
			for tok := range vocab { // token t: the unit row e_{t mod k}
				for i := range k {
					v := float32(0)
					if i == tok%k {
						v = 1
					}
					binary.LittleEndian.PutUint32(data[4*(tok*k+i):], math.Float32bits(v))
				}
			}
			w := b.mat(tc.typ, vocab, k, 0.5)
			if tc.typ == "F32" {
				// Few levels (ties); column 0 (tokens 0, 64, ...) also
				// NaN, ±Inf and -0, which reach every column as NaN
				// (0·Inf, 0·NaN) in those rows.
				data := b.p.Weights[w].Data.Bytes
				for j := range vocab {
					for i := range k {
						v := float32(rng.IntN(6))*0.75 - 2
						if i == 0 {
							switch x := rng.IntN(40); {
							case x == 0:
								v = float32(math.NaN())
							case x == 1:
								v = float32(math.Inf(-1))
							case x == 2 && j%300 == 7:
								v = float32(math.Inf(1))
							case x == 3:
								v = float32(math.Copysign(0, -1))
							}
						}
						binary.LittleEndian.PutUint32(data[4*(j*k+i):], math.Float32bits(v))
					}
				}
			}
			b.op(backend.Op{Kind: backend.OpEmbed, Out: x, W: emb})
			b.op(backend.Op{Kind: backend.OpGather, Out: sel, A: x, OnSelected: true})
			b.op(backend.Op{Kind: backend.OpMatMul, Out: logits, A: sel, W: w, Bias: backend.NoWeight, OnSelected: true, Head: true})
			b.p.Logits = logits
			ex, err := gpu.Compile(b.p)
			if err != nil {
				t.Fatal(err)
			}
			defer ex.Close()
			e := ex.(*exec)
			lg := make([]float32, 2*vocab)
			out := make([]int32, 2)
			check := func(what string, bt *backend.Batch, s []backend.Sampling, folded bool) {
				t.Helper()
				n := len(bt.Selected)
				if err := e.Run(bt, lg[:n*vocab]); err != nil {
					t.Fatal(err)
				}
				err := e.RunSampled(bt, s, out[:n])
				if got := e.drawOut == outFolded || e.drawOut == outFoldedNucleus; err == nil && got != folded {
					t.Fatalf("%s: folded %v, want %v", what, got, folded)
				}
				for i := range n {
					want, werr := sample.Draw(s[i]).Sample(lg[i*vocab : (i+1)*vocab])
					switch {
					case werr != nil && (err == nil || out[i] >= 0):
						t.Fatalf("%s, row %d (%+v): drawn %d (%v) where the host finds %v", what, i, s[i], out[i], err, werr)
					case werr == nil && (err != nil || out[i] != want):
						t.Fatalf("%s, row %d (%+v): drawn %d (%v), sample %d", what, i, s[i], out[i], err, want)
					}
				}
			}
			for trial := range 80 {
				tok := int32(rng.IntN(vocab))
				if trial%5 == 0 {
					tok = int32(k * rng.IntN(vocab/k)) // column 0
				}
				s := []backend.Sampling{{Temperature: []float32{0, 0.05, 0.8, 2.5}[trial%4], Seed: uint64(trial), Step: uint64(3 * trial)}}
				one := &backend.Batch{Tokens: []int32{tok}, Pos: []int32{0}, Slots: []int32{0}, Selected: []int32{0}}
				greedy := tc.folds && s[0].Temperature == 0 // tempered rows take the draw kernel
				check(fmt.Sprintf("trial %d, one row", trial), one, s, greedy)
				three := &backend.Batch{Tokens: []int32{5, 9, tok}, Pos: []int32{0, 1, 2}, Slots: []int32{0, 0, 0}, Selected: []int32{2}}
				check(fmt.Sprintf("trial %d, one of three rows", trial), three, s, greedy)
				// Top-p or min-p without a top-k: the largest logit folded.
				nuc := []backend.Sampling{{Temperature: []float32{0.05, 0.8, 2.5}[trial%3], TopP: []float32{0.9, 0.5, 1, 0.999, 1e-6}[trial%5],
					MinP: []float32{0, 0.05, 0.3, 0}[trial%4], Seed: uint64(trial), Step: uint64(trial)}}
				isNuc := nuc[0].Nucleus()
				check(fmt.Sprintf("trial %d, nucleus %v", trial, isNuc), one, nuc, tc.folds && isNuc)
				check(fmt.Sprintf("trial %d, nucleus %v, one of three rows", trial, isNuc), three, nuc, tc.folds && isNuc)
				if trial%8 == 0 {
					nuc[0].BiasIDs, nuc[0].BiasValues = []int32{3, vocab - 1}, []float32{2, -1}
					check(fmt.Sprintf("trial %d, biased", trial), one, nuc, false)
					s[0].TopK, s[0].TopP = 40, 1
					check(fmt.Sprintf("trial %d, top-k", trial), one, s, greedy)
					two := &backend.Batch{Tokens: []int32{tok, 77}, Pos: []int32{0, 0}, Slots: []int32{0, 0}, Selected: []int32{0, 1}}
					check(fmt.Sprintf("trial %d, two rows", trial), two, []backend.Sampling{s[0], {Temperature: 0.8, Seed: 4}}, false)
				}
			}
			if (e.draw.foldAt >= 0) != tc.folds {
				t.Errorf("folds %v, want %v", e.draw.foldAt >= 0, tc.folds)
			}

			// Queued steps, each fed the draw before, against Run and the
			// host's draws.
			for _, s := range []backend.Sampling{{Seed: 9, Step: 40}, {Temperature: 1.1, Seed: 9, Step: 40},
				{Temperature: 0.9, TopP: 0.8, Seed: 2, Step: 7}, {Temperature: 1.2, MinP: 0.1, Seed: 3}} {
				const steps = 12
				temp := s.Temperature
				tok, want := int32(3), make([]int32, steps)
				for i := range steps {
					si := s
					si.Step += uint64(i)
					if err := e.Run(&backend.Batch{Tokens: []int32{tok}, Pos: []int32{int32(4 + i)}, Slots: []int32{0}, Selected: []int32{0}}, lg[:vocab]); err != nil {
						t.Fatal(err)
					}
					if want[i], err = sample.Draw(si).Sample(lg[:vocab]); err != nil {
						t.Fatal(err)
					}
					tok = want[i]
				}
				if err := e.IssueSampled(&backend.Batch{Tokens: []int32{3}, Pos: []int32{4}, Slots: []int32{0}, Selected: []int32{0}}, []backend.Sampling{s}); err != nil {
					t.Fatal(err)
				}
				if got, want := e.drawOut == outFolded || e.drawOut == outFoldedNucleus, tc.folds && (temp == 0 || s.Nucleus()); got != want {
					t.Fatalf("queued steps (%+v): folded %v, want %v", s, got, want)
				}
				for i := range steps {
					if i < steps-1 {
						if err := e.IssueNext(); err != nil {
							t.Fatal(err)
						}
					}
					if err := e.WaitSampled(out[:1]); err != nil {
						t.Fatal(err)
					}
					if out[0] != want[i] {
						t.Fatalf("T %g, step %d: queued draw %d, stepped %d", temp, i, out[0], want[i])
					}
				}
			}
		})
	}
}
