package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/backend/cpu"
	"github.com/weftlm/weft/backend/cuda"
	"github.com/weftlm/weft/backend/split"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/modelpath"
	"github.com/weftlm/weft/weights"
)

func init() {
	register(command{name: "check", summary: "run the same tokens on the CPU and the GPU and report per-layer error and logit KL", run: runCheck})
}

// layerTrace records the residual stream entering each layer.
type layerTrace struct {
	layers map[int][]float32
}

func (lt *layerTrace) observe(layer int, x []float32) {
	lt.layers[layer] = append([]float32(nil), x...)
}

// perLayer places every layer on its own part of one backend kind, so the
// residual stream can be observed between layers.
func perLayer(newBackend func() (backend.Backend, error), nLayers int, lt *layerTrace) (backend.Backend, error) {
	var parts []split.Part
	for l := 0; l < nLayers; l++ {
		be, err := newBackend()
		if err != nil {
			return nil, err
		}
		parts = append(parts, split.Part{Backend: be, FirstLayer: l})
	}
	s, err := split.New(parts)
	if err != nil {
		return nil, err
	}
	s.Observe = lt.observe
	return s, nil
}

func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("check", stderr)
	model := fs.String("m", "", "model file, directory or name")
	tokens := fs.String("tokens", "", "token ids to run (default: 64 ids spread over the vocabulary)")
	threads := fs.Int("threads", 0, "CPU threads")
	maxKL := fs.Float64("max-kl", 1e-4, "fail when the logits' KL(cpu‖gpu) at some position exceeds this")
	exact := fs.Bool("exact", false, "both backends keep to one float64 contract for every rounded sum (slower), so that they agree bit for bit")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *model == "" {
		return fmt.Errorf("%w: -m MODEL is required", errUsage)
	}
	if !(*maxKL > 0) || math.IsInf(*maxKL, 0) {
		return fmt.Errorf("%w: --max-kl %v: want a positive number", errUsage, *maxKL)
	}
	if _, err := cuda.Devices(); err != nil {
		return fmt.Errorf("no GPU to check against: %w", err)
	}
	resolved, err := modelpath.Resolve(*model)
	if err != nil {
		return err
	}
	w, err := weights.Open(resolved, weights.Options{})
	if err != nil {
		return err
	}
	defer w.Close()
	cfg := w.Config
	ids, err := parseIDs(*tokens)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		for i := 0; i < 64; i++ {
			ids = append(ids, int32((i*7919+1)%cfg.VocabSize))
		}
	}
	if err := checkVocab(ids, cfg.VocabSize); err != nil {
		return err
	}
	run := func(newBackend func() (backend.Backend, error)) (*layerTrace, []float32, error) {
		lt := &layerTrace{layers: map[int][]float32{}}
		be, err := perLayer(newBackend, cfg.NLayers, lt)
		if err != nil {
			return nil, nil, err
		}
		m, err := engine.Load(w, be, engine.Options{Context: len(ids), MaxBatch: len(ids)})
		if err != nil {
			return nil, nil, err
		}
		defer m.Close()
		seq, err := m.NewSequence()
		if err != nil {
			return nil, nil, err
		}
		defer seq.Close()
		logits, err := seq.Forward(ids, true)
		return lt, logits, err
	}
	newCPU, newGPU := func() (backend.Backend, error) { return cpu.New(*threads), nil }, func() (backend.Backend, error) { return cuda.New(0) }
	if *exact {
		newCPU = func() (backend.Backend, error) { return cpu.NewExact(*threads), nil }
		newGPU = func() (backend.Backend, error) { return cuda.NewExact(0) }
	}
	cpuTrace, cpuLogits, err := run(newCPU)
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	gpuTrace, gpuLogits, err := run(newGPU)
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	fmt.Fprintf(stdout, "%s: %d tokens, %d layers\n", resolved, len(ids), cfg.NLayers)
	fmt.Fprintln(stdout, "layer  max relative error of the residual entering it (per row ‖Δ‖/‖cpu‖)")
	for l := 1; l < cfg.NLayers; l++ {
		fmt.Fprintf(stdout, "%5d  %.3g\n", l, maxRowRelErr(gpuTrace.layers[l], cpuTrace.layers[l], cfg.Dim))
	}
	v := cfg.VocabSize
	worstKL, worstPos, same := 0.0, 0, 0
	for r := 0; r < len(ids); r++ {
		c, g := cpuLogits[r*v:(r+1)*v], gpuLogits[r*v:(r+1)*v]
		if kl := klDiv(c, g); kl > worstKL {
			worstKL, worstPos = kl, r
		}
		if slices.Equal(c, g) {
			same++
		}
	}
	fmt.Fprintf(stdout, "logits: max relative error %.3g, max KL(cpu‖gpu) %.3g at position %d; %d of %d positions identical\n",
		maxRowRelErr(gpuLogits, cpuLogits, v), worstKL, worstPos, same, len(ids))
	if worstKL > *maxKL {
		hint := ""
		if !*exact {
			hint = klHint(w)
		}
		return fmt.Errorf("KL %.3g exceeds %g%s", worstKL, *maxKL, hint)
	}
	return nil
}

// klHint says, for a model with quantized matrices, why the backends can
// differ by more than float rounding.
func klHint(w *weights.Provider) string {
	for _, t := range w.Tensors() {
		if len(t.Shape) == 2 && (t.MLX != nil || (t.HasGGML && t.GGML.Quantized())) {
			return " (the CPU rounds a quantized product's inputs to int8 levels; the GPU's default prefill multiplies " +
				"in f16, its sums run in another order, and types without GPU kernels run as f16 weights on float inputs, " +
				"about 1e-3 apart on a trained model; --exact makes both backends keep to one float64 contract)"
		}
	}
	return ""
}

func maxRowRelErr(got, want []float32, cols int) float64 {
	worst := 0.0
	for r := 0; r*cols < len(want) && r*cols < len(got); r++ {
		var d, n float64
		for i := r * cols; i < (r+1)*cols; i++ {
			x := float64(got[i]) - float64(want[i])
			d += x * x
			n += float64(want[i]) * float64(want[i])
		}
		if n > 0 {
			worst = max(worst, math.Sqrt(d/n))
		}
	}
	return worst
}

// klDiv is KL(softmax(p) ‖ softmax(q)) in float64.
func klDiv(p, q []float32) float64 {
	lp, lq := logSoftmax(p), logSoftmax(q)
	var kl float64
	for i := range lp {
		kl += math.Exp(lp[i]) * (lp[i] - lq[i])
	}
	return max(kl, 0)
}

func logSoftmax(x []float32) []float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = max(mx, float64(v))
	}
	var sum float64
	for _, v := range x {
		sum += math.Exp(float64(v) - mx)
	}
	out := make([]float64, len(x))
	lse := mx + math.Log(sum)
	for i, v := range x {
		out[i] = float64(v) - lse
	}
	return out
}
