package weights

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/safetensors"
)

// ConfigFile is the name of a Hugging Face model directory's config.
const ConfigFile = "config.json"

func openSafetensors(path string, isDir bool, opts Options) (*Provider, error, error) {
	dir := path
	if !isDir {
		dir = filepath.Dir(path)
	}
	m, err := safetensors.Open(path, safetensors.Options{NoMmap: opts.NoMmap})
	if err != nil {
		return nil, nil, err
	}
	p := &Provider{Path: path, Format: Safetensors, Dir: dir, tensors: map[string]*Tensor{}, cache: map[string]Data{}}
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
	p.extra = map[string]any{}
	meta := map[string]string{}
	for _, f := range m.Files {
		for k, v := range f.Metadata() {
			meta[k] = v
		}
	}
	if len(meta) > 0 {
		p.extra["__metadata__"] = meta
	}

	cfgPath := filepath.Join(dir, ConfigFile)
	var cfgErr error
	raw, err := readBounded(cfgPath, maxConfigBytes)
	family := ""
	switch {
	case errors.Is(err, os.ErrNotExist):
		cfgErr = &ConfigError{Source: cfgPath, Field: "(file)", Msg: "missing: a safetensors model needs its config.json beside it"}
	case err != nil:
		cfgErr = err
	default:
		var rawObj map[string]any
		if json.Unmarshal(raw, &rawObj) == nil {
			p.extra[ConfigFile] = rawObj
		}
		cfg, d, err := ParseHFConfig(raw, cfgPath)
		p.Config = cfg
		if err != nil {
			cfgErr = err
		} else {
			p.Arch = d
			family = d.Name
		}
	}
	nm := newNamer(hfRules, family, p.Config.NLayers)

	// MLX stores a quantized matrix as NAME.weight (packed uint32) beside
	// NAME.scales and NAME.biases; gather the companions first.
	byName := map[string]safetensors.Tensor{}
	for _, t := range m.Tensors() {
		byName[t.Name] = t
	}
	for _, t := range m.Tensors() {
		stripped := stripHFPrefix(t.Name)
		canonical := ""
		if family != "" {
			canonical = nm.canonical(stripped)
			if canonical == "" {
				if stem, ok := strings.CutSuffix(stripped, ".scales"); ok {
					if c := nm.canonical(stem + ".weight"); c != "" {
						canonical = strings.TrimSuffix(c, ".weight") + ".scales"
					}
				} else if stem, ok := strings.CutSuffix(stripped, ".biases"); ok {
					if c := nm.canonical(stem + ".weight"); c != "" {
						canonical = strings.TrimSuffix(c, ".weight") + ".biases"
					}
				}
			}
		}
		p.files = append(p.files, FileTensor{Name: t.Name, Canonical: canonical, Type: string(t.DType), Shape: t.Shape, Bytes: uint64(t.Size())})
		if canonical == "" || strings.HasSuffix(canonical, ".scales") || strings.HasSuffix(canonical, ".biases") {
			continue
		}
		tensor := &Tensor{Name: canonical, FileName: t.Name, Type: string(t.DType), Shape: t.Shape, Bytes: uint64(t.Size())}
		if gt, err := ggml.ParseType(string(t.DType)); err == nil {
			tensor.GGML, tensor.HasGGML = gt, true
		}
		stem := strings.TrimSuffix(t.Name, ".weight")
		scales, hasScales := byName[stem+".scales"]
		biases, hasBiases := byName[stem+".biases"]
		if t.DType == safetensors.U32 && hasScales && hasBiases {
			q, shape, err := mlxQuant(p.Config, t, scales, biases)
			if err != nil {
				m.Close()
				return nil, nil, fmt.Errorf("%s: tensor %q: %w", path, t.Name, err)
			}
			tensor.MLX, tensor.Shape, tensor.Type = q, shape, fmt.Sprintf("MLX_Q%d", q.Bits)
		}
		p.add(tensor)
	}
	if cfgErr == nil {
		cfgErr = p.finishConfig()
	}
	return p, cfgErr, nil
}

// mlxQuant checks an MLX quantized triple against the config's bits and
// group size and returns its description and logical [out, in] shape.
func mlxQuant(c Config, w, scales, biases safetensors.Tensor) (*MLXQuant, []int64, error) {
	if c.QuantBits == 0 {
		return nil, nil, errors.New("packed uint32 weights with scales and biases, but config.json has no quantization block")
	}
	if len(w.Shape) != 2 || len(scales.Shape) != 2 || len(biases.Shape) != 2 {
		return nil, nil, fmt.Errorf("MLX quantized tensors must be matrices (weight %v, scales %v, biases %v)", w.Shape, scales.Shape, biases.Shape)
	}
	out, packed := w.Shape[0], w.Shape[1]
	in := packed * 32 / int64(c.QuantBits)
	gs := int64(c.QuantGroupSize)
	if in%gs != 0 {
		return nil, nil, fmt.Errorf("%d inputs is not a multiple of group size %d", in, gs)
	}
	want := []int64{out, in / gs}
	for _, comp := range []safetensors.Tensor{scales, biases} {
		if comp.Shape[0] != want[0] || comp.Shape[1] != want[1] {
			return nil, nil, fmt.Errorf("%s has shape %v, want %v for %d-bit groups of %d", comp.Name, comp.Shape, want, c.QuantBits, gs)
		}
		switch comp.DType {
		case safetensors.F16, safetensors.BF16, safetensors.F32:
		default:
			return nil, nil, fmt.Errorf("%s has dtype %s, want F16, BF16 or F32", comp.Name, comp.DType)
		}
	}
	if scales.DType != biases.DType {
		return nil, nil, fmt.Errorf("scales are %s but biases are %s", scales.DType, biases.DType)
	}
	return &MLXQuant{Bits: c.QuantBits, GroupSize: c.QuantGroupSize, ScalesType: string(scales.DType), Scales: scales.Name, Biases: biases.Name},
		[]int64{out, in}, nil
}

// readBounded reads a whole small file, refusing one larger than limit.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
}
