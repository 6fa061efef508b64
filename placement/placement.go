// Package placement decides where a model's layers run before anything is
// allocated: how many of the last layers go to GPUs (the rest stay on the
// CPU), how those layers are shared among several GPUs, and which context
// length fits, from the size of each layer as a device stores it and each
// device's free memory.
//
// The layout follows llama.cpp's layer split: the CPU part, when there is
// one, runs the first layers with the embedding; the GPU layers follow in
// device order, each device taking a contiguous range in proportion to its
// share; the last device also runs the output head. Only the residual
// stream crosses a boundary, so the split costs one [rows, dim] copy per
// boundary per step.
package placement

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Device is one GPU as the planner sees it.
type Device struct {
	Index     int    // the device number the backend opens
	Name      string // for the printed plan
	FreeBytes int64  // free memory before loading
}

// Model is what the planner needs to know about a model: the device
// memory each piece takes once uploaded.
type Model struct {
	LayerBytes  []int64 // weights of each layer
	EmbedBytes  int64   // the token embedding, held by whoever runs layer 0
	OutputBytes int64   // the output norm and head, held by the last part
	// SharedBytes is counted in both EmbedBytes and OutputBytes (a tied
	// output matrix): a part holding both holds it once.
	SharedBytes int64
	// KVBytes returns the key/value cache of layer l for one slot holding
	// ctx positions (a sliding-window layer holds fewer).
	KVBytes func(l, ctx int) int64
	// WorkBytes is what one device part needs beside its weights and
	// caches: activation buffers and scratch.
	WorkBytes int64
}

// Request is what the user asked for.
type Request struct {
	// GPULayers is how many of the last layers run on GPUs; negative asks
	// for as many as fit.
	GPULayers int
	// Split gives each device's share of the GPU layers, one entry per
	// device in Devices' order (zero leaves a device out). Empty puts them
	// on the device with the most free memory when they fit there, else
	// shares them in proportion to free memory.
	Split []float64
	// Context is the positions per slot wanted; when ContextFixed is false
	// and not every layer fits, the planner may lower it (halving, down to
	// MinContext) if that puts every layer on the GPUs.
	Context      int
	ContextFixed bool
	Slots        int
	// Margin is left free on every device (driver, cuBLAS and kernel
	// modules, fragmentation).
	Margin int64
}

// MinContext is the shortest context the planner lowers to.
const MinContext = 1024

// DefaultMargin is the memory left free on each device by default.
const DefaultMargin = 1 << 30

// Part is a layer range on one place: Device < 0 is the CPU.
type Part struct {
	Device     int // index into the devices passed to Fit; -1 for the CPU
	FirstLayer int
	EndLayer   int   // one past the last layer
	Output     bool  // runs the output head
	Bytes      int64 // device memory it needs (0 for the CPU)
}

// Plan is a placement.
type Plan struct {
	Parts   []Part
	Context int // positions per slot
	Lowered bool
	devices []Device
	layers  int
}

// GPULayers counts the layers placed on GPUs.
func (p Plan) GPULayers() int {
	n := 0
	for _, part := range p.Parts {
		if part.Device >= 0 {
			n += part.EndLayer - part.FirstLayer
		}
	}
	return n
}

// String prints the plan on one line, e.g.
// "layers 0-9 on cpu; 10-21 on cuda:0 NVIDIA H100 (5.1 GiB of 79.1 GiB free); 22-31 and output on cuda:1 … (context 4096)".
func (p Plan) String() string {
	var b strings.Builder
	for i, part := range p.Parts {
		if i > 0 {
			b.WriteString("; ")
		}
		if i == 0 {
			b.WriteString("layers ")
		}
		switch {
		case part.EndLayer-part.FirstLayer == 1:
			fmt.Fprintf(&b, "%d", part.FirstLayer)
		case part.EndLayer > part.FirstLayer:
			fmt.Fprintf(&b, "%d-%d", part.FirstLayer, part.EndLayer-1)
		default:
			b.WriteString("none")
		}
		if part.Output {
			b.WriteString(" and output")
		}
		if part.Device < 0 {
			b.WriteString(" on cpu")
			continue
		}
		d := p.devices[part.Device]
		fmt.Fprintf(&b, " on cuda:%d %s (%s of %s free)", d.Index, d.Name, Human(part.Bytes), Human(d.FreeBytes))
	}
	fmt.Fprintf(&b, " (context %d", p.Context)
	if p.Lowered {
		b.WriteString(", lowered to fit every layer on the GPU")
	}
	b.WriteString(")")
	return b.String()
}

// Human prints a byte count in GiB or MiB.
func Human(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
}

// Fit places the model. With GPULayers ≥ 0 the count is kept and Fit
// fails, naming the device, when it does not fit; with GPULayers < 0 it
// takes the most layers that fit (every one when possible, lowering the
// context first if allowed).
func Fit(m Model, devs []Device, r Request) (Plan, error) {
	n := len(m.LayerBytes)
	if n == 0 {
		return Plan{}, errors.New("placement: the model has no layers")
	}
	if r.Context <= 0 {
		return Plan{}, fmt.Errorf("placement: context %d", r.Context)
	}
	shares, err := shares(devs, r.Split)
	if err != nil {
		return Plan{}, err
	}
	// Unless told how to share, a model that fits on the device with the
	// most free memory stays there: a split only adds a copy per boundary
	// per step (ollama's choice too).
	if len(r.Split) == 0 && len(devs) > 1 {
		best := 0
		for i, d := range devs {
			if d.FreeBytes > devs[best].FreeBytes {
				best = i
			}
		}
		one := make([]float64, len(devs))
		one[best] = 1
		k := n
		if r.GPULayers >= 0 {
			k = min(r.GPULayers, n)
		}
		if p, err := place(m, devs, one, r, k, r.Context); err == nil && p.check(r.Margin) == nil {
			return p, nil
		}
	}
	if r.GPULayers < 0 && len(devs) == 0 {
		return place(m, devs, shares, r, 0, r.Context)
	}
	if r.GPULayers >= 0 {
		k := min(r.GPULayers, n)
		p, err := place(m, devs, shares, r, k, r.Context)
		if err != nil {
			return Plan{}, err
		}
		return p, p.check(r.Margin)
	}
	// Every layer at the asked context, then at lower ones, then fewer
	// layers at the asked context.
	for ctx := r.Context; ; ctx /= 2 {
		p, err := place(m, devs, shares, r, n, ctx)
		if err != nil {
			return Plan{}, err
		}
		if p.check(r.Margin) == nil {
			p.Lowered = ctx != r.Context
			return p, nil
		}
		if r.ContextFixed || ctx/2 < MinContext {
			break
		}
	}
	for k := n - 1; k >= 0; k-- {
		p, err := place(m, devs, shares, r, k, r.Context)
		if err != nil {
			return Plan{}, err
		}
		if p.check(r.Margin) == nil {
			return p, nil
		}
	}
	return place(m, devs, shares, r, 0, r.Context)
}

// shares normalises the split over the devices.
func shares(devs []Device, split []float64) ([]float64, error) {
	if len(split) > 0 && len(split) != len(devs) {
		return nil, fmt.Errorf("placement: --tensor-split has %d entries for %d GPUs", len(split), len(devs))
	}
	out := make([]float64, len(devs))
	total := 0.0
	for i, d := range devs {
		v := float64(max(d.FreeBytes, 0))
		if len(split) > 0 {
			v = split[i]
			if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("placement: --tensor-split entry %d is %v; shares must be ≥ 0", i, split[i])
			}
		}
		out[i] = v
		total += v
	}
	if len(devs) > 0 && total <= 0 {
		if len(split) > 0 {
			return nil, errors.New("placement: --tensor-split gives every GPU a share of 0")
		}
		for i := range out {
			out[i] = 1
		}
		total = float64(len(out))
	}
	for i := range out {
		out[i] /= total
	}
	return out, nil
}

// place puts the last k layers on the devices by share (device i takes
// the layers whose index within the GPU block falls in its share of the
// cumulative range) and works out each part's memory.
func place(m Model, devs []Device, shares []float64, r Request, k, ctx int) (Plan, error) {
	n := len(m.LayerBytes)
	if k > 0 && len(devs) == 0 {
		return Plan{}, errors.New("placement: layers asked on the GPU, but there is no GPU")
	}
	p := Plan{Context: ctx, devices: devs, layers: n}
	first := n - k
	if first > 0 {
		p.Parts = append(p.Parts, Part{Device: -1, FirstLayer: 0, EndLayer: first, Output: k == 0})
	}
	if k == 0 {
		return p, nil
	}
	cum, at := 0.0, first
	for i, s := range shares {
		cum += s
		end := min(max(first+int(cum*float64(k)+0.5), at), n)
		if s == 0 || end == at {
			continue
		}
		p.Parts = append(p.Parts, Part{Device: i, FirstLayer: at, EndLayer: end})
		at = end
	}
	// Rounding may leave the last layers unassigned: the last GPU part
	// takes them, with the output head.
	tail := &p.Parts[len(p.Parts)-1]
	tail.EndLayer, tail.Output = n, true
	for i := range p.Parts {
		part := &p.Parts[i]
		if part.Device < 0 {
			continue
		}
		part.Bytes = m.WorkBytes
		for l := part.FirstLayer; l < part.EndLayer; l++ {
			part.Bytes += m.LayerBytes[l] + int64(max(r.Slots, 1))*m.KVBytes(l, ctx)
		}
		if part.FirstLayer == 0 {
			part.Bytes += m.EmbedBytes
		}
		if part.Output {
			part.Bytes += m.OutputBytes
		}
		if part.FirstLayer == 0 && part.Output {
			part.Bytes -= m.SharedBytes
		}
	}
	return p, nil
}

// check reports the first device part that does not fit.
func (p Plan) check(margin int64) error {
	for _, part := range p.Parts {
		if part.Device < 0 {
			continue
		}
		d := p.devices[part.Device]
		if part.Bytes > d.FreeBytes-margin {
			return fmt.Errorf("placement: layers %d-%d need %s on cuda:%d (%s), which has %s free (%s kept free); use fewer GPU layers (--n-gpu-layers) or a shorter context",
				part.FirstLayer, part.EndLayer-1, Human(part.Bytes), d.Index, d.Name, Human(d.FreeBytes), Human(margin))
		}
	}
	return nil
}

// ParseSplit reads a --tensor-split value: comma-separated non-negative
// shares ("3,1").
func ParseSplit(s string) ([]float64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []float64
	for i, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return nil, fmt.Errorf("--tensor-split %q: entry %d (%q) is not a non-negative number", s, i+1, f)
		}
		out = append(out, v)
	}
	return out, nil
}
