package tokenizer

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
)

func TestWPMLlamacppVectors(t *testing.T) {
	v := spOpenGGUF(t, "llamacpp-vocab", "ggml-vocab-bert-bge.gguf")
	if v.Model != "bert" {
		t.Fatalf("model %q is not WordPiece", v.Model)
	}
	w, err := newWPM(v)
	if err != nil {
		t.Fatal(err)
	}
	spRunVectors(t, "bert-bge", w.encode)
}

// TestWPMPreprocess checks the preprocessing and the greedy cut on a
// vocabulary small enough to follow by hand.
func TestWPMPreprocess(t *testing.T) {
	v := &Vocab{
		Tokens: []string{"[UNK]", "▁hello", "▁world", "▁un", "aff", "able", "▁a", "▁!", "▁,", "▁$", "▁你", "▁好",
			"▁fuhrer", "▁e", "▁ᄒ", "▁ω", "▁'", "▁ſ", "▁-", "▁unaff", "ᅡ", "ᆫ", "a", "▁न", "म", "स", "त", "▁i"},
		UNK: 0,
	}
	w, err := newWPM(v)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		text string
		want []int32
	}{
		{"Hello World", []int32{1, 2}},
		{"  hello\t\nworld  ", []int32{1, 2}},
		{"hello,world!", []int32{1, 8, 2, 7}},    // punctuation stands alone
		{"$a", []int32{9, 6}},                    // so does an ASCII symbol
		{"unaffable", []int32{19, 5}},            // longest first: "▁unaff" then "able"
		{"unaffablee", []int32{0}},               // "e" left over: the whole word is UNK
		{"你好", []int32{10, 11}},                  // CJK ideographs stand alone
		{"Führer", []int32{12}},                  // accents go with NFD
		{"Ｅ", []int32{0}},                        // a compatibility form is kept (NFD, not NFKD)
		{"e\u0301", []int32{13}},                 // a combining mark typed as such goes too
		{"é", []int32{13}},                       //
		{"한", []int32{14, 20, 21}},               // a Hangul syllable becomes its jamo
		{"नमस्ते", []int32{23, 24, 25, 26}},      // the virama (Mn) goes; the vowel sign (Mc) stays: no piece
		{"नमसत", []int32{23, 24, 25, 26}},        //
		{"İ", []int32{27}},                       // capital I with dot: the dot is a mark
		{"\u2126", []int32{15}},                  // OHM SIGN decomposes to omega, then lower case
		{"\u1e9b", []int32{17}},                  // long s with dot above
		{"a\u200bb\x00c\xffd\ufffd", []int32{0}}, // format, NUL, bad bytes and U+FFFD vanish: "abcd"
		{"a\u00a0a\u3000a", []int32{6, 6, 6}},    // Unicode whitespace
		{"'-'", []int32{16, 18, 16}},             //
		{"", nil},                                //
		{" \t ", nil},                            //
		{"\U0001F600", []int32{0}},               // a symbol above ASCII joins words: unknown
		{strings.Repeat("a", 100), append([]int32{6}, slices.Repeat([]int32{22}, 99)...)},
		{strings.Repeat("a", 101), []int32{0}}, // more than 100 characters
		{"hello ab", []int32{1, 0}},            // no "b" continuation
	}
	for _, tc := range tests {
		if got := w.encode(nil, tc.text); !slices.Equal(got, tc.want) {
			t.Errorf("encode(%q) = %v, want %v", tc.text, got, tc.want)
		}
	}
}

func TestNewWPMErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    Vocab
		want string
	}{
		{"no unk", Vocab{Tokens: []string{"a"}, UNK: -1}, "needs an unknown token"},
		{"duplicate", Vocab{Tokens: []string{"[UNK]", "a", "a"}, UNK: 0}, `token 2 "a" repeats token 1`},
	} {
		if _, err := newWPM(&tc.v); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestWPMEncodeAllocs(t *testing.T) {
	v := spOpenGGUF(t, "llamacpp-vocab", "ggml-vocab-bert-bge.gguf")
	w, err := newWPM(v)
	if err != nil {
		t.Fatal(err)
	}
	text := "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～ Führer Cửa Việt"
	dst := w.encode(nil, text)
	if n := testing.AllocsPerRun(100, func() { dst = w.encode(dst[:0], text) }); n != 0 {
		t.Errorf("%v allocations per encode once warm, want 0", n)
	}
}

func BenchmarkWPMEncode(b *testing.B) {
	v := spOpenGGUF(b, "llamacpp-vocab", "ggml-vocab-bert-bge.gguf")
	w, err := newWPM(v)
	if err != nil {
		b.Fatal(err)
	}
	_, lines, _ := spWarAndPeace(b)
	n := 0
	for _, l := range lines {
		n += len(l)
	}
	b.SetBytes(int64(n))
	b.ReportAllocs()
	var dst []int32
	for b.Loop() {
		for _, l := range lines {
			dst = w.encode(dst[:0], l)
		}
	}
}

// TestWPMReference checks every line of the novel and the multilingual
// strings against Hugging Face's BERT tokenizer.
func TestWPMReference(t *testing.T) {
	r := spReadReference(t)
	v := spOpenGGUF(t, "llamacpp-vocab", "ggml-vocab-bert-bge.gguf")
	w, err := newWPM(v)
	if err != nil {
		t.Fatal(err)
	}
	_, lines, _ := spWarAndPeace(t)
	spCheckDigests(t, "wpm lines", r, r.WPMLines, lines, w.encode)

	b, err := os.ReadFile(spTestdata(t, "swift-transformers", "multilingual-conformance", "inputs.json"))
	if err != nil {
		t.Fatal(err)
	}
	var inputs []struct{ ID, Text string }
	if err := json.Unmarshal(b, &inputs); err != nil {
		t.Fatal(err)
	}
	if len(inputs) != len(r.WPMMultilingual) {
		t.Fatalf("%d multilingual inputs, %d in the reference", len(inputs), len(r.WPMMultilingual))
	}
	pass := 0
	for i, in := range inputs {
		want := r.WPMMultilingual[i]
		if len(want) == 0 {
			want = nil
		}
		if got := w.encode(nil, in.Text); slices.Equal(got, want) {
			pass++
		} else {
			t.Errorf("%s %q:\n got %v\nwant %v", in.ID, in.Text, got, want)
		}
	}
	t.Logf("wpm multilingual: %d/%d agree with the reference", pass, len(inputs))
}

// FuzzWPMEncode checks that any text, valid UTF-8 or not, gives ids of the
// vocabulary, and that a text cut at whitespace encodes as its parts do.
func FuzzWPMEncode(f *testing.F) {
	v := spOpenGGUF(f, "llamacpp-vocab", "ggml-vocab-bert-bge.gguf")
	w, err := newWPM(v)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		whole := w.encode(nil, a+" "+b)
		for _, id := range whole {
			if id < 0 || int(id) >= len(v.Tokens) {
				t.Fatalf("id %d outside %d tokens", id, len(v.Tokens))
			}
		}
		if parts := w.encode(w.encode(nil, a), b); !slices.Equal(whole, parts) {
			t.Fatalf("encode(%q + \" \" + %q) = %v, parts give %v", a, b, whole, parts)
		}
	})
}
