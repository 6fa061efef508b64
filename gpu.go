package weft

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/weftlm/weft/arch"
	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/backend/cpu"
	"github.com/weftlm/weft/backend/cuda"
	"github.com/weftlm/weft/backend/split"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/modelpath"
	"github.com/weftlm/weft/placement"
	"github.com/weftlm/weft/weights"
)

// gpuSystem finds and opens GPUs. Load uses CUDA; tests put CPU backends
// with made-up free memory in its place to exercise placement end to end.
type gpuSystem interface {
	Devices() ([]placement.Device, error)
	Open(index int) (backend.Backend, error)
}

type cudaSystem struct{}

func (cudaSystem) Devices() ([]placement.Device, error) {
	ds, err := cuda.Devices()
	if err != nil {
		return nil, err
	}
	var out []placement.Device
	for _, d := range ds {
		out = append(out, placement.Device{Index: d.Index, Name: d.Name, FreeBytes: int64(d.FreeBytes)})
	}
	return out, nil
}

func (cudaSystem) Open(index int) (backend.Backend, error) { return cuda.New(index) }

var gpus gpuSystem = cudaSystem{}

// NewBackend is the backend Load would build for the options: the CPU, or
// GPUs (with the CPU for the first layers) placed within the devices' free
// memory. ctx is the context wanted; it returns the context that fits and
// the plan (nil on the CPU alone). Only the backend, thread, parallel,
// batch, context, GPU-layer and tensor-split options matter. For callers
// driving package engine directly (weft bench); the caller closes the
// backend.
func NewBackend(w *weights.Provider, ctx int, opts ...Option) (backend.Backend, *placement.Plan, int, error) {
	o := defaultOptions()
	for _, f := range opts {
		f(&o)
	}
	return chooseBackend(&o, w, ctx)
}

// gpuBatch is the default replay width with GPUs: prompts are read 512
// tokens a replay (llama.cpp's default micro-batch), where a GPU's matrix
// units pay off; the CPU gains nothing past 64.
const gpuBatch = 512

// chooseBackend builds the backend and settles the options that depend on
// it (the batch width).
func chooseBackend(o *loadOptions, w *weights.Provider, ctx int) (backend.Backend, *placement.Plan, int, error) {
	if o.backend == "" {
		o.backend = "auto"
	}
	switch o.backend {
	case "cpu":
		if len(o.tensorSplit) > 0 {
			return nil, nil, 0, errors.New("weft: a tensor split needs the cuda or auto backend")
		}
		return cpu.New(o.threads), nil, ctx, nil
	case "cuda", "auto":
	default:
		return nil, nil, 0, fmt.Errorf("weft: unknown backend %q (have: cpu, cuda, auto)", o.backend)
	}
	if o.gpuLayers == 0 {
		return cpu.New(o.threads), nil, ctx, nil
	}
	plan, devs, batch, err := planGPUs(o, w, ctx)
	var noGPU *noGPUError
	if errors.As(err, &noGPU) && o.backend == "auto" {
		if len(o.tensorSplit) > 0 {
			return nil, nil, 0, fmt.Errorf("weft: a tensor split needs GPUs: %w", noGPU.err)
		}
		if !errors.Is(err, cuda.ErrNoDriver) {
			o.cpuFallback = err
		}
		return cpu.New(o.threads), nil, ctx, nil
	}
	if err != nil {
		return nil, nil, 0, err
	}
	var parts []split.Part
	closeAll := func() {
		for _, p := range parts {
			p.Backend.Close()
		}
	}
	for _, part := range plan.Parts {
		var be backend.Backend = cpu.New(o.threads)
		if part.Device >= 0 {
			be, err = gpus.Open(devs[part.Device].Index)
			if err != nil {
				closeAll()
				if o.backend == "auto" {
					o.cpuFallback = fmt.Errorf("weft: %w", err)
					return cpu.New(o.threads), nil, ctx, nil
				}
				return nil, nil, 0, fmt.Errorf("weft: %w", err)
			}
		}
		parts = append(parts, split.Part{Backend: be, FirstLayer: part.FirstLayer})
	}
	if plan.GPULayers() > 0 {
		o.batch = batch
	}
	if len(parts) == 1 {
		return parts[0].Backend, &plan, plan.Context, nil
	}
	s, err := split.New(parts)
	if err != nil {
		closeAll()
		return nil, nil, 0, err
	}
	return s, &plan, plan.Context, nil
}

// noGPUError says why no GPU can be used.
type noGPUError struct{ err error }

func (e *noGPUError) Error() string { return "weft: " + e.err.Error() }
func (e *noGPUError) Unwrap() error { return e.err }

// planGPUs finds the GPUs and places the model on them (and the CPU) for
// the options, allocating nothing; it returns the plan, the devices and
// the batch width the plan assumed.
func planGPUs(o *loadOptions, w *weights.Provider, ctx int) (placement.Plan, []placement.Device, int, error) {
	devs, err := gpus.Devices()
	if err == nil && len(devs) == 0 {
		err = errors.New("cuda: no device found")
	}
	if err != nil {
		return placement.Plan{}, nil, 0, &noGPUError{err}
	}
	slots := max(o.parallel, 1)
	batch := o.batch
	if batch <= 0 {
		batch = gpuBatch
	}
	plan, err := placement.Fit(footprint(w, slots, batch, o.cacheType == "f16"), devs, placement.Request{
		GPULayers: o.gpuLayers, Split: o.tensorSplit, Context: ctx, ContextFixed: o.context > 0,
		Slots: slots, Margin: placement.DefaultMargin,
	})
	if err != nil {
		return placement.Plan{}, nil, 0, fmt.Errorf("weft: %s: %w", w.Name(), err)
	}
	return plan, devs, batch, nil
}

// PlanPlacement is where Load with these options would put the model at
// path on the GPUs (and the CPU), worked out from the file's tensor table
// and the devices' free memory without loading or allocating anything: a
// dry run for `weft info -m`. Only the context, parallel, batch,
// GPU-layer and tensor-split options matter. Where no GPU can be used the
// plan is the CPU alone, as with the "auto" backend.
func PlanPlacement(path string, opts ...Option) (*placement.Plan, error) {
	o := defaultOptions()
	for _, f := range opts {
		f(&o)
	}
	resolved, err := modelpath.Resolve(path)
	if err != nil {
		return nil, err
	}
	w, err := weights.Open(resolved, weights.Options{})
	if err != nil {
		return nil, err
	}
	defer w.Close()
	ctx := o.context
	if ctx <= 0 {
		ctx = min(w.Config.ContextLength, engine.DefaultContext)
	}
	plan, _, _, err := planGPUs(&o, w, ctx)
	var noGPU *noGPUError
	if errors.As(err, &noGPU) {
		plan, err = placement.Fit(footprint(w, max(o.parallel, 1), o.batch, o.cacheType == "f16"), nil, placement.Request{GPULayers: -1, Context: ctx})
	}
	if err != nil {
		return nil, err
	}
	return &plan, nil
}

// footprint is the model as a GPU would hold it: each layer's weights,
// the embedding, the output head (the embedding again when tied), each
// layer's key/value cache (f16 or float32) and the working buffers of a
// part.
func footprint(w *weights.Provider, slots, batch int, f16Cache bool) placement.Model {
	c := &w.Config
	m := placement.Model{LayerBytes: make([]int64, c.NLayers)}
	var largest *weights.Tensor
	for _, t := range w.Tensors() {
		n := cuda.WeightBytes(t)
		if len(t.Shape) == 2 && (largest == nil || t.Rows()*t.Cols() > largest.Rows()*largest.Cols()) {
			largest = t
		}
		switch {
		case layerOf(t.Name) >= 0 && layerOf(t.Name) < c.NLayers:
			m.LayerBytes[layerOf(t.Name)] += n
		case t.Name == arch.TokenEmbedding:
			m.EmbedBytes += n
			if !w.Has(arch.Output) {
				m.OutputBytes += n
				m.SharedBytes = n
			}
		default:
			m.OutputBytes += n
		}
	}
	if batch <= 0 {
		batch = engine.DefaultBatch
	}
	maxRows := max(batch, slots)
	m.WorkBytes = cuda.WorkBytes(c, maxRows, largest)
	m.KVBytes = func(l, ctx int) int64 {
		if c.SlidingWindow > 0 && l < len(c.SlidingLayers) && c.SlidingLayers[l] {
			ctx = min(ctx, c.SlidingWindow+maxRows)
		}
		return cuda.KVBytes(c, ctx, f16Cache)
	}
	return m
}

// layerOf reads the layer number of a canonical name "layers.N.…", or -1.
func layerOf(name string) int {
	rest, ok := strings.CutPrefix(name, "layers.")
	if !ok {
		return -1
	}
	num, _, ok := strings.Cut(rest, ".")
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(num)
	if err != nil {
		return -1
	}
	return n
}
