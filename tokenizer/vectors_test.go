package tokenizer

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// testdataDir returns a folder or file of the shared third-party test data,
// or skips the test when that data is not checked out beside the repository.
func testdataDir(t testing.TB, elem ...string) string {
	t.Helper()
	p := filepath.Join(append([]string{"..", "..", "shared", "testdata"}, elem...)...)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("shared test data %s not present: %v", p, err)
	}
	return p
}

type vectorCase struct {
	text string
	ids  []int32
}

// readVectors reads a llama.cpp .inp/.out pair: test strings separated by
// "\n__ggml_vocab_test__\n" and one line of space-separated ids per string.
func readVectors(t testing.TB, inp string) []vectorCase {
	t.Helper()
	in, err := os.ReadFile(inp)
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(strings.TrimSuffix(inp, ".inp") + ".out")
	if err != nil {
		t.Fatal(err)
	}
	texts := strings.Split(string(in), "\n__ggml_vocab_test__\n")
	texts = texts[:len(texts)-1]
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != len(texts) {
		t.Fatalf("%s: %d strings, %d id lines", inp, len(texts), len(lines))
	}
	cases := make([]vectorCase, len(texts))
	for i, text := range texts {
		cases[i].text = text
		cases[i].ids = parseIDs(t, lines[i])
	}
	return cases
}

func parseIDs(t testing.TB, line string) []int32 {
	t.Helper()
	ids := []int32{}
	for _, f := range strings.Fields(line) {
		x, err := strconv.ParseInt(f, 10, 32)
		if err != nil {
			t.Fatalf("bad id %q", f)
		}
		ids = append(ids, int32(x))
	}
	return ids
}

// checkCases encodes each case and counts the matches, failing on each
// mismatch; it logs the pass rate.
func checkCases(t *testing.T, name string, tk *Tokenizer, cases []vectorCase, addSpecial bool) {
	t.Helper()
	pass := 0
	for _, c := range cases {
		got := tk.Encode(c.text, addSpecial, false)
		if slices.Equal(got, c.ids) {
			pass++
			continue
		}
		t.Errorf("%s: Encode(%q)\n got %v\nwant %v", name, c.text, got, c.ids)
	}
	t.Logf("%s: %d/%d match", name, pass, len(cases))
}

func loadTokenizer(t testing.TB, path string) *Tokenizer {
	t.Helper()
	tk, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// llama3Specials are the Llama 3 special tokens 128000.. that the ollama
// copy of the vocabulary (encoder.json) leaves out.
func llama3Vocab(t testing.TB) *Vocab {
	t.Helper()
	dir := testdataDir(t, "ollama-tokenizer", "llama3.2")
	v, err := ReadBPEFiles(filepath.Join(dir, "encoder.json"), filepath.Join(dir, "vocab.bpe"))
	if err != nil {
		t.Fatal(err)
	}
	v.Pre = "llama-bpe"
	named := []string{"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
		"<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
		"<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"}
	for i := range 256 {
		text := "<|reserved_special_token_" + strconv.Itoa(i-len(named)+3) + "|>"
		if i < len(named) {
			text = named[i]
		}
		if err := addToken(v, int64(128000+i), hfAddedTokenContent{Content: text, Special: true}); err != nil {
			t.Fatal(err)
		}
	}
	v.BOS, v.EOS, v.AddBOS = 128000, 128001, true
	return v
}

func newTokenizer(t testing.TB, v *Vocab) *Tokenizer {
	t.Helper()
	tk, err := New(v)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// TestLlamacppVectors checks every .inp/.out pair of llama.cpp's vocab
// tests whose vocabulary is here: the GGUF itself, or for Llama 3 and
// Qwen2 the same vocabulary as Hugging Face files. The ids were made
// without BOS.
func TestLlamacppVectors(t *testing.T) {
	dir := testdataDir(t, "llamacpp-vocab")
	inps, err := filepath.Glob(filepath.Join(dir, "*.gguf.inp"))
	if err != nil || len(inps) == 0 {
		t.Fatalf("no .inp files in %s", dir)
	}
	substitutes := map[string]func(testing.TB) *Tokenizer{
		"llama-bpe": func(t testing.TB) *Tokenizer { return newTokenizer(t, llama3Vocab(t)) },
		"qwen2": func(t testing.TB) *Tokenizer {
			return loadTokenizer(t, testdataDir(t, "hf-qwen2.5-0.5b"))
		},
	}
	substitutes["deepseek-r1-qwen"] = substitutes["qwen2"]
	for _, inp := range inps {
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(inp), "ggml-vocab-"), ".gguf.inp")
		t.Run(name, func(t *testing.T) {
			var tk *Tokenizer
			if gg := strings.TrimSuffix(inp, ".inp"); fileExists(gg) {
				tk = loadTokenizer(t, gg)
			} else if sub, ok := substitutes[name]; ok {
				tk = sub(t)
			} else {
				t.Skipf("no vocabulary for %s here", name)
			}
			checkCases(t, name, tk, readVectors(t, inp), false)
		})
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestOllamaInputs checks ollama's 46 Llama 3.2 expectations (no BOS).
func TestOllamaInputs(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testdataDir(t, "ollama-tokenizer"), "inputs.json"))
	if err != nil {
		t.Fatal(err)
	}
	var raw []struct {
		Base64 string  `json:"base64"`
		IDs    []int32 `json:"ids"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	cases := make([]vectorCase, len(raw))
	for i, r := range raw {
		text, err := base64.StdEncoding.DecodeString(r.Base64)
		if err != nil {
			t.Fatal(err)
		}
		cases[i] = vectorCase{string(text), append([]int32{}, r.IDs...)}
	}
	checkCases(t, "llama3.2", newTokenizer(t, llama3Vocab(t)), cases, false)
}

// TestSentencePieceVectors checks the Llama 2 tokenizer.model against the
// llama-spm vectors, which were made with that vocabulary.
func TestSentencePieceVectors(t *testing.T) {
	tk := loadTokenizer(t, testdataDir(t, "llama2-tokenizer", "tokenizer.model"))
	checkCases(t, "llama2 tokenizer.model", tk, readVectors(t, testdataDir(t, "llamacpp-vocab", "ggml-vocab-llama-spm.gguf.inp")), false)
}
