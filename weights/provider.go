// Package weights opens model weights — a GGUF file (or split set), or a
// Hugging Face / MLX safetensors directory — behind one interface: a Config,
// an architecture descriptor, and tensors under canonical names
// ("layers.3.attention.q.weight"). Model code never learns the file format.
package weights

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/weftlm/weft/arch"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/gguf"
)

// Format is the file format weights came from.
type Format string

// Formats.
const (
	GGUF        Format = "gguf"
	Safetensors Format = "safetensors"
)

// MLXQuant describes an MLX affine-quantized matrix: each group of
// GroupSize consecutive weights along a row shares a scale and a bias, and
// w = scale*q + bias with q packed Bits at a time, little end first, into
// uint32 words.
type MLXQuant struct {
	Bits       int    `json:"bits"`
	GroupSize  int    `json:"group_size"`
	ScalesType string `json:"scales_type"` // "F16", "BF16" or "F32"
	Scales     string `json:"scales"`      // file names of the companion tensors
	Biases     string `json:"biases"`
}

// Tensor is one canonical tensor.
type Tensor struct {
	Name     string `json:"name"` // canonical
	FileName string `json:"file_name"`
	// Type is spelled as ggml spells it ("F32", "Q4_0", "BF16"); types
	// only safetensors has keep its spelling ("U32", "BOOL"); an MLX
	// quantized matrix is "MLX_Q4" or "MLX_Q8".
	Type string    `json:"type"`
	GGML ggml.Type `json:"-"` // valid when HasGGML
	// HasGGML reports whether Type has a ggml id (all but MLX and a few
	// safetensors-only types).
	HasGGML bool `json:"-"`
	// Shape is logical and outermost first: a matrix mapping n inputs to m
	// outputs is [m, n], whatever order the file stores.
	Shape []int64   `json:"shape"`
	Bytes uint64    `json:"bytes"` // of the main data (MLX: packed weights only)
	MLX   *MLXQuant `json:"mlx,omitempty"`
}

// Rows and Cols of a matrix (Cols is the contiguous dimension).
func (t *Tensor) Rows() int64 {
	if len(t.Shape) < 2 {
		return 1
	}
	return t.Shape[0]
}

// Cols is the innermost dimension.
func (t *Tensor) Cols() int64 {
	if len(t.Shape) == 0 {
		return 1
	}
	return t.Shape[len(t.Shape)-1]
}

// Data is a tensor's bytes: views of the mapped file where possible.
type Data struct {
	Bytes  []byte
	Scales []byte // MLX only
	Biases []byte // MLX only
}

// FileTensor is a tensor as the file stores it, for inspection.
type FileTensor struct {
	Name      string  `json:"name"`
	Canonical string  `json:"canonical"` // "" when no rule maps it
	Type      string  `json:"type"`
	Shape     []int64 `json:"shape"` // as the file orders it: GGUF innermost first, safetensors outermost first
	Bytes     uint64  `json:"bytes"`
}

// Options control opening.
type Options struct {
	NoMmap bool // read tensors into memory instead of mapping the file
}

// source is what a format reader gives the provider.
type source struct {
	tensor func(fileName string) ([]byte, error)
	close  func() error
}

// Provider is an open set of model weights.
type Provider struct {
	Path   string
	Format Format
	Config Config
	Arch   *arch.Descriptor
	// GGUF is the opened GGUF model — its key-value metadata, for
	// inspection and tokenizers; nil for safetensors.
	GGUF *gguf.Model
	// Dir is the safetensors directory (for tokenizer files), "" for GGUF.
	Dir string

	extra   map[string]any // format-specific metadata for inspection
	files   []FileTensor
	tensors map[string]*Tensor
	order   []string
	src     source

	mu    sync.Mutex
	cache map[string]Data
}

// Open opens model weights at path: a .gguf file (or one shard of a split
// set), a .safetensors file, or a directory with config.json and
// safetensors. The config is validated and every tensor the architecture
// needs is checked for presence and shape.
func Open(path string, opts Options) (*Provider, error) {
	p, cfgErr, err := open(path, opts)
	if err != nil {
		return nil, err
	}
	if cfgErr != nil {
		p.Close()
		return nil, cfgErr
	}
	if err := p.check(); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Inspect opens path like Open but tolerates what inspection does not need:
// an unknown architecture, an incomplete config (vocabulary-only GGUF
// files), missing tensors. The config problem, if any, is returned as
// configErr beside a usable Provider.
func Inspect(path string, opts Options) (p *Provider, configErr error, err error) {
	return open(path, opts)
}

func open(path string, opts Options) (*Provider, error, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	if st.IsDir() || strings.HasSuffix(path, ".safetensors") {
		return openSafetensors(path, st.IsDir(), opts)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	var magic [4]byte
	_, rerr := io.ReadFull(f, magic[:])
	f.Close()
	if rerr == nil && string(magic[:]) == gguf.Magic {
		return openGGUF(path, opts)
	}
	return nil, nil, fmt.Errorf("%s: unrecognised model format: %s (want a GGUF file, a .safetensors file, or a directory with config.json)", path, describeMagic(magic[:], rerr))
}

func describeMagic(b []byte, err error) string {
	if err != nil {
		return "file shorter than 4 bytes"
	}
	switch {
	case bytes.HasPrefix(b, []byte("PK")):
		return "a zip archive (a PyTorch .bin/.pt checkpoint?)"
	case b[0] == '{':
		return "JSON text"
	case bytes.Equal(b, []byte("ggjt")) || bytes.Equal(b, []byte("ggml")) || bytes.Equal(b, []byte("ggmf")):
		return fmt.Sprintf("a legacy GGML file (magic %q); convert it to GGUF", b)
	}
	return fmt.Sprintf("first bytes %q", b)
}

func openGGUF(path string, opts Options) (*Provider, error, error) {
	m, err := gguf.Open(path, gguf.Options{NoMmap: opts.NoMmap})
	if err != nil {
		return nil, nil, err
	}
	p := &Provider{Path: path, Format: GGUF, GGUF: m, tensors: map[string]*Tensor{}, cache: map[string]Data{}}
	p.src = source{
		tensor: func(name string) ([]byte, error) {
			t, ok := m.Tensor(name)
			if !ok {
				return nil, fmt.Errorf("%s: no tensor %q", path, name)
			}
			return t.Data()
		},
		close: m.Close,
	}
	cfg, d, cfgErr := configFromGGUF(m, path)
	family := ""
	if d != nil {
		family = d.Name
		p.Arch = d
	}
	p.Config = cfg
	nm := newNamer(ggufRules, family, cfg.NLayers)
	for _, t := range m.Tensors() {
		shape := make([]int64, len(t.Dims))
		for i, d := range t.Dims {
			shape[i] = int64(d)
		}
		canonical := ""
		if family != "" {
			canonical = nm.canonical(t.Name)
		}
		p.files = append(p.files, FileTensor{Name: t.Name, Canonical: canonical, Type: t.Type.String(), Shape: shape, Bytes: t.Size})
		if canonical == "" {
			continue
		}
		logical := make([]int64, len(shape))
		for i := range shape {
			logical[i] = shape[len(shape)-1-i]
		}
		p.add(&Tensor{Name: canonical, FileName: t.Name, Type: t.Type.String(), GGML: t.Type, HasGGML: true, Shape: logical, Bytes: t.Size})
	}
	if cfgErr == nil {
		cfgErr = p.finishConfig()
	}
	return p, cfgErr, nil
}

func (p *Provider) add(t *Tensor) {
	p.tensors[t.Name] = t
	p.order = append(p.order, t.Name)
}

// finishConfig settles what depends on the tensors present, then validates.
func (p *Provider) finishConfig() error {
	c := &p.Config
	_, hasOut := p.tensors[arch.Output]
	c.TiedEmbeddings = !hasOut
	if emb, ok := p.tensors[arch.TokenEmbedding]; ok && c.VocabSize == 0 {
		c.VocabSize = int(emb.Rows())
	}
	return c.Validate(p.Path)
}

// Close releases the files. It is idempotent.
func (p *Provider) Close() error {
	if p.src.close == nil {
		return nil
	}
	c := p.src.close
	p.src.close = nil
	p.mu.Lock()
	p.cache = map[string]Data{}
	p.mu.Unlock()
	return c()
}

// FileTensors lists the tensors as the file stores them.
func (p *Provider) FileTensors() []FileTensor { return p.files }

// Tensors lists the canonical tensors in file order.
func (p *Provider) Tensors() []*Tensor {
	out := make([]*Tensor, len(p.order))
	for i, n := range p.order {
		out[i] = p.tensors[n]
	}
	return out
}

// Tensor returns the canonical tensor name.
func (p *Provider) Tensor(name string) (*Tensor, bool) {
	t, ok := p.tensors[name]
	return t, ok
}

// Has reports whether the canonical tensor exists.
func (p *Provider) Has(name string) bool {
	_, ok := p.tensors[name]
	return ok
}

// Data returns the bytes of a canonical tensor, read on first use and
// cached (zero-copy views when the file is mapped).
func (p *Provider) Data(name string) (Data, error) {
	t, ok := p.tensors[name]
	if !ok {
		return Data{}, fmt.Errorf("%s: no tensor %q", p.Path, name)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if d, ok := p.cache[name]; ok {
		return d, nil
	}
	if p.src.close == nil {
		return Data{}, errors.New("weights: provider is closed")
	}
	var d Data
	var err error
	if d.Bytes, err = p.src.tensor(t.FileName); err != nil {
		return Data{}, err
	}
	if t.MLX != nil {
		if d.Scales, err = p.src.tensor(t.MLX.Scales); err != nil {
			return Data{}, err
		}
		if d.Biases, err = p.src.tensor(t.MLX.Biases); err != nil {
			return Data{}, err
		}
	}
	p.cache[name] = d
	return d, nil
}

// ExtraMetadata returns metadata that is not GGUF key-value pairs: the
// safetensors headers' __metadata__ and the parsed config.json.
func (p *Provider) ExtraMetadata() map[string]any { return p.extra }

// Name returns a short display name: the file or directory name.
func (p *Provider) Name() string { return filepath.Base(p.Path) }
