package modelpath

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeStores builds a Hugging Face cache and an ollama store in a temporary
// folder, laid out as huggingface_hub and ollama write them, and points the
// environment at them.
type fakeStores struct {
	t      *testing.T
	hf, ol string
}

func newFakeStores(t *testing.T) *fakeStores {
	t.Helper()
	root := t.TempDir()
	f := &fakeStores{t: t, hf: filepath.Join(root, "hfhome", "hub"), ol: filepath.Join(root, "ollama", "models")}
	t.Setenv("HF_HUB_CACHE", "")
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HF_HOME", filepath.Join(root, "hfhome"))
	t.Setenv("OLLAMA_MODELS", f.ol)
	t.Setenv("HOME", filepath.Join(root, "home"))
	return f
}

func (f *fakeStores) stores() Stores { return Stores{HuggingFace: f.hf, Ollama: f.ol} }

func (f *fakeStores) write(p string, data []byte) {
	f.t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func sha(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:])
}

// commit makes a 40-hex commit hash from a seed.
func commit(seed string) string { return sha([]byte(seed))[:40] }

// hfRepoDir is the cache folder of a repo id.
func (f *fakeStores) hfRepoDir(repo string) string {
	return filepath.Join(f.hf, "models--"+strings.ReplaceAll(repo, "/", "--"))
}

// hfSnapshot writes the files of one commit of repo as symlinks into the
// repo's blobs/ folder, and points each of refs at the commit. It returns
// the snapshot folder.
func (f *fakeStores) hfSnapshot(repo, commit string, refs []string, files map[string]string) string {
	f.t.Helper()
	dir := f.hfRepoDir(repo)
	snap := filepath.Join(dir, "snapshots", commit)
	for rel, content := range files {
		blob := filepath.Join(dir, "blobs", sha([]byte(content)))
		f.write(blob, []byte(content))
		link := filepath.Join(snap, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			f.t.Fatal(err)
		}
		target, err := filepath.Rel(filepath.Dir(link), blob)
		if err != nil {
			f.t.Fatal(err)
		}
		if err := os.Symlink(target, link); err != nil {
			f.t.Fatal(err)
		}
	}
	for _, r := range refs {
		f.write(filepath.Join(dir, "refs", filepath.FromSlash(r)), []byte(commit))
	}
	return snap
}

// hfRemoveBlob deletes the blob a snapshot file links to, as an interrupted
// download leaves it.
func (f *fakeStores) hfRemoveBlob(snapFile string) {
	f.t.Helper()
	target, err := os.Readlink(snapFile)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(filepath.Dir(snapFile), target)); err != nil {
		f.t.Fatal(err)
	}
}

// ggufBytes is a blob that starts like a GGUF file.
func ggufBytes(tag string) []byte { return []byte("GGUF\x03\x00\x00\x00" + tag) }

// ollamaManifest is the manifest ollama writes for a model blob, with
// template and params layers around it.
func ollamaManifest(model []byte, size int64) []byte {
	tmpl := []byte("{{ .Prompt }}")
	m := map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.docker.distribution.manifest.v2+json",
		"config":        map[string]any{"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + sha([]byte("cfg")), "size": 3},
		"layers": []map[string]any{
			{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + sha(tmpl), "size": len(tmpl)},
			{"mediaType": mediaTypeModel, "digest": "sha256:" + sha(model), "size": size},
			{"mediaType": "application/vnd.ollama.image.params", "digest": "sha256:" + sha([]byte("p")), "size": 1},
		},
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// ollamaModel writes the manifest at manifests/{rel} and the model blob;
// it returns the blob's path.
func (f *fakeStores) ollamaModel(rel string, model []byte) string {
	f.t.Helper()
	f.write(filepath.Join(f.ol, "manifests", filepath.FromSlash(rel)), ollamaManifest(model, int64(len(model))))
	blob := filepath.Join(f.ol, "blobs", "sha256-"+sha(model))
	f.write(blob, model)
	return blob
}

// ollamaRaw writes a manifest as given, for the malformed cases.
func (f *fakeStores) ollamaRaw(rel string, manifest []byte) string {
	f.t.Helper()
	p := filepath.Join(f.ol, "manifests", filepath.FromSlash(rel))
	f.write(p, manifest)
	return p
}
