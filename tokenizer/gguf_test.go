package tokenizer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weftlm/weft/gguf"
)

// spTestdata returns a file of the shared third-party test data, or
// skips the test when that data is not checked out beside the repository.
func spTestdata(t testing.TB, elem ...string) string {
	t.Helper()
	p := filepath.Join(append([]string{"..", "..", "shared", "testdata"}, elem...)...)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("shared test data %s not present: %v", p, err)
	}
	return p
}

// spOpenGGUF loads the vocabulary of a shared GGUF file.
func spOpenGGUF(t testing.TB, elem ...string) *Vocab {
	t.Helper()
	m, err := gguf.Open(spTestdata(t, elem...), gguf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	v, err := VocabFromGGUF(m)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestVocabFromGGUFFiles(t *testing.T) {
	type ids struct{ bos, eos, unk, pad, sep, mask int32 }
	tests := []struct {
		file            string
		model, pre      string
		n, merges       int
		ids             ids
		addBOS, prefix  bool
		piece           int32 // a token id whose text is checked
		text            string
		scored, byTypes bool
	}{
		{"llamacpp-vocab/ggml-vocab-llama-spm.gguf", "llama", "default", 32000, 0, ids{1, 2, 0, -1, -1, -1}, true, true, 29871, "▁", true, true},
		{"llamacpp-vocab/ggml-vocab-phi-3.gguf", "llama", "default", 32064, 0, ids{1, 32000, 0, 32000, -1, -1}, true, true, 32007, "<|end|>", true, true},
		{"llamacpp-vocab/ggml-vocab-baichuan.gguf", "llama", "", 64000, 0, ids{1, 2, 0, 0, -1, -1}, true, true, 5, "\n", true, true},
		{"llamacpp-vocab/ggml-vocab-bert-bge.gguf", "bert", "bert-bge", 30522, 0, ids{101, -1, 100, 0, 102, 103}, true, false, 1996, "▁the", false, true},
		{"llamacpp-vocab/ggml-vocab-gpt-2.gguf", "gpt2", "gpt-2", 50257, 50000, ids{50256, 50256, -1, -1, -1, -1}, false, false, 50256, "<|endoftext|>", false, true},
		{"llamacpp-vocab/ggml-vocab-gpt-neox.gguf", "gpt2", "", 50432, 50009, ids{0, 0, 0, -1, -1, -1}, false, false, 1, "<|padding|>", false, true},
		{"llamacpp-vocab/ggml-vocab-mpt.gguf", "gpt2", "mpt", 50432, 50009, ids{0, 0, 0, -1, -1, -1}, false, false, 0, "<|endoftext|>", false, true},
		{"llamacpp-vocab/ggml-vocab-falcon.gguf", "gpt2", "falcon", 65024, 64784, ids{11, 11, -1, -1, -1, -1}, false, false, 0, ">>TITLE<<", false, true},
		{"llamacpp-vocab/ggml-vocab-starcoder.gguf", "gpt2", "starcoder", 49152, 48872, ids{0, 0, 0, -1, -1, -1}, false, false, 1, "<fim_prefix>", false, true},
		{"llamacpp-vocab/ggml-vocab-refact.gguf", "gpt2", "refact", 49216, 48891, ids{0, 0, 0, -1, -1, -1}, false, false, 2, "<fim_middle>", false, true},
		{"llamacpp-vocab/ggml-vocab-deepseek-coder.gguf", "gpt2", "deepseek-coder", 32256, 31757, ids{32013, 32014, -1, 32014, -1, -1}, true, false, 0, "!", false, true},
		{"llamacpp-vocab/ggml-vocab-deepseek-llm.gguf", "gpt2", "deepseek-llm", 102400, 99757, ids{100000, 100001, -1, 100001, -1, -1}, true, false, 100000, "<｜begin▁of▁sentence｜>", false, true},
		// seperator and padding ids are 0xFFFFFFFF here: "none".
		{"gguf-stories260K/stories260K.gguf", "llama", "", 512, 0, ids{1, 2, 0, -1, -1, -1}, true, true, 3, "<0x00>", true, true},
	}
	for _, tc := range tests {
		t.Run(filepath.Base(tc.file), func(t *testing.T) {
			v := spOpenGGUF(t, strings.Split(tc.file, "/")...)
			if v.Model != tc.model || v.Pre != tc.pre {
				t.Errorf("model/pre = %q/%q, want %q/%q", v.Model, v.Pre, tc.model, tc.pre)
			}
			if len(v.Tokens) != tc.n || len(v.Merges) != tc.merges {
				t.Errorf("%d tokens, %d merges; want %d, %d", len(v.Tokens), len(v.Merges), tc.n, tc.merges)
			}
			got := ids{v.BOS, v.EOS, v.UNK, v.PAD, v.SEP, v.MASK}
			if got != tc.ids {
				t.Errorf("bos eos unk pad sep mask = %v, want %v", got, tc.ids)
			}
			if v.AddBOS != tc.addBOS || v.AddEOS || v.AddSpacePrefix != tc.prefix {
				t.Errorf("addBOS %v addEOS %v prefix %v, want %v false %v", v.AddBOS, v.AddEOS, v.AddSpacePrefix, tc.addBOS, tc.prefix)
			}
			if v.Tokens[tc.piece] != tc.text {
				t.Errorf("token %d = %q, want %q", tc.piece, v.Tokens[tc.piece], tc.text)
			}
			if (v.Scores != nil) != tc.scored || (v.Types != nil) != tc.byTypes {
				t.Errorf("scores %v types %v, want %v %v", v.Scores != nil, v.Types != nil, tc.scored, tc.byTypes)
			}
			var err error
			switch v.Model {
			case "llama":
				_, err = newSPM(v)
			case "bert":
				_, err = newWPM(v)
			}
			if err != nil {
				t.Errorf("segmenter: %v", err)
			}
		})
	}
}

// spMeta is GGUF metadata held in a map, for hand-made test cases.
type spMeta map[string]gguf.Value

func (m spMeta) KV(key string) (gguf.Value, bool) { v, ok := m[key]; return v, ok }

func TestVocabFromGGUFDefaults(t *testing.T) {
	tokens := gguf.Strings([]string{"<unk>", "<s>", "</s>", "▁a", "a"})
	tests := []struct {
		name string
		md   spMeta
		want Vocab
	}{
		{"llama", spMeta{keyModel: gguf.String("llama"), keyTokens: tokens},
			Vocab{BOS: 1, EOS: 2, UNK: 0, PAD: -1, SEP: -1, MASK: -1, AddBOS: true, AddSpacePrefix: true, EscapeWhitespaces: true}},
		{"llama overridden", spMeta{keyModel: gguf.String("llama"), keyTokens: tokens,
			keyAddBOS: gguf.Bool(false), keyAddEOS: gguf.Bool(true), keyAddSpacePrefix: gguf.Bool(false),
			keyRemoveExtraWS: gguf.Bool(true), keyEOS: gguf.Int32(-1), keySEPAlt: gguf.Uint32(3)},
			Vocab{BOS: 1, EOS: -1, UNK: 0, PAD: -1, SEP: 3, MASK: -1, AddEOS: true, RemoveExtraSpaces: true, EscapeWhitespaces: true}},
		{"sic spelling wins", spMeta{keyModel: gguf.String("llama"), keyTokens: tokens,
			keySEPAlt: gguf.Uint32(3), keySEP: gguf.Uint32(4)},
			Vocab{BOS: 1, EOS: 2, UNK: 0, PAD: -1, SEP: 4, MASK: -1, AddBOS: true, AddSpacePrefix: true, EscapeWhitespaces: true}},
		{"gpt2 llama-bpe adds BOS", spMeta{keyModel: gguf.String("gpt2"), keyPre: gguf.String("llama-bpe"), keyTokens: tokens,
			keyMerges: gguf.Strings([]string{"▁ a"})},
			Vocab{BOS: -1, EOS: -1, UNK: -1, PAD: -1, SEP: -1, MASK: -1, AddBOS: true}},
		{"gpt2 qwen2 does not", spMeta{keyModel: gguf.String("gpt2"), keyPre: gguf.String("qwen2"), keyTokens: tokens,
			keyMerges: gguf.Strings([]string{"▁ a"}), keyBOS: gguf.Uint32(1)},
			Vocab{BOS: 1, EOS: -1, UNK: -1, PAD: -1, SEP: -1, MASK: -1}},
		{"bert cls is bos", spMeta{keyModel: gguf.String("bert"), keyTokens: tokens, keyCLS: gguf.Uint32(1)},
			Vocab{BOS: 1, EOS: -1, UNK: -1, PAD: 0, SEP: -1, MASK: -1, AddBOS: true, EscapeWhitespaces: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := VocabFromGGUF(tc.md)
			if err != nil {
				t.Fatal(err)
			}
			got := *v
			got.Model, got.Pre, got.Tokens, got.Scores, got.Types, got.Merges = "", "", nil, nil, nil, nil
			if got.BOS != tc.want.BOS || got.EOS != tc.want.EOS || got.UNK != tc.want.UNK || got.PAD != tc.want.PAD ||
				got.SEP != tc.want.SEP || got.MASK != tc.want.MASK || got.AddBOS != tc.want.AddBOS || got.AddEOS != tc.want.AddEOS ||
				got.AddSpacePrefix != tc.want.AddSpacePrefix || got.RemoveExtraSpaces != tc.want.RemoveExtraSpaces ||
				got.EscapeWhitespaces != tc.want.EscapeWhitespaces {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestVocabFromGGUFErrors(t *testing.T) {
	tokens := gguf.Strings([]string{"<unk>", "<s>", "</s>"})
	base := func(extra spMeta) spMeta {
		m := spMeta{keyModel: gguf.String("llama"), keyTokens: tokens}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	tests := []struct {
		name string
		md   spMeta
		want string // in the error, besides the key
		key  string
	}{
		{"no model", spMeta{keyTokens: tokens}, "missing", keyModel},
		{"model not a string", base(spMeta{keyModel: gguf.Uint32(1)}), "want a string", keyModel},
		{"unknown model", base(spMeta{keyModel: gguf.String("wordlevel")}), "unknown tokenizer model", keyModel},
		{"no vocab", base(spMeta{keyModel: gguf.String("no_vocab")}), "no vocabulary", keyModel},
		{"no tokens", spMeta{keyModel: gguf.String("llama")}, "missing", keyTokens},
		{"tokens not strings", base(spMeta{keyTokens: gguf.Int32s([]int32{1, 2})}), "want strings", keyTokens},
		{"tokens not an array", base(spMeta{keyTokens: gguf.String("a")}), "want an array", keyTokens},
		{"empty tokens", base(spMeta{keyTokens: gguf.Strings(nil)}), "no tokens", keyTokens},
		{"short scores", base(spMeta{keyScores: gguf.Float32s([]float32{0, 0})}), "2 scores for 3 tokens", keyScores},
		{"string scores", base(spMeta{keyScores: gguf.Strings([]string{"a", "b", "c"})}), "want a number", keyScores},
		{"long types", base(spMeta{keyTokenType: gguf.Int32s([]int32{1, 1, 1, 1})}), "4 token types for 3 tokens", keyTokenType},
		{"bad type", base(spMeta{keyTokenType: gguf.Int32s([]int32{1, 9, 1})}), "token 1 has type 9", keyTokenType},
		{"float types", base(spMeta{keyTokenType: gguf.Float32s([]float32{1, 1, 1})}), "want an integer", keyTokenType},
		{"bos out of range", base(spMeta{keyBOS: gguf.Uint32(3)}), "outside the vocabulary of 3", keyBOS},
		{"eos negative", base(spMeta{keyEOS: gguf.Int32(-2)}), "outside the vocabulary", keyEOS},
		{"unk a string", base(spMeta{keyUNK: gguf.String("0")}), "want an integer token id", keyUNK},
		{"sep huge", base(spMeta{keySEP: gguf.Uint64(1 << 40)}), "outside the vocabulary", keySEP},
		{"mask float", base(spMeta{keyMASK: gguf.Float32(1)}), "want an integer", keyMASK},
		{"add_bos not bool", base(spMeta{keyAddBOS: gguf.Uint8(1)}), "want a bool", keyAddBOS},
		{"prefix not bool", base(spMeta{keyAddSpacePrefix: gguf.String("yes")}), "want a bool", keyAddSpacePrefix},
		{"gpt2 without merges", base(spMeta{keyModel: gguf.String("gpt2")}), "missing", keyMerges},
		{"merge without space", base(spMeta{keyModel: gguf.String("gpt2"), keyMerges: gguf.Strings([]string{"ab"})}), `merge 0 "ab"`, keyMerges},
		{"merge with empty half", base(spMeta{keyModel: gguf.String("gpt2"), keyMerges: gguf.Strings([]string{"a b", "a "})}), `merge 1 "a "`, keyMerges},
		{"merges not strings", base(spMeta{keyMerges: gguf.Float32s([]float32{1})}), "want strings", keyMerges},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := VocabFromGGUF(tc.md)
			if err == nil {
				t.Fatalf("no error; vocab %+v", v)
			}
			if msg := err.Error(); !strings.Contains(msg, tc.want) || !strings.Contains(msg, tc.key) || !strings.HasPrefix(msg, "tokenizer: gguf") {
				t.Errorf("error %q does not say %q about %q", msg, tc.want, tc.key)
			}
		})
	}
}
