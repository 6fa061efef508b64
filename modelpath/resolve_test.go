package modelpath

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tree is the fake machine most tests share.
type tree struct {
	*fakeStores
	qwenMain, qwenV1, qwenPR, gpt2        string // safetensors snapshot folders
	bartQ4, bartQ8, tiny, tinyProj        string // .gguf files in the HF cache
	splitQ4, splitQ8                      string
	llamaLatest, llama1b, mine, hfco, qol string // ollama blobs
}

func newTree(t *testing.T) *tree {
	f := newFakeStores(t)
	tr := &tree{fakeStores: f}
	tr.qwenMain = f.hfSnapshot("Qwen/Qwen2.5-0.5B-Instruct", commit("qwen-main"), []string{"main"}, map[string]string{
		"config.json": `{"model_type":"qwen2"}`, "model.safetensors": "weights-main", "tokenizer.json": "{}",
	})
	tr.qwenV1 = f.hfSnapshot("Qwen/Qwen2.5-0.5B-Instruct", commit("qwen-v1"), []string{"v1"}, map[string]string{
		"config.json": `{"model_type":"qwen2"}`, "model.safetensors": "weights-v1!",
	})
	tr.qwenPR = f.hfSnapshot("Qwen/Qwen2.5-0.5B-Instruct", commit("qwen-pr"), []string{"refs/pr/3"}, map[string]string{
		"config.json": `{"model_type":"qwen2"}`, "model.safetensors": "weights-pr",
	})
	tr.gpt2 = f.hfSnapshot("gpt2", commit("gpt2"), []string{"main"}, map[string]string{
		"config.json":                      `{}`,
		"model-00001-of-00002.safetensors": "shard-one",
		"model-00002-of-00002.safetensors": "shard-two",
		"model.safetensors.index.json":     `{"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}`,
	})
	bart := f.hfSnapshot("bartowski/Llama-3.2-1B-Instruct-GGUF", commit("bart"), []string{"main"}, map[string]string{
		"Llama-3.2-1B-Instruct-Q4_K_M.gguf": "GGUF-q4", "Llama-3.2-1B-Instruct-Q8_0.gguf": "GGUF-q8--", "README.md": "# hi",
	})
	tr.bartQ4 = filepath.Join(bart, "Llama-3.2-1B-Instruct-Q4_K_M.gguf")
	tr.bartQ8 = filepath.Join(bart, "Llama-3.2-1B-Instruct-Q8_0.gguf")
	tiny := f.hfSnapshot("TheBloke/tiny-GGUF", commit("tiny"), []string{"main"}, map[string]string{
		"tiny.Q4_K_M.gguf": "GGUF-tiny", "mmproj-tiny-f16.gguf": "GGUF-proj",
	})
	tr.tiny, tr.tinyProj = filepath.Join(tiny, "tiny.Q4_K_M.gguf"), filepath.Join(tiny, "mmproj-tiny-f16.gguf")
	split := f.hfSnapshot("org/split-GGUF", commit("split"), []string{"main"}, map[string]string{
		"Q4_K_M/split-Q4_K_M-00001-of-00002.gguf": "GGUF-s1", "Q4_K_M/split-Q4_K_M-00002-of-00002.gguf": "GGUF-s2!",
		"split-Q8_0.gguf": "GGUF-s8",
	})
	tr.splitQ4 = filepath.Join(split, "Q4_K_M", "split-Q4_K_M-00001-of-00002.gguf")
	tr.splitQ8 = filepath.Join(split, "split-Q8_0.gguf")

	tr.llamaLatest = f.ollamaModel("registry.ollama.ai/library/llama3.2/latest", ggufBytes("latest"))
	tr.llama1b = f.ollamaModel("registry.ollama.ai/library/llama3.2/1b", ggufBytes("1b"))
	tr.mine = f.ollamaModel("registry.ollama.ai/myuser/mymodel/latest", ggufBytes("mine"))
	tr.hfco = f.ollamaModel("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF/Q4_K_M", ggufBytes("hfco"))
	// The same spelling as an HF repo: the HF repo wins for the short name.
	tr.qol = f.ollamaModel("registry.ollama.ai/Qwen/Qwen2.5-0.5B-Instruct/latest", ggufBytes("qwen-ollama"))
	return tr
}

func TestResolve(t *testing.T) {
	tr := newTree(t)
	file := filepath.Join(t.TempDir(), "model.gguf")
	tr.write(file, ggufBytes("local"))
	cases := []struct {
		name, want string
	}{
		{file, file},
		{filepath.Dir(file), filepath.Dir(file)},
		// Hugging Face names and revisions.
		{"Qwen/Qwen2.5-0.5B-Instruct", tr.qwenMain},
		{"Qwen/Qwen2.5-0.5B-Instruct@main", tr.qwenMain},
		{"Qwen/Qwen2.5-0.5B-Instruct@v1", tr.qwenV1},
		{"Qwen/Qwen2.5-0.5B-Instruct@" + commit("qwen-v1"), tr.qwenV1},
		{"Qwen/Qwen2.5-0.5B-Instruct@refs/pr/3", tr.qwenPR},
		{"gpt2", tr.gpt2},
		// GGUF repos: tags, file names, case.
		{"bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M", tr.bartQ4},
		{"bartowski/Llama-3.2-1B-Instruct-GGUF:q8_0", tr.bartQ8},
		{"bartowski/Llama-3.2-1B-Instruct-GGUF:Q4", tr.bartQ4},
		{"bartowski/Llama-3.2-1B-Instruct-GGUF:Llama-3.2-1B-Instruct-Q8_0.gguf", tr.bartQ8},
		{"bartowski/Llama-3.2-1B-Instruct-GGUF@main:llama-3.2-1b-instruct-q8_0.GGUF", tr.bartQ8},
		{"BARTOWSKI/llama-3.2-1b-instruct-gguf:Q8_0", tr.bartQ8},
		{"TheBloke/tiny-GGUF", tr.tiny},
		{"TheBloke/tiny-GGUF:Q4_K_M", tr.tiny},
		{"TheBloke/tiny-GGUF:mmproj-tiny-f16.gguf", tr.tinyProj},
		{"org/split-GGUF:Q4_K_M", tr.splitQ4},
		{"org/split-GGUF:split-Q4_K_M-00002-of-00002.gguf", tr.splitQ4},
		{"org/split-GGUF:Q8_0", tr.splitQ8},
		// ollama names.
		{"llama3.2", tr.llamaLatest},
		{"llama3.2:1b", tr.llama1b},
		{"LLAMA3.2:1B", tr.llama1b},
		{"library/llama3.2:latest", tr.llamaLatest},
		{"registry.ollama.ai/library/llama3.2:latest", tr.llamaLatest},
		{"myuser/mymodel", tr.mine},
		{"hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M", tr.hfco},
		{"registry.ollama.ai/Qwen/Qwen2.5-0.5B-Instruct:latest", tr.qol},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, "/", "|"), func(t *testing.T) {
			got, err := Resolve(c.name)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("got %s\nwant %s", got, c.want)
			}
		})
	}
}

func TestResolveErrors(t *testing.T) {
	tr := newTree(t)
	cases := []struct {
		name string
		is   error    // errors.Is target, or nil
		msg  []string // substrings of the message
	}{
		{"bartowski/Llama-3.2-1B-Instruct-GGUF", nil, []string{"holds 2 GGUF models", ":Q4_K_M", ":Q8_0"}},
		{"bartowski/Llama-3.2-1B-Instruct-GGUF:Q5_K_M", nil, []string{`quant tag "Q5_K_M" matches no .gguf file`, "Llama-3.2-1B-Instruct-Q4_K_M.gguf"}},
		{"bartowski/Llama-3.2-1B-Instruct-GGUF:Instruct", ErrAmbiguous, []string{"Q4_K_M.gguf", "Q8_0.gguf"}},
		{"bartowski/Llama-3.2-1B-Instruct-GGUF:nope.gguf", nil, []string{`file "nope.gguf" matches no .gguf file`}},
		{"TheBloke/tiny-GGUF:f16", nil, []string{"matches no .gguf file"}},
		{"gpt2:Q4_K_M", nil, []string{`selector "Q4_K_M"`, "holds no .gguf files"}},
		{"Qwen/Qwen2.5-0.5B-Instruct@nope", nil, []string{"no ref nope", "main", "v1", commit("qwen-v1")}},
		{"Qwen/Qwen2.5-0.5B-Instruct@" + commit("absent"), nil, []string{"no snapshot of commit " + commit("absent")}},
		// The HF repo decides; the error points at the ollama model of the same spelling.
		{"Qwen/Qwen2.5-0.5B-Instruct:latest", nil, []string{"holds no .gguf files", `name it "registry.ollama.ai/Qwen/Qwen2.5-0.5B-Instruct:latest"`}},
		// Case-insensitive matches in both stores.
		{"qwen/qwen2.5-0.5b-instruct", ErrAmbiguous, []string{"Qwen/Qwen2.5-0.5B-Instruct in the Hugging Face cache", "registry.ollama.ai/Qwen/Qwen2.5-0.5B-Instruct:latest in the ollama store"}},
		{"nothere", ErrNotFound, []string{tr.hf, tr.ol, "models--nothere", filepath.Join("manifests", "registry.ollama.ai", "library", "nothere", "latest"), "weft list"}},
		{"../escape/x", ErrNotFound, []string{"not a repo id", "not a model name"}},
		{"a/b/c/d", ErrNotFound, []string{"more than one '/'", "more than three"}},
		{"org/name@", ErrNotFound, []string{"empty revision"}},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, "/", "|"), func(t *testing.T) {
			got, err := Resolve(c.name)
			if err == nil {
				t.Fatalf("resolved to %s, want an error", got)
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("error %v is not %v", err, c.is)
			}
			for _, m := range c.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error lacks %q:\n%v", m, err)
				}
			}
		})
	}
}

// TestResolveBroken covers stores damaged the ways interrupted downloads
// and bad files leave them; each case builds its own store.
func TestResolveBroken(t *testing.T) {
	const repo = "org/model"
	st := map[string]string{"config.json": "{}", "model.safetensors": "w"}
	cases := []struct {
		what  string
		build func(f *fakeStores) // damages or builds the store
		name  string
		is    error
		msg   []string
	}{
		{"ollama blob missing", func(f *fakeStores) {
			os.Remove(f.ollamaModel("registry.ollama.ai/library/m/latest", ggufBytes("x")))
		}, "m", ErrIncomplete, []string{"model blob", "sha256-" + sha(ggufBytes("x")), "is missing", "ollama pull m:latest"}},
		{"ollama size mismatch", func(f *fakeStores) {
			f.ollamaRaw("registry.ollama.ai/library/m/latest", ollamaManifest(ggufBytes("x"), 999))
			f.write(filepath.Join(f.ol, "blobs", "sha256-"+sha(ggufBytes("x"))), ggufBytes("x"))
		}, "m", ErrIncomplete, []string{"is 9 bytes but manifest", "says 999"}},
		{"ollama manifest not JSON", func(f *fakeStores) {
			f.ollamaRaw("registry.ollama.ai/library/m/latest", []byte(`{"layers": [`))
		}, "m:latest", nil, []string{"ollama m:latest: manifest /", filepath.Join("ollama", "models", "manifests", "registry.ollama.ai", "library", "m", "latest") + ": unexpected end of JSON"}},
		{"ollama manifest wrong type", func(f *fakeStores) {
			f.ollamaRaw("registry.ollama.ai/library/m/latest", []byte(`{"layers": [{"mediaType": 1}]}`))
		}, "m", nil, []string{"library/m/latest", "mediaType"}},
		{"ollama no model layer", func(f *fakeStores) {
			f.ollamaRaw("registry.ollama.ai/library/m/cloud", []byte(`{"layers": [{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:00", "size": 1}]}`))
		}, "m:cloud", errNoModelLayer, []string{"cloud"}},
		{"ollama digest escapes blobs", func(f *fakeStores) {
			f.ollamaRaw("registry.ollama.ai/library/m/latest", []byte(`{"layers": [{"mediaType": "`+mediaTypeModel+`", "digest": "sha256:../../../etc/passwd", "size": 1}]}`))
		}, "m", nil, []string{"layers[0].digest", "64 hex digits"}},
		{"ollama negative size", func(f *fakeStores) {
			f.ollamaRaw("registry.ollama.ai/library/m/latest", ollamaManifest(ggufBytes("x"), -4))
		}, "m", nil, []string{"layers[1].size -4 is negative"}},
		{"ollama two model layers", func(f *fakeStores) {
			f.ollamaRaw("registry.ollama.ai/library/m/latest", []byte(`{"layers": [{"mediaType": "`+mediaTypeModel+`"}, {"mediaType": "`+mediaTypeModel+`"}]}`))
		}, "m", nil, []string{"layers[0] and layers[1]"}},
		{"ollama blob not GGUF", func(f *fakeStores) {
			f.ollamaModel("registry.ollama.ai/library/m/latest", []byte("ggjt-old-format"))
		}, "m", nil, []string{"not a GGUF file", `"ggjt"`}},
		{"hf blob missing", func(f *fakeStores) {
			f.hfRemoveBlob(filepath.Join(f.hfSnapshot(repo, commit("a"), []string{"main"}, st), "model.safetensors"))
		}, repo, ErrIncomplete, []string{"model.safetensors: its blob is missing"}},
		{"hf config blob missing", func(f *fakeStores) {
			f.hfRemoveBlob(filepath.Join(f.hfSnapshot(repo, commit("a"), []string{"main"}, st), "config.json"))
		}, repo, ErrIncomplete, []string{"config.json: its blob is missing"}},
		{"hf shard missing from index", func(f *fakeStores) {
			f.hfSnapshot(repo, commit("a"), []string{"main"}, map[string]string{
				"config.json": "{}", "model-00001-of-00002.safetensors": "w",
				"model.safetensors.index.json": `{"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}}`,
			})
		}, repo, ErrIncomplete, []string{"model.safetensors.index.json", `shard "model-00002-of-00002.safetensors"`}},
		{"hf index not JSON", func(f *fakeStores) {
			f.hfSnapshot(repo, commit("a"), []string{"main"}, map[string]string{
				"config.json": "{}", "model.safetensors": "w", "model.safetensors.index.json": `{"weight_map": 3}`,
			})
		}, repo, nil, []string{"safetensors index", "model.safetensors.index.json", "weight_map"}},
		{"hf split shard missing", func(f *fakeStores) {
			f.hfSnapshot(repo, commit("a"), []string{"main"}, map[string]string{"m-Q4_0-00001-of-00003.gguf": "GGUF", "m-Q4_0-00003-of-00003.gguf": "GGUF"})
		}, repo, ErrIncomplete, []string{"missing m-Q4_0-00002-of-00003.gguf"}},
		{"hf gguf blob missing", func(f *fakeStores) {
			f.hfRemoveBlob(filepath.Join(f.hfSnapshot(repo, commit("a"), []string{"main"}, map[string]string{"m-Q4_0.gguf": "GGUF"}), "m-Q4_0.gguf"))
		}, repo, ErrIncomplete, []string{"missing m-Q4_0.gguf"}},
		{"hf no refs/main", func(f *fakeStores) {
			f.hfSnapshot(repo, commit("a"), nil, st)
		}, repo, nil, []string{"no ref main", "revisions there: " + commit("a")}},
		{"hf refs/main not a hash", func(f *fakeStores) {
			f.hfSnapshot(repo, commit("a"), nil, st)
			f.write(filepath.Join(f.hfRepoDir(repo), "refs", "main"), []byte("garbage\n"))
		}, repo, nil, []string{filepath.Join("refs", "main"), `"garbage"`, "not a commit hash"}},
		{"hf refs/main to missing snapshot", func(f *fakeStores) {
			f.hfSnapshot(repo, commit("a"), nil, st)
			f.write(filepath.Join(f.hfRepoDir(repo), "refs", "main"), []byte(commit("b")))
		}, repo, ErrIncomplete, []string{"commit " + commit("b"), "is missing"}},
		{"hf repo folder empty", func(f *fakeStores) {
			os.MkdirAll(f.hfRepoDir(repo), 0o755)
		}, repo, ErrIncomplete, []string{"no refs or snapshots"}},
		{"hf bin weights only", func(f *fakeStores) {
			f.hfSnapshot(repo, commit("a"), []string{"main"}, map[string]string{"config.json": "{}", "pytorch_model.bin": "w"})
		}, repo, nil, []string{"has config.json but no .safetensors or .gguf"}},
		{"hf safetensors without config", func(f *fakeStores) {
			f.hfSnapshot(repo, commit("a"), []string{"main"}, map[string]string{"model.safetensors": "w"})
		}, repo, nil, []string{"no config.json"}},
		{"case-folded twins in HF", func(f *fakeStores) {
			f.hfSnapshot("Org/Model", commit("a"), []string{"main"}, st)
			f.hfSnapshot("org/MODEL", commit("b"), []string{"main"}, st)
		}, "ORG/model", ErrAmbiguous, []string{"Org/Model and org/MODEL"}},
		{"case-folded twins in ollama", func(f *fakeStores) {
			f.ollamaModel("registry.ollama.ai/library/Mod/latest", ggufBytes("1"))
			f.ollamaModel("registry.ollama.ai/library/MOD/latest", ggufBytes("2"))
		}, "mod", ErrAmbiguous, []string{"registry.ollama.ai/library/Mod:latest", "registry.ollama.ai/library/MOD:latest", "differ only in case"}},
	}
	for _, c := range cases {
		t.Run(c.what, func(t *testing.T) {
			f := newFakeStores(t)
			c.build(f)
			got, err := Resolve(c.name)
			if err == nil {
				t.Fatalf("resolved to %s, want an error", got)
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("error %v is not %v", err, c.is)
			}
			for _, m := range c.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error lacks %q:\n%v", m, err)
				}
			}
		})
	}
}

// TestResolveFixedCommit: a repo downloaded at a commit has no refs/main
// but resolves by that commit.
func TestResolveFixedCommit(t *testing.T) {
	f := newFakeStores(t)
	snap := f.hfSnapshot("org/model", commit("a"), nil, map[string]string{"config.json": "{}", "model.safetensors": "w"})
	got, err := Resolve("org/model@" + commit("a"))
	if err != nil || got != snap {
		t.Fatalf("got %q, %v; want %s", got, err, snap)
	}
}

func TestDefaultStores(t *testing.T) {
	cases := []struct {
		env            map[string]string
		wantHF, wantOl string
	}{
		{map[string]string{"HOME": "/h"}, "/h/.cache/huggingface/hub", "/h/.ollama/models"},
		{map[string]string{"HOME": "/h", "XDG_CACHE_HOME": "/x"}, "/x/huggingface/hub", "/h/.ollama/models"},
		{map[string]string{"HOME": "/h", "XDG_CACHE_HOME": "/x", "HF_HOME": "/hf"}, "/hf/hub", "/h/.ollama/models"},
		{map[string]string{"HOME": "/h", "HF_HOME": "/hf", "HF_HUB_CACHE": "/cache", "OLLAMA_MODELS": "/om"}, "/cache", "/om"},
		{map[string]string{}, "", ""},
	}
	for _, c := range cases {
		for _, k := range []string{"HOME", "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE", "OLLAMA_MODELS"} {
			t.Setenv(k, c.env[k])
		}
		s := DefaultStores()
		if s.HuggingFace != filepath.FromSlash(c.wantHF) || s.Ollama != filepath.FromSlash(c.wantOl) {
			t.Errorf("env %v: got %+v, want %s and %s", c.env, s, c.wantHF, c.wantOl)
		}
	}
}

// TestResolveUnconfigured: with no home and no variables the error says the
// stores are not configured rather than naming an empty path.
func TestResolveUnconfigured(t *testing.T) {
	for _, k := range []string{"HOME", "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE", "OLLAMA_MODELS"} {
		t.Setenv(k, "")
	}
	_, err := Resolve("org/absent-model")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "not configured: set HF_HUB_CACHE") || !strings.Contains(err.Error(), "not configured: set OLLAMA_MODELS") {
		t.Fatalf("got %v", err)
	}
}
