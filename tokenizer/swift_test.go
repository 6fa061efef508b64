package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The expectations in swift-transformers were made with Hugging Face's
// Python tokenizers: ids with the model's special tokens, and decodes with
// and without them.

func readJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// hfFileTokenizer loads a tokenizer.json stored under another name, with
// its tokenizer_config.json when config is not "".
func hfFileTokenizer(t testing.TB, file, config string) *Tokenizer {
	t.Helper()
	v, err := readTokenizerJSON(file)
	if err != nil {
		t.Fatal(err)
	}
	if config != "" {
		cfg, err := readHFConfig(config)
		if err != nil {
			t.Fatal(err)
		}
		if err := cfg.apply(v); err != nil {
			t.Fatal(err)
		}
	}
	return newTokenizer(t, v)
}

// swiftTokenizers are the tokenizers of the expectations whose
// vocabulary is in the shared test data, by a name and the HF model id,
// with Hugging Face's clean_up_tokenization_spaces setting.
func swiftTokenizers(t *testing.T) []struct {
	name, model string
	cleanUp     bool
	load        func(testing.TB) *Tokenizer
} {
	vocabs := testdataDir(t, "swift-transformers", "vocabs")
	gguf := func(file string) func(testing.TB) *Tokenizer {
		return func(t testing.TB) *Tokenizer { return loadTokenizer(t, testdataDir(t, "llamacpp-vocab", file)) }
	}
	return []struct {
		name, model string
		cleanUp     bool
		load        func(testing.TB) *Tokenizer
	}{
		{"gpt2-gguf", "distilgpt2", true, gguf("ggml-vocab-gpt-2.gguf")},
		{"gpt2-tokenizer.json", "distilgpt2", true, func(t testing.TB) *Tokenizer {
			return hfFileTokenizer(t, filepath.Join(vocabs, "gpt2_tokenizer.json"), filepath.Join(vocabs, "gpt2_tokenizer_config.json"))
		}},
		{"llama2-gguf", "coreml-projects/Llama-2-7b-chat-coreml", false, gguf("ggml-vocab-llama-spm.gguf")},
		{"llama2-tokenizer.json", "coreml-projects/Llama-2-7b-chat-coreml", false, func(t testing.TB) *Tokenizer {
			return hfFileTokenizer(t, filepath.Join(vocabs, "llama_tokenizer.json"), filepath.Join(vocabs, "llama_tokenizer_config.json"))
		}},
		{"llama2-sentencepiece", "coreml-projects/Llama-2-7b-chat-coreml", false, func(t testing.TB) *Tokenizer {
			return loadTokenizer(t, testdataDir(t, "llama2-tokenizer", "tokenizer.model"))
		}},
		{"llama3.2", "pcuenq/Llama-3.2-1B-Instruct-tokenizer", true, func(t testing.TB) *Tokenizer { return newTokenizer(t, llama3Vocab(t)) }},
		{"falcon-gguf", "tiiuae/falcon-7b", true, gguf("ggml-vocab-falcon.gguf")},
		// BGE's vocabulary is bert-base-uncased's.
		{"bert-gguf", "bert-base-uncased", true, gguf("ggml-vocab-bert-bge.gguf")},
		{"bert-gguf-google", "google-bert/bert-base-uncased", true, gguf("ggml-vocab-bert-bge.gguf")},
	}
}

func TestSwiftTokenizerTests(t *testing.T) {
	var all map[string][]struct {
		Input   string `json:"input"`
		Encoded struct {
			IDs []int32 `json:"input_ids"`
		} `json:"encoded"`
		WithSpecial    string `json:"decoded_with_special"`
		WithoutSpecial string `json:"decoded_without_special"`
	}
	readJSON(t, testdataDir(t, "swift-transformers", "expected", "tokenizer_tests.json"), &all)
	for _, tc := range swiftTokenizers(t) {
		t.Run(tc.name, func(t *testing.T) {
			cases, ok := all[tc.model]
			if !ok {
				t.Fatalf("no expectations for %s", tc.model)
			}
			tk := tc.load(t)
			pass := 0
			for _, c := range cases {
				got := tk.Encode(c.Input, true, false)
				with := tk.DecodeWith(c.Encoded.IDs, DecodeOptions{CleanUp: tc.cleanUp})
				without := tk.DecodeWith(c.Encoded.IDs, DecodeOptions{CleanUp: tc.cleanUp, SkipSpecial: true})
				ok := true
				if !slices.Equal(got, c.Encoded.IDs) {
					ok = false
					t.Errorf("Encode(%q)\n got %v\nwant %v", c.Input, got, c.Encoded.IDs)
				}
				if with != c.WithSpecial || without != c.WithoutSpecial {
					ok = false
					t.Errorf("Decode(%v) = %q / skipping special %q, want %q / %q", c.Encoded.IDs, with, without, c.WithSpecial, c.WithoutSpecial)
				}
				if ok {
					pass++
				}
			}
			t.Logf("%s (%s): %d/%d match", tc.name, tc.model, pass, len(cases))
		})
	}
}

// TestSwiftEncoded checks the long French paragraph of the *_encoded.json
// files, whose ids include the model's BOS.
func TestSwiftEncoded(t *testing.T) {
	dir := testdataDir(t, "swift-transformers", "expected")
	files := map[string]string{
		"gpt2-gguf": "gpt2_encoded_tokens.json", "gpt2-tokenizer.json": "gpt2_encoded_tokens.json",
		"llama2-gguf": "llama_encoded.json", "llama2-tokenizer.json": "llama_encoded.json",
		"llama2-sentencepiece": "llama_encoded.json",
		"llama3.2":             "llama_3.2_encoded.json", "falcon-gguf": "falcon_encoded.json",
	}
	for _, tc := range swiftTokenizers(t) {
		if files[tc.name] == "" {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			var want struct {
				Text    string  `json:"text"`
				IDs     []int32 `json:"token_ids"`
				Decoded string  `json:"decoded_text"`
			}
			readJSON(t, filepath.Join(dir, files[tc.name]), &want)
			tk := tc.load(t)
			if got := tk.Encode(want.Text, true, false); !slices.Equal(got, want.IDs) {
				t.Errorf("Encode:\n got %v\nwant %v", got, want.IDs)
			}
			if got := tk.DecodeWith(want.IDs, DecodeOptions{CleanUp: tc.cleanUp}); got != want.Decoded {
				t.Errorf("Decode:\n got %q\nwant %q", got, want.Decoded)
			}
		})
	}
}

// TestMultilingualConformance checks 83 multilingual strings against the
// Python ids and decodes for Qwen2.5, TinyLlama (Llama 2's vocabulary) and
// GPT-2.
func TestMultilingualConformance(t *testing.T) {
	var inputs []struct {
		ID   string `json:"id"`
		Text string `json:"text"`
	}
	readJSON(t, testdataDir(t, "swift-transformers", "multilingual-conformance", "inputs.json"), &inputs)
	text := map[string]string{}
	for _, in := range inputs {
		text[in.ID] = in.Text
	}
	vocabs := testdataDir(t, "swift-transformers", "vocabs")
	for _, tc := range []struct {
		name, baseline string
		load           func(testing.TB) *Tokenizer
	}{
		{"qwen2.5", "qwen2_5", func(t testing.TB) *Tokenizer { return loadTokenizer(t, testdataDir(t, "hf-qwen2.5-0.5b")) }},
		{"tinyllama-gguf", "tinyllama", func(t testing.TB) *Tokenizer {
			return loadTokenizer(t, testdataDir(t, "llamacpp-vocab", "ggml-vocab-llama-spm.gguf"))
		}},
		{"tinyllama-tokenizer.json", "tinyllama", func(t testing.TB) *Tokenizer {
			return hfFileTokenizer(t, filepath.Join(vocabs, "llama_tokenizer.json"), filepath.Join(vocabs, "llama_tokenizer_config.json"))
		}},
		{"tinyllama-sentencepiece", "tinyllama", func(t testing.TB) *Tokenizer {
			return loadTokenizer(t, testdataDir(t, "llama2-tokenizer", "tokenizer.model"))
		}},
		{"gpt2", "gpt2", func(t testing.TB) *Tokenizer {
			return hfFileTokenizer(t, filepath.Join(vocabs, "gpt2_tokenizer.json"), filepath.Join(vocabs, "gpt2_tokenizer_config.json"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var base struct {
				Entries []struct {
					ID          string  `json:"id"`
					IDs         []int32 `json:"input_ids"`
					WithSpecial string  `json:"decoded_with_special"`
					SkipSpecial string  `json:"decoded_skip_special"`
				} `json:"entries"`
			}
			readJSON(t, testdataDir(t, "swift-transformers", "multilingual-conformance", "baselines", tc.baseline+"_multilingual.json"), &base)
			tk := tc.load(t)
			pass := 0
			for _, e := range base.Entries {
				in, ok := text[e.ID]
				if !ok {
					t.Fatalf("no input %q", e.ID)
				}
				got := tk.Encode(in, true, false)
				with := tk.DecodeWith(e.IDs, DecodeOptions{})
				skip := tk.DecodeWith(e.IDs, DecodeOptions{SkipSpecial: true})
				if !slices.Equal(got, e.IDs) {
					t.Errorf("%s: Encode(%q)\n got %v\nwant %v", e.ID, in, got, e.IDs)
				} else if with != e.WithSpecial || skip != e.SkipSpecial {
					t.Errorf("%s: Decode = %q / %q, want %q / %q", e.ID, with, skip, e.WithSpecial, e.SkipSpecial)
				} else {
					pass++
				}
			}
			t.Logf("%s: %d/%d match", tc.name, pass, len(base.Entries))
		})
	}
}
