package safetensors

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// IndexFile is the name transformers gives the index of a sharded model.
const IndexFile = "model.safetensors.index.json"

// maxIndexSize bounds the index JSON read into memory; real indices of the
// largest models are a few MiB.
const maxIndexSize = 100 << 20

// Index is a parsed model.safetensors.index.json.
type Index struct {
	// Metadata is the "metadata" object as decoded JSON (numbers as
	// json.Number); transformers writes total_size there. It is not checked.
	Metadata map[string]any
	// WeightMap maps each tensor name to the file name of its shard,
	// relative to the index's directory.
	WeightMap map[string]string

	name string // as given to ParseIndex
}

// ParseIndex parses index JSON; name is used in errors. Duplicate keys,
// shard names that are not local paths (absolute, or climbing out with
// ".."), and a missing weight_map are errors.
func ParseIndex(data []byte, name string) (*Index, error) {
	fail := func(where string, err error) error {
		return &FormatError{File: name, Where: where, Msg: err.Error()}
	}
	w := newWalker(data)
	if err := w.object(); err != nil {
		return nil, fail("index", err)
	}
	idx := &Index{name: name}
	seen := map[string]bool{}
	for {
		key, done, err := w.key(seen)
		if errors.Is(err, errDuplicate) {
			return nil, fail(fmt.Sprintf("key %q", key), err)
		}
		if err != nil {
			return nil, fail("index", err)
		}
		if done {
			break
		}
		switch key {
		case "metadata":
			v, err := w.value()
			if err != nil {
				return nil, fail("metadata", err)
			}
			if v != nil {
				m, ok := v.(map[string]any)
				if !ok {
					return nil, fail("metadata", fmt.Errorf("is not an object"))
				}
				idx.Metadata = m
			}
		case "weight_map":
			if idx.WeightMap, err = parseWeightMap(w); err != nil {
				return nil, fail("weight_map", err)
			}
		default:
			if err := w.skip(); err != nil {
				return nil, fail(fmt.Sprintf("key %q", key), err)
			}
		}
	}
	if err := w.end(); err != nil {
		return nil, fail("index", err)
	}
	if idx.WeightMap == nil {
		return nil, fail("index", errors.New(`missing "weight_map"`))
	}
	return idx, nil
}

func parseWeightMap(w *walker) (map[string]string, error) {
	if err := w.object(); err != nil {
		return nil, err
	}
	m := map[string]string{}
	seen := map[string]bool{}
	for {
		key, done, err := w.key(seen)
		if errors.Is(err, errDuplicate) {
			return nil, about(fmt.Sprintf("tensor %q", key), err)
		}
		if err != nil {
			return nil, err
		}
		if done {
			return m, nil
		}
		shard, err := w.str()
		if err != nil {
			return nil, about(fmt.Sprintf("tensor %q: shard", key), err)
		}
		// Lexical only: the hub cache's snapshot folders hold symlinks into
		// a sibling blobs folder, so following links must stay allowed.
		if !filepath.IsLocal(shard) || filepath.Ext(shard) != ".safetensors" {
			return nil, fmt.Errorf("tensor %q: shard %q is not a .safetensors file inside the model's directory", key, shard)
		}
		m[key] = shard
	}
}

// Tensor is a tensor of a Model: its info and the file holding it.
type Tensor struct {
	*TensorInfo
	File *File
}

// Data returns the tensor's bytes (see File.TensorData).
func (t Tensor) Data() ([]byte, error) { return t.File.TensorData(t.TensorInfo) }

// Model is a model stored in one safetensors file or sharded over several.
type Model struct {
	Files []*File // in shard name order
	Index *Index  // nil when the model has no index file

	tensors []Tensor
	byName  map[string]int
}

// Open opens a model. path is a .safetensors file, an index JSON file, or a
// directory. A directory holding model.safetensors.index.json opens the
// shards it lists, each once, and checks that the index and the shards agree
// tensor for tensor; a directory without one opens every *.safetensors file
// in it. A tensor name found in two files is an error either way.
func Open(path string, opts Options) (*Model, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	if !st.IsDir() {
		if filepath.Ext(path) == ".json" {
			return openIndexed(path, opts)
		}
		f, err := OpenFile(path, opts)
		if err != nil {
			return nil, err
		}
		m, err := newModel([]*File{f}, nil)
		if err != nil {
			f.Close()
		}
		return m, err
	}
	indexPath := filepath.Join(path, IndexFile)
	if _, err := os.Stat(indexPath); err == nil {
		return openIndexed(indexPath, opts)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("safetensors %s: %w", indexPath, err)
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	var names []string // ReadDir sorts by name
	for _, e := range entries {
		if !e.IsDir() && filepath.Ext(e.Name()) == ".safetensors" {
			names = append(names, filepath.Join(path, e.Name()))
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("safetensors %s: no %s and no .safetensors files in the directory", path, IndexFile)
	}
	return openFiles(names, nil, opts)
}

func openIndexed(indexPath string, opts Options) (*Model, error) {
	data, err := readBounded(indexPath, maxIndexSize)
	if err != nil {
		return nil, err
	}
	idx, err := ParseIndex(data, indexPath)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(indexPath)
	shardSet := map[string]bool{}
	for _, shard := range idx.WeightMap {
		shardSet[shard] = true
	}
	var names []string
	for shard := range shardSet {
		names = append(names, filepath.Join(dir, shard))
	}
	sort.Strings(names)
	if len(names) == 0 {
		return nil, &FormatError{File: indexPath, Where: "weight_map", Msg: "lists no tensors"}
	}
	m, err := openFiles(names, idx, opts)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("safetensors %s: a shard it lists is missing: %w", indexPath, err)
	}
	if err != nil {
		return nil, err
	}
	// Every shard tensor is in the map (checked by newModel); now every
	// map entry must be in the shard it names.
	for name, shard := range idx.WeightMap {
		t, ok := m.Tensor(name)
		if !ok {
			m.Close()
			return nil, &FormatError{File: indexPath, Where: fmt.Sprintf("tensor %q", name),
				Msg: fmt.Sprintf("listed in shard %s, which does not hold it", shard)}
		}
		if want := filepath.Join(dir, shard); t.File.Name != want {
			m.Close()
			return nil, &FormatError{File: indexPath, Where: fmt.Sprintf("tensor %q", name),
				Msg: fmt.Sprintf("listed in shard %s but stored in %s", shard, t.File.Name)}
		}
	}
	return m, nil
}

// readBounded reads a whole file of at most limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("safetensors %s: %d bytes, more than the %d an index may have", path, st.Size(), limit)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	return data, nil
}

// openFiles opens the named files and builds the model, closing all of them
// on any failure.
func openFiles(names []string, idx *Index, opts Options) (*Model, error) {
	files := make([]*File, 0, len(names))
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	for _, name := range names {
		f, err := OpenFile(name, opts)
		if err != nil {
			closeAll()
			return nil, err
		}
		files = append(files, f)
	}
	m, err := newModel(files, idx)
	if err != nil {
		closeAll()
		return nil, err
	}
	return m, nil
}

// newModel indexes the files' tensors. With an index, every tensor must be
// listed in its weight map.
func newModel(files []*File, idx *Index) (*Model, error) {
	m := &Model{Files: files, Index: idx, byName: map[string]int{}}
	for _, f := range files {
		for i := range f.tensors {
			t := &f.tensors[i]
			if j, dup := m.byName[t.Name]; dup {
				return nil, fmt.Errorf("safetensors %s: tensor %q is also in %s", f.Name, t.Name, m.tensors[j].File.Name)
			}
			if idx != nil {
				if _, listed := idx.WeightMap[t.Name]; !listed {
					return nil, fmt.Errorf("safetensors %s: tensor %q is not in the weight_map of %s", f.Name, t.Name, idx.name)
				}
			}
			m.byName[t.Name] = len(m.tensors)
			m.tensors = append(m.tensors, Tensor{TensorInfo: t, File: f})
		}
	}
	return m, nil
}

// Close closes every file.
func (m *Model) Close() error {
	var first error
	for _, f := range m.Files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Tensors returns every tensor, file by file in Files order, each file's in
// data order.
func (m *Model) Tensors() []Tensor { return m.tensors }

// Tensor returns the named tensor.
func (m *Model) Tensor(name string) (Tensor, bool) {
	i, ok := m.byName[name]
	if !ok {
		return Tensor{}, false
	}
	return m.tensors[i], true
}
