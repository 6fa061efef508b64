package modelpath

import (
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseManifest: any bytes give a manifest or an error, and a manifest
// that parses names a blob file that stays inside blobs/.
func FuzzParseManifest(f *testing.F) {
	f.Add(ollamaManifest(ggufBytes("seed"), 12))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, l, err := parseManifest(data)
		if err != nil {
			return
		}
		if m == nil || l.MediaType != mediaTypeModel || l.Size < 0 || !validDigest(l.Digest) {
			t.Fatalf("accepted layer %+v", l)
		}
		name := blobName(l.Digest)
		if strings.ContainsAny(name, `/\:`) || !strings.HasPrefix(name, "sha256-") || len(name) != len("sha256-")+64 {
			t.Fatalf("blob name %q", name)
		}
	})
}

// FuzzParseName: a name that parses as either kind builds paths that stay
// inside the store, and prints back to the same name.
func FuzzParseName(f *testing.F) {
	for _, s := range []string{"Qwen/Qwen2.5-0.5B-Instruct", "org/repo@v1:Q4_K_M", "llama3.2:1b", "hf.co/org/repo:Q4_K_M", "localhost:5000/ns/m:t"} {
		f.Add(s)
	}
	root := filepath.FromSlash("/store")
	inside := func(p string) bool {
		rel, err := filepath.Rel(root, p)
		return err == nil && rel != "." && !strings.HasPrefix(rel, "..")
	}
	f.Fuzz(func(t *testing.T, s string) {
		if h, err := parseHFName(s); err == nil {
			if !inside(filepath.Join(root, h.folder())) || strings.ContainsAny(h.folder(), `/\`) {
				t.Fatalf("%q: folder %q leaves the cache", s, h.folder())
			}
			if h.Revision != "" && !inside(filepath.Join(root, "refs", filepath.FromSlash(h.Revision))) {
				t.Fatalf("%q: revision %q leaves refs/", s, h.Revision)
			}
			if back, err := parseHFName(h.String()); err != nil || back != h {
				t.Fatalf("%q: %+v prints as %q, which parses as %+v, %v", s, h, h.String(), back, err)
			}
		}
		if o, err := parseOllamaName(s); err == nil {
			for _, seg := range o.segments() {
				if strings.ContainsAny(seg, `/\`) || seg == ".." || seg == "." || seg == "" {
					t.Fatalf("%q: segment %q", s, seg)
				}
			}
			for _, form := range []string{o.String(), o.short()} {
				if back, err := parseOllamaName(form); err != nil || back != o {
					t.Fatalf("%q: %+v prints as %q, which parses as %+v, %v", s, o, form, back, err)
				}
			}
		}
	})
}
