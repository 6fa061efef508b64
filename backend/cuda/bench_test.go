package cuda

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weftlm/weft/arch"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/synth"
	"github.com/weftlm/weft/weights"
)

// llama1B is the shape of Llama-3.2-1B (tied embeddings), the model of the
// peer figures in the shared performance notes: every weight byte, about
// 0.7 GB in Q4_0, is read once per decoded token.
func llama1B() weights.Config {
	return weights.Config{Architecture: "llama", NLayers: 16, Dim: 2048, NHeads: 32, NKVHeads: 8, HeadDim: 64,
		FFNDim: 8192, VocabSize: 128256, ContextLength: 4096, NormEps: 1e-5, RopeTheta: 500000, RopeDim: 64, TiedEmbeddings: true}
}

// benchModel writes a random-weight model of llama1B's shape, once per
// machine: later runs find it in the temporary folder.
func benchModel(b *testing.B, typ ggml.Type) string {
	dir := filepath.Join(os.TempDir(), "weft-cuda-bench")
	path := filepath.Join(dir, "llama-1b-"+typ.String()+".gguf")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(f.Name())
	d, _ := arch.Lookup("llama")
	if err := synth.Write(f, llama1B(), d, synth.Options{Type: typ, Seed: 1}); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		b.Fatal(err)
	}
	return path
}

func loadBench(b *testing.B, typ ggml.Type, opts engine.Options) *engine.Model {
	gpu := newGPU(b)
	w, err := weights.Open(benchModel(b, typ), weights.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { w.Close() })
	m, err := engine.Load(w, gpu, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m
}

// BenchmarkDecode measures single-sequence greedy decode of the 1B shape,
// the cache growing up to 1024 positions and starting over.
func BenchmarkDecode(b *testing.B) {
	for _, typ := range []ggml.Type{ggml.F16, ggml.Q8_0, ggml.Q4_0} {
		b.Run(typ.String(), func(b *testing.B) {
			m := loadBench(b, typ, engine.Options{Context: 1024})
			seq, err := m.NewSequence()
			if err != nil {
				b.Fatal(err)
			}
			logits := make([]float32, m.Vocab())
			tok := []int32{1}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if seq.Pos() == m.Context() {
					seq.Rewind(0)
				}
				if err := seq.ForwardInto(tok, false, logits); err != nil {
					b.Fatal(err)
				}
				tok[0] = argmax(logits)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

// BenchmarkPrefill measures a 512-token prompt of the 1B shape in chunks
// of 64 rows.
func BenchmarkPrefill(b *testing.B) {
	for _, typ := range []ggml.Type{ggml.F16, ggml.Q8_0, ggml.Q4_0} {
		b.Run(typ.String(), func(b *testing.B) {
			m := loadBench(b, typ, engine.Options{Context: 1024, MaxBatch: 64})
			prompt := make([]int32, 512)
			for i := range prompt {
				prompt[i] = int32(300 + i)
			}
			logits := make([]float32, m.Vocab())
			b.ResetTimer()
			for range b.N {
				seq, err := m.NewSequence()
				if err != nil {
					b.Fatal(err)
				}
				if err := seq.ForwardInto(prompt, false, logits); err != nil {
					b.Fatal(err)
				}
				seq.Close()
			}
			b.ReportMetric(float64(b.N*len(prompt))/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

// TestSynthBenchModels writes the random-weight models the performance
// notes measure, into $WEFT_BENCH_SYNTH: each Hugging Face config named in
// $WEFT_BENCH_CONFIGS (name=path, comma-separated) at Q4_0, Q8_0 and
// BF16 (or the types in $WEFT_BENCH_TYPES), as name-TYPE.gguf, all at
// once (one goroutine a file).
func TestSynthBenchModels(t *testing.T) {
	dir, configs := os.Getenv("WEFT_BENCH_SYNTH"), os.Getenv("WEFT_BENCH_CONFIGS")
	if dir == "" || configs == "" {
		t.Skip("set WEFT_BENCH_SYNTH to a folder and WEFT_BENCH_CONFIGS to name=config.json,...")
	}
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for _, nc := range strings.Split(configs, ",") {
		name, path, _ := strings.Cut(nc, "=")
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		c, d, err := weights.ParseHFConfig(raw, path)
		if err != nil {
			t.Fatal(err)
		}
		types := []ggml.Type{ggml.Q4_0, ggml.Q8_0, ggml.BF16}
		if list := os.Getenv("WEFT_BENCH_TYPES"); list != "" {
			types = nil
			for _, name := range strings.Split(list, ",") {
				typ, err := ggml.ParseType(name)
				if err != nil {
					t.Fatal(err)
				}
				types = append(types, typ)
			}
		}
		for _, typ := range types {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out := filepath.Join(dir, name+"-"+typ.String()+".gguf")
				f, err := os.Create(out)
				if err == nil {
					err = synth.Write(f, c, d, synth.Options{Type: typ, Seed: 1, Name: name})
					if cerr := f.Close(); err == nil {
						err = cerr
					}
				}
				if err != nil {
					errs <- fmt.Errorf("%s: %w", out, err)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestBenchGGUF measures each GGUF in $WEFT_BENCH (comma-separated) the
// way llama-bench does: a 512-token prompt in one batch (pp512) and 128
// single-token decode steps from an empty cache (tg128), each after an
// untimed warm-up, repeated; it prints the median and the spread, and the
// weight bytes a decode step reads (the whole file but the embedding
// table when the output matrix is separate).
func TestBenchGGUF(t *testing.T) {
	list := os.Getenv("WEFT_BENCH")
	if list == "" {
		t.Skip("set WEFT_BENCH to GGUF paths, comma-separated")
	}
	gpu := newGPU(t)
	if name, err := gpu.CuBLAS(); err != nil {
		fmt.Printf("bench: no cuBLAS: %v\n", err)
	} else {
		fmt.Printf("bench: cuBLAS %s\n", name)
	}
	const reps = 5
	for _, path := range strings.Split(list, ",") {
		w, err := weights.Open(path, weights.Options{})
		if err != nil {
			t.Fatal(err)
		}
		var total, embed uint64
		separateOutput := false
		for _, tn := range w.Tensors() {
			total += tn.Bytes
			switch tn.Name {
			case arch.TokenEmbedding:
				embed = tn.Bytes
			case arch.Output:
				separateOutput = true
			}
		}
		perToken := total
		if separateOutput {
			perToken -= embed
		}
		start := time.Now()
		m, err := engine.Load(w, gpu, engine.Options{Context: 1024, MaxBatch: 512})
		if err != nil {
			t.Fatal(err)
		}
		load := time.Since(start)
		seq, err := m.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		logits := make([]float32, m.Vocab())
		prompt := make([]int32, 512)
		pp := func() float64 {
			for i := range prompt {
				prompt[i] = int32(rng.IntN(m.Vocab()))
			}
			if err := seq.Rewind(0); err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			if err := seq.ForwardInto(prompt, false, logits); err != nil {
				t.Fatal(err)
			}
			return float64(len(prompt)) / time.Since(t0).Seconds()
		}
		one := []int32{0}
		tg := func(n int) float64 {
			if err := seq.Rewind(0); err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			for range n {
				one[0] = int32(rng.IntN(m.Vocab()))
				if err := seq.ForwardInto(one, false, logits); err != nil {
					t.Fatal(err)
				}
			}
			return float64(n) / time.Since(t0).Seconds()
		}
		pp()
		tg(16)
		var pps, tgs []float64
		for range reps {
			pps = append(pps, pp())
			tgs = append(tgs, tg(128))
		}
		fmt.Printf("bench %s: %.2f GB read per token, load %.1fs, pp512 %s tok/s, tg128 %s tok/s\n",
			filepath.Base(path), float64(perToken)/1e9, load.Seconds(), spread(pps), spread(tgs))
		seq.Close()
		m.Close()
		w.Close()
	}
}

// spread formats the median and the range of xs.
func spread(xs []float64) string {
	s := slices.Clone(xs)
	slices.Sort(s)
	return fmt.Sprintf("%.1f [%.1f-%.1f]", s[len(s)/2], s[0], s[len(s)-1])
}

// TestProfileDecode runs $WEFT_PROFILE_STEPS (default 30) decode steps of
// the GGUF in $WEFT_PROFILE, for a kernel profiler (ncu) to time the
// launches of a few steps in the middle.
func TestProfileDecode(t *testing.T) {
	path := os.Getenv("WEFT_PROFILE")
	if path == "" {
		t.Skip("set WEFT_PROFILE to a GGUF")
	}
	steps := 30
	if s := os.Getenv("WEFT_PROFILE_STEPS"); s != "" {
		fmt.Sscan(s, &steps)
	}
	gpu := newGPU(t)
	w, err := weights.Open(path, weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	m, err := engine.Load(w, gpu, engine.Options{Context: 1024, MaxBatch: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	seq, err := m.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	logits := make([]float32, m.Vocab())
	for i := range steps {
		if err := seq.ForwardInto([]int32{int32(i + 7)}, false, logits); err != nil {
			t.Fatal(err)
		}
	}
}
