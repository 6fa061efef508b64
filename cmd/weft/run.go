package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/term"

	"github.com/weftlm/weft"
	"github.com/weftlm/weft/constrain"
	"github.com/weftlm/weft/placement"
)

func init() {
	register(command{name: "run", summary: "generate text from a prompt (streams only the generated text to stdout)", run: runRun})
}

// genFlags are the generation flags shared by run and chat.
type genFlags struct {
	model         *string
	n             *int
	temp          *float64
	topK          *int
	topP, minP    *float64
	repeatPenalty *float64
	seed          *uint64
	ctx, threads  *int
	verbose       *bool
	backend       *string
	gpuLayers     *int
	tensorSplit   *string
	cacheType     *string
}

func addGenFlags(fs *flag.FlagSet, defaultN int) *genFlags {
	return &genFlags{
		model:         fs.String("m", "", "model: a file, a directory, or a name from the Hugging Face cache or ollama store"),
		n:             fs.Int("n", defaultN, "most tokens to generate (0: until end of generation or a full context)"),
		temp:          fs.Float64("temp", 0.8, "sampling temperature (0: greedy)"),
		topK:          fs.Int("top-k", 40, "keep the k most probable tokens (0: off)"),
		topP:          fs.Float64("top-p", 0.95, "keep the most probable tokens up to this probability (1: off)"),
		minP:          fs.Float64("min-p", 0.05, "drop tokens below this fraction of the best token's probability (0: off)"),
		repeatPenalty: fs.Float64("repeat-penalty", 1.0, "penalise recently seen tokens (1: off)"),
		seed:          fs.Uint64("seed", 0, "random seed (0: random)"),
		ctx:           fs.Int("ctx", 0, "context length (0: the model's, capped at 4096)"),
		threads:       fs.Int("threads", 0, "CPU threads (0: one per CPU)"),
		verbose:       fs.Bool("verbose", false, "print loading and speed figures to stderr"),
		backend:       fs.String("backend", "auto", backendUsage),
		gpuLayers:     fs.Int("n-gpu-layers", -1, gpuLayersUsage),
		tensorSplit:   fs.String("tensor-split", "", tensorSplitUsage),
		cacheType:     fs.String("cache-type", "f32", cacheTypeUsage),
	}
}

func (g *genFlags) options() []weft.GenerateOption {
	return []weft.GenerateOption{
		weft.WithMaxTokens(*g.n), weft.WithTemperature(float32(*g.temp)), weft.WithTopK(*g.topK),
		weft.WithTopP(float32(*g.topP)), weft.WithMinP(float32(*g.minP)),
		weft.WithRepeatPenalty(float32(*g.repeatPenalty)), weft.WithSeed(*g.seed),
	}
}

// load opens the model, drawing a progress bar on stderr when it is a
// terminal.
func (g *genFlags) load(ctx context.Context, stderr io.Writer) (*weft.Model, error) {
	if *g.model == "" {
		return nil, fmt.Errorf("%w: -m MODEL is required", errUsage)
	}
	shares, err := placement.ParseSplit(*g.tensorSplit)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	opts := []weft.Option{weft.WithContext(*g.ctx), weft.WithThreads(*g.threads), weft.WithBackend(*g.backend),
		weft.WithGPULayers(*g.gpuLayers), weft.WithTensorSplit(shares), weft.WithCacheType(*g.cacheType)}
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		opts = append(opts, weft.WithProgress(progressBar(stderr)))
	}
	m, err := weft.Load(ctx, *g.model, opts...)
	if err != nil {
		return nil, err
	}
	if p := m.Info().Placement; p != "" {
		fmt.Fprintf(stderr, "weft: %s\n", p)
	}
	if f := m.Info().CPUFallback; f != "" {
		fmt.Fprintf(stderr, "weft: running on the CPU: %s\n", f)
	}
	if *g.verbose {
		in := m.Info()
		fmt.Fprintf(stderr, "weft: %s: %s, %d layers, %.1fM parameters, %s backend, %d threads, context %d\n",
			in.Path, in.Architecture, in.Config.NLayers, float64(in.Parameters)/1e6, in.Backend, in.Threads, in.Context)
	}
	return m, nil
}

const (
	backendUsage     = "compute backend: cpu, cuda, or auto (NVIDIA GPUs when one can be used, else the CPU)"
	gpuLayersUsage   = "with a GPU backend: put only the last N layers and the output on GPUs, failing when they do not fit (-1: as many as fit in free memory)"
	tensorSplitUsage = "with several GPUs: each one's share of the GPU layers, comma-separated in device order, e.g. 3,1 (default: one GPU when the model fits, else by free memory)"
	cacheTypeUsage   = "key/value cache storage: f32, or f16 (half the memory, llama.cpp's default)"
)

// progressBar draws one line on a terminal, rewritten in place.
func progressBar(w io.Writer) func(weft.Progress) {
	lastStage, lastFill := "", -1
	return func(p weft.Progress) {
		const width = 30
		frac := 1.0
		if p.Total > 0 {
			frac = float64(p.Done) / float64(p.Total)
		}
		fill := int(frac * width)
		if p.Stage == lastStage && fill == lastFill {
			return
		}
		lastStage, lastFill = p.Stage, fill
		fmt.Fprintf(w, "\r\033[Kloading %-8s [%s%s] %3.0f%%", p.Stage, strings.Repeat("=", fill), strings.Repeat(" ", width-fill), frac*100)
		if p.Stage == "warmup" && p.Done == p.Total {
			fmt.Fprint(w, "\r\033[K")
		}
	}
}

func printMetrics(w io.Writer, m *weft.Model) {
	mt := m.Metrics()
	fmt.Fprintf(w, "\nweft: prompt %d tokens at %.1f tok/s; generated %d tokens at %.1f tok/s; first token after %s; peak memory %.1f MiB\n",
		mt.LastPromptTokens, mt.PrefillTokensPerSec, mt.LastGeneratedTokens, mt.DecodeTokensPerSec,
		mt.TimeToFirstToken.Round(1e5), float64(mt.PeakMemoryBytes)/(1<<20))
}

func runRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runRunWithStdin(ctx, args, os.Stdin, stdout, stderr)
}

func runRunWithStdin(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("run", stderr)
	g := addGenFlags(fs, 256)
	prompt := fs.String("p", "", "prompt (default: standard input when it is not a terminal; empty starts from BOS)")
	overflow := fs.String("overflow", "error", "a prompt longer than the context: error, truncate (drop the oldest tokens) or shift (also shift the context while generating)")
	jsonMode := fs.Bool("json", false, "constrain the output to one JSON object")
	jsonSchema := fs.String("json-schema", "", "constrain the output to JSON following the JSON Schema in this file")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("%w: unexpected argument %q (give the prompt with -p)", errUsage, pos[0])
	}
	promptSet := false
	fs.Visit(func(f *flag.Flag) { promptSet = promptSet || f.Name == "p" })
	text := *prompt
	if !promptSet && stdin != nil {
		if f, ok := stdin.(*os.File); !ok || !term.IsTerminal(int(f.Fd())) {
			b, err := io.ReadAll(io.LimitReader(stdin, 64<<20))
			if err != nil {
				return err
			}
			text = string(b)
		}
	}
	opts := g.options()
	switch *overflow {
	case "error":
	case "truncate":
		opts = append(opts, weft.WithOverflow(weft.OverflowTruncate))
	case "shift":
		opts = append(opts, weft.WithOverflow(weft.OverflowShift))
	default:
		return fmt.Errorf("%w: --overflow must be error, truncate or shift", errUsage)
	}
	if *jsonMode {
		opts = append(opts, weft.WithJSON())
	}
	if *jsonSchema != "" {
		b, err := os.ReadFile(*jsonSchema)
		if err != nil {
			return err
		}
		if _, err := constrain.CompileSchema(b); err != nil {
			return fmt.Errorf("%s: %w", *jsonSchema, err)
		}
		opts = append(opts, weft.WithJSONSchema(b))
	}
	m, err := g.load(ctx, stderr)
	if err != nil {
		return err
	}
	defer m.Close()
	for tok, err := range m.Generate(ctx, text, opts...) {
		if err != nil {
			return err
		}
		if _, err := io.WriteString(stdout, tok.Text); err != nil {
			return err
		}
		if f, ok := stdout.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			f.Sync()
		}
		for _, n := range tok.Notices {
			fmt.Fprintf(stderr, "\nweft: %s\n", n)
		}
	}
	if *g.verbose {
		printMetrics(stderr, m)
	}
	return nil
}
