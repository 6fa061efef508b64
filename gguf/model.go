package gguf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
)

// Keys written by llama.cpp's gguf-split.
const (
	KeySplitNo           = "split.no"
	KeySplitCount        = "split.count"
	KeySplitTensorsCount = "split.tensors.count"
)

// splitName matches NAME-00001-of-00003.gguf.
var splitName = regexp.MustCompile(`^(.*)-(\d{5})-of-(\d{5})\.gguf$`)

// SplitPath returns the path of shard no (0-based) of count for a model
// whose shards are named like prefix-00001-of-0000N.gguf.
func SplitPath(prefix string, no, count int) string {
	return fmt.Sprintf("%s-%05d-of-%05d.gguf", prefix, no+1, count)
}

// Tensor is a tensor of a Model: its info and the file holding it.
type Tensor struct {
	*TensorInfo
	File *File
}

// Data returns the tensor's bytes (see File.TensorData).
func (t Tensor) Data() ([]byte, error) { return t.File.TensorData(t.TensorInfo) }

// Model is a model stored in one GGUF file or split over several. Its
// metadata is the first shard's; its tensors are the union of all shards'.
type Model struct {
	Files   []*File
	tensors []Tensor
	index   map[string]int
}

// Open opens a GGUF model. A path named like NAME-0000K-of-0000N.gguf, or a
// file whose split.count is above 1, opens all N shards (any shard may be
// named) and unifies their tensors; a tensor name found in two shards is an
// error.
func Open(path string, opts Options) (*Model, error) {
	first, err := OpenFile(path, opts)
	if err != nil {
		return nil, err
	}
	count := 1
	if v, ok := first.KV(KeySplitCount); ok {
		c, ok := v.Uint()
		if !ok || c == 0 || c > 9999 {
			first.Close()
			return nil, &FormatError{File: path, Where: fmt.Sprintf("key %q", KeySplitCount), Offset: -1, Msg: fmt.Sprintf("bad shard count %s", v)}
		}
		count = int(c)
	}
	if count == 1 {
		return newModel([]*File{first})
	}
	m := splitName.FindStringSubmatch(filepath.Base(path))
	if m == nil {
		first.Close()
		return nil, fmt.Errorf("gguf %s: split.count is %d but the name is not NAME-0000K-of-%05d.gguf, so the other shards cannot be found", path, count, count)
	}
	if n, _ := strconv.Atoi(m[3]); n != count {
		first.Close()
		return nil, fmt.Errorf("gguf %s: name says %d shards but split.count is %d", path, n, count)
	}
	prefix := filepath.Join(filepath.Dir(path), m[1])
	files := make([]*File, count)
	closeAll := func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}
	given, _ := strconv.Atoi(m[2])
	files[given-1] = first
	for i := range count {
		if files[i] != nil {
			continue
		}
		sp := SplitPath(prefix, i, count)
		f, err := OpenFile(sp, opts)
		if err != nil {
			closeAll()
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("gguf %s: shard %d of %d is missing: %w", path, i+1, count, err)
			}
			return nil, err
		}
		files[i] = f
	}
	for i, f := range files {
		no, okNo := f.KV(KeySplitNo)
		cnt, okCnt := f.KV(KeySplitCount)
		n, _ := no.Uint()
		c, _ := cnt.Uint()
		if !okNo || !okCnt || int(n) != i || int(c) != count {
			closeAll()
			return nil, fmt.Errorf("gguf %s: shard %d of %d has split.no=%s split.count=%s", f.Name, i+1, count, no, cnt)
		}
	}
	model, err := newModel(files)
	if err != nil {
		closeAll()
		return nil, err
	}
	if v, ok := files[0].KV(KeySplitTensorsCount); ok {
		if n, _ := v.Uint(); int(n) != len(model.tensors) {
			closeAll()
			return nil, fmt.Errorf("gguf %s: split.tensors.count is %d but the shards hold %d tensors", files[0].Name, n, len(model.tensors))
		}
	}
	return model, nil
}

func newModel(files []*File) (*Model, error) {
	m := &Model{Files: files, index: map[string]int{}}
	for _, f := range files {
		for i := range f.Tensors {
			t := &f.Tensors[i]
			if j, dup := m.index[t.Name]; dup {
				return nil, fmt.Errorf("gguf %s: tensor %q is also in %s", f.Name, t.Name, m.tensors[j].File.Name)
			}
			m.index[t.Name] = len(m.tensors)
			m.tensors = append(m.tensors, Tensor{TensorInfo: t, File: f})
		}
	}
	return m, nil
}

// Close closes every shard.
func (m *Model) Close() error {
	var first error
	for _, f := range m.Files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Name is the path of the first shard.
func (m *Model) Name() string { return m.Files[0].Name }

// KVs returns the model's metadata in file order.
func (m *Model) KVs() []KV { return m.Files[0].KVs }

// KV returns the value of a metadata key.
func (m *Model) KV(key string) (Value, bool) { return m.Files[0].KV(key) }

// Tensors returns every tensor, shard by shard, in file order.
func (m *Model) Tensors() []Tensor { return m.tensors }

// Tensor returns the named tensor.
func (m *Model) Tensor(name string) (Tensor, bool) {
	i, ok := m.index[name]
	if !ok {
		return Tensor{}, false
	}
	return m.tensors[i], true
}

// Metadata is read access to GGUF key-value metadata; *File and *Model
// implement it.
type Metadata interface {
	KV(key string) (Value, bool)
}

// GetString returns a string value; ok is false when the key is absent or
// holds another type.
func GetString(md Metadata, key string) (string, bool) {
	v, ok := md.KV(key)
	if !ok {
		return "", false
	}
	return v.Str()
}

// GetUint returns an unsigned integer value.
func GetUint(md Metadata, key string) (uint64, bool) {
	v, ok := md.KV(key)
	if !ok {
		return 0, false
	}
	return v.Uint()
}

// GetFloat returns a numeric value as float64.
func GetFloat(md Metadata, key string) (float64, bool) {
	v, ok := md.KV(key)
	if !ok {
		return 0, false
	}
	return v.Float()
}

// GetBool returns a boolean value.
func GetBool(md Metadata, key string) (bool, bool) {
	v, ok := md.KV(key)
	if !ok {
		return false, false
	}
	return v.Bool()
}

// GetArray returns an array value.
func GetArray(md Metadata, key string) (Array, bool) {
	v, ok := md.KV(key)
	if !ok {
		return Array{}, false
	}
	return v.Array()
}
