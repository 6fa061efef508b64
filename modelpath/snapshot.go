package modelpath

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Limits on what a snapshot walk will look at; a real repo is far below them.
const (
	snapshotMaxDepth = 4
	snapshotMaxFiles = 100000
	indexMaxBytes    = 64 << 20
)

// snapshot is what a snapshot folder holds that matters for loading: the
// files of a safetensors model at its top level, and .gguf files anywhere.
type snapshot struct {
	dir         string
	config      bool     // config.json is present (its blob may still be missing)
	safetensors []string // top-level *.safetensors, sorted
	indexes     []string // top-level *.safetensors.index.json, sorted
	ggufs       []ggufModel
}

// ggufModel is one GGUF model in a snapshot: a single file, or the shards
// of a split named NAME-0000K-of-0000N.gguf.
type ggufModel struct {
	files   []string // slash paths relative to the snapshot; shards in order
	size    int64    // bytes of the files whose data is present
	missing []string // files absent, or symlinks whose blob is absent
}

// splitShard matches the file names llama.cpp's gguf-split writes.
var splitShard = regexp.MustCompile(`(?i)^(.*)-(\d{5})-of-(\d{5})\.gguf$`)

// readSnapshot walks dir, following the symlinks of files (into blobs/) but
// not of folders.
func readSnapshot(dir string) (*snapshot, error) {
	sn := &snapshot{dir: dir}
	type split struct {
		prefix string
		count  int
		shards map[int]string
	}
	splits := map[string]*split{}
	var singles []string
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if n++; n > snapshotMaxFiles {
			return fmt.Errorf("more than %d files", snapshotMaxFiles)
		}
		if d.IsDir() {
			if strings.Count(rel, "/") >= snapshotMaxDepth-1 {
				return fs.SkipDir
			}
			return nil
		}
		lower := strings.ToLower(d.Name())
		top := !strings.Contains(rel, "/")
		switch {
		case top && d.Name() == "config.json":
			sn.config = true
		case top && strings.HasSuffix(lower, ".safetensors"):
			sn.safetensors = append(sn.safetensors, rel)
		case top && strings.HasSuffix(lower, ".safetensors.index.json"):
			sn.indexes = append(sn.indexes, rel)
		case strings.HasSuffix(lower, ".gguf"):
			m := splitShard.FindStringSubmatch(d.Name())
			if m == nil {
				singles = append(singles, rel)
				break
			}
			var no, count int
			fmt.Sscan(m[2], &no)
			fmt.Sscan(m[3], &count)
			prefix := path.Join(path.Dir(rel), m[1])
			key := fmt.Sprintf("%s-of-%05d", prefix, count)
			sp := splits[key]
			if sp == nil {
				sp = &split{prefix: prefix, count: count, shards: map[int]string{}}
				splits[key] = sp
			}
			sp.shards[no] = rel
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	for _, f := range singles {
		sn.ggufs = append(sn.ggufs, ggufModel{files: []string{f}})
	}
	for _, sp := range splits {
		var m ggufModel
		for i := 1; i <= sp.count; i++ {
			if f, ok := sp.shards[i]; ok {
				m.files = append(m.files, f)
			} else {
				m.missing = append(m.missing, fmt.Sprintf("%s-%05d-of-%05d.gguf", sp.prefix, i, sp.count))
			}
		}
		if len(m.files) == 0 || len(sp.shards) != len(m.files) {
			// Shard numbers outside 1..count: not a split we can load, so
			// list each file on its own and let the GGUF reader complain.
			for _, f := range sp.shards {
				sn.ggufs = append(sn.ggufs, ggufModel{files: []string{f}})
			}
			continue
		}
		sn.ggufs = append(sn.ggufs, m)
	}
	for i := range sn.ggufs {
		m := &sn.ggufs[i]
		for _, f := range m.files {
			fi, err := os.Stat(filepath.Join(dir, filepath.FromSlash(f)))
			if err != nil {
				m.missing = append(m.missing, f)
				continue
			}
			m.size += fi.Size()
		}
	}
	sort.Slice(sn.ggufs, func(i, j int) bool { return sn.ggufs[i].files[0] < sn.ggufs[j].files[0] })
	return sn, nil
}

// isSafetensors reports whether the snapshot is a model weft loads as a
// directory: config.json next to .safetensors weights.
func (sn *snapshot) isSafetensors() bool { return sn.config && len(sn.safetensors) > 0 }

// checkSafetensors verifies that config.json and every weight file resolve,
// the shards named by an index included, and returns the weights' size.
func (sn *snapshot) checkSafetensors() (int64, error) {
	if _, err := os.Stat(filepath.Join(sn.dir, "config.json")); err != nil {
		return 0, fmt.Errorf("%w: %s: config.json: its blob is missing", ErrIncomplete, sn.dir)
	}
	have := map[string]bool{}
	var size int64
	for _, f := range sn.safetensors {
		fi, err := os.Stat(filepath.Join(sn.dir, f))
		if err != nil {
			return 0, fmt.Errorf("%w: %s: %s: its blob is missing", ErrIncomplete, sn.dir, f)
		}
		have[f] = true
		size += fi.Size()
	}
	for _, idx := range sn.indexes {
		p := filepath.Join(sn.dir, idx)
		b, err := readSmall(p, indexMaxBytes)
		if err != nil {
			return 0, fmt.Errorf("%w: %s: %v", ErrIncomplete, p, err)
		}
		var index struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(b, &index); err != nil {
			return 0, fmt.Errorf("safetensors index %s: %w", p, err)
		}
		shards := map[string]bool{}
		for _, f := range index.WeightMap {
			shards[f] = true
		}
		for _, f := range sortedKeys(shards) {
			if !have[f] {
				return 0, fmt.Errorf("%w: %s: shard %q named in weight_map is not in the snapshot", ErrIncomplete, p, f)
			}
		}
	}
	return size, nil
}

// pick returns what a name with selector sel stands for in the snapshot.
func (sn *snapshot) pick(sel string) (string, error) {
	if sel == "" && sn.isSafetensors() {
		if _, err := sn.checkSafetensors(); err != nil {
			return "", err
		}
		return sn.dir, nil
	}
	if sel == "" {
		models := modelsOnly(sn.ggufs)
		switch len(models) {
		case 0:
			return "", sn.noModelError()
		case 1:
			return sn.usable(models[0])
		}
		return "", fmt.Errorf("%s holds %d GGUF models; add one of %s to the name", sn.dir, len(models), sn.selectorList(models))
	}
	if len(sn.ggufs) == 0 {
		return "", fmt.Errorf("selector %q: %s holds no .gguf files", sel, sn.dir)
	}
	m, err := selectGGUF(sn.ggufs, sel)
	if err != nil {
		return "", fmt.Errorf("%s: %w", sn.dir, err)
	}
	return sn.usable(m)
}

// usable returns the path of m's first file, or the files it lacks.
func (sn *snapshot) usable(m ggufModel) (string, error) {
	if len(m.missing) > 0 {
		return "", fmt.Errorf("%w: %s: missing %s", ErrIncomplete, sn.dir, strings.Join(m.missing, ", "))
	}
	return filepath.Join(sn.dir, filepath.FromSlash(m.files[0])), nil
}

func (sn *snapshot) noModelError() error {
	switch {
	case len(sn.safetensors) > 0:
		return fmt.Errorf("%s has .safetensors files but no config.json", sn.dir)
	case sn.config:
		return fmt.Errorf("%s has config.json but no .safetensors or .gguf weights (weft does not read PyTorch .bin files)", sn.dir)
	}
	return fmt.Errorf("%s holds no model: want config.json with .safetensors files, or .gguf files", sn.dir)
}

// selectorList is ":TAG, :TAG, …" for an error message.
func (sn *snapshot) selectorList(models []ggufModel) string {
	var s []string
	for _, m := range models {
		s = append(s, ":"+selectorFor(m, sn.ggufs))
	}
	return strings.Join(s, ", ")
}

// list adds the snapshot's models to l under the base name (repo or
// repo@revision). A safetensors model takes the bare name; GGUF models
// take name:TAG unless one is the only model of the snapshot.
func (sn *snapshot) list(l *Listing, name string) {
	listed := false
	if sn.isSafetensors() {
		listed = true
		if size, err := sn.checkSafetensors(); err != nil {
			l.skip(SourceHuggingFace, name, sn.dir, err.Error())
		} else {
			l.Entries = append(l.Entries, Entry{Name: name, Source: SourceHuggingFace, Path: sn.dir, Format: FormatSafetensors, Size: size})
		}
	}
	models := modelsOnly(sn.ggufs)
	for _, m := range models {
		listed = true
		n := name
		if len(models) > 1 || sn.isSafetensors() {
			n += ":" + selectorFor(m, sn.ggufs)
		}
		p, err := sn.usable(m)
		if err != nil {
			l.skip(SourceHuggingFace, n, filepath.Join(sn.dir, filepath.FromSlash(m.files[0])), err.Error())
			continue
		}
		l.Entries = append(l.Entries, Entry{Name: n, Source: SourceHuggingFace, Path: p, Format: FormatGGUF, Size: m.size})
	}
	if !listed {
		l.skip(SourceHuggingFace, name, sn.dir, sn.noModelError().Error())
	}
}

// isProjector reports whether m is a multimodal projector (mmproj-*.gguf),
// which accompanies a model but is not one.
func isProjector(m ggufModel) bool {
	return strings.HasPrefix(strings.ToLower(path.Base(m.files[0])), "mmproj")
}

func modelsOnly(ms []ggufModel) []ggufModel {
	var out []ggufModel
	for _, m := range ms {
		if !isProjector(m) {
			out = append(out, m)
		}
	}
	return out
}

// stem is m's first file without folder, split suffix and extension:
// "Q4_K_M/Llama-Q4_K_M-00001-of-00002.gguf" → "Llama-Q4_K_M".
func stem(m ggufModel) string {
	b := path.Base(m.files[0])
	if s := splitShard.FindStringSubmatch(b); s != nil {
		return s[1]
	}
	return b[:len(b)-len(".gguf")]
}

// tagTokens splits a GGUF path into the words a quant tag is matched
// against. '_' is not a separator: it is part of tags such as Q4_K_M.
func tagTokens(m ggufModel) []string {
	dir := path.Dir(m.files[0])
	if dir == "." {
		dir = ""
	}
	return strings.FieldsFunc(dir+"/"+stem(m), func(r rune) bool { return r == '-' || r == '.' || r == '/' })
}

// selectGGUF picks the model sel names. A selector ending in .gguf names a
// file (its path in the snapshot or its base name, any shard of a split).
// Any other selector is a quant tag: a model whose name has it as a whole
// word (between '-', '.' or '/') wins; failing that, one whose file name
// contains it. Case is ignored. Projectors are matched only by file name.
func selectGGUF(ms []ggufModel, sel string) (ggufModel, error) {
	if strings.HasSuffix(strings.ToLower(sel), ".gguf") {
		var hits []ggufModel
		for _, m := range ms {
			for _, f := range m.files {
				if strings.EqualFold(f, sel) || strings.EqualFold(path.Base(f), sel) {
					hits = append(hits, m)
					break
				}
			}
		}
		return oneOf(hits, ms, fmt.Sprintf("file %q", sel))
	}
	models := modelsOnly(ms)
	var words, subs []ggufModel
	for _, m := range models {
		for _, t := range tagTokens(m) {
			if strings.EqualFold(t, sel) {
				words = append(words, m)
				break
			}
		}
		if strings.Contains(strings.ToLower(m.files[0]), strings.ToLower(sel)) {
			subs = append(subs, m)
		}
	}
	if len(words) > 0 {
		return oneOf(words, ms, fmt.Sprintf("quant tag %q", sel))
	}
	return oneOf(subs, ms, fmt.Sprintf("quant tag %q", sel))
}

// oneOf returns the single hit, or an error listing the hits or, with none,
// every GGUF file there is.
func oneOf(hits, all []ggufModel, what string) (ggufModel, error) {
	switch len(hits) {
	case 1:
		return hits[0], nil
	case 0:
		return ggufModel{}, fmt.Errorf("%s matches no .gguf file; there are %s", what, fileList(all))
	}
	return ggufModel{}, fmt.Errorf("%w: %s matches %s", ErrAmbiguous, what, fileList(hits))
}

func fileList(ms []ggufModel) string {
	var s []string
	for _, m := range ms {
		s = append(s, m.files[0])
	}
	return strings.Join(s, ", ")
}

// selectorFor is the shortest selector that picks m among all: its quant
// tag (the last word of its name) when that is unambiguous, else its path.
func selectorFor(m ggufModel, all []ggufModel) string {
	if t := tagTokens(m); len(t) > 0 && !isProjector(m) {
		if got, err := selectGGUF(all, t[len(t)-1]); err == nil && got.files[0] == m.files[0] {
			return t[len(t)-1]
		}
	}
	return m.files[0]
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
