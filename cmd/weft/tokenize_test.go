package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTokenize(t *testing.T) {
	root := sharedTestdata(t)
	llama := filepath.Join(root, "llamacpp-vocab", "ggml-vocab-llama-spm.gguf")
	qwen := filepath.Join(root, "hf-qwen2.5-0.5b")
	textFile := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(textFile, []byte("Hello World"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		// Llama 2 adds BOS (1); " Hello World" is ▁Hello ▁World.
		{"gguf", []string{"-m", llama, "Hello", "World"}, "1 15043 2787\n"},
		{"no-special", []string{"-m", llama, "--no-special", "Hello World"}, "15043 2787\n"},
		{"json", []string{"-m", llama, "--json", "Hello World"}, "[1,15043,2787]\n"},
		{"file", []string{"-m", llama, "--file", textFile}, "1 15043 2787\n"},
		{"special text parsed", []string{"-m", llama, "--no-special=false", "</s>"}, "1 2\n"},
		{"decode", []string{"-m", llama, "--decode", "1,15043,2787"}, "<s> Hello World\n"},
		// Qwen2.5 adds no BOS and parses <|im_end|> as one token.
		{"hf dir", []string{"-m", qwen, "hi<|im_end|>"}, "6023 151645\n"},
		{"hf dir no-special", []string{"-m", qwen, "--no-special", "<|im_end|>"}, "27 91 318 6213 91 29\n"},
		{"hf decode", []string{"-m", qwen, "--decode", "6023 151645"}, "hi<|im_end|>\n"},
		{"empty json", []string{"-m", qwen, "--json", "--no-special", ""}, "[]\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runWeft(t, append([]string{"tokenize"}, tc.args...)...)
			if code != 0 || out != tc.want {
				t.Errorf("weft tokenize %q = %q (exit %d, stderr %q), want %q", tc.args, out, code, errOut, tc.want)
			}
		})
	}
}

func TestTokenizeErrors(t *testing.T) {
	root := sharedTestdata(t)
	llama := filepath.Join(root, "llamacpp-vocab", "ggml-vocab-llama-spm.gguf")
	tests := []struct {
		name     string
		args     []string
		code     int
		contains string
	}{
		{"no model", []string{"hi"}, 2, "-m PATH is required"},
		{"no text", []string{"-m", llama}, 2, "TEXT or --file"},
		{"text and file", []string{"-m", llama, "--file", "x", "hi"}, 2, "TEXT or --file"},
		{"bad id", []string{"-m", llama, "--decode", "1,x"}, 2, `"x" is not a token id`},
		{"id out of range", []string{"-m", llama, "--decode", "32000"}, 2, "outside the vocabulary of 32000"},
		{"missing model", []string{"-m", filepath.Join(t.TempDir(), "nope.gguf"), "hi"}, 1, "nope.gguf"},
		{"not a tokenizer dir", []string{"-m", t.TempDir(), "hi"}, 1, "no tokenizer.json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, errOut, code := runWeft(t, append([]string{"tokenize"}, tc.args...)...)
			if code != tc.code || !strings.Contains(errOut, tc.contains) {
				t.Errorf("weft tokenize %q: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, errOut, tc.code, tc.contains)
			}
		})
	}
}
