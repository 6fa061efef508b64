// Package weft runs large language models from GGUF files and Hugging Face
// / MLX safetensors directories, in Go.
//
//	m, err := weft.Load(ctx, "model.gguf", weft.WithContext(4096))
//	if err != nil { … }
//	defer m.Close()
//	for tok, err := range m.Generate(ctx, "Once upon a time", weft.WithMaxTokens(64)) {
//		if err != nil { … }
//		fmt.Print(tok.Text)
//	}
//
// A Model serves several requests at once up to its parallelism
// (WithParallel); each holds its own KV cache slot while it runs.
package weft

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/backend/cpu"
	"github.com/weftlm/weft/chat"
	"github.com/weftlm/weft/constrain"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/modelpath"
	"github.com/weftlm/weft/tokenizer"
	"github.com/weftlm/weft/weights"
)

// Progress reports loading: Stage is "open", "weights", "compile" or
// "warmup"; Done of Total units of that stage are complete.
type Progress struct {
	Stage       string
	Done, Total int
}

// loadOptions are set by Option functions.
type loadOptions struct {
	context     int
	threads     int
	seed        uint64
	backend     string
	noMmap      bool
	progress    func(Progress)
	parallel    int
	batch       int
	memoryLimit int64
	gpuLayers   int       // -1: as many as fit (the default when a GPU backend is chosen)
	tensorSplit []float64 // each GPU's share of the GPU layers; nil: by free memory
	cacheType   string    // engine.Options.CacheType
	// cpuFallback is set by chooseBackend: why "auto" chose the CPU
	// although a driver is installed.
	cpuFallback error
}

func defaultOptions() loadOptions { return loadOptions{backend: "auto", parallel: 1, gpuLayers: -1} }

// Option configures Load.
type Option func(*loadOptions)

// WithContext sets the most tokens a sequence may hold (default: the
// model's context length, capped at 4096).
func WithContext(n int) Option { return func(o *loadOptions) { o.context = n } }

// WithCacheType sets how the key/value cache stores its values: "f32"
// (the default) or "f16" (half the memory, rounded as it is stored).
func WithCacheType(t string) Option { return func(o *loadOptions) { o.cacheType = t } }

// WithThreads sets the CPU worker count (default: one per CPU).
func WithThreads(n int) Option { return func(o *loadOptions) { o.threads = n } }

// WithDefaultSeed sets the sampling seed of requests that name none
// (default: a random seed per request).
func WithDefaultSeed(seed uint64) Option { return func(o *loadOptions) { o.seed = seed } }

// WithBackend chooses the compute backend: "cpu", "cuda" (NVIDIA GPUs; an
// error when none can be used) or "auto" (default: CUDA when a GPU can be
// used, else the CPU; Info().CPUFallback says why not where a driver is
// installed).
func WithBackend(name string) Option { return func(o *loadOptions) { o.backend = name } }

// WithGPULayers puts only the last n layers (and the output head) on
// GPUs, the rest on the CPU; Load fails before allocating when they do not
// fit. -1 (default) puts as many as fit in free memory with a margin:
// every layer when it can, lowering the context (unless WithContext set
// it) before leaving layers on the CPU. Only used with the "cuda" and
// "auto" backends; Info().Placement says what was chosen.
func WithGPULayers(n int) Option { return func(o *loadOptions) { o.gpuLayers = n } }

// WithTensorSplit shares the GPU layers among the GPUs in these
// proportions, one per device in device order (3,1 gives the first three
// quarters; 0 leaves a device out). By default a model that fits on the
// device with the most free memory stays there, and otherwise the shares
// follow each device's free memory. Each device runs a contiguous range of layers;
// the last one also runs the output head.
func WithTensorSplit(shares []float64) Option {
	return func(o *loadOptions) { o.tensorSplit = append([]float64(nil), shares...) }
}

// WithMmap turns memory-mapping of the weights on (default) or off; off
// reads them into memory.
func WithMmap(on bool) Option { return func(o *loadOptions) { o.noMmap = !on } }

// WithProgress sets a callback for loading progress.
func WithProgress(f func(Progress)) Option { return func(o *loadOptions) { o.progress = f } }

// WithParallel sets how many requests may run at once, each with its own
// KV cache (default 1).
func WithParallel(n int) Option { return func(o *loadOptions) { o.parallel = n } }

// WithBatch sets the most tokens one forward replay carries: the prefill
// chunk and the widest batched decode (default 64 on the CPU, 512 with
// GPUs; never fewer than the parallel requests).
func WithBatch(n int) Option { return func(o *loadOptions) { o.batch = n } }

// WithMemoryLimit makes Load fail, before allocating, when the weights,
// the KV caches and the activation buffers would exceed limit bytes.
func WithMemoryLimit(limit int64) Option { return func(o *loadOptions) { o.memoryLimit = limit } }

// Model is a loaded model. Its methods are safe for concurrent use.
type Model struct {
	w    *weights.Provider
	eng  *engine.Model
	tok  *tokenizer.Tokenizer // nil when the model ships no tokenizer
	opts loadOptions
	info Info

	slots chan struct{} // one token per free sequence slot
	sched *scheduler

	mu       sync.Mutex
	metrics  Metrics
	template *chat.Template    // parsed on first use
	masker   *constrain.Masker // token texts for JSON-constrained sampling, built on first use
	closed   bool
	closeMu  sync.RWMutex // held for reading while a request runs
}

// ErrClosed is returned by a closed model.
var ErrClosed = errors.New("weft: model is closed")

// Load opens the model at path — a GGUF file, a safetensors file or
// directory, or a name found in the Hugging Face hub cache or the ollama
// store — and prepares it to run.
func Load(ctx context.Context, path string, opts ...Option) (*Model, error) {
	o := defaultOptions()
	for _, f := range opts {
		f(&o)
	}
	report := func(stage string, done, total int) {
		if o.progress != nil {
			o.progress(Progress{Stage: stage, Done: done, Total: total})
		}
	}
	if o.cacheType != "" && !slices.Contains(engine.CacheTypes, o.cacheType) {
		return nil, fmt.Errorf("weft: cache type %q: want one of %s", o.cacheType, strings.Join(engine.CacheTypes, ", "))
	}
	resolved, err := modelpath.Resolve(path)
	if err != nil {
		return nil, err
	}
	report("open", 0, 1)
	w, err := weights.Open(resolved, weights.Options{NoMmap: o.noMmap})
	if err != nil {
		return nil, err
	}
	report("open", 1, 1)
	if err := ctx.Err(); err != nil {
		w.Close()
		return nil, err
	}
	ctxLen := o.context
	if ctxLen <= 0 {
		ctxLen = min(w.Config.ContextLength, engine.DefaultContext)
	}
	be, plan, ctxLen, err := chooseBackend(&o, w, ctxLen)
	if err != nil {
		w.Close()
		return nil, err
	}
	if o.memoryLimit > 0 {
		if need := estimateMemory(w, ctxLen, max(o.parallel, 1), o.batch, o.cacheType == "f16"); need > o.memoryLimit {
			be.Close()
			w.Close()
			return nil, fmt.Errorf("weft: %s needs about %s (weights, KV cache for %d × %d tokens, buffers), over the limit of %s; lower the context or parallelism",
				path, humanBytes(need), max(o.parallel, 1), ctxLen, humanBytes(o.memoryLimit))
		}
	}
	eng, err := engine.Load(w, be, engine.Options{Context: ctxLen, Slots: o.parallel, MaxBatch: o.batch, CacheType: o.cacheType,
		Progress: func(stage string, done, total int) { report(stage, done, total) }})
	if err != nil {
		be.Close()
		w.Close()
		return nil, err
	}
	m := &Model{w: w, eng: eng, opts: o, slots: make(chan struct{}, eng.Slots())}
	for range eng.Slots() {
		m.slots <- struct{}{}
	}
	if tok, err := loadTokenizer(w); err == nil {
		m.tok = tok
	} else if !errors.Is(err, errNoTokenizer) {
		m.Close()
		return nil, err
	}
	m.info = buildInfo(m, resolved, be)
	if plan != nil {
		m.info.Placement = plan.String()
	}
	if o.cpuFallback != nil {
		m.info.CPUFallback = o.cpuFallback.Error()
	}
	m.sched = startScheduler(m)
	return m, nil
}

var errNoTokenizer = errors.New("no tokenizer")

// loadTokenizer reads the tokenizer shipped with the weights: GGUF
// metadata, or tokenizer files beside a safetensors model.
func loadTokenizer(w *weights.Provider) (*tokenizer.Tokenizer, error) {
	if w.GGUF != nil {
		if _, ok := w.GGUF.KV("tokenizer.ggml.model"); !ok {
			return nil, errNoTokenizer
		}
		return tokenizer.FromGGUF(w.GGUF)
	}
	for _, f := range []string{"tokenizer.json", "vocab.json", "tokenizer.model"} {
		if _, err := os.Stat(w.Dir + "/" + f); err == nil {
			return tokenizer.FromHF(w.Dir)
		}
	}
	return nil, errNoTokenizer
}

// estimateMemory is what a load will hold: the weights, every slot's KV
// cache at full context (float32 keys and values, or f16 with f16Cache)
// and the activation buffers.
func estimateMemory(w *weights.Provider, ctx, slots, batch int, f16Cache bool) int64 {
	var total int64
	for _, t := range w.FileTensors() {
		total += int64(t.Bytes)
	}
	c := w.Config
	elem := int64(4)
	if f16Cache {
		elem = 2
	}
	total += int64(c.NLayers) * int64(slots) * int64(ctx) * int64(c.KVDim()) * 2 * elem
	if batch <= 0 {
		batch = 64
	}
	total += int64(batch) * int64(4*c.Dim+2*c.QDim()+2*c.KVDim()+2*c.FFNDim+c.VocabSize) * 4
	return total
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d bytes", n)
}

// Close frees the model. It waits for running requests to notice and
// return, and is idempotent.
func (m *Model) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	if m.sched != nil {
		m.sched.stop() // running requests end with ErrClosed
	}
	m.closeMu.Lock() // waits for them to return their slots
	defer m.closeMu.Unlock()
	err := m.eng.Close()
	if berr := m.eng.Backend.Close(); err == nil {
		err = berr
	}
	if werr := m.w.Close(); err == nil {
		err = werr
	}
	return err
}

// acquire takes a sequence slot, waiting for one while ctx allows. The
// returned release must be called when the request ends.
func (m *Model) acquire(ctx context.Context) (*engine.Sequence, func(), error) {
	seq, _, release, err := m.acquireFor(ctx, nil)
	return seq, release, err
}

// acquireFor is acquire taking the slot whose cache holds the longest
// start of prompt (prompt caching across requests): the sequence starts
// after the kept tokens, and the caller feeds prompt[kept:].
func (m *Model) acquireFor(ctx context.Context, prompt []int32) (*engine.Sequence, int, func(), error) {
	m.closeMu.RLock()
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		m.closeMu.RUnlock()
		return nil, 0, nil, ErrClosed
	}
	select {
	case <-m.slots:
	case <-ctx.Done():
		m.closeMu.RUnlock()
		return nil, 0, nil, ctx.Err()
	}
	seq, kept, err := m.eng.NewSequenceFor(prompt)
	if err != nil {
		m.slots <- struct{}{}
		m.closeMu.RUnlock()
		return nil, 0, nil, err
	}
	return seq, kept, func() {
		seq.Close()
		m.slots <- struct{}{}
		m.closeMu.RUnlock()
	}, nil
}

// Info describes a loaded model.
type Info struct {
	Path         string         `json:"path"`
	Format       string         `json:"format"`
	Architecture string         `json:"architecture"`
	Config       weights.Config `json:"config"`
	Parameters   int64          `json:"parameters"`
	WeightBytes  int64          `json:"weight_bytes"`
	Backend      string         `json:"backend"`
	Placement    string         `json:"placement,omitempty"` // where the layers run, when GPUs are used
	// CPUFallback says why the auto backend runs on the CPU although an
	// NVIDIA driver is installed (empty where it uses a GPU, where no
	// driver is installed, or where another backend was asked for).
	CPUFallback   string          `json:"cpu_fallback,omitempty"`
	Threads       int             `json:"threads"`
	Context       int             `json:"context"`
	Parallel      int             `json:"parallel"`
	HasTokenizer  bool            `json:"has_tokenizer"`
	ChatTemplate  bool            `json:"chat_template"`
	EndOfGen      []int32         `json:"end_of_generation_tokens,omitempty"`
	SpecialTokens map[string]bool `json:"-"`
}

// Info describes the model.
func (m *Model) Info() Info { return m.info }

func buildInfo(m *Model, path string, be backend.Backend) Info {
	in := Info{Path: path, Format: string(m.w.Format), Architecture: m.w.Config.Architecture, Config: m.w.Config,
		Backend: be.Name(), Context: m.eng.Context(), Parallel: m.eng.Slots(), HasTokenizer: m.tok != nil}
	if c, ok := be.(*cpu.Backend); ok {
		in.Threads = c.Threads()
	} else {
		in.Threads = runtime.GOMAXPROCS(0)
	}
	for _, t := range m.w.Tensors() {
		n := int64(1)
		for _, s := range t.Shape {
			n *= s
		}
		in.Parameters += n
	}
	for _, t := range m.w.FileTensors() {
		in.WeightBytes += int64(t.Bytes)
	}
	if m.tok != nil {
		in.ChatTemplate = m.tok.ChatTemplate() != ""
		in.EndOfGen = m.tok.EOG()
	}
	return in
}

// Tokenizer returns the model's tokenizer, or nil when it has none.
func (m *Model) Tokenizer() *tokenizer.Tokenizer { return m.tok }

// elapsed is time since t in seconds, never zero.
func elapsed(t time.Time) float64 { return max(time.Since(t).Seconds(), 1e-9) }
