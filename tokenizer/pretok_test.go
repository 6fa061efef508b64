package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

// TestSplittersMatchRegexes compares each hand-written splitter with the
// regex it stands for, as Python's regex module splits the strings of
// testdata/pretok/cases.json (made by gen.py there).
func TestSplittersMatchRegexes(t *testing.T) {
	var fixture struct {
		Regexes []string `json:"regexes"`
		Cases   []struct {
			Text   string  `json:"text"`
			Splits [][]int `json:"splits"`
		} `json:"cases"`
	}
	readJSON(t, "testdata/pretok/cases.json", &fixture)
	for ri, re := range fixture.Regexes {
		sp, ok := regexSplitters[re]
		if !ok {
			t.Errorf("no splitter for %q", re)
			continue
		}
		p := &preTokenizer{name: re, stages: []splitter{sp}}
		pass := 0
		for _, c := range fixture.Cases {
			var got []int
			p.split(c.Text, func(s string) { got = append(got, len(s)) })
			if slices.Equal(got, c.Splits[ri]) {
				pass++
				continue
			}
			t.Errorf("%q splits %q into %q, want %q", re, c.Text, pieces(c.Text, got), pieces(c.Text, c.Splits[ri]))
		}
		if pass < len(fixture.Cases) {
			t.Logf("%q: %d/%d", re, pass, len(fixture.Cases))
		}
	}
}

// pieces cuts text by byte lengths, for messages.
func pieces(text string, lens []int) []string {
	var out []string
	for _, n := range lens {
		if n > len(text) {
			return append(out, text)
		}
		out = append(out, text[:n])
		text = text[n:]
	}
	return out
}

func TestPreTokenizerStages(t *testing.T) {
	tests := []struct {
		pre, text string
		want      []string
	}{
		{"gpt-2", "Hello world", []string{"Hello", " world"}},
		{"gpt-2", "you'll I'M", []string{"you", "'ll", " I", "'", "M"}},
		{"llama-bpe", "you'll I'M", []string{"you", "'ll", " I", "'M"}},
		{"llama-bpe", "1234567", []string{"123", "456", "7"}},
		{"qwen2", "1234", []string{"1", "2", "3", "4"}},
		{"starcoder", "x=12 ab", []string{"x", "=", "1", "2", " ab"}},
		// Falcon: punctuation runs first, then GPT-2, then digit triples.
		{"falcon", "a (12345)", []string{"a", " ", "(", "123", "45", ")"}},
		{"deepseek-coder", "ab\n12", []string{"ab", "\n", "1", "2"}},
		{"deepseek-llm", "ab  \ncd  ", []string{"ab", "  ", "\n", "cd", "  "}},
		{"default", "a...b 1234", []string{"a", "...", "b", " ", "123", "4"}},
		{"bloom", "hi, there", []string{"hi", ",", " there"}},
	}
	for _, tc := range tests {
		p, _, err := ggufPreTokenizer(tc.pre)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		p.split(tc.text, func(s string) { got = append(got, s) })
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s splits %q into %q, want %q", tc.pre, tc.text, got, tc.want)
		}
	}
}

func TestUnknownPreTokenizer(t *testing.T) {
	for _, name := range []string{"no-such-thing", "chameleon"} {
		_, _, err := ggufPreTokenizer(name)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("ggufPreTokenizer(%q) error = %v, want one naming it", name, err)
		}
	}
	v := &Vocab{Model: "gpt2", Pre: "mystery-bpe", Tokens: []string{"a"}, BOS: -1, EOS: -1, UNK: -1, PAD: -1, SEP: -1, MASK: -1}
	if _, err := New(v); err == nil || !strings.Contains(err.Error(), `"mystery-bpe"`) {
		t.Errorf("New with an unknown pre-tokenizer: error = %v, want one naming it", err)
	}
}

// TestSplitterLinear runs the splitters over long runs that a naive
// implementation of \s+$ or of the lookahead would scan quadratically.
func TestSplitterLinear(t *testing.T) {
	long := strings.Repeat(" ", 1<<20) + "x" + strings.Repeat("\u3000", 1<<18) + "y"
	for re, sp := range regexSplitters {
		p := &preTokenizer{stages: []splitter{sp}}
		n := 0
		p.split(long, func(s string) { n += len(s) })
		if n != len(long) {
			t.Errorf("%q: pieces cover %d of %d bytes", re, n, len(long))
		}
	}
}
