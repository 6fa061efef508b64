package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestFromHFQwen(t *testing.T) {
	tk := loadTokenizer(t, testdataDir(t, "hf-qwen2.5-0.5b"))
	v := tk.Vocab()
	if v.Model != "gpt2" || v.Pre != "qwen2" || !v.NFC || v.AddBOS || tk.BOS() != -1 || tk.EOS() != 151643 {
		t.Errorf("vocab: model %q pre %q nfc %v addBOS %v bos %d eos %d", v.Model, v.Pre, v.NFC, v.AddBOS, tk.BOS(), tk.EOS())
	}
	for _, id := range []int32{151643, 151645} {
		if !tk.IsEOG(id) {
			t.Errorf("IsEOG(%d %q) = false", id, v.Tokens[id])
		}
	}
	if !strings.Contains(tk.ChatTemplate(), "<|im_start|>") {
		t.Errorf("chat template %.60q lacks <|im_start|>", tk.ChatTemplate())
	}
	// NFC: a decomposed é encodes as the composed one.
	if a, b := tk.Encode("caf\u0065\u0301", false, false), tk.Encode("caf\u00e9", false, false); !slices.Equal(a, b) {
		t.Errorf("NFC: %v != %v", a, b)
	}
	if got := tk.Encode("<|im_start|>user", true, true); got[0] != 151644 || len(got) != 2 {
		t.Errorf("Encode(<|im_start|>user) = %v", got)
	}
}

func TestTokenizerJSONLlama(t *testing.T) {
	v, err := readTokenizerJSON(filepath.Join(testdataDir(t, "swift-transformers", "vocabs"), "llama_tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if v.Model != "llama" || !v.AddSpacePrefix || !v.AddBOS || v.BOS != 1 || v.UNK != 0 || v.Types[3] != TypeByte || v.Types[1] != TypeControl {
		t.Errorf("model %q prefix %v addBOS %v bos %d unk %d types %v", v.Model, v.AddSpacePrefix, v.AddBOS, v.BOS, v.UNK, v.Types[:4])
	}
}

// wordPieceJSON is a minimal BERT tokenizer.json.
const wordPieceJSON = `{
 "added_tokens": [{"id": 0, "content": "[PAD]", "special": true}, {"id": 1, "content": "[UNK]", "special": true},
  {"id": 2, "content": "[CLS]", "special": true}, {"id": 3, "content": "[SEP]", "special": true}],
 "normalizer": {"type": "BertNormalizer", "lowercase": true},
 "pre_tokenizer": {"type": "BertPreTokenizer"},
 "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "[CLS]"}}, {"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "[SEP]"}}],
  "special_tokens": {"[CLS]": {"ids": [2]}, "[SEP]": {"ids": [3]}}},
 "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
  "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "world": 5, "##s": 6, "!": 7}}
}`

// byteLevelJSON is a minimal GPT-2 style tokenizer.json with pair merges.
func byteLevelJSON(pre string) string {
	var vocab []string
	for b := range 256 {
		vocab = append(vocab, quoteJSON(string(byteRune[b]))+": "+itoa(b))
	}
	vocab = append(vocab, `"hi": 256`)
	return `{"added_tokens": [{"id": 257, "content": "<|endoftext|>", "special": true}],
 "pre_tokenizer": ` + pre + `,
 "model": {"type": "BPE", "ignore_merges": true, "vocab": {` + strings.Join(vocab, ", ") + `}, "merges": [["h", "i"]]}}`
}

func quoteJSON(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func itoa(x int) string { return strconv.Itoa(x) }

func TestTokenizerJSONVariants(t *testing.T) {
	llama3Split := `{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": ` + quoteJSON(reLlama3) + `}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "use_regex": false}]}`
	tests := []struct {
		name, json string
		pre        string
		text       string
		want       []int32
	}{
		{"bytelevel", byteLevelJSON(`{"type": "ByteLevel", "add_prefix_space": false}`), "gpt-2", "hi<|endoftext|>", []int32{256, 257}},
		{"llama3 split", byteLevelJSON(llama3Split), "llama3", "hi hi", []int32{256, ' ', 256}},
		{"wordpiece", wordPieceJSON, "default", "Hello worlds!", []int32{2, 4, 5, 6, 7, 3}},
		// Gemma: spaces become ▁ in the normalizer, no ▁ is prepended, and
		// the Split on " " that follows has nothing left to split.
		{"gemma", `{"added_tokens": [{"id": 1, "content": "<bos>", "special": true}],
		 "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
		 "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false},
		 "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<bos>"}}, {"Sequence": {"id": "A"}}],
		  "special_tokens": {"<bos>": {"ids": [1]}}},
		 "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
		  "vocab": {"<unk>": 0, "<bos>": 1, "a": 2, "▁": 3, "b": 4, "▁b": 5}, "merges": ["▁ b"]}}`, "default", "a b b", []int32{1, 2, 5, 5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := parseTokenizerJSON([]byte(tc.json))
			if err != nil {
				t.Fatal(err)
			}
			if v.Pre != tc.pre {
				t.Errorf("Pre = %q, want %q", v.Pre, tc.pre)
			}
			tk := newTokenizer(t, v)
			if got := tk.Encode(tc.text, true, true); !slices.Equal(got, tc.want) {
				t.Errorf("Encode(%q) = %v, want %v", tc.text, got, tc.want)
			}
		})
	}
	if got := newTokenizer(t, mustParse(t, wordPieceJSON)).DecodeWith([]int32{2, 4, 5, 6, 7, 3}, DecodeOptions{SkipSpecial: true, CleanUp: true}); got != "hello worlds!" {
		t.Errorf("WordPiece decode = %q", got)
	}
}

func mustParse(t *testing.T, s string) *Vocab {
	t.Helper()
	v, err := parseTokenizerJSON([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestTokenizerJSONErrors(t *testing.T) {
	bl := byteLevelJSON(`{"type": "ByteLevel"}`)
	tests := []struct {
		name, json, want string
	}{
		{"not json", `{`, "unexpected end"},
		{"unigram", `{"model": {"type": "Unigram", "vocab": {"a": 0}}}`, `model.type "Unigram" is not supported`},
		{"normalizer", strings.Replace(bl, `"pre_tokenizer"`, `"normalizer": {"type": "NFKC"}, "pre_tokenizer"`, 1), `unsupported normalizer "NFKC"`},
		{"pre-tokenizer", byteLevelJSON(`{"type": "Whitespace"}`), `unsupported pre-tokenizer "Whitespace"`},
		{"regex", byteLevelJSON(`{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated"}, {"type": "ByteLevel", "use_regex": false}]}`), `unsupported pre-tokenizer regexes ["\\w+"]`},
		{"merge", strings.Replace(bl, `[["h", "i"]]`, `["hi"]`, 1), `model.merges[0] "hi"`},
		{"vocab id", strings.Replace(bl, `"hi": 256`, `"hi": -5`, 1), `token "hi" has id -5`},
		{"added id", strings.Replace(bl, `"id": 257`, `"id": 99999999`, 1), `id 99999999`},
		{"empty vocab", `{"model": {"type": "BPE", "vocab": {}}}`, "empty vocabulary"},
	}
	for _, tc := range tests {
		_, err := parseTokenizerJSON([]byte(tc.json))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

func TestFromHFFiles(t *testing.T) {
	var vocab []string
	for b := range 256 {
		vocab = append(vocab, quoteJSON(string(byteRune[b]))+": "+itoa(b))
	}
	vocabJSON := "{" + strings.Join(vocab, ",") + `, "hi": 256}`
	cfg := `{"tokenizer_class": "GPT2Tokenizer", "eos_token": {"content": "<|endoftext|>"},
	 "added_tokens_decoder": {"300": {"content": "<|endoftext|>", "special": true}},
	 "chat_template": [{"name": "default", "template": "T"}, {"name": "tool_use", "template": "U"}]}`
	dir := writeFiles(t, map[string]string{
		"vocab.json": vocabJSON, "merges.txt": "#version: 0.2\nh i\n",
		"tokenizer_config.json": cfg, "generation_config.json": `{"eos_token_id": [300, 256]}`,
	})
	tk, err := FromHF(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := tk.Encode("hi<|endoftext|>", true, true); !slices.Equal(got, []int32{256, 300}) {
		t.Errorf("Encode = %v", got)
	}
	if tk.EOS() != 300 || !tk.IsEOG(256) || tk.ChatTemplate() != "T" || tk.Type(299) != TypeUnused {
		t.Errorf("EOS %d, IsEOG(256) %v, template %q, type of filler %v", tk.EOS(), tk.IsEOG(256), tk.ChatTemplate(), tk.Type(299))
	}

	bad := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"empty dir", map[string]string{}, "no tokenizer.json"},
		{"no class", map[string]string{"vocab.json": vocabJSON, "merges.txt": ""}, "cannot tell the pre-tokenizer"},
		{"unknown class", map[string]string{"vocab.json": vocabJSON, "merges.txt": "", "tokenizer_config.json": `{"tokenizer_class": "FooTokenizer"}`}, `"FooTokenizer"`},
		{"bad merges", map[string]string{"vocab.json": vocabJSON, "merges.txt": "h i\nhi\n", "tokenizer_config.json": cfg}, "merges line 2"},
		{"bad config", map[string]string{"vocab.json": vocabJSON, "merges.txt": "", "tokenizer_config.json": `{"eos_token": 5}`}, "tokenizer_config.json"},
		{"missing eos", map[string]string{"vocab.json": vocabJSON, "merges.txt": "", "tokenizer_config.json": `{"tokenizer_class": "GPT2Tokenizer", "eos_token": "</s>"}`}, `eos_token "</s>" is not in the vocabulary`},
		{"bad generation config", map[string]string{"vocab.json": vocabJSON, "merges.txt": "", "tokenizer_config.json": cfg, "generation_config.json": `{"eos_token_id": 1000000}`}, "eos_token_id 1000000"},
		{"bad tokenizer.json", map[string]string{"tokenizer.json": `[]`}, "tokenizer.json"},
	}
	for _, tc := range bad {
		_, err := FromHF(writeFiles(t, tc.files))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: FromHF error = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// TestHFLibraryCases checks small tokenizer.json documents that Hugging
// Face's tokenizers library built, against the ids that library gave
// (testdata/hfcheck, made by gen.py there): Metaspace prepend schemes,
// added tokens' lstrip/rstrip, NFC and ignore_merges.
func TestHFLibraryCases(t *testing.T) {
	var cases map[string]struct {
		Tokenizer json.RawMessage `json:"tokenizer"`
		Error     string          `json:"error"`
		Encodings []struct {
			Text string  `json:"text"`
			IDs  []int32 `json:"ids"`
		} `json:"encodings"`
	}
	readJSON(t, "testdata/hfcheck/cases.json", &cases)
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			if c.Error != "" {
				t.Fatalf("the fixture has no case: %s", c.Error)
			}
			tk := newTokenizer(t, mustParse(t, string(c.Tokenizer)))
			for _, e := range c.Encodings {
				if got := tk.Encode(e.Text, false, true); !slices.Equal(got, e.IDs) {
					t.Errorf("Encode(%q) = %v, want %v", e.Text, got, e.IDs)
				}
			}
		})
	}
}
