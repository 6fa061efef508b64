package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/weftlm/weft/convert"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/modelpath"
	"github.com/weftlm/weft/synth"
	"github.com/weftlm/weft/weights"
)

func init() {
	register(command{name: "synth", summary: "make a random-weight GGUF model of a real shape from a config.json", run: runSynth})
	register(command{name: "convert", summary: "write a model as GGUF (any weight type) or as an MLX quantized directory", run: runConvert})
}

func parseWeightType(s string) (ggml.Type, error) {
	t, err := ggml.ParseType(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errUsage, err)
	}
	return t, nil
}

// writeFileAtomically writes through a temporary file renamed into place,
// so an interrupted run leaves no truncated model behind.
func writeFileAtomically(path string, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(dirOf(path), ".weft-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := write(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func dirOf(path string) string {
	for i := len(path) - 1; i >= 0; i-- {
		if path[i] == '/' {
			return path[:i+1]
		}
	}
	return "."
}

func runSynth(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("synth", stderr)
	cfgPath := fs.String("config", "", "Hugging Face config.json giving the shape")
	typ := fs.String("type", "Q4_0", "element type of the weight matrices (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K, …)")
	seed := fs.Uint64("seed", 1, "random seed")
	std := fs.Float64("std", 0.02, "standard deviation of the weights")
	out := fs.String("o", "", "output .gguf file")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *cfgPath == "" || *out == "" {
		return fmt.Errorf("%w: need --config and -o", errUsage)
	}
	t, err := parseWeightType(*typ)
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(*cfgPath)
	if err != nil {
		return err
	}
	c, d, err := weights.ParseHFConfig(raw, *cfgPath)
	if err == nil {
		err = c.Validate(*cfgPath)
	}
	if err != nil {
		return err
	}
	return writeFileAtomically(*out, func(w io.Writer) error {
		return synth.Write(w, c, d, synth.Options{Type: t, Seed: *seed, Std: *std, Name: "synthetic " + c.Architecture})
	})
}

func runConvert(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("convert", stderr)
	typ := fs.String("type", "F16", "GGUF element type of the weight matrices")
	mlxBits := fs.Int("mlx-bits", 0, "write an MLX affine-quantized directory with this many bits (4 or 8) instead of GGUF")
	group := fs.Int("group-size", 64, "MLX quantization group size")
	out := fs.String("o", "", "output .gguf file (or directory with --mlx-bits)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: weft convert MODEL -o OUT [--type Q8_0 | --mlx-bits 4 --group-size 64]")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || *out == "" {
		fs.Usage()
		return fmt.Errorf("%w: need one MODEL and -o", errUsage)
	}
	resolved, err := modelpath.Resolve(pos[0])
	if err != nil {
		return err
	}
	p, err := weights.Open(resolved, weights.Options{})
	if err != nil {
		return err
	}
	defer p.Close()
	if *mlxBits != 0 {
		return convert.WriteMLX(p, *out, *mlxBits, *group)
	}
	t, err := parseWeightType(*typ)
	if err != nil {
		return err
	}
	return writeFileAtomically(*out, func(w io.Writer) error {
		return convert.WriteGGUF(p, w, convert.Options{Type: t, Name: p.Name()})
	})
}
