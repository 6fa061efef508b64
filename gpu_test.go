package weft

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/backend/cpu"
	"github.com/weftlm/weft/backend/cuda"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/internal/testmodel"
	"github.com/weftlm/weft/placement"
	"github.com/weftlm/weft/weights"
)

// fakeGPUs stands in for CUDA: each "device" is a CPU backend, so the
// placement and the split it builds run end to end without a GPU.
type fakeGPUs struct {
	devs     []placement.Device
	err      error
	opened   []int
	drawing  bool // devices draw tokens themselves, as CUDA does
	backends []*testmodel.Drawing
	// pipelining: devices also queue decode steps (backend.Pipeliner),
	// as CUDA does
	pipelining bool
	pipelined  []*testmodel.Pipelining
	// logprobs: devices report log-probabilities with their draws
	// (backend.LogprobSampler), as CUDA does
	logprobs bool
}

func (f *fakeGPUs) Devices() ([]placement.Device, error) { return f.devs, f.err }

func (f *fakeGPUs) Open(i int) (backend.Backend, error) {
	f.opened = append(f.opened, i)
	if f.pipelining {
		p := &testmodel.Pipelining{Backend: cpu.New(1), Logprobs: f.logprobs}
		f.pipelined = append(f.pipelined, p)
		return p, nil
	}
	if f.drawing {
		d := &testmodel.Drawing{Backend: cpu.New(1), Logprobs: f.logprobs}
		f.backends = append(f.backends, d)
		return d, nil
	}
	return cpu.New(1), nil
}

// draws counts the tokens the fake devices drew.
func (f *fakeGPUs) draws() int {
	n := 0
	for _, d := range f.backends {
		n += d.Draws
	}
	return n
}

// logprobRows counts the rows whose log-probabilities the fake devices
// reported.
func (f *fakeGPUs) logprobRows() int {
	n := 0
	for _, d := range f.backends {
		n += d.LogprobRows
	}
	for _, p := range f.pipelined {
		n += p.LogprobRows
	}
	return n
}

func withGPUs(t *testing.T, f gpuSystem) {
	old := gpus
	gpus = f
	t.Cleanup(func() { gpus = old })
}

func greedyIDs(t *testing.T, m *Model) []int32 {
	t.Helper()
	_, ids, _ := collect(t, m.Generate(context.Background(), "Once upon a time", WithTemperature(0), WithMaxTokens(40)))
	return ids
}

func TestPlacementOnFakeGPUs(t *testing.T) {
	path := sharedFile(t, "gguf-stories260K/stories260K.gguf")
	want := greedyIDs(t, loadStories(t))

	w, err := weights.Open(path, weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fp := footprint(w, 1, gpuBatch, false)
	w.Close()
	nLayers := len(fp.LayerBytes)
	// Room for the output head, the buffers and two layers, beside the
	// margin: auto-fit must leave the rest on the CPU.
	twoLayers := placement.DefaultMargin + fp.WorkBytes + fp.OutputBytes + 2*(fp.LayerBytes[0]+fp.KVBytes(0, 64)) + 1024
	const plenty = 80 << 30

	tests := []struct {
		name       string
		devs       []placement.Device
		opts       []Option
		wantParts  string // the plan's text must contain this
		wantOpened []int
		wantErr    string
	}{
		{"one device, every layer", []placement.Device{{Index: 0, Name: "fake", FreeBytes: plenty}}, nil,
			"layers 0-4 and output on cuda:0 fake", []int{0}, ""},
		{"fits on the device with the most free memory", []placement.Device{{Index: 0, Name: "a", FreeBytes: plenty / 2}, {Index: 1, Name: "b", FreeBytes: plenty}}, nil,
			"layers 0-4 and output on cuda:1 b", []int{1}, ""},
		{"three devices, split evenly", []placement.Device{{Index: 0, Name: "a", FreeBytes: plenty}, {Index: 1, Name: "b", FreeBytes: plenty}, {Index: 2, Name: "c", FreeBytes: plenty}},
			[]Option{WithTensorSplit([]float64{1, 1, 1})}, "layers 0-1 on cuda:0 a", []int{0, 1, 2}, ""},
		{"explicit split leaves device 0 out", []placement.Device{{Index: 0, Name: "a", FreeBytes: plenty}, {Index: 1, Name: "b", FreeBytes: plenty}},
			[]Option{WithTensorSplit([]float64{0, 1})}, "layers 0-4 and output on cuda:1 b", []int{1}, ""},
		{"auto-fit leaves layers on the CPU", []placement.Device{{Index: 0, Name: "small", FreeBytes: twoLayers}}, []Option{WithContext(64)},
			"layers 0-2 on cpu; 3-4 and output on cuda:0 small", []int{0}, ""},
		{"explicit layer count", []placement.Device{{Index: 0, Name: "a", FreeBytes: plenty}}, []Option{WithGPULayers(1)},
			"layers 0-3 on cpu; 4 and output on cuda:0 a", []int{0}, ""},
		{"explicit count that does not fit", []placement.Device{{Index: 0, Name: "small", FreeBytes: twoLayers}}, []Option{WithGPULayers(nLayers), WithContext(64)},
			"", nil, "need"},
		{"split of the wrong length", []placement.Device{{Index: 0, Name: "a", FreeBytes: plenty}}, []Option{WithTensorSplit([]float64{1, 1})},
			"", nil, "2 entries for 1 GPUs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeGPUs{devs: tc.devs}
			withGPUs(t, f)
			m, err := Load(context.Background(), path, append([]Option{WithBackend("cuda")}, tc.opts...)...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "stories260K") {
					t.Fatalf("err = %v, want it to name the model and contain %q", err, tc.wantErr)
				}
				if len(f.opened) != 0 {
					t.Errorf("opened devices %v before failing", f.opened)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if p := m.Info().Placement; !strings.Contains(p, tc.wantParts) {
				t.Errorf("placement %q, want it to contain %q", p, tc.wantParts)
			}
			if len(f.opened) != len(tc.wantOpened) {
				t.Errorf("opened %v, want %v", f.opened, tc.wantOpened)
			}
			for i := range min(len(f.opened), len(tc.wantOpened)) {
				if f.opened[i] != tc.wantOpened[i] {
					t.Errorf("opened %v, want %v", f.opened, tc.wantOpened)
				}
			}
			got := greedyIDs(t, m)
			if len(got) != len(want) {
				t.Fatalf("%d tokens, want %d", len(got), len(want))
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("token %d: %d, want %d (split placement must match the CPU)", i, got[i], want[i])
				}
			}
		})
	}
}

func TestPlacementFallback(t *testing.T) {
	path := sharedFile(t, "gguf-stories260K/stories260K.gguf")
	// No driver: the CPU, and nothing to say about it; a driver whose GPU
	// cannot be used: the CPU, and Info says why. Auto is the default.
	for _, tc := range []struct {
		err      error
		fallback string
	}{
		{fmt.Errorf("%w: libcuda.so.1: cannot open shared object file", cuda.ErrNoDriver), ""},
		{errors.New("cuda: the NVIDIA driver supports CUDA 11.4; weft needs 12.0 or newer"), "weft: cuda: the NVIDIA driver supports CUDA 11.4"},
		{errors.New("cuda: cannot load NVRTC"), "weft: cuda: cannot load NVRTC"},
	} {
		withGPUs(t, &fakeGPUs{err: tc.err})
		m, err := Load(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		if in := m.Info(); in.Backend != "cpu" || in.Placement != "" || !strings.HasPrefix(in.CPUFallback, tc.fallback) || (tc.fallback == "") != (in.CPUFallback == "") {
			t.Errorf("auto, %v: backend %q placement %q fallback %q", tc.err, in.Backend, in.Placement, in.CPUFallback)
		}
		m.Close()
	}
	withGPUs(t, &fakeGPUs{err: errors.New("cuda: libcuda.so.1 not found")})
	if _, err := Load(context.Background(), path, WithBackend("cuda")); err == nil || !strings.Contains(err.Error(), "libcuda") {
		t.Errorf("cuda without a GPU: %v", err)
	}
	withGPUs(t, &fakeGPUs{})
	if _, err := Load(context.Background(), path, WithBackend("cuda")); err == nil || !strings.Contains(err.Error(), "no device") {
		t.Errorf("cuda with no device: %v", err)
	}
	if _, err := Load(context.Background(), path, WithTensorSplit([]float64{1, 1})); err == nil || !strings.Contains(err.Error(), "tensor split") {
		t.Errorf("tensor split on the CPU: %v", err)
	}
}

func TestLayerOf(t *testing.T) {
	for name, want := range map[string]int{
		"layers.0.attention.q.weight": 0, "layers.31.mlp.down.weight": 31, "token_embedding.weight": -1,
		"layers.x.y": -1, "layers.7": -1, "output.weight": -1,
	} {
		if got := layerOf(name); got != want {
			t.Errorf("layerOf(%q) = %d, want %d", name, got, want)
		}
	}
}

// TestDeviceDraws: requests whose sampling a device can do (greedy, a
// temperature alone, or with a top-k of at most 64 and any top-p and
// min-p, or with top-p or min-p and no top-k, and penalties over a short
// window) are drawn there, and give the same tokens as on the CPU for the
// same seed, alone or batched with requests that need the logits on the
// host (log-probabilities).
func TestDeviceDraws(t *testing.T) {
	path := sharedFile(t, "gguf-stories260K/stories260K.gguf")
	plain := []GenerateOption{WithTemperature(0.9), WithTopK(0), WithTopP(1), WithMinP(0), WithSeed(11), WithMaxTokens(48)}
	topk := []GenerateOption{WithTemperature(0.8), WithTopK(40), WithTopP(0.95), WithMinP(0.05), WithSeed(13), WithMaxTokens(48)}
	chain := []GenerateOption{WithTemperature(0.9), WithTopK(20), WithTopP(0.9), WithRepeatPenalty(1.1), WithSeed(12), WithMaxTokens(48)}
	nucleus := []GenerateOption{WithTemperature(1), WithTopK(0), WithTopP(0.9), WithMinP(0.02), WithSeed(14), WithMaxTokens(48)}
	bias := func(g *GenerateOptions) { g.Sampling.LogitBias = map[int32]float32{5: 3, 9: -100, 13: 2} }
	biased := []GenerateOption{WithTemperature(0.9), bias, WithSeed(15), WithMaxTokens(48)}
	cpuModel := loadStories(t, WithParallel(2))
	_, wantPlain, _ := collect(t, cpuModel.Generate(context.Background(), "Once upon a time", plain...))
	_, wantTopK, _ := collect(t, cpuModel.Generate(context.Background(), "Once upon a time", topk...))
	_, wantNucleus, _ := collect(t, cpuModel.Generate(context.Background(), "Once upon a time", nucleus...))
	_, wantBiased, _ := collect(t, cpuModel.Generate(context.Background(), "Once upon a time", biased...))
	_, wantChain, _ := collect(t, cpuModel.Generate(context.Background(), "Once upon a time", chain...))

	f := &fakeGPUs{devs: []placement.Device{{Index: 0, Name: "fake", FreeBytes: 80 << 30}}, drawing: true}
	withGPUs(t, f)
	m, err := Load(context.Background(), path, WithBackend("cuda"), WithParallel(2))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	same := func(what string, got, want []int32) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d tokens, want %d", what, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s: token %d is %d, want %d", what, i, got[i], want[i])
			}
		}
	}
	// Each request alone: the same tokens as on the CPU, drawn on the
	// device.
	for _, c := range []struct {
		what string
		opts []GenerateOption
		want []int32
	}{
		{"plain alone", plain, wantPlain}, {"top-k, top-p, min-p alone", topk, wantTopK}, {"top-p, min-p alone", nucleus, wantNucleus},
		{"a logit bias", biased, wantBiased}, {"a penalty alone", chain, wantChain},
	} {
		before := f.draws()
		_, got, _ := collect(t, m.Generate(context.Background(), "Once upon a time", c.opts...))
		same(c.what, got, c.want)
		if f.draws() == before {
			t.Errorf("%s: not drawn on the device", c.what)
		}
	}
	before := f.draws()
	withLogprobs := append(slices.Clone(chain), WithLogprobs(2))
	_, got, _ := collect(t, m.Generate(context.Background(), "Once upon a time", withLogprobs...))
	same("a penalty with log-probabilities", got, wantChain)
	if f.draws() != before {
		t.Errorf("the device drew %d tokens for requests that need the logits", f.draws()-before)
	}
	// Together: steps carry both, so every draw happens on the host, and
	// each request still gets its own tokens.
	ids := func(opts []GenerateOption, dst *[]int32, errp *error) {
		for tok, err := range m.Generate(context.Background(), "Once upon a time", opts...) {
			if err != nil {
				*errp = err
				return
			}
			if !tok.Done {
				*dst = append(*dst, tok.ID)
			}
		}
	}
	var wg sync.WaitGroup
	var gotPlain, gotChain []int32
	var errPlain, errChain error
	wg.Add(2)
	go func() { defer wg.Done(); ids(plain, &gotPlain, &errPlain) }()
	go func() { defer wg.Done(); ids(withLogprobs, &gotChain, &errChain) }()
	wg.Wait()
	if errPlain != nil || errChain != nil {
		t.Fatal(errPlain, errChain)
	}
	same("plain beside log-probabilities", gotPlain, wantPlain)
	same("log-probabilities beside plain", gotChain, wantChain)
	// BatchGenerate draws on the device too.
	before = f.draws()
	res, err := m.BatchGenerate(context.Background(), []string{"Once upon a time", "Once upon a time"}, plain...)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range res {
		same(fmt.Sprintf("batch %d", i), c.Tokens, wantPlain)
	}
	if f.draws() == before {
		t.Error("BatchGenerate drew nothing on the device")
	}
}

// TestDeviceLogprobs: on a device that reports log-probabilities with its
// draws (backend.LogprobSampler), requests asking for them draw there,
// queued ahead or not, alone or beside others, and every token carries
// the same log-probabilities as on the CPU, which computes them from the
// logits.
func TestDeviceLogprobs(t *testing.T) {
	path := sharedFile(t, "gguf-stories260K/stories260K.gguf")
	greedy := []GenerateOption{WithTemperature(0), WithMaxTokens(40), WithLogprobs(3)}
	penalty := []GenerateOption{WithTemperature(0.9), WithTopK(20), WithTopP(0.9), WithRepeatPenalty(1.3), WithSeed(12), WithMaxTokens(40),
		WithLogprobs(5)}
	nucleus := []GenerateOption{WithTemperature(1), WithTopK(0), WithTopP(0.9), WithSeed(14), WithMaxTokens(40), WithLogprobs(0)}
	plain := []GenerateOption{WithTemperature(0.9), WithTopK(0), WithTopP(1), WithMinP(0), WithSeed(11), WithMaxTokens(40)}
	many := []GenerateOption{WithTemperature(0), WithMaxTokens(8), WithLogprobs(backend.MaxTopLogprobs + 1)}
	cases := []struct {
		what string
		opts []GenerateOption
		// device: the device reports this request's log-probabilities
		// (more alternatives than a device row has room for go to the
		// host)
		device bool
	}{{"greedy", greedy, true}, {"penalty", penalty, true}, {"nucleus", nucleus, true}, {"21 alternatives", many, false}}
	tokens := func(t *testing.T, m *Model, opts []GenerateOption) []Token {
		t.Helper()
		var out []Token
		for tok, err := range m.Generate(context.Background(), "Once upon a time", opts...) {
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, tok)
		}
		return out
	}
	cpuModel := loadStories(t, WithParallel(2))
	want := make([][]Token, len(cases))
	for i, c := range cases {
		want[i] = tokens(t, cpuModel, c.opts)
	}
	_, wantPlain, _ := collect(t, cpuModel.Generate(context.Background(), "Once upon a time", plain...))
	same := func(t *testing.T, what string, got, want []Token) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d tokens, want %d", what, len(got), len(want))
		}
		for i := range got {
			g, w := got[i], want[i]
			if g.ID != w.ID || g.Logprob != w.Logprob || !slices.Equal(g.TopLogprobs, w.TopLogprobs) {
				t.Fatalf("%s: token %d is %d (log p %v, top %v), want %d (%v, %v)", what, i, g.ID, g.Logprob, g.TopLogprobs, w.ID, w.Logprob, w.TopLogprobs)
			}
		}
	}
	for _, pipelining := range []bool{false, true} {
		t.Run(fmt.Sprintf("pipelining=%v", pipelining), func(t *testing.T) {
			f := &fakeGPUs{devs: []placement.Device{{Index: 0, Name: "fake", FreeBytes: 80 << 30}}, drawing: true, pipelining: pipelining,
				logprobs: true}
			withGPUs(t, f)
			m, err := Load(context.Background(), path, WithBackend("cuda"), WithParallel(2))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			for i, c := range cases {
				before := f.logprobRows()
				same(t, c.what, tokens(t, m, c.opts), want[i])
				if reported := f.logprobRows() > before; reported != c.device {
					t.Errorf("%s: the device reported log-probabilities: %v, want %v", c.what, reported, c.device)
				}
			}
			// Beside a request that asks for none, in the same steps.
			var wg sync.WaitGroup
			var got []Token
			var gotPlain []int32
			wg.Add(2)
			go func() { defer wg.Done(); got = tokens(t, m, penalty) }()
			go func() {
				defer wg.Done()
				_, gotPlain, _ = collect(t, m.Generate(context.Background(), "Once upon a time", plain...))
			}()
			wg.Wait()
			same(t, "penalty beside plain", got, want[1])
			if !slices.Equal(gotPlain, wantPlain) {
				t.Errorf("plain beside log-probabilities: %v, want %v", gotPlain, wantPlain)
			}
		})
	}
}

// recording wraps a backend and records every replay's rows per slot.
type recording struct {
	backend.Backend
	mu      sync.Mutex
	replays []map[int32]int
}

type recordingExec struct {
	backend.Exec
	r *recording
}

func (r *recording) Compile(p *backend.Program) (backend.Exec, error) {
	x, err := r.Backend.Compile(p)
	if err != nil {
		return nil, err
	}
	return &recordingExec{Exec: x, r: r}, nil
}

func (e *recordingExec) Run(b *backend.Batch, out []float32) error {
	rows := map[int32]int{}
	for _, s := range b.Slots {
		rows[s]++
	}
	e.r.mu.Lock()
	e.r.replays = append(e.r.replays, rows)
	e.r.mu.Unlock()
	return e.Exec.Run(b, out)
}

// TestChunkedPrefill: a long prompt arriving while another request
// decodes is read a chunk per replay beside the decode row, never in
// replays of its own that would stall the running stream, and both
// requests get what they get alone.
func TestChunkedPrefill(t *testing.T) {
	path := sharedFile(t, "gguf-stories260K/stories260K.gguf")
	rec := &recording{Backend: cpu.New(1)}
	withGPUs(t, &recordingGPUs{fakeGPUs{devs: []placement.Device{{Name: "rec", FreeBytes: 80 << 30}}}, rec})
	m, err := Load(context.Background(), path, WithBackend("cuda"), WithParallel(2), WithBatch(8), WithContext(512))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	long := strings.Repeat("Once upon a time there was a little girl named Lily. ", 30)
	if n := len(m.Tokenizer().Encode(long, true, false)); n < 200 {
		t.Fatalf("long prompt of %d tokens", n)
	}
	optsA := []GenerateOption{WithTemperature(0), WithMaxTokens(300)}
	optsB := []GenerateOption{WithTemperature(0), WithMaxTokens(20)}
	// Alone, on another model: on m the prompts would then be found in
	// the slots' caches and hardly fed at all.
	other := loadStories(t, WithParallel(2), WithBatch(8), WithContext(512))
	aloneA, _, _ := collect(t, other.Generate(ctx, "Tom was sad", optsA...))
	aloneB, _, _ := collect(t, other.Generate(ctx, long, optsB...))
	var a, b strings.Builder
	var bErr error
	var wg sync.WaitGroup
	n := 0
	for tok, err := range m.Generate(ctx, "Tom was sad", optsA...) {
		if err != nil {
			t.Fatal(err)
		}
		a.WriteString(tok.Text)
		if n++; n == 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for tok, err := range m.Generate(ctx, long, optsB...) {
					if err != nil {
						bErr = err
						return
					}
					b.WriteString(tok.Text)
				}
			}()
		}
	}
	wg.Wait()
	if bErr != nil {
		t.Fatal(bErr)
	}
	if a.String() != aloneA || b.String() != aloneB {
		t.Errorf("concurrent outputs differ from alone:\nA %q\n  %q\nB %q\n  %q", a.String(), aloneA, b.String(), aloneB)
	}
	// Replays that read several prompt tokens of one slot must carry the
	// other slot's decode row whenever that request was still running.
	mixed, alonePrompt := 0, 0
	rec.mu.Lock()
	for _, r := range rec.replays {
		prompt := false
		for _, k := range r {
			prompt = prompt || k > 1
		}
		switch {
		case prompt && len(r) == 2:
			mixed++
		case prompt:
			alonePrompt++
		}
	}
	rec.mu.Unlock()
	if mixed < 20 {
		t.Errorf("%d replays mixed B's prompt with A's decode row (%d read the prompt alone); want the prompt read beside A", mixed, alonePrompt)
	}
}

// recordingGPUs opens the one recording backend.
type recordingGPUs struct {
	fakeGPUs
	rec *recording
}

func (g *recordingGPUs) Open(int) (backend.Backend, error) { return g.rec, nil }

// capturing compiles on the CPU and keeps the last program it saw.
type capturing struct {
	backend.Backend
	p *backend.Program
}

func (c *capturing) Compile(p *backend.Program) (backend.Exec, error) {
	c.p = p
	return c.Backend.Compile(p)
}

// TestFootprintCoversProgram: the footprint placement plans with is never
// below what the CUDA backend allocates for the program the engine builds
// (cuda.ProgramBytes, from the same plan Compile makes), and not far above.
func TestFootprintCoversProgram(t *testing.T) {
	root := filepath.Join("testdata", "models")
	for _, tc := range []struct {
		path              string
		ctx, slots, batch int
		f16               bool // f16 key/value caches
	}{
		{filepath.Join(root, "llama3-tiny"), 64, 1, 16, false},
		{filepath.Join(root, "llama3-tiny"), 512, 2, 16, true},
		{filepath.Join(root, "gemma3-tiny"), 96, 2, 32, false}, // sliding-window layers
		{filepath.Join(root, "quant", "llama3-tiny-Q4_0.gguf"), 64, 3, 48, false},
		{filepath.Join(root, "quant", "llama-256-Q4_K.gguf"), 128, 1, 64, false},
		{filepath.Join(root, "quant", "qwen3-tiny-mlx4"), 64, 1, 64, false}, // converted to F16 on upload
	} {
		cacheType := "f32"
		if tc.f16 {
			cacheType = "f16"
		}
		t.Run(filepath.Base(tc.path)+"/"+cacheType, func(t *testing.T) {
			w, err := weights.Open(tc.path, weights.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			c := &capturing{Backend: cpu.New(1)}
			m, err := engine.Load(w, c, engine.Options{Context: tc.ctx, Slots: tc.slots, MaxBatch: tc.batch, CacheType: cacheType})
			if err != nil {
				t.Fatal(err)
			}
			m.Close()
			actual, err := cuda.ProgramBytes(c.p)
			if err != nil {
				t.Fatal(err)
			}
			fp := footprint(w, tc.slots, tc.batch, tc.f16)
			est := fp.WorkBytes + fp.EmbedBytes + fp.OutputBytes - fp.SharedBytes
			for l, b := range fp.LayerBytes {
				est += b + int64(tc.slots)*fp.KVBytes(l, tc.ctx)
			}
			// What the footprint adds for the module and graphs is not
			// in the program's own allocations.
			est -= cuda.ModuleBytes
			if est < actual || est > 3*actual {
				t.Errorf("footprint of %d bytes (beside the module) for a program of %d", est, actual)
			}
		})
	}
}

// TestPlanPlacement: the dry run gives the plan Load then uses, and the
// CPU alone where no GPU can be used.
func TestPlanPlacement(t *testing.T) {
	path := sharedFile(t, "gguf-stories260K/stories260K.gguf")
	withGPUs(t, &fakeGPUs{devs: []placement.Device{{Index: 0, Name: "a", FreeBytes: 80 << 30}, {Index: 1, Name: "b", FreeBytes: 80 << 30}}})
	opts := []Option{WithGPULayers(3), WithTensorSplit([]float64{1, 2}), WithContext(128)}
	plan, err := PlanPlacement(path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(context.Background(), path, append(opts, WithBackend("cuda"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if plan.String() != m.Info().Placement || plan.GPULayers() != 3 {
		t.Errorf("dry run %q, Load %q", plan, m.Info().Placement)
	}
	withGPUs(t, &fakeGPUs{err: errors.New("cuda: no driver")})
	plan, err = PlanPlacement(path, WithContext(128))
	if err != nil || plan.GPULayers() != 0 || !strings.Contains(plan.String(), "on cpu") {
		t.Errorf("without a GPU: %v, %v", plan, err)
	}
	if _, err := PlanPlacement(filepath.Join(t.TempDir(), "none.gguf")); err == nil || !strings.Contains(err.Error(), "none.gguf") {
		t.Errorf("missing model: %v", err)
	}
}

// TestPipelinedGeneration: on a device that queues decode steps (the
// next step issued before the host has read the draws of the one before
// it), generations give the tokens, text and ends the CPU gives them:
// alone and side by side, stopped by their length, a stop string, the end
// of the context or their reader, and cancelled.
func TestPipelinedGeneration(t *testing.T) {
	path := sharedFile(t, "gguf-stories260K/stories260K.gguf")
	opts := []Option{WithParallel(3), WithContext(96)}
	cpuModel := loadStories(t, opts...)
	f := &fakeGPUs{devs: []placement.Device{{Index: 0, Name: "fake", FreeBytes: 80 << 30}}, pipelining: true}
	withGPUs(t, f)
	m, err := Load(context.Background(), path, append(opts, WithBackend("cuda"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	type result struct {
		text   string
		ids    []int32
		reason string
	}
	gen := func(m *Model, prompt string, o []GenerateOption) (result, error) {
		var r result
		var sb strings.Builder
		for tok, err := range m.Generate(context.Background(), prompt, o...) {
			if err != nil {
				return r, err
			}
			sb.WriteString(tok.Text)
			if !tok.Done {
				r.ids = append(r.ids, tok.ID)
			} else {
				r.reason = tok.FinishReason
			}
		}
		r.text = sb.String()
		return r, nil
	}
	cases := []struct {
		name   string
		prompt string
		opts   []GenerateOption
	}{
		{"greedy", "Once upon a time", []GenerateOption{WithTemperature(0), WithMaxTokens(40)}},
		{"tempered", "Once upon a time", []GenerateOption{WithTemperature(0.8), WithSeed(3), WithMaxTokens(30)}},
		{"one token", "The dog", []GenerateOption{WithTemperature(0), WithMaxTokens(1)}},
		{"two tokens", "The dog", []GenerateOption{WithTemperature(0), WithMaxTokens(2)}},
		{"stop string", "Once upon a time", []GenerateOption{WithTemperature(0), WithStop("park"), WithMaxTokens(60)}},
		{"context end", "Lily and Ben", []GenerateOption{WithTemperature(0.7), WithSeed(5)}},
		{"hot", "Lily", []GenerateOption{WithTemperature(1.6), WithSeed(11), WithMaxTokens(50)}},
		{"top-k, top-p, min-p", "Once upon a time", []GenerateOption{WithTemperature(0.8), WithTopK(40), WithTopP(0.95), WithMinP(0.05),
			WithSeed(7), WithMaxTokens(40)}},
		{"top-p alone", "Once upon a time", []GenerateOption{WithTemperature(1), WithTopK(0), WithTopP(0.9), WithSeed(8), WithMaxTokens(40)}},
		{"repeat penalty", "Once upon a time", []GenerateOption{WithTemperature(0.7), WithTopK(40), WithRepeatPenalty(1.5), WithSeed(9),
			WithMaxTokens(90)}},
		{"greedy, repeat penalty", "Lily", []GenerateOption{WithTemperature(0), WithRepeatPenalty(1.3), WithMaxTokens(90)}},
		{"logit bias", "Lily", []GenerateOption{WithTemperature(0.8), WithTopP(0.9), WithTopK(0), WithSeed(4), WithMaxTokens(60),
			func(g *GenerateOptions) { g.Sampling.LogitBias = map[int32]float32{13: 4, 29: -100} }}},
	}
	want := make([]result, len(cases))
	for i, c := range cases {
		if want[i], err = gen(cpuModel, c.prompt, c.opts); err != nil {
			t.Fatal(err)
		}
	}
	check := func(what string, got, want result) {
		t.Helper()
		if !slices.Equal(got.ids, want.ids) || got.text != want.text || got.reason != want.reason {
			t.Errorf("%s: %d tokens %q (%s), want %d %q (%s)", what, len(got.ids), got.text, got.reason, len(want.ids), want.text, want.reason)
		}
	}
	chained := func() int {
		n := 0
		for _, p := range f.pipelined {
			n += p.Chained
		}
		return n
	}
	for i, c := range cases {
		got, err := gen(m, c.prompt, c.opts)
		if err != nil {
			t.Fatal(err)
		}
		check(c.name, got, want[i])
	}
	if chained() == 0 {
		t.Fatal("no step was issued ahead")
	}
	// Three at a time, joining and leaving while steps are queued.
	got := make([]result, len(cases))
	errs := make([]error, len(cases))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 3)
	for i, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			got[i], errs[i] = gen(m, c.prompt, c.opts)
		}()
	}
	wg.Wait()
	for i, c := range cases {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		check(c.name+" beside others", got[i], want[i])
	}
	// A reader that stops early, and one whose context is cancelled:
	// the next generation is unaffected.
	n := 0
	for _, err := range m.Generate(context.Background(), "Once upon a time", WithTemperature(0)) {
		if err != nil {
			t.Fatal(err)
		}
		if n++; n == 5 {
			break
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	n = 0
	for _, err := range m.Generate(ctx, "Once upon a time", WithTemperature(0)) {
		if n++; n == 3 {
			cancel()
		}
		if err != nil {
			break
		}
	}
	cancel()
	r, err := gen(m, cases[0].prompt, cases[0].opts)
	if err != nil {
		t.Fatal(err)
	}
	check("after a stopped reader", r, want[0])
}
