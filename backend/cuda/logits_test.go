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

// TestSkipGather: a batch of one row skips the gather of its selected row,
// its norm reading the gather's input instead; other batches gather, and
// nothing is skipped where a later launch reads the gathered rows.
func TestSkipGather(t *testing.T) {
	type ran struct{ gather, fromGather, fromInput int }
	count := func(pl *planned, p *backend.Program, gathered, input arg, rows, sel int) ran {
		var r ran
		for _, c := range pl.calls {
			l := launch{cond: c.cond, which: c.which, depth: c.depth, copyLen: c.copyLen, whole: c.whole, rowsIf: c.rowsIf}
			if c.gemm != nil || !l.runs(rows, sel, outDevice, false) {
				continue
			}
			switch {
			case c.kernel == "gather":
				r.gather++
			case strings.HasPrefix(c.kernel, "rmsnorm") && c.args[1] == gathered:
				r.fromGather++
			case strings.HasPrefix(c.kernel, "rmsnorm") && c.args[1] == input && c.args[0] != input:
				r.fromInput++
			}
		}
		return r
	}
	p := headProgram(t, "Q8_0", 1000, 256, 0) // embed x, norm xn, gather sel from xn, norm seln from sel, product
	xn, sel := buf(1), buf(2)
	pl, err := plan(p, planOptions{sms: 4, gemm: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rows, sel int
		want      ran
	}{
		{1, 1, ran{0, 0, 1}}, {3, 1, ran{1, 1, 0}}, {4, 4, ran{1, 1, 0}}, {12, 1, ran{1, 1, 0}}, {12, 12, ran{1, 1, 0}},
	} {
		got := count(pl, p, sel, xn, tc.rows, tc.sel)
		if got != tc.want {
			t.Errorf("%d rows, %d selected: %+v launches, want %+v", tc.rows, tc.sel, got, tc.want)
		}
	}

	// The gathered rows read again after the norm: every batch gathers.
	p.Ops = append(p.Ops, backend.Op{Kind: backend.OpAdd, Out: 2, A: 2, B: 2, OnSelected: true})
	pl, err = plan(p, planOptions{sms: 4, gemm: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := count(pl, p, sel, xn, 1, 1); got.gather != 1 || got.fromGather == 0 {
		t.Errorf("one row, the gathered rows read later: %+v launches", got)
	}
}

// TestFuseEmbedNorm: an embedding and the quantizing norm of its output
// become one launch with both kernels' arguments, for the batches the
// norm ran on; with cuBLAS the embedding stays for large batches (before
// their plain norm); an embedding type without a fused kernel stays.
func TestFuseEmbedNorm(t *testing.T) {
	for _, tc := range []struct {
		emb   string
		gemm  bool
		fused bool
	}{{"F32", false, true}, {"Q4_0", true, true}, {"Q8_0", false, true}, {"BF16", true, true}, {"Q6_K", false, false}} {
		b := newProg(t, 3, 4, 1, 32, 300)
		x, xn, logits := b.buf(256), b.buf(256), b.buf(300)
		emb, nw := b.mat(tc.emb, 300, 256, 1), b.vec(256, 1, 0.1)
		b.op(backend.Op{Kind: backend.OpEmbed, Out: x, W: emb, Scale: 1.5})
		b.op(backend.Op{Kind: backend.OpRMSNorm, Out: xn, A: x, W: nw, Eps: 1e-5, Group: 256})
		b.op(backend.Op{Kind: backend.OpMatMul, Out: logits, A: xn, W: b.mat("Q8_0", 300, 256, 1), Bias: backend.NoWeight})
		b.p.Logits = logits
		pl, err := plan(b.p, planOptions{sms: 4, gemm: tc.gemm})
		if err != nil {
			t.Fatal(err)
		}
		m := pl.mats[emb]
		sfx := weightTypes[m.typ]
		var fused, embeds []call
		for _, c := range pl.calls {
			switch {
			case c.kernel == "embed_norm_q8_"+sfx:
				fused = append(fused, c)
			case strings.HasPrefix(c.kernel, "embed_"):
				embeds = append(embeds, c)
			}
		}
		if !tc.fused {
			if len(fused) != 0 || len(embeds) != 1 || embeds[0].cond != always {
				t.Errorf("%s: fused %v, embeddings %v", tc.emb, fused, embeds)
			}
			continue
		}
		if len(fused) != 1 {
			t.Fatalf("%s gemm=%v: %d fused launches", tc.emb, tc.gemm, len(fused))
		}
		f := fused[0]
		want := []arg{buf(x), weight(emb), i64(m.rowBytes), i64(int(m.dOff)), metaField(fieldTokens, 4), f32(1.5),
			buf(xn), weight(nw), metaField(-1, 4), i32(metaRows), i32(256), i32(256), f32(1e-5), scratch(scratchQ8), scratch(scratchQ8DS)}
		if !slices.Equal(f.args, want) || f.gridX != 1 || f.gridY != gridAll || f.which != metaRows {
			t.Errorf("%s gemm=%v: %+v\nwant args %+v", tc.emb, tc.gemm, f, want)
		}
		wantCond, wantEmbeds := always, 0
		if tc.gemm {
			wantCond, wantEmbeds = small, 1
		}
		if f.cond != wantCond || len(embeds) != wantEmbeds || (wantEmbeds == 1 && embeds[0].cond != large) {
			t.Errorf("%s gemm=%v: fused under %v, embeddings %+v", tc.emb, tc.gemm, f.cond, embeds)
		}
	}
}
