package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/weftlm/weft/gguf"
	"github.com/weftlm/weft/weights"
)

func init() {
	register(command{
		name:    "inspect",
		summary: "show a model's format, config, metadata and tensors (reads no tensor data)",
		run:     runInspect,
	})
}

// inspectArrayLimit is how many elements of a metadata array are shown;
// longer arrays are summarised with their type and length.
const inspectArrayLimit = 16

// InspectReport is the stable JSON form of `weft inspect --json`.
type InspectReport struct {
	Format       string                `json:"format"` // "gguf" or "safetensors"
	Path         string                `json:"path"`
	Architecture string                `json:"architecture"` // as the file names it
	Config       *weights.Config       `json:"config"`
	ConfigError  string                `json:"config_error,omitempty"`
	Metadata     map[string]any        `json:"metadata"`
	Tensors      []weights.FileTensor  `json:"tensors"`
	TotalBytes   uint64                `json:"total_bytes"`
	MLX          map[string]MLXSummary `json:"mlx_quantized,omitempty"`
}

// MLXSummary shows how an MLX quantized triple was combined.
type MLXSummary struct {
	Bits      int `json:"bits"`
	GroupSize int `json:"group_size"`
}

// ArraySummary stands for a metadata array too long to print.
type ArraySummary struct {
	Array  string `json:"array"` // element type
	Length int    `json:"length"`
	First  []any  `json:"first"`
}

func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("inspect", stderr)
	asJSON := fs.Bool("json", false, "print the stable JSON report")
	noMmap := fs.Bool("no-mmap", false, "read instead of mapping the file")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: weft inspect PATH [--json]\n\nPATH is a .gguf file, a .safetensors file or a model directory.")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return fmt.Errorf("%w: want exactly one PATH", errUsage)
	}
	p, cfgErr, err := weights.Inspect(pos[0], weights.Options{NoMmap: *noMmap})
	if err != nil {
		return err
	}
	defer p.Close()
	rep := buildReport(p, cfgErr)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printReport(stdout, rep)
	return nil
}

func buildReport(p *weights.Provider, cfgErr error) *InspectReport {
	rep := &InspectReport{Format: string(p.Format), Path: p.Path, Metadata: map[string]any{}, Tensors: p.FileTensors()}
	if rep.Tensors == nil {
		rep.Tensors = []weights.FileTensor{}
	}
	cfg := p.Config
	rep.Config = &cfg
	if cfgErr != nil {
		rep.ConfigError = cfgErr.Error()
	}
	rep.Architecture = cfg.Architecture
	if p.GGUF != nil {
		if a, ok := gguf.GetString(p.GGUF, "general.architecture"); ok {
			rep.Architecture = a
		}
		for _, kv := range p.GGUF.KVs() {
			rep.Metadata[kv.Key] = metadataValue(kv.Value)
		}
	}
	for k, v := range p.ExtraMetadata() {
		rep.Metadata[k] = v
	}
	for _, t := range rep.Tensors {
		rep.TotalBytes += t.Bytes
	}
	for _, t := range p.Tensors() {
		if t.MLX != nil {
			if rep.MLX == nil {
				rep.MLX = map[string]MLXSummary{}
			}
			rep.MLX[t.Name] = MLXSummary{Bits: t.MLX.Bits, GroupSize: t.MLX.GroupSize}
		}
	}
	return rep
}

func metadataValue(v gguf.Value) any {
	arr, ok := v.Array()
	if !ok || arr.Len() <= inspectArrayLimit {
		return v.Interface(inspectArrayLimit)
	}
	first := make([]any, 0, 8)
	for i, e := range arr.All() {
		if i >= 8 {
			break
		}
		first = append(first, e.Interface(8))
	}
	return ArraySummary{Array: arr.Elem().String(), Length: arr.Len(), First: first}
}

func printReport(w io.Writer, rep *InspectReport) {
	fmt.Fprintf(w, "path:          %s\nformat:        %s\narchitecture:  %s\n", rep.Path, rep.Format, rep.Architecture)
	if rep.ConfigError != "" {
		fmt.Fprintf(w, "config:        incomplete: %s\n", rep.ConfigError)
	}
	c := rep.Config
	fmt.Fprintf(w, "layers %d, dim %d, heads %d (kv %d, head_dim %d), ffn %d, vocab %d, context %d\n",
		c.NLayers, c.Dim, c.NHeads, c.NKVHeads, c.HeadDim, c.FFNDim, c.VocabSize, c.ContextLength)
	fmt.Fprintf(w, "rope theta %g (%s, dim %d, scaling %s), norm eps %g, tied embeddings %v\n",
		c.RopeTheta, c.RopeLayout, c.RopeDim, c.RopeScaling.Type, c.NormEps, c.TiedEmbeddings)
	if c.SlidingWindow > 0 {
		n := 0
		for _, s := range c.SlidingLayers {
			if s {
				n++
			}
		}
		fmt.Fprintf(w, "sliding window %d on %d of %d layers, local rope theta %g\n", c.SlidingWindow, n, c.NLayers, c.RopeLocalTheta)
	}
	if c.QuantBits > 0 {
		fmt.Fprintf(w, "MLX quantization: %d bits, group size %d\n", c.QuantBits, c.QuantGroupSize)
	}
	if len(rep.Metadata) > 0 {
		fmt.Fprintf(w, "\nmetadata (%d keys):\n", len(rep.Metadata))
		keys := make([]string, 0, len(rep.Metadata))
		for k := range rep.Metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "  %s = %s\n", k, formatMeta(rep.Metadata[k]))
		}
	}
	fmt.Fprintf(w, "\ntensors (%d, %s):\n", len(rep.Tensors), humanBytes(rep.TotalBytes))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  NAME\tCANONICAL\tTYPE\tSHAPE\tBYTES")
	for _, t := range rep.Tensors {
		canon := t.Canonical
		if canon == "" {
			canon = "-"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%v\t%d\n", t.Name, canon, t.Type, t.Shape, t.Bytes)
	}
	tw.Flush()
}

func formatMeta(v any) string {
	switch x := v.(type) {
	case ArraySummary:
		parts := make([]string, len(x.First))
		for i, e := range x.First {
			parts[i] = formatMeta(e)
		}
		return fmt.Sprintf("[%s × %d: %s …]", x.Array, x.Length, strings.Join(parts, " "))
	case string:
		if len(x) > 120 {
			return fmt.Sprintf("%q… (%d bytes)", x[:120], len(x))
		}
		return fmt.Sprintf("%q", x)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}

func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
