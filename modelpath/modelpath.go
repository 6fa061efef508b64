// Package modelpath turns the MODEL argument of weft's commands into a file
// or directory on disk, and lists the models installed on this machine.
//
// MODEL is a path, or a name looked up in two local stores: the Hugging Face
// hub cache (the folder huggingface_hub downloads into) and the ollama model
// store. Nothing is downloaded; the stores are only read.
//
// How a name is decided (Resolve):
//
//  1. A name that is an existing file or directory is returned as it is.
//  2. A name of the form repo[@revision][:selector] whose repo has a folder
//     in the Hugging Face cache (exact spelling) is decided there: its
//     snapshot directory or .gguf file, or its error. An exact repo match
//     wins over an ollama model of the same spelling; when the repo cannot
//     be resolved and the ollama store does hold the name, the error says so
//     and gives the fully qualified ollama name that selects it.
//  3. Otherwise a name of the form [host/][namespace/]model[:tag] whose
//     manifest is in the ollama store (exact spelling) is decided there.
//  4. Otherwise both stores are searched ignoring case (Hugging Face repo ids
//     and ollama names are case-insensitive upstream). One match is used;
//     several are an error (ErrAmbiguous) listing them all.
//  5. Otherwise the error (ErrNotFound) names each store's root, the path
//     looked for in it, and suggests `weft list`.
//
// The fully qualified ollama form host/namespace/model:tag never parses as a
// Hugging Face repo id, so every ollama model has a name that reaches it.
package modelpath

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Sources and formats reported in Entry.
const (
	SourceHuggingFace = "huggingface"
	SourceOllama      = "ollama"
	FormatGGUF        = "gguf"
	FormatSafetensors = "safetensors"
)

var (
	// ErrNotFound: the name is not a path and neither store holds it.
	ErrNotFound = errors.New("model not found")
	// ErrAmbiguous: the name matches several models and none is exact.
	ErrAmbiguous = errors.New("ambiguous model name")
	// ErrIncomplete: the store knows the name but files are missing or
	// truncated (an interrupted download).
	ErrIncomplete = errors.New("incomplete download")
)

// Entry is one installed model.
type Entry struct {
	Name   string `json:"name"`   // what to pass to -m; Resolve(Name) gives Path
	Source string `json:"source"` // SourceHuggingFace or SourceOllama
	Path   string `json:"path"`   // snapshot directory or .gguf file (first shard when split)
	Format string `json:"format"` // FormatGGUF or FormatSafetensors
	Size   int64  `json:"size"`   // bytes of weights: all shards, without tokenizer or config files
}

// Skipped is something in a store that looks like a model but cannot be
// loaded, most often an interrupted download.
type Skipped struct {
	Source string `json:"source"`
	Name   string `json:"name"`
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// Listing is what Scan finds: usable models, and the incomplete ones it left
// out so that a caller can say why a model it expected is missing.
type Listing struct {
	Entries []Entry
	Skipped []Skipped
}

// Stores names the roots of the two stores. An empty root is a store that
// is not configured (for example no home directory); it holds nothing.
type Stores struct {
	HuggingFace string // hub cache root, the folder holding models--org--name
	Ollama      string // ollama models root, the folder holding manifests/ and blobs/
}

// DefaultStores finds the roots the way huggingface_hub and ollama do:
// $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
// else ~/.cache/huggingface/hub; and $OLLAMA_MODELS, else ~/.ollama/models.
func DefaultStores() Stores {
	home, err := os.UserHomeDir()
	if err != nil {
		home = ""
	}
	var s Stores
	switch {
	case os.Getenv("HF_HUB_CACHE") != "":
		s.HuggingFace = os.Getenv("HF_HUB_CACHE")
	case os.Getenv("HF_HOME") != "":
		s.HuggingFace = filepath.Join(os.Getenv("HF_HOME"), "hub")
	case os.Getenv("XDG_CACHE_HOME") != "":
		s.HuggingFace = filepath.Join(os.Getenv("XDG_CACHE_HOME"), "huggingface", "hub")
	case home != "":
		s.HuggingFace = filepath.Join(home, ".cache", "huggingface", "hub")
	}
	switch {
	case os.Getenv("OLLAMA_MODELS") != "":
		s.Ollama = os.Getenv("OLLAMA_MODELS")
	case home != "":
		s.Ollama = filepath.Join(home, ".ollama", "models")
	}
	return s
}

// Resolve returns the file or directory that name stands for, looking in
// DefaultStores. See the package comment for the rules.
func Resolve(name string) (string, error) { return DefaultStores().Resolve(name) }

// List returns the usable models in DefaultStores, leaving out incomplete
// ones (Scan reports those).
func List() ([]Entry, error) { return DefaultStores().List() }

// Scan lists DefaultStores, incomplete models included.
func Scan() (Listing, error) { return DefaultStores().Scan() }

// List returns the usable models in s: Hugging Face entries first, then
// ollama ones, each sorted by name.
func (s Stores) List() ([]Entry, error) {
	l, err := s.Scan()
	return l.Entries, err
}

// Scan walks both stores. A model that cannot be loaded as it stands (a ref
// without its snapshot, a blob missing or of the wrong size, a manifest
// without weights) is not an entry but a Skipped with the reason: List
// drops those silently, weft list counts them and -v explains. A root that
// does not exist holds nothing and is no error; a root that exists but
// cannot be read is.
func (s Stores) Scan() (Listing, error) {
	var l Listing
	var errs []error
	if err := s.scanHF(&l); err != nil {
		errs = append(errs, err)
	}
	if err := s.scanOllama(&l); err != nil {
		errs = append(errs, err)
	}
	sort.SliceStable(l.Entries, func(i, j int) bool {
		a, b := l.Entries[i], l.Entries[j]
		if a.Source != b.Source {
			return a.Source == SourceHuggingFace
		}
		return a.Name < b.Name
	})
	return l, errors.Join(errs...)
}

// match says how a store knows a name.
type match int

const (
	noMatch     match = iota
	exactMatch        // the spelling given is on disk
	foldedMatch       // found only when ignoring case
)

// lookup is one store's answer for a name.
type lookup struct {
	match match
	path  string // when err is nil
	err   error  // the store knows the name but cannot resolve it
	what  string // the canonical name that matched, for ambiguity messages
	where string // where the store looked, for not-found messages
}

// Resolve returns the file or directory that name stands for in s.
func (s Stores) Resolve(name string) (string, error) {
	if name == "" {
		return "", errors.New("model: empty name")
	}
	_, statErr := os.Stat(name)
	if statErr == nil {
		return name, nil
	}
	hf := s.lookupHF(name)
	ol := s.lookupOllama(name)
	if hf.match == exactMatch {
		if hf.err != nil && ol.match != noMatch && ol.err == nil {
			return "", fmt.Errorf("%w (the ollama store also holds %s: name it %q to use that one)", hf.err, ol.what, ol.what)
		}
		return hf.path, hf.err
	}
	if ol.match == exactMatch {
		return ol.path, ol.err
	}
	if hf.match == foldedMatch && ol.match == foldedMatch {
		return "", fmt.Errorf("model %q: %w: it matches %s in the Hugging Face cache and %s in the ollama store when case is ignored; spell one exactly",
			name, ErrAmbiguous, hf.what, ol.what)
	}
	if hf.match == foldedMatch {
		return hf.path, hf.err
	}
	if ol.match == foldedMatch {
		return ol.path, ol.err
	}
	var b strings.Builder
	if !errors.Is(statErr, os.ErrNotExist) {
		fmt.Fprintf(&b, "as a path: %v; ", statErr)
	} else {
		b.WriteString("no such file or directory; ")
	}
	fmt.Fprintf(&b, "Hugging Face cache %s: %s; ollama store %s: %s; run 'weft list' to see the installed models",
		rootText(s.HuggingFace, "HF_HUB_CACHE"), hf.where, rootText(s.Ollama, "OLLAMA_MODELS"), ol.where)
	return "", fmt.Errorf("model %q: %w: %s", name, ErrNotFound, b.String())
}

// rootText describes a store root for an error message.
func rootText(root, env string) string {
	if root == "" {
		return "(not configured: set " + env + ")"
	}
	if _, err := os.Stat(root); err != nil {
		return root + " (does not exist)"
	}
	return root
}

// readSmall reads a file that is expected to be small, refusing one above
// limit bytes so that a corrupt store cannot make us allocate gigabytes.
func readSmall(path string, limit int64) ([]byte, error) {
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

// foldedChildren returns the names in dir equal to name ignoring case,
// sorted. A directory that cannot be read has none.
func foldedChildren(dir, name string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if strings.EqualFold(e.Name(), name) {
			out = append(out, e.Name())
		}
	}
	return out
}

// validSegment reports whether s can be one component of a path under a
// store root: non-empty, not . or .., and made of letters, digits, '.', '_'
// and '-' only, so that a name can never reach outside the store.
func validSegment(s string, max int) bool {
	if s == "" || len(s) > max || s == "." || s == ".." {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

func (l *Listing) skip(source, name, path, reason string) {
	l.Skipped = append(l.Skipped, Skipped{Source: source, Name: name, Path: path, Reason: reason})
}
