package main

import (
	"context"
	"fmt"
	"io"
	"runtime"

	"github.com/weftlm/weft"
	"github.com/weftlm/weft/backend/cuda"
	"github.com/weftlm/weft/placement"
)

func init() {
	register(command{
		name:    "info",
		summary: "show the machine's compute devices (CPU threads, CUDA GPUs or why none is usable) and, with -m, where a model would run",
		run:     runInfo,
	})
}

func runInfo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("info", stderr)
	model := fs.String("m", "", "also show where this model would run: the placement Load would choose, without loading it")
	ctxLen := fs.Int("ctx", 0, "with -m: context length (0: the model's, capped at 4096)")
	parallel := fs.Int("parallel", 1, "with -m: requests at once, each with its own KV cache")
	gpuLayers := fs.Int("n-gpu-layers", -1, gpuLayersUsage)
	tensorSplit := fs.String("tensor-split", "", tensorSplitUsage)
	cacheType := fs.String("cache-type", "f32", "with -m: "+cacheTypeUsage)
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("%w: info takes no arguments (give a model with -m)", errUsage)
	}
	shares, err := placement.ParseSplit(*tensorSplit)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	var plan *placement.Plan
	if *model != "" {
		plan, err = weft.PlanPlacement(*model, weft.WithContext(*ctxLen), weft.WithParallel(*parallel),
			weft.WithGPULayers(*gpuLayers), weft.WithTensorSplit(shares), weft.WithCacheType(*cacheType))
		if err != nil {
			return err
		}
		defer fmt.Fprintf(stdout, "placement of %s: %s\n", *model, plan)
	}
	fmt.Fprintf(stdout, "cpu: %d threads (%s/%s)\n", runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH)
	devs, err := cuda.Devices()
	for _, d := range devs {
		fmt.Fprintf(stdout, "cuda:%d: %s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f GiB free), L2 %.0f MiB, driver CUDA %s\n",
			d.Index, d.Name, d.Major, d.Minor, d.SMs, gibibytes(d.TotalBytes), gibibytes(d.FreeBytes), float64(d.L2Bytes)/(1<<20), d.Driver)
	}
	switch {
	case err != nil:
		fmt.Fprintf(stdout, "cuda: not usable: %v\n", err)
		return nil
	case len(devs) == 0:
		fmt.Fprintln(stdout, "cuda: the driver is installed but reports no device")
		return nil
	}
	if v, err := cuda.NVRTC(); err != nil {
		fmt.Fprintf(stdout, "nvrtc: not usable, kernels cannot be compiled: %v\n", err)
	} else {
		fmt.Fprintf(stdout, "nvrtc: %s\n", v)
	}
	return nil
}

func gibibytes(n uint64) float64 { return float64(n) / (1 << 30) }
