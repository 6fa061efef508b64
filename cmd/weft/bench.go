package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/weftlm/weft"
	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/placement"
	"github.com/weftlm/weft/weights"
)

func init() {
	register(command{name: "bench", summary: "measure prompt processing and generation speed (tok/s), like llama-bench", run: runBench})
}

// benchResult is one line of `weft bench --json`, named as llama-bench's
// fields are but in weft's spelling.
type benchResult struct {
	Test       string    `json:"test"` // "pp512", "tg128", "tg128 @ d4096", "tg128 x4" (4 sequences at once), "tg128 drawn" (--draw)
	TokPerSec  float64   `json:"tokens_per_second"`
	Stddev     float64   `json:"stddev"`
	Threads    int       `json:"threads"`
	Backend    string    `json:"backend"` // as the backend names itself: "cpu", "cuda:0", or a split's parts
	ModelBytes uint64    `json:"model_bytes"`
	Samples    []float64 `json:"samples_tokens_per_second"`
}

// benchSpec is what one bench run measures.
type benchSpec struct {
	prompt, gen, repeats, threads, batch int
	depth                                int              // tokens in the context before each test
	parallel                             int              // sequences the tg test decodes at once
	draw                                 bool             // the tg test feeds back draws, pipelined (engine.IssueNext)
	chain                                backend.Sampling // what the draws follow (the zero value: greedy)
	backend                              string           // "cpu", "cuda" or "auto"
	gpuLayers                            int
	tensorSplit                          []float64
	cacheType                            string    // engine.Options.CacheType
	profile                              io.Writer // CPU profile of the timed runs, if set
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench", stderr)
	model := fs.String("m", "", "model: a GGUF file or a Hugging Face / MLX directory")
	var s benchSpec
	fs.IntVar(&s.prompt, "p", 512, "prompt tokens processed in one prefill (0: skip the pp test)")
	fs.IntVar(&s.gen, "n", 128, "tokens generated one decode step at a time (0: skip the tg test)")
	fs.IntVar(&s.depth, "d", 0, "tokens already in the context when each test starts (llama-bench's -d)")
	fs.IntVar(&s.parallel, "parallel", 1, "sequences the tg test decodes together, one token each a step (tok/s counts them all)")
	fs.BoolVar(&s.draw, "draw", false, "tg: feed each step's draw back, as generation does (drawn on the device, the next step queued before the host reads the token, where the backend can), instead of random tokens with the logits handed to the host as llama-bench does; the test is named tgN drawn")
	temp := fs.Float64("temp", 0, "with --draw: the draws' temperature (0: greedy)")
	topK := fs.Int("top-k", 0, "with --draw and a temperature: keep the k most probable tokens, at most 64 (0: off)")
	topP := fs.Float64("top-p", 1, "with --draw and a temperature: keep the most probable tokens up to this probability (1: off)")
	minP := fs.Float64("min-p", 0, "with --draw and a temperature: drop tokens below this fraction of the best token's probability (0: off)")
	logprobs := fs.Int("logprobs", -1, "with --draw: each draw also reports its log-probability and those of the N most probable tokens, 0 to 20, as an API request with logprobs does (-1: off)")
	fs.IntVar(&s.repeats, "r", 3, "repetitions of each test")
	fs.IntVar(&s.threads, "threads", runtime.GOMAXPROCS(0), "CPU worker threads")
	fs.IntVar(&s.batch, "b", 512, "most tokens one plan replay carries during prefill (llama-bench's -ub)")
	fs.StringVar(&s.backend, "backend", "auto", backendUsage)
	fs.IntVar(&s.gpuLayers, "n-gpu-layers", -1, gpuLayersUsage)
	tensorSplit := fs.String("tensor-split", "", tensorSplitUsage)
	fs.StringVar(&s.cacheType, "cache-type", "f32", cacheTypeUsage)
	asJSON := fs.Bool("json", false, "print a JSON list instead of a table")
	profile := fs.String("cpuprofile", "", "write a Go CPU profile of the timed runs to this file")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *model == "":
		return fmt.Errorf("%w: -m MODEL is required", errUsage)
	case s.prompt < 0 || s.gen < 0 || s.prompt+s.gen == 0:
		return fmt.Errorf("%w: -p %d -n %d: need a positive prompt or generation length", errUsage, s.prompt, s.gen)
	case s.depth < 0:
		return fmt.Errorf("%w: -d %d: need zero or more tokens", errUsage, s.depth)
	case s.parallel < 1:
		return fmt.Errorf("%w: --parallel %d: need at least one sequence", errUsage, s.parallel)
	case s.repeats < 1:
		return fmt.Errorf("%w: -r %d: need at least one repetition", errUsage, s.repeats)
	case s.threads < 1:
		return fmt.Errorf("%w: --threads %d: need at least one", errUsage, s.threads)
	case s.batch < 1:
		return fmt.Errorf("%w: -b %d: need at least one", errUsage, s.batch)
	case s.backend != "cpu" && s.backend != "cuda" && s.backend != "auto":
		return fmt.Errorf("%w: --backend %q: want cpu, cuda or auto", errUsage, s.backend)
	}
	s.chain = backend.Sampling{Temperature: float32(*temp), TopK: *topK, TopP: float32(*topP), MinP: float32(*minP)}
	if *logprobs >= 0 {
		s.chain.Logprobs, s.chain.TopLogprobs = true, *logprobs
	}
	if err := benchChain(s); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	var err error
	if s.tensorSplit, err = placement.ParseSplit(*tensorSplit); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *profile != "" {
		f, err := os.Create(*profile)
		if err != nil {
			return err
		}
		defer f.Close()
		s.profile = f
	}
	results, err := bench(ctx, *model, s, stderr)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(results)
	}
	tw := 13 // the test column, as wide as its longest name
	for _, r := range results {
		tw = max(tw, len(r.Test))
	}
	fmt.Fprintf(stdout, "| %-28s | %10s | %-10s | %7s | %*s | %18s |\n", "model", "size", "backend", "threads", tw, "test", "t/s")
	fmt.Fprintf(stdout, "|%s|%s|%s|%s|%s|%s|\n", dashes(30), dashes(12), dashes(12), dashes(9), dashes(tw+2), dashes(20))
	for _, r := range results {
		fmt.Fprintf(stdout, "| %-28s | %6.1f MiB | %-10s | %7d | %*s | %8.2f ± %7.2f |\n",
			filepath.Base(*model), float64(r.ModelBytes)/(1<<20), r.Backend, r.Threads, tw, r.Test, r.TokPerSec, r.Stddev)
	}
	return nil
}

func dashes(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = '-'
	}
	return string(b)
}

// bench loads the model once and runs the pp and tg tests on random tokens
// from a fixed seed, each test from an empty sequence and after an untimed
// warm-up (a whole prefill; a few decode steps), as llama-bench does.
func bench(ctx context.Context, path string, s benchSpec, stderr io.Writer) ([]benchResult, error) {
	w, err := weights.Open(path, weights.Options{})
	if err != nil {
		return nil, err
	}
	defer w.Close()
	var modelBytes uint64
	for _, t := range w.Tensors() {
		modelBytes += t.Bytes
	}
	positions := s.depth + max(s.prompt, s.gen, 1)
	if positions > w.Config.ContextLength {
		return nil, fmt.Errorf("%s: %d positions exceed the model's context of %d", path, positions, w.Config.ContextLength)
	}
	batch := max(min(s.batch, max(s.prompt, s.depth, 1)), s.parallel)
	be, plan, _, err := weft.NewBackend(w, positions, weft.WithBackend(s.backend), weft.WithThreads(s.threads),
		weft.WithGPULayers(s.gpuLayers), weft.WithTensorSplit(s.tensorSplit), weft.WithContext(positions),
		weft.WithBatch(batch), weft.WithParallel(s.parallel), weft.WithCacheType(s.cacheType))
	if err != nil {
		return nil, err
	}
	defer be.Close()
	if plan != nil {
		fmt.Fprintf(stderr, "weft: %s\n", plan)
	}
	m, err := engine.Load(w, be, engine.Options{Context: positions, MaxBatch: batch, Slots: s.parallel, CacheType: s.cacheType})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	seqs := make([]*engine.Sequence, s.parallel)
	for i := range seqs {
		if seqs[i], err = m.NewSequence(); err != nil {
			return nil, err
		}
		defer seqs[i].Close()
	}
	seq := seqs[0]

	rng := rand.New(rand.NewPCG(1, 2))
	token := func() int32 { return int32(rng.IntN(m.Vocab())) }
	logits := make([]float32, m.Vocab())
	// start puts the sequences at the test's depth: the first time by a
	// prefill of random tokens (untimed, outside the measured runs), then
	// by rewinding to it.
	filled := false
	start := func() error {
		for _, seq := range seqs {
			if filled {
				if err := seq.Rewind(s.depth); err != nil {
					return err
				}
				continue
			}
			if err := seq.Rewind(0); err != nil {
				return err
			}
			ctx := make([]int32, s.depth)
			for i := range ctx {
				ctx[i] = token()
			}
			if s.depth > 0 {
				if err := seq.ForwardInto(ctx, false, logits); err != nil {
					return err
				}
			}
		}
		filled = true
		return nil
	}
	prompt := make([]int32, s.prompt)
	pp := func() error {
		for i := range prompt {
			prompt[i] = token()
		}
		if err := start(); err != nil {
			return err
		}
		_, err := seq.ForwardView(prompt)
		return err
	}
	one := []int32{0}
	toks, all := make([]int32, s.parallel), make([]float32, s.parallel*m.Vocab())
	draws := make([]backend.Sampling, s.parallel)
	for i := range draws {
		draws[i] = s.chain
		draws[i].Seed = uint64(i + 1)
	}
	tg := func(steps int) error {
		if err := start(); err != nil {
			return err
		}
		if s.draw {
			// A random first token, then the draws fed back: one step
			// queued ahead while the host reads the draws of the last.
			for i := range toks {
				toks[i] = token()
			}
			if err := m.IssueSampled(seqs, toks, draws); err != nil {
				return err
			}
			for range steps - 1 {
				if err := m.IssueNext(); err != nil {
					return err
				}
				if err := m.WaitSampled(toks); err != nil {
					return err
				}
			}
			return m.WaitSampled(toks)
		}
		for range steps {
			if s.parallel == 1 {
				// The logits are left where the backend put them, as
				// llama-bench leaves llama.cpp's in its output buffer.
				one[0] = token()
				if _, err := seq.ForwardView(one); err != nil {
					return err
				}
				continue
			}
			for i := range toks {
				toks[i] = token()
			}
			if err := m.Step(seqs, toks, all); err != nil {
				return err
			}
		}
		return nil
	}
	var out []benchResult
	measure := func(name string, tokens int, warm, run func() error) error {
		r := benchResult{Test: name, Threads: s.threads, Backend: be.Name(), ModelBytes: modelBytes}
		if err := warm(); err != nil {
			return err
		}
		if s.profile != nil {
			if err := pprof.StartCPUProfile(s.profile); err != nil {
				return err
			}
			defer pprof.StopCPUProfile()
		}
		for range s.repeats {
			if err := ctx.Err(); err != nil {
				return err
			}
			start := time.Now()
			if err := run(); err != nil {
				return err
			}
			r.Samples = append(r.Samples, float64(tokens)/time.Since(start).Seconds())
		}
		r.TokPerSec, r.Stddev = meanStddev(r.Samples)
		out = append(out, r)
		return nil
	}
	at := ""
	if s.depth > 0 {
		at = fmt.Sprintf(" @ d%d", s.depth)
	}
	if s.prompt > 0 {
		name := fmt.Sprintf("pp%d%s", s.prompt, at)
		if err := measure(name, s.prompt, pp, pp); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", path, name, err)
		}
	}
	if s.gen > 0 {
		name := fmt.Sprintf("tg%d%s", s.gen, at)
		if s.parallel > 1 {
			name = fmt.Sprintf("tg%d x%d%s", s.gen, s.parallel, at)
		}
		if s.draw {
			name = strings.Replace(name, fmt.Sprintf("tg%d", s.gen), fmt.Sprintf("tg%d drawn%s", s.gen, chainName(s.chain)), 1)
		}
		if err := measure(name, s.gen*s.parallel, func() error { return tg(min(s.gen, 4)) }, func() error { return tg(s.gen) }); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", path, name, err)
		}
	}
	return out, nil
}

// benchChain checks the draws' chain of a bench: set only with --draw,
// and one the backend can draw from the logits alone.
func benchChain(s benchSpec) error {
	c := s.chain
	if !s.draw && (c.Temperature != 0 || c.TopK != 0 || c.TopP != 1 || c.MinP != 0 || c.Logprobs) {
		return errors.New("--temp, --top-k, --top-p, --min-p and --logprobs choose the draws of --draw")
	}
	if err := c.Check(); err != nil {
		return err
	}
	return nil
}

// chainName is the suffix of a drawn test's name: the chain, if not
// greedy, and the log-probabilities asked for.
func chainName(c backend.Sampling) string {
	name := ""
	if c.Logprobs {
		name = fmt.Sprintf(" lp%d", c.TopLogprobs)
	}
	if c.Temperature == 0 {
		return name
	}
	name += fmt.Sprintf(" T%g", c.Temperature)
	if c.TopK > 0 {
		name += fmt.Sprintf(" k%d", c.TopK)
	}
	if c.TopP < 1 {
		name += fmt.Sprintf(" p%g", c.TopP)
	}
	if c.MinP > 0 {
		name += fmt.Sprintf(" m%g", c.MinP)
	}
	return name
}

// meanStddev returns the mean and the sample standard deviation (0 for a
// single sample), as llama-bench reports them.
func meanStddev(xs []float64) (mean, sd float64) {
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	if len(xs) < 2 {
		return mean, 0
	}
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(ss / float64(len(xs)-1))
}
