package tokenizer

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Run with:
//
//	go test ./tokenizer -run '^$' -bench Encode -benchtime 5x -cpu 1

func warAndPeace(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testdataDir(t, "ollama-tokenizer"), "war-and-peace.txt"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// benchVocabs are the vocabularies the benchmarks and round trips run on.
func benchVocabs() []struct {
	name string
	load func(testing.TB) *Tokenizer
} {
	gguf := func(file string) func(testing.TB) *Tokenizer {
		return func(t testing.TB) *Tokenizer { return loadTokenizer(t, testdataDir(t, "llamacpp-vocab", file)) }
	}
	return []struct {
		name string
		load func(testing.TB) *Tokenizer
	}{
		{"gpt-2", gguf("ggml-vocab-gpt-2.gguf")},
		{"llama-spm", gguf("ggml-vocab-llama-spm.gguf")},
		{"llama-bpe", func(t testing.TB) *Tokenizer { return newTokenizer(t, llama3Vocab(t)) }},
		{"qwen2", func(t testing.TB) *Tokenizer { return loadTokenizer(t, testdataDir(t, "hf-qwen2.5-0.5b")) }},
		{"phi-3", gguf("ggml-vocab-phi-3.gguf")},
		{"falcon", gguf("ggml-vocab-falcon.gguf")},
		{"mpt", gguf("ggml-vocab-mpt.gguf")},
		{"starcoder", gguf("ggml-vocab-starcoder.gguf")},
		{"refact", gguf("ggml-vocab-refact.gguf")},
		{"deepseek-coder", gguf("ggml-vocab-deepseek-coder.gguf")},
		{"deepseek-llm", gguf("ggml-vocab-deepseek-llm.gguf")},
		{"baichuan", gguf("ggml-vocab-baichuan.gguf")},
		{"mistral-v1", func(t testing.TB) *Tokenizer {
			return loadTokenizer(t, testdataDir(t, "mistral-spm", "tokenizer.model.v1"))
		}},
		{"mistral-v3", func(t testing.TB) *Tokenizer {
			return loadTokenizer(t, testdataDir(t, "mistral-spm", "mistral_instruct_tokenizer_240323.model.v3"))
		}},
	}
}

func BenchmarkEncode(b *testing.B) {
	text := warAndPeace(b)
	for _, bv := range benchVocabs() {
		b.Run(bv.name, func(b *testing.B) {
			tk := bv.load(b)
			b.SetBytes(int64(len(text)))
			b.ResetTimer()
			for range b.N {
				tk.Encode(text, false, false)
			}
		})
	}
}

// BenchmarkEncodeCold is BenchmarkEncode with a new tokenizer for each
// pass, so that no word cache is warm when the novel starts.
func BenchmarkEncodeCold(b *testing.B) {
	text := warAndPeace(b)
	for _, bv := range benchVocabs()[:4] {
		b.Run(bv.name, func(b *testing.B) {
			v := bv.load(b).Vocab()
			b.SetBytes(int64(len(text)))
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				tk := newTokenizer(b, v)
				b.StartTimer()
				tk.Encode(text, false, false)
			}
		})
	}
}

// BenchmarkEncodeNoSpaces encodes a megabyte without a space: one piece
// that BPE must merge in O(n log n), not O(n²).
func BenchmarkEncodeNoSpaces(b *testing.B) {
	inputs := map[string]string{"a": strings.Repeat("a", 1<<20), "letters": randomLetters(1 << 20)}
	for _, bv := range benchVocabs()[:4] {
		for _, in := range []string{"a", "letters"} {
			b.Run(bv.name+"/"+in, func(b *testing.B) {
				tk := bv.load(b)
				b.SetBytes(int64(len(inputs[in])))
				b.ResetTimer()
				for range b.N {
					tk.Encode(inputs[in], false, false)
				}
			})
		}
	}
}

func randomLetters(n int) string {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + r.IntN(26))
	}
	return string(b)
}

// TestRoundTripWarAndPeace checks that decoding the encoding of the whole
// novel gives it back, for every vocabulary that loses nothing (all here
// but BERT's, which lowercases).
func TestRoundTripWarAndPeace(t *testing.T) {
	text := warAndPeace(t)
	for _, bv := range benchVocabs() {
		t.Run(bv.name, func(t *testing.T) {
			tk := bv.load(t)
			ids := tk.Encode(text, false, false)
			if got := tk.Decode(ids); got != text {
				i := 0
				for i < len(got) && i < len(text) && got[i] == text[i] {
					i++
				}
				t.Fatalf("round trip differs at byte %d: got %q, want %q", i, got[i:min(i+40, len(got))], text[i:min(i+40, len(text))])
			}
			t.Logf("%d bytes, %d tokens", len(text), len(ids))
		})
	}
}

// TestEncodeNoSpaces encodes a megabyte of one letter and of random
// letters, which a quadratic BPE would not finish, and decodes it back.
func TestEncodeNoSpaces(t *testing.T) {
	if testing.Short() {
		t.Skip("slow in -short mode")
	}
	inputs := []string{strings.Repeat("a", 1<<20), randomLetters(1 << 20)}
	for _, bv := range benchVocabs()[:2] { // BenchmarkEncodeNoSpaces times more

		t.Run(bv.name, func(t *testing.T) {
			tk := bv.load(t)
			for _, in := range inputs {
				if got := tk.Decode(tk.Encode(in, false, false)); got != in {
					t.Errorf("round trip of %d bytes without spaces differs", len(in))
				}
			}
		})
	}
}
