package cuda

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weftlm/weft/arch"
	"github.com/weftlm/weft/backend/cpu"
	"github.com/weftlm/weft/convert"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/gguf"
	"github.com/weftlm/weft/quant"
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
// once (one goroutine a file). With WEFT_BENCH_FAST=1 the models get
// random quants (Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_1, Q5_1, Q4_K, Q5_K, Q6_K)
// or random BF16 values instead
// of quantized normal values (fastSynth: seconds instead of minutes for an
// 8B shape).
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
		fast := os.Getenv("WEFT_BENCH_FAST") == "1"
		for _, typ := range types {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out := filepath.Join(dir, name+"-"+typ.String()+".gguf")
				f, err := os.Create(out)
				if err == nil {
					if fast {
						err = fastSynth(f, c, d, typ, name)
					} else {
						err = synth.Write(f, c, d, synth.Options{Type: typ, Seed: 1, Name: name})
					}
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

// fastSynth writes what synth.Write does for a dense architecture whose
// matrices all take typ (Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_1, Q5_1 or the
// K-quants Q4_K, Q5_K and Q6_K, with uniformly random quants and block
// scales that give the weights synth's standard deviation, 0.02; or BF16,
// with random signs and mantissas of magnitudes in [2^-7, 2^-5)):
// products and attention cost what they cost on any weights, and the
// file is written at the speed of the disk.
func fastSynth(w io.Writer, c weights.Config, d *arch.Descriptor, typ ggml.Type, name string) error {
	qstd, ok := fastSynthLevels[typ]
	if !ok {
		return fmt.Errorf("fastSynth: type %s, want Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_1, Q5_1, Q4_K, Q5_K, Q6_K or BF16", typ)
	}
	if d.QKVBias || len(d.Required) == 0 {
		return fmt.Errorf("fastSynth: architecture %s has biases or no layers", d.Name)
	}
	scale := uint16(float16Bits(float32(0.02 / qstd)))
	dim, q, kv, ffn := int64(c.Dim), int64(c.QDim()), int64(c.KVDim()), int64(c.FFNDim)
	shape := map[string][]int64{
		arch.AttnNorm: {dim}, arch.FFNNorm: {dim}, arch.AttnPostNorm: {dim}, arch.FFNPostNorm: {dim},
		arch.AttnQ: {q, dim}, arch.AttnK: {kv, dim}, arch.AttnV: {kv, dim}, arch.AttnOut: {dim, q},
		arch.AttnQNorm: {int64(c.HeadDim)}, arch.AttnKNorm: {int64(c.HeadDim)},
		arch.FFNGate: {ffn, dim}, arch.FFNUp: {ffn, dim}, arch.FFNDown: {dim, ffn},
	}
	type spec struct {
		canonical string
		shape     []int64
	}
	specs := []spec{{arch.TokenEmbedding, []int64{int64(c.VocabSize), dim}}}
	for l := range c.NLayers {
		for _, p := range d.Required {
			if shape[p] == nil {
				return fmt.Errorf("fastSynth: no shape for %s", p)
			}
			specs = append(specs, spec{arch.Layer(p, l), shape[p]})
		}
	}
	specs = append(specs, spec{arch.OutputNorm, []int64{dim}})
	if !c.TiedEmbeddings {
		specs = append(specs, spec{arch.Output, []int64{int64(c.VocabSize), dim}})
	}
	c.RopeLayout = d.GGUFRope.String()
	gw := gguf.NewWriter()
	convert.WriteConfig(gw, c, d, convert.Options{Type: typ, Name: name})
	for _, kv := range synth.Tokenizer(c.VocabSize) {
		gw.SetKV(kv.Key, kv.Value)
	}
	for i, sp := range specs {
		gname, ok := convert.GGUFTensorName(sp.canonical)
		if !ok {
			return fmt.Errorf("fastSynth: no GGUF name for %q", sp.canonical)
		}
		dims := make([]uint64, len(sp.shape))
		for j, v := range sp.shape {
			dims[len(sp.shape)-1-j] = uint64(v)
		}
		rng := rand.New(rand.NewPCG(1, uint64(i)))
		t, n := ggml.F32, sp.shape[0]
		if len(sp.shape) == 2 {
			t, n = typ, sp.shape[0]*sp.shape[1]
		}
		if err := gw.AddTensorFunc(gname, t, dims, func(out io.Writer) error {
			return fastFill(out, t, int(n), scale, rng)
		}); err != nil {
			return err
		}
	}
	bw := bufio.NewWriterSize(w, 4<<20)
	if _, err := gw.WriteTo(bw); err != nil {
		return err
	}
	return bw.Flush()
}

// fastSynthLevels are the types fastSynth writes, with the root mean
// square of their random levels: uniform over [-128, 127], [-8, 7] and
// [-16, 15], or over IQ4_NL's 16 levels (1 for BF16, whose values are
// random); for the K-quants, the levels times the fixed sub-block scale
// fastFillK writes (32 for Q4_K and Q5_K, 16 for Q6_K's uniform [-32,
// 31]).
var fastSynthLevels = map[ggml.Type]float64{ggml.Q8_0: 73.9, ggml.Q4_0: 4.61, ggml.Q5_0: 9.23, ggml.IQ4_NL: 67.4, ggml.BF16: 1,
	ggml.Q4_1: 4.61, ggml.Q5_1: 9.23, ggml.Q4_K: 32 * 4.61, ggml.Q5_K: 32 * 9.23, ggml.Q6_K: 16 * 18.47}

// fastSynthMean is the mean level of the affine types, whose minimum m is
// set to −mean·d so that the weights are centred.
var fastSynthMean = map[ggml.Type]float64{ggml.Q4_1: 7.5, ggml.Q5_1: 15.5}

// fastFill writes n values of type t: F32 ones (norm gains), or blocks of
// 32 with the f16 scale (and for Q4_1 / Q5_1 the centring minimum) and
// random quant bytes (every byte pattern after them is a valid block of
// these types).
func fastFill(w io.Writer, t ggml.Type, n int, scale uint16, rng *rand.Rand) error {
	if t == ggml.F32 {
		b := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(1))
		}
		_, err := w.Write(b)
		return err
	}
	const perWrite = 1 << 15
	if t == ggml.BF16 {
		// Sign and mantissa random, exponent 2^-7 or 2^-6 (bf16 is the
		// top half of a float32): 16 random bits an element.
		buf := make([]byte, 2*perWrite)
		for done := 0; done < n; done += perWrite {
			m := min(perWrite, n-done)
			for i := 0; i < m; i += 4 {
				r := rng.Uint64()
				for k := 0; k < 4 && i+k < m; k++ {
					x := uint16(r >> (16 * k))
					binary.LittleEndian.PutUint16(buf[2*(i+k):], x&0x807f|(120+x>>14&1)<<7)
				}
			}
			if _, err := w.Write(buf[:2*m]); err != nil {
				return err
			}
		}
		return nil
	}
	if kquantFast[t] {
		return fastFillK(w, t, n, scale, rng)
	}
	bb, err := t.RowBytes(32)
	if err != nil {
		return err
	}
	blockBytes, head := int(bb), 2
	var minBits uint16
	if mean, ok := fastSynthMean[t]; ok {
		head, minBits = 4, quant.F32ToF16(-float32(mean)*quant.F16ToF32(scale))
	}
	buf := make([]byte, perWrite*blockBytes)
	for done := 0; done < n/32; done += perWrite {
		nb := min(perWrite, n/32-done)
		for b := range nb {
			blk := buf[b*blockBytes : (b+1)*blockBytes]
			binary.LittleEndian.PutUint16(blk, scale)
			if head == 4 {
				binary.LittleEndian.PutUint16(blk[2:], minBits)
			}
			for i := head; i < blockBytes; i += 8 {
				var r [8]byte
				binary.LittleEndian.PutUint64(r[:], rng.Uint64())
				copy(blk[i:], r[:])
			}
		}
		if _, err := w.Write(buf[:nb*blockBytes]); err != nil {
			return err
		}
	}
	return nil
}

// kquantFast are the K-quant types fastFillK writes.
var kquantFast = map[ggml.Type]bool{ggml.Q4_K: true, ggml.Q5_K: true, ggml.Q6_K: true}

// fastFillK writes n values of K-quant type t as super-blocks of 256 with
// random quants and one fixed header: every sub-block scale 32 (Q6_K:
// 16), every Q4_K/Q5_K sub-block minimum 32 with dmin = mean·d, so that
// the weights are centred (w = 32·d·(q − mean)), and d = scale.
func fastFillK(w io.Writer, t ggml.Type, n int, scale uint16, rng *rand.Rand) error {
	bb, err := t.RowBytes(256)
	if err != nil {
		return err
	}
	blockBytes := int(bb)
	// proto is a super-block's fixed bytes; rnd the ranges of quants.
	proto := make([]byte, blockBytes)
	var rnd [][2]int
	switch t {
	case ggml.Q4_K, ggml.Q5_K:
		mean := float32(7.5)
		if t == ggml.Q5_K {
			mean = 15.5
		}
		binary.LittleEndian.PutUint16(proto, scale)
		binary.LittleEndian.PutUint16(proto[2:], quant.F32ToF16(mean*quant.F16ToF32(scale)))
		// scales[12]: 6-bit scale and minimum 32 (0b100000) for each of
		// the 8 sub-blocks. Sub-blocks 0-3 keep theirs in the low 6 bits
		// of bytes 0-3 (scale) and 4-7 (min); 4-7 keep their low 4 bits
		// in bytes 8-11 (0 here) and their top 2 bits (0b10) in the top
		// bits of bytes 0-7.
		for j := range 8 {
			proto[4+j] = 0xA0
		}
		rnd = [][2]int{{16, blockBytes}}
	case ggml.Q6_K:
		for j := range 16 {
			proto[192+j] = 16
		}
		binary.LittleEndian.PutUint16(proto[208:], scale)
		rnd = [][2]int{{0, 192}}
	default:
		return fmt.Errorf("fastFillK: type %s", t)
	}
	const perWrite = 1 << 12
	buf := make([]byte, perWrite*blockBytes)
	for done := 0; done < n/256; done += perWrite {
		nb := min(perWrite, n/256-done)
		for b := range nb {
			blk := buf[b*blockBytes : (b+1)*blockBytes]
			copy(blk, proto)
			for _, r := range rnd {
				for i := r[0]; i < r[1]; i += 8 {
					var v [8]byte
					binary.LittleEndian.PutUint64(v[:], rng.Uint64())
					copy(blk[i:r[1]], v[:])
				}
			}
		}
		if _, err := w.Write(buf[:nb*blockBytes]); err != nil {
			return err
		}
	}
	return nil
}

// float16Bits rounds a normal float32 in f16's range to f16's bits.
func float16Bits(f float32) uint16 {
	b := math.Float32bits(f)
	exp := int(b>>23&0xff) - 127 + 15
	mant := (b >> 13) & 0x3ff
	if b>>12&1 == 1 {
		mant++
	}
	return uint16(exp)<<10 + uint16(mant)
}

// TestBenchGGUF measures each GGUF in $WEFT_BENCH (comma-separated) the
// way llama-bench does: a 512-token prompt in one batch (pp512) and 128
// single-token decode steps from an empty cache (tg128), each after an
// untimed warm-up, repeated; it prints the median and the spread, and the
// weight bytes a decode step reads (the whole file but the embedding
// table when the output matrix is separate). $WEFT_BENCH_MMQ, a
// comma-separated list of WEFT_MMQ values, measures each model under
// each; WEFT_BENCH_TG=0 skips decode.
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
	variants := []string{os.Getenv("WEFT_MMQ")}
	if v := os.Getenv("WEFT_BENCH_MMQ"); v != "" {
		variants = strings.Split(v, ",")
	}
	decode := os.Getenv("WEFT_BENCH_TG") != "0"
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
		for _, v := range variants {
			t.Setenv("WEFT_MMQ", v)
			line := benchModelRuns(t, gpu, w, decode)
			fmt.Printf("bench %s (WEFT_MMQ=%s): %.2f GB read per token, %s\n", filepath.Base(path), v, float64(perToken)/1e9, line)
		}
		w.Close()
	}
}

// benchModelRuns loads w on gpu and returns its load time and pp512 (and
// tg128) figures.
func benchModelRuns(t *testing.T, gpu *Backend, w *weights.Provider, decode bool) string {
	const reps = 5
	start := time.Now()
	m, err := engine.Load(w, gpu, engine.Options{Context: 1024, MaxBatch: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	load := time.Since(start)
	seq, err := m.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
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
	var pps, tgs []float64
	for range reps {
		pps = append(pps, pp())
	}
	line := fmt.Sprintf("load %.1fs, pp512 %s tok/s", load.Seconds(), spread(pps))
	if decode {
		tg(16)
		for range reps {
			tgs = append(tgs, tg(128))
		}
		line += fmt.Sprintf(", tg128 %s tok/s", spread(tgs))
	}
	return line
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
	decodeSteps(t, newGPU(t), path, profileSteps(), nil)
}

// TestTraceDecode prints a block trace (trace.go) of one decode step of
// the GGUF at WEFT_TRACE, after WEFT_PROFILE_STEPS (default 30) warm-up
// steps: run with WEFT_CUDA_TRACE=1 and -test.v.
func TestTraceDecode(t *testing.T) {
	path := os.Getenv("WEFT_TRACE")
	if path == "" {
		t.Skip("set WEFT_TRACE to a GGUF (and WEFT_CUDA_TRACE=1)")
	}
	if !traceOn() {
		t.Fatal("WEFT_TRACE needs WEFT_CUDA_TRACE=1, which compiles the kernels with tracing")
	}
	gpu, steps := newGPU(t), profileSteps()
	decodeSteps(t, gpu, path, steps+1, func(i int) {
		if i == steps {
			if err := gpu.traceReset(); err != nil {
				t.Fatal(err)
			}
		}
	})
	recs, names, err := gpu.traceRead()
	if err != nil {
		t.Fatal(err)
	}
	ls, err := summarizeTrace(recs, names)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	writeTrace(&b, ls)
	t.Logf("%s at position %d, %d blocks:\n%s", filepath.Base(path), steps, len(recs), b.String())
	if dump := os.Getenv("WEFT_TRACE_DUMP"); dump != "" {
		var d strings.Builder
		if err := dumpTrace(&d, recs, names); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dump, []byte(d.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ph, err := gpu.tracePhase()
	if err != nil {
		t.Fatal(err)
	}
	// The last layer's decode attention, block (0, 0): µs from its start
	// to its release (the first tile's early copies issued), the first
	// tile in shared memory, the first tile's scores and softmax (warp 0),
	// the tiles done, the output written (a row of one run).
	line := "attention block 0 phases (µs after its start):"
	for i := 1; i < len(ph); i++ {
		if ph[i] != 0 && ph[0] != 0 {
			line += fmt.Sprintf(" %d:%.2f", i, float64(int64(ph[i]-ph[0]))/1000)
		}
	}
	t.Log(line)
}

// profileSteps is $WEFT_PROFILE_STEPS, or 30.
func profileSteps() int {
	steps := 30
	if s := os.Getenv("WEFT_PROFILE_STEPS"); s != "" {
		fmt.Sscan(s, &steps)
	}
	return steps
}

// decodeSteps loads the GGUF at path on gpu and runs steps one-token
// decode steps of one sequence, calling before(i), where set, before
// step i.
func decodeSteps(t *testing.T, gpu *Backend, path string, steps int, before func(i int)) {
	m, seq := openSequence(t, path, gpu, engine.Options{Context: 1024, MaxBatch: 512})
	logits := make([]float32, m.Vocab())
	for i := range steps {
		if before != nil {
			before(i)
		}
		if err := seq.ForwardInto([]int32{int32(i + 7)}, false, logits); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFastSynth checks that fastSynth's files load and run (on the CPU
// backend) to finite logits, for each type.
func TestFastSynth(t *testing.T) {
	c := weights.Config{Architecture: "llama", NLayers: 2, Dim: 64, NHeads: 4, NKVHeads: 2, HeadDim: 16,
		FFNDim: 128, VocabSize: 300, ContextLength: 64, NormEps: 1e-5, RopeTheta: 10000, RopeDim: 16}
	// The K-quants' rows are whole super-blocks of 256.
	ck := c
	ck.Dim, ck.NHeads, ck.NKVHeads, ck.HeadDim, ck.RopeDim, ck.FFNDim = 256, 8, 4, 32, 32, 512
	d, _ := arch.Lookup("llama")
	for _, typ := range []ggml.Type{ggml.Q8_0, ggml.Q4_0, ggml.Q5_0, ggml.IQ4_NL, ggml.BF16, ggml.Q4_K, ggml.Q5_K, ggml.Q6_K} {
		c := c
		if kquantFast[typ] {
			c = ck
		}
		path := filepath.Join(t.TempDir(), "m.gguf")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := fastSynth(f, c, d, typ, "tiny"); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		w, err := weights.Open(path, weights.Options{})
		if err != nil {
			t.Fatal(err)
		}
		// The weights are about centred (Q4_0's levels average -0.5)
		// with synth's standard deviation, 0.02 (BF16's random
		// magnitudes aim at it only roughly).
		if typ != ggml.BF16 {
			data, err := w.Data(arch.Layer(arch.FFNGate, 0))
			if err != nil {
				t.Fatal(err)
			}
			v := make([]float32, c.FFNDim*c.Dim)
			if err := quant.Dequantize(typ, data.Bytes, v); err != nil {
				t.Fatal(err)
			}
			var sum, sq float64
			for _, x := range v {
				sum += float64(x)
				sq += float64(x) * float64(x)
			}
			mean := sum / float64(len(v))
			if std := math.Sqrt(sq/float64(len(v)) - mean*mean); math.Abs(mean) > 3e-3 || math.Abs(std-0.02) > 2e-3 {
				t.Errorf("%s: gate weights mean %.2g, standard deviation %.3g; want 0 and 0.02", typ, mean, std)
			}
		}
		m, err := engine.Load(w, cpu.New(1), engine.Options{Context: 16})
		if err != nil {
			t.Fatal(err)
		}
		seq, err := m.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		logits, err := seq.Forward([]int32{1, 5, 299}, false)
		if err != nil {
			t.Fatal(err)
		}
		var spread float64
		for _, v := range logits {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("%s: logit %v", typ, v)
			}
			spread = max(spread, math.Abs(float64(v-logits[0])))
		}
		if spread == 0 {
			t.Errorf("%s: every logit is %v", typ, logits[0])
		}
		seq.Close()
		m.Close()
		w.Close()
	}
	if err := fastSynth(io.Discard, ck, d, ggml.Q3_K, "tiny"); err == nil {
		t.Error("fastSynth wrote Q3_K")
	}
}
