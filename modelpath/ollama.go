package modelpath

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The ollama model store, as ollama writes it:
//
//	ROOT/manifests/{host}/{namespace}/{model}/{tag}   an OCI-style JSON manifest
//	ROOT/blobs/sha256-{hex}                            content named by its digest
//
// The manifest's layer of mediaType application/vnd.ollama.image.model is
// the GGUF file; other layers hold the template, parameters, licence and,
// for vision models, the projector.
const (
	ollamaDefaultHost      = "registry.ollama.ai"
	ollamaDefaultNamespace = "library"
	ollamaDefaultTag       = "latest"
	mediaTypeModel         = "application/vnd.ollama.image.model"
	manifestMaxBytes       = 4 << 20
)

// ollamaName is a parsed ollama name: [host/][namespace/]model[:tag].
type ollamaName struct {
	Host, Namespace, Model, Tag string
}

// parseOllamaName fills in the defaults registry.ollama.ai, library and
// latest. The tag is looked for only after the last '/', so that a host
// with a port (localhost:5000/ns/model) parses.
func parseOllamaName(s string) (ollamaName, error) {
	n := ollamaName{Host: ollamaDefaultHost, Namespace: ollamaDefaultNamespace, Tag: ollamaDefaultTag}
	if strings.Contains(s, "@") {
		return n, errors.New("names with '@' (revisions or digests) are not ollama names")
	}
	slash := strings.LastIndexByte(s, '/')
	if i := strings.IndexByte(s[slash+1:], ':'); i >= 0 {
		n.Tag = s[slash+1+i+1:]
		s = s[:slash+1+i]
	}
	parts := strings.Split(s, "/")
	switch len(parts) {
	case 1:
		n.Model = parts[0]
	case 2:
		n.Namespace, n.Model = parts[0], parts[1]
	case 3:
		n.Host, n.Namespace, n.Model = parts[0], parts[1], parts[2]
	default:
		return n, fmt.Errorf("%q has more than three '/'-separated parts", s)
	}
	if !validHost(n.Host) {
		return n, fmt.Errorf("host %q is not a host name", n.Host)
	}
	for _, p := range []struct{ what, v string }{{"namespace", n.Namespace}, {"model", n.Model}, {"tag", n.Tag}} {
		if !validSegment(p.v, 128) {
			return n, fmt.Errorf("%s %q: want letters, digits, '.', '_' or '-'", p.what, p.v)
		}
	}
	return n, nil
}

// validHost accepts name or name:port.
func validHost(h string) bool {
	name, port, hasPort := strings.Cut(h, ":")
	if hasPort {
		if port == "" || len(port) > 5 || strings.Trim(port, "0123456789") != "" {
			return false
		}
	}
	return validSegment(name, 253)
}

// String is the fully qualified form, host/namespace/model:tag.
func (n ollamaName) String() string {
	return n.Host + "/" + n.Namespace + "/" + n.Model + ":" + n.Tag
}

// short is the form ollama itself prints: defaults left out, tag kept.
func (n ollamaName) short() string {
	switch {
	case n.Host == ollamaDefaultHost && n.Namespace == ollamaDefaultNamespace:
		return n.Model + ":" + n.Tag
	case n.Host == ollamaDefaultHost:
		return n.Namespace + "/" + n.Model + ":" + n.Tag
	}
	return n.String()
}

func (n ollamaName) segments() []string {
	return []string{"manifests", n.Host, n.Namespace, n.Model, n.Tag}
}

// manifest is the part of an ollama manifest weft reads.
type manifest struct {
	SchemaVersion int     `json:"schemaVersion"`
	MediaType     string  `json:"mediaType"`
	Config        layer   `json:"config"`
	Layers        []layer `json:"layers"`
}

type layer struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

// errNoModelLayer marks a manifest without weights, such as the stub ollama
// keeps for a cloud model.
var errNoModelLayer = errors.New("no layer of mediaType " + mediaTypeModel)

// parseManifest decodes a manifest and returns its one model layer, checked:
// a sha256 digest (so the blob's file name cannot leave blobs/) and a size
// that is not negative.
func parseManifest(b []byte) (*manifest, layer, error) {
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, layer{}, err
	}
	idx := -1
	for i, l := range m.Layers {
		if l.MediaType != mediaTypeModel {
			continue
		}
		if idx >= 0 {
			return nil, layer{}, fmt.Errorf("layers[%d] and layers[%d] are both %s; weft loads a single GGUF", idx, i, mediaTypeModel)
		}
		idx = i
	}
	if idx < 0 {
		return nil, layer{}, fmt.Errorf("%w among %d layers (a cloud or remote model?)", errNoModelLayer, len(m.Layers))
	}
	l := m.Layers[idx]
	if !validDigest(l.Digest) {
		return nil, layer{}, fmt.Errorf("layers[%d].digest %q: want sha256: and 64 hex digits", idx, truncate(l.Digest, 80))
	}
	if l.Size < 0 {
		return nil, layer{}, fmt.Errorf("layers[%d].size %d is negative", idx, l.Size)
	}
	return &m, l, nil
}

func validDigest(d string) bool {
	hex, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hex) != 64 {
		return false
	}
	for _, c := range hex {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// blobName is the file a digest is stored in: "sha256:ab…" → "sha256-ab…".
func blobName(digest string) string { return strings.Replace(digest, ":", "-", 1) }

// lookupOllama is the ollama store's answer for name.
func (s Stores) lookupOllama(name string) lookup {
	n, err := parseOllamaName(name)
	if err != nil {
		return lookup{where: "not a model name: " + err.Error()}
	}
	if s.Ollama == "" {
		return lookup{where: "not searched"}
	}
	rel := filepath.Join(n.segments()...)
	l := lookup{where: "no manifest " + rel}
	if isFile(filepath.Join(s.Ollama, rel)) {
		l.match, l.what = exactMatch, n.String()
		l.path, _, l.err = s.checkOllama(n)
		return l
	}
	folded := foldedPaths(s.Ollama, n.segments())
	switch len(folded) {
	case 0:
		return l
	case 1:
		f := folded[0]
		m := ollamaName{Host: f[1], Namespace: f[2], Model: f[3], Tag: f[4]}
		l.match, l.what = foldedMatch, m.String()
		l.path, _, l.err = s.checkOllama(m)
	default:
		var names []string
		for _, f := range folded {
			names = append(names, ollamaName{Host: f[1], Namespace: f[2], Model: f[3], Tag: f[4]}.String())
		}
		l.match, l.what = foldedMatch, strings.Join(names, ", ")
		l.err = fmt.Errorf("ollama %s: %w: the store holds %s, which differ only in case; spell one exactly",
			n.short(), ErrAmbiguous, strings.Join(names, " and "))
	}
	return l
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// foldedPaths returns the paths under root that spell segs ignoring case and
// end in a regular file, each as its list of segments.
func foldedPaths(root string, segs []string) [][]string {
	var out [][]string
	var walk func(dir string, done []string)
	walk = func(dir string, done []string) {
		i := len(done)
		for _, c := range foldedChildren(dir, segs[i]) {
			p := filepath.Join(dir, c)
			next := append(append([]string(nil), done...), c)
			if i == len(segs)-1 {
				if isFile(p) {
					out = append(out, next)
				}
			} else if isDir(p) {
				walk(p, next)
			}
		}
	}
	walk(root, nil)
	return out
}

// checkOllama reads n's manifest and verifies its model blob: present, of
// the size the manifest gives, and a GGUF file. It returns the blob's path
// and size.
func (s Stores) checkOllama(n ollamaName) (string, int64, error) {
	mpath := filepath.Join(append([]string{s.Ollama}, n.segments()...)...)
	b, err := readSmall(mpath, manifestMaxBytes)
	if err != nil {
		return "", 0, fmt.Errorf("ollama %s: manifest %s: %w", n.short(), mpath, err)
	}
	_, l, err := parseManifest(b)
	if err != nil {
		return "", 0, fmt.Errorf("ollama %s: manifest %s: %w", n.short(), mpath, err)
	}
	blob := filepath.Join(s.Ollama, "blobs", blobName(l.Digest))
	fi, err := os.Stat(blob)
	if errors.Is(err, fs.ErrNotExist) {
		return "", 0, fmt.Errorf("ollama %s: %w: model blob %s named by manifest %s is missing (run 'ollama pull %s')",
			n.short(), ErrIncomplete, blob, mpath, n.short())
	}
	if err != nil {
		return "", 0, fmt.Errorf("ollama %s: model blob: %w", n.short(), err)
	}
	if !fi.Mode().IsRegular() {
		return "", 0, fmt.Errorf("ollama %s: model blob %s is not a regular file", n.short(), blob)
	}
	if fi.Size() != l.Size {
		return "", 0, fmt.Errorf("ollama %s: %w: model blob %s is %d bytes but manifest %s says %d",
			n.short(), ErrIncomplete, blob, fi.Size(), mpath, l.Size)
	}
	if err := checkGGUFMagic(blob); err != nil {
		return "", 0, fmt.Errorf("ollama %s: model blob %s: %w", n.short(), blob, err)
	}
	return blob, l.Size, nil
}

// checkGGUFMagic reads the first four bytes of a file. Very old ollama
// models are GGML files, which weft does not read.
func checkGGUFMagic(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil {
		return fmt.Errorf("reading the magic: %w", err)
	}
	if string(magic[:]) != "GGUF" {
		return fmt.Errorf("not a GGUF file (it starts with %q)", magic[:])
	}
	return nil
}

// scanOllama adds the ollama store's models to l. A model is listed by the
// short name ollama prints unless the Hugging Face cache has a repo of that
// spelling, which Resolve would prefer; then by its fully qualified name.
func (s Stores) scanOllama(l *Listing) error {
	if s.Ollama == "" {
		return nil
	}
	root := filepath.Join(s.Ollama, "manifests")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root && errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll
			}
			if p == root {
				return err
			}
			l.skip(SourceOllama, "", p, err.Error())
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		segs := strings.Split(filepath.ToSlash(rel), "/")
		if d.IsDir() {
			if len(segs) >= 4 {
				return fs.SkipDir
			}
			return nil
		}
		if len(segs) != 4 {
			return nil
		}
		n := ollamaName{Host: segs[0], Namespace: segs[1], Model: segs[2], Tag: segs[3]}
		if _, err := parseOllamaName(n.String()); err != nil {
			l.skip(SourceOllama, n.String(), p, "path is not a model name: "+err.Error())
			return nil
		}
		name := n.short()
		if s.hfHasRepo(name) {
			name = n.String()
		}
		blob, size, err := s.checkOllama(n)
		if err != nil {
			l.skip(SourceOllama, name, p, err.Error())
			return nil
		}
		l.Entries = append(l.Entries, Entry{Name: name, Source: SourceOllama, Path: blob, Format: FormatGGUF, Size: size})
		return nil
	})
	if err != nil {
		return fmt.Errorf("ollama store %s: %w", root, err)
	}
	return nil
}

// hfHasRepo reports whether name, read as a Hugging Face name, has a repo
// folder of exactly that spelling in the cache.
func (s Stores) hfHasRepo(name string) bool {
	n, err := parseHFName(name)
	return err == nil && s.HuggingFace != "" && isDir(filepath.Join(s.HuggingFace, n.folder()))
}
