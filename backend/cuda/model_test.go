package cuda

import (
	"encoding/json"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/backend/cpu"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/gguf"
	"github.com/weftlm/weft/internal/testmodel"
	"github.com/weftlm/weft/quant"
	"github.com/weftlm/weft/weights"
)

// klDiv is KL(softmax(p) ‖ softmax(q)) in float64.
func klDiv(p, q []float32) float64 {
	lse := func(v []float32) float64 {
		m := math.Inf(-1)
		for _, x := range v {
			m = max(m, float64(x))
		}
		var s float64
		for _, x := range v {
			s += math.Exp(float64(x) - m)
		}
		return m + math.Log(s)
	}
	lp, lq := lse(p), lse(q)
	var kl float64
	for i := range p {
		a, b := float64(p[i])-lp, float64(q[i])-lq
		kl += math.Exp(a) * (a - b)
	}
	if math.IsNaN(kl) {
		return math.Inf(1)
	}
	return kl
}

func argmax(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

// modelPaths lists the fixtures the end-to-end test loads: the Hugging
// Face directories, the Q8_0, Q4_0, Q4_K and Q6_K GGUFs and the MLX 4-bit
// directories.
func modelPaths(t *testing.T) []string {
	root := filepath.Join("..", "..", "testdata", "models")
	var paths []string
	for _, name := range []string{"llama3-tiny", "llama3-tiny-bf16", "qwen2-tiny", "qwen3-tiny", "gemma3-tiny"} {
		paths = append(paths, filepath.Join(root, name))
	}
	for _, pat := range []string{"*-Q8_0.gguf", "*-Q4_0.gguf", "*-Q4_K.gguf", "*-Q6_K.gguf", "*-mlx4"} {
		m, _ := filepath.Glob(filepath.Join(root, "quant", pat))
		paths = append(paths, m...)
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("fixture %s: %v", p, err)
		}
	}
	return paths
}

// pair is one model loaded on both backends.
type pair struct {
	t        *testing.T
	cpu, gpu *engine.Model
	worst    float64
}

// sequences starts a sequence on each backend's model.
func (p *pair) sequences() (cs, gs *engine.Sequence) {
	p.t.Helper()
	cs, err := p.cpu.NewSequence()
	if err != nil {
		p.t.Fatal(err)
	}
	if gs, err = p.gpu.NewSequence(); err != nil {
		p.t.Fatal(err)
	}
	return cs, gs
}

// loadPair loads w on the CPU backend cb and on gpu with opts; the models
// close when the test ends.
func loadPair(t *testing.T, w *weights.Provider, cb backend.Backend, gpu *Backend, opts engine.Options) *pair {
	t.Helper()
	p := &pair{t: t}
	for _, side := range []struct {
		m  **engine.Model
		be backend.Backend
	}{{&p.cpu, cb}, {&p.gpu, gpu}} {
		m, err := engine.Load(w, side.be, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		*side.m = m
	}
	return p
}

// compare checks every row of logits ([rows, vocab]) for KL < limit.
func (p *pair) compare(what string, want, got []float32, limit float64) {
	p.t.Helper()
	v := p.cpu.Vocab()
	for r := 0; r < len(want)/v; r++ {
		kl := klDiv(want[r*v:(r+1)*v], got[r*v:(r+1)*v])
		p.worst = max(p.worst, kl)
		if kl > limit {
			p.t.Fatalf("%s row %d: KL %.3g > %.g", what, r, kl, limit)
		}
	}
}

// TestModelsAgainstCPU loads every fixture on both backends and compares
// the logits of a prefill (in chunks), of greedy decoding, and of batched
// decode steps over two sequences. K-quant and MLX fixtures run a second
// time without cuBLAS, Q8_0 and Q4_0 ones a second time with mmq, and
// those and the float ones once more with the gate/up/GLU launch split in
// two (WEFT_CUDA_GLU=0). K-quant fixtures run on a backend whose K-quant
// products read Q8_K records as the CPU's do (kActQ8K): on Q4_0's per-32
// records (kA32, the default) these tiny random-weight models amplify
// the other rounding to KL 0.03-0.19 (H100); TestQuantizedReferencesGPU
// holds that path to transformers' logits instead.
func TestModelsAgainstCPU(t *testing.T) {
	gpu := newGPU(t)
	kgpu := q8kGPU(t, gpu)
	type variant struct {
		path                    string
		noBLAS, mmq, f16, noGLU bool
	}
	var variants []variant
	for _, path := range modelPaths(t) {
		variants = append(variants, variant{path: path})
		if !strings.HasSuffix(path, ".gguf") && !strings.HasSuffix(path, "-mlx4") {
			// The float fixtures again with f16 key/value caches on both
			// backends (rope_store_h, attention over half caches).
			variants = append(variants, variant{path: path, f16: true})
		}
		switch {
		case strings.HasSuffix(path, "_K.gguf") || strings.HasSuffix(path, "-mlx4"):
			variants = append(variants, variant{path: path, noBLAS: true})
		case strings.HasSuffix(path, "_0.gguf"):
			variants = append(variants, variant{path: path, mmq: true})
		}
		if !strings.HasSuffix(path, "_K.gguf") && !strings.HasSuffix(path, "-mlx4") {
			variants = append(variants, variant{path: path, noGLU: true})
		}
	}
	for _, vt := range variants {
		path, name := vt.path, filepath.Base(vt.path)
		switch {
		case vt.noBLAS:
			name += "/no-cublas"
		case vt.mmq:
			name += "/mmq"
		case vt.f16:
			name += "/f16-cache"
		case vt.noGLU:
			name += "/unfused-glu"
		}
		t.Run(name, func(t *testing.T) {
			gpu := gpu
			if strings.HasSuffix(path, "_K.gguf") {
				gpu = kgpu
			}
			if vt.noBLAS {
				// Every product on the matrix-vector kernels.
				saved := gpu.blas
				gpu.blas = nil
				defer func() { gpu.blas = saved }()
			}
			if vt.mmq {
				t.Setenv("WEFT_MMQ", "1")
			}
			if vt.noGLU {
				t.Setenv("WEFT_CUDA_GLU", "0")
			}
			w, err := weights.Open(path, weights.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			opts := engine.Options{Context: 96, MaxBatch: 16, Slots: 2}
			if vt.f16 {
				opts.CacheType = "f16"
			}
			p := loadPair(t, w, cpu.New(2), gpu, opts)
			cm, gm := p.cpu, p.gpu
			// Prefill chunks of more than 8 rows multiply on cuBLAS in f16:
			// activations round there (BF16 weights convert exactly). With
			// Q8_0 and Q4_0 weights, whose products both backends feed
			// int8 activations, the f16 rounding of weights and
			// activations also moves some activations of later products
			// across an int8 level, and these small random models amplify
			// that over their layers (KL up to 1.1e-2 seen on an H100).
			// With mmq instead, which does the CPU's float operations in
			// the CPU's order (int32 sums per block of 32, each added as
			// fma(sum, dw·da, acc), block after block), the first
			// prefill's chunks of 16 agree to 1e-4 (8.6e-5 seen). The
			// matrix-vector kernels of smaller batches split K over lanes
			// and scale in another order: their results differ from the
			// CPU's in the last bits, which now and then moves an
			// activation across an int8 level (KL up to 2e-3 seen after 12
			// decode steps), so later steps keep the wider limit.
			// Q4_K and Q6_K weights (whose activations both backends
			// quantize per 256 as Q8_K) do the same on cuBLAS. MLX weights
			// run as f16 on the GPU, float32 on the CPU; with f16
			// activations on cuBLAS too, KL reached 1.1e-4 on an H100.
			// Both run a second time without cuBLAS, where they must agree
			// to 1e-4 (but see below).
			limit := 1e-4
			switch {
			case strings.HasSuffix(path, "_0.gguf"):
				limit = 3e-2
			case strings.HasSuffix(path, "_K.gguf") && !vt.noBLAS:
				limit = 5e-2 // 2.9e-2 seen
			case strings.HasSuffix(path, "-mlx4") && !vt.noBLAS:
				limit = 1e-3
			case vt.f16 && strings.Contains(path, "bf16"):
				// BF16 weights: the GPU's prefill rounds activations to
				// f16 for cuBLAS (4.3e-5 with float32 caches); a key or
				// value that lands beside an f16 rounding boundary then
				// rounds to the other neighbour in the cache, a whole f16
				// step (1.7e-4 seen at the second chunk on an H100).
				limit = 1e-3
			case vt.noBLAS && strings.HasSuffix(path, "_K.gguf"):
				// The GPU sums a K-quant product in float32 per chunk of
				// 32 elements where the CPU scales each super-block's
				// integer sum once; a float32 rounding apart, an
				// activation of the next layer can land on the other side
				// of a Q8_K level, and the change reaches every later
				// position through the cache (on an H100: qwen2-256-Q6_K
				// 1.1e-3, llama-256-Q4_K 1.5e-3, qwen2-256-Q4_K 5.9e-3 in
				// the prefill; llama-256-Q6_K 3.6e-13).
				limit = 3e-2
			}
			// With mmq the first chunk (16 rows, every product on mmq, no
			// earlier positions) must match the CPU; later chunks attend
			// to the cache in another float order and keep the limit.
			firstLimit := limit
			if vt.mmq {
				firstLimit = 1e-4
			}
			// The prompts depend on the subtest's name alone, so that adding a
			// variant changes no other subtest's inputs.
			h := fnv.New64a()
			h.Write([]byte(t.Name()))
			rng := rand.New(rand.NewPCG(h.Sum64(), 11))
			prompt := func(n int) []int32 {
				ids := make([]int32, n)
				for j := range ids {
					ids[j] = int32(rng.IntN(cm.Vocab()))
				}
				return ids
			}
			seqs := func() (c, g *engine.Sequence) {
				c, err := cm.NewSequence()
				if err != nil {
					t.Fatal(err)
				}
				if g, err = gm.NewSequence(); err != nil {
					t.Fatal(err)
				}
				return c, g
			}
			forward := func(what string, c, g *engine.Sequence, ids []int32, all bool, limit float64) []float32 {
				want, err := c.Forward(ids, all)
				if err != nil {
					t.Fatal(err)
				}
				got, err := g.Forward(ids, all)
				if err != nil {
					t.Fatal(err)
				}
				p.compare(what, want, got, limit)
				return want
			}

			c1, g1 := seqs()
			forward("prefill", c1, g1, prompt(16), true, firstLimit)
			t.Logf("first chunk worst KL %.3g", p.worst)
			logits := forward("prefill", c1, g1, prompt(21), true, limit)
			t.Logf("prefill worst KL %.3g", p.worst)
			last := logits[len(logits)-cm.Vocab():]
			for step := range 12 {
				last = forward("decode "+string(rune('a'+step)), c1, g1, []int32{argmax(last)}, false, limit)
			}

			c2, g2 := seqs()
			forward("second prefill", c2, g2, prompt(5), false, limit)
			ids := []int32{1, 2}
			v := cm.Vocab()
			want, got := make([]float32, 2*v), make([]float32, 2*v)
			for range 6 {
				if err := cm.Step([]*engine.Sequence{c1, c2}, ids, want); err != nil {
					t.Fatal(err)
				}
				if err := gm.Step([]*engine.Sequence{g1, g2}, ids, got); err != nil {
					t.Fatal(err)
				}
				p.compare("batched step", want, got, limit)
				ids = []int32{argmax(want[:v]), argmax(want[v:])}
			}
			t.Logf("worst KL %.3g", p.worst)
		})
	}
}

// sharedFile finds a file of the shared test data: under $WEFT_SHARED
// when set (the device machine, where ../shared does not exist), else in
// the shared folder beside the repository.
func sharedFile(t *testing.T, rel string) string {
	t.Helper()
	p := sharedPath(rel)
	if p == "" {
		t.Skipf("shared test data %s not available", rel)
	}
	return p
}

// sharedPath is sharedFile's path, or "" where the file is absent.
func sharedPath(rel string) string {
	root := os.Getenv("WEFT_SHARED")
	if root == "" {
		root = filepath.Join("..", "..", "..", "shared")
	}
	p := filepath.Join(root, "testdata", rel)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// TestStoriesGreedy decodes 256 tokens greedily from BOS with the real
// stories260K model on the GPU and compares with the ids llama2.c's run.c
// produces.
func TestStoriesGreedy(t *testing.T) {
	var want struct {
		IDs []int32 `json:"ids_including_bos"`
	}
	b, err := os.ReadFile(sharedFile(t, "llama2c-stories260K/DERIVED_greedy_ids_t0.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	model := sharedFile(t, "gguf-stories260K/stories260K.gguf")
	gpu := newGPU(t)
	m, seq := openSequence(t, model, gpu, engine.Options{Context: 512})
	logits := make([]float32, m.Vocab())
	got := []int32{want.IDs[0]}
	start := time.Now()
	for len(got) < len(want.IDs) {
		if err := seq.ForwardInto(got[len(got)-1:], false, logits); err != nil {
			t.Fatal(err)
		}
		got = append(got, argmax(logits))
	}
	elapsed := time.Since(start)
	for i := range want.IDs {
		if got[i] != want.IDs[i] {
			t.Fatalf("token %d is %d, want %d\n got %v\nwant %v", i, got[i], want.IDs[i], got[:i+1], want.IDs[:i+1])
		}
	}
	one := got[len(got)-1:]
	allocs := testing.AllocsPerRun(20, func() {
		if err := seq.ForwardInto(one, false, logits); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%d tokens in %v (%.0f tok/s)", len(got)-1, elapsed, float64(len(got)-1)/elapsed.Seconds())
	if allocs != 0 {
		t.Errorf("a decode step allocates %.0f times", allocs)
	}
}

// storiesAs writes stories260K (f) with its F32 matrices whose rows are
// whole blocks of typ quantized to typ (the others kept) into a
// temporary GGUF and returns its path.
func storiesAs(t *testing.T, f *gguf.File, typ ggml.Type) string {
	t.Helper()
	return requantized(t, f, typ, "stories260K", false)
}

// requantized writes f with its 2-D tensors whose rows are whole blocks of
// typ quantized to typ from their float32 values (F32 ones only, unless
// requant: then every type, dequantized first) into a temporary GGUF
// named for base and typ, and returns its path.
func requantized(t *testing.T, f *gguf.File, typ ggml.Type, base string, requant bool) string {
	t.Helper()
	gw := gguf.NewWriter()
	for _, kv := range f.KVs {
		gw.SetKV(kv.Key, kv.Value)
	}
	quantized := 0
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		data, err := f.TensorData(ti)
		if err != nil {
			t.Fatal(err)
		}
		if len(ti.Dims) != 2 || (ti.Type != ggml.F32 && !requant) || ti.Dims[0]%uint64(typ.BlockSize()) != 0 {
			if err := gw.AddTensor(ti.Name, ti.Type, ti.Dims, data); err != nil {
				t.Fatal(err)
			}
			continue
		}
		vals := make([]float32, ti.Dims[0]*ti.Dims[1])
		if err := quant.Dequantize(ti.Type, data, vals); err != nil {
			t.Fatalf("%s: %v", ti.Name, err)
		}
		rb, err := typ.RowBytes(ti.Dims[0])
		if err != nil {
			t.Fatal(err)
		}
		out := make([]byte, rb*ti.Dims[1])
		if err := quant.Quantize(typ, vals, out); err != nil {
			t.Fatalf("%s: %v", ti.Name, err)
		}
		if err := gw.AddTensor(ti.Name, typ, ti.Dims, out); err != nil {
			t.Fatal(err)
		}
		quantized++
	}
	if quantized == 0 {
		t.Fatal("no tensor quantized")
	}
	path := filepath.Join(t.TempDir(), base+"-"+typ.String()+".gguf")
	w, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gw.WriteTo(w); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTrainedQuantizedAgainstCPU quantizes stories260K, a trained model,
// to weight types whose blocks fit its 64-wide rows (every matrix but the
// 172-wide FFN down product, which stays F32) and compares the logits of
// both backends: a prefill in chunks of 16, then greedy decode steps,
// every position. Unlike the random fixtures of TestModelsAgainstCPU, a
// trained model does not turn a moved int8 activation level into a
// different distribution, so the limits say what each path computes:
//
//   - F16, BF16 (cuBLAS with f16 activations for the chunks, float
//     matrix-vector kernels): 1e-4 (3.4e-6 seen on an H100).
//   - Q8_0, Q4_0 with mmq (and without cuBLAS, for the F32 matrix): both
//     backends round activations to int8 and sum each block's integers
//     exactly, so the first chunk of 16 is held to 1e-4 (5.7e-13 seen
//     for Q8_0). Later chunks attend to the cache in another float order
//     than the CPU (as in TestModelsAgainstCPU), which now and then moves
//     an int8 level of a later product; from there on they keep the
//     default path's 1e-2 (on an H100: Q4_0 3.1e-4 and 5.9e-4 at the
//     second chunk, Q5_0 8.6e-4 at its last row and 1.8e-3 at the third
//     decode step; Q8_0 and IQ4_NL 5e-13 throughout).
//   - Q8_0, Q4_0 by default: cuBLAS multiplies the chunks in f16, 1e-2
//     (3e-3 seen).
//   - Q5_0 and IQ4_NL are stored as Q8_0 on the GPU without loss
//     (convert.go's q8Exact), so they take Q8_0's limits.
//   - Q5_1, Q4_1 are stored as Q8_A on the GPU without loss (convert.go's
//     q8Affine) and take int8 activations as on the CPU: 1e-2 (as F16
//     weights on float activations they reached 8.1e-3).
func TestTrainedQuantizedAgainstCPU(t *testing.T) {
	src := sharedFile(t, "gguf-stories260K/stories260K.gguf")
	gpu := newGPU(t)
	f, err := gguf.OpenFile(src, gguf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, tc := range []struct {
		typ   ggml.Type
		mmq   bool
		first float64 // the first chunk's limit
		limit float64 // the later chunks' and the decode steps'
	}{
		{ggml.F16, false, 1e-4, 1e-4}, {ggml.BF16, false, 1e-4, 1e-4},
		{ggml.Q8_0, true, 1e-4, 1e-2}, {ggml.Q4_0, true, 1e-4, 1e-2},
		{ggml.Q5_0, true, 1e-4, 1e-2}, {ggml.IQ4_NL, true, 1e-4, 1e-2},
		{ggml.Q8_0, false, 1e-2, 1e-2}, {ggml.Q4_0, false, 1e-2, 1e-2},
		{ggml.Q5_0, false, 1e-2, 1e-2}, {ggml.Q5_1, false, 1e-2, 1e-2}, {ggml.Q4_1, false, 1e-2, 1e-2},
		{ggml.IQ4_NL, false, 1e-2, 1e-2},
	} {
		typ, name := tc.typ, tc.typ.String()
		if tc.mmq {
			name += "/mmq"
		}
		t.Run(name, func(t *testing.T) {
			if tc.mmq {
				// mmq, and the F32 down product on the matrix-vector
				// kernels rather than cuBLAS in f16 (which moved a level
				// for Q4_0: KL 3.1e-4 on an H100).
				t.Setenv("WEFT_MMQ", "1")
				saved := gpu.blas
				gpu.blas = nil
				defer func() { gpu.blas = saved }()
			}
			path := storiesAs(t, f, typ)
			wp, err := weights.Open(path, weights.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer wp.Close()
			opts := engine.Options{Context: 128, MaxBatch: 16}
			p := loadPair(t, wp, cpu.New(2), gpu, opts)
			cm := p.cpu
			cs, gs := p.sequences()
			rng := rand.New(rand.NewPCG(7, uint64(typ)))
			prompt := make([]int32, 48)
			for i := range prompt {
				prompt[i] = int32(1 + rng.IntN(cm.Vocab()-1))
			}
			want, err := cs.Forward(prompt, true)
			if err != nil {
				t.Fatal(err)
			}
			got, err := gs.Forward(prompt, true)
			if err != nil {
				t.Fatal(err)
			}
			n := 16 * cm.Vocab() // the first chunk (MaxBatch)
			p.compare("prefill", want[:n], got[:n], tc.first)
			p.compare("prefill after the first chunk", want[n:], got[n:], tc.limit)
			last := want[len(want)-cm.Vocab():]
			for step := range 24 {
				ids := []int32{argmax(last)}
				if last, err = cs.Forward(ids, false); err != nil {
					t.Fatal(err)
				}
				g, err := gs.Forward(ids, false)
				if err != nil {
					t.Fatal(err)
				}
				p.compare("decode step "+strconv.Itoa(step), last, g, tc.limit)
			}
			t.Logf("%s: worst KL %.3g", typ, p.worst)
		})
	}
}

// TestQuantizedReferencesGPU runs the GGUF fixtures of
// testdata/models/quant on the GPU against transformers fed the same
// dequantized weights (scripts/make_quant_references.py), teacher-forced,
// under the bounds of the engine's TestQuantizedReferences (mean row
// relative error ≤ 0.12, worst ≤ 0.35, top-1 on 75 % of rows): what the
// rounding of activations to int8 costs these tiny random-weight models,
// which amplify it. It covers what the comparison with the CPU cannot
// where the backends round differently: the K-quant products here read
// levels per 32 (kA32), the CPU's per 256 (Q8_K).
func TestQuantizedReferencesGPU(t *testing.T) {
	refs, _ := filepath.Glob(filepath.Join("..", "..", "testdata", "models", "quant", "*.reference.json"))
	if len(refs) == 0 {
		t.Skip("no quantized references in testdata/models/quant")
	}
	gpu := newGPU(t)
	for _, ref := range refs {
		base := ref[:len(ref)-len(".reference.json")]
		if _, err := os.Stat(base + ".gguf"); err != nil {
			continue // MLX directories: the engine's float32 reference test
		}
		t.Run(filepath.Base(base), func(t *testing.T) {
			r := testmodel.LoadReferenceFiles(t, ref, base+".logits.f32")
			_, seq := openSequence(t, base+".gguf", gpu, engine.Options{Context: 128, MaxBatch: 16})
			got, err := seq.Forward(append(append([]int32{}, r.Tokens...), r.Generated...), true)
			if err != nil {
				t.Fatal(err)
			}
			testmodel.CheckQuantRows(t, got, r)
		})
	}
}
