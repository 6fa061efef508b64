package tokenizer

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// byteVocab is a small GPT-2 style vocabulary: the 256 byte tokens (ids
// 0..255 in byte order), a few merges, and special tokens after them.
func byteVocab(t testing.TB, merges []string, specials ...string) *Vocab {
	t.Helper()
	v := &Vocab{Model: "gpt2", Pre: "gpt-2", BOS: -1, EOS: -1, UNK: -1, PAD: -1, SEP: -1, MASK: -1}
	for b := range 256 {
		v.Tokens = append(v.Tokens, string(byteRune[b]))
	}
	for _, m := range merges {
		v.Tokens = append(v.Tokens, strings.Replace(m, " ", "", 1))
	}
	v.Merges = merges
	v.Types = make([]TokenType, len(v.Tokens))
	for i := range v.Types {
		v.Types[i] = TypeNormal
	}
	for _, s := range specials {
		typ := TypeControl
		if text, ok := strings.CutPrefix(s, "user:"); ok {
			s, typ = text, TypeUserDefined
		}
		v.Tokens = append(v.Tokens, s)
		v.Types = append(v.Types, typ)
	}
	return v
}

// byteIDs are the ids of s's bytes in a byteVocab without merges.
func byteIDs(s string) []int32 {
	ids := make([]int32, len(s))
	for i := range len(s) {
		ids[i] = int32(s[i])
	}
	return ids
}

func TestBPEMergeOrder(t *testing.T) {
	// Lower ranks merge first, then the leftmost pair: "aaaa" is aa+aa, not
	// aaa+a, and " bc" is Ġ+bc although "Ġ b" is further left.
	v := byteVocab(t, []string{"a a", "b c", "aa a", "Ġ b"})
	tk := newTokenizer(t, v)
	id := func(s string) int32 { i, _ := tk.ID(s); return i }
	tests := []struct {
		text string
		want []int32
	}{
		{"aaa", []int32{id("aaa")}},
		{"aaaa", []int32{id("aa"), id("aa")}},
		{"abc", []int32{'a', id("bc")}},
		{" bc", []int32{' ', id("bc")}},
		{"", nil},
	}
	for _, tc := range tests {
		if got := tk.Encode(tc.text, false, false); !slices.Equal(got, tc.want) {
			t.Errorf("Encode(%q) = %v, want %v", tc.text, got, tc.want)
		}
	}
	// A word longer than bpeSmall takes the heap path; both must agree.
	long := strings.Repeat("a", 3*bpeSmall+1)
	got := tk.Encode(long, false, false)
	if want := append(slices.Repeat([]int32{id("aa")}, 3*bpeSmall/2-1), id("aaa")); !slices.Equal(got, want) {
		t.Errorf("Encode(%d a's) = %v, want %v", len(long), got, want)
	}
}

func TestSpecialTokens(t *testing.T) {
	v := byteVocab(t, nil, "<|im_start|>", "<|im_end|>", "<|im", "user:<tool>")
	v.BOS, v.AddBOS = int32(len(v.Tokens)-4), true
	tk := newTokenizer(t, v)
	start, end, im, tool := int32(256), int32(257), int32(258), int32(259)
	tests := []struct {
		text                   string
		addSpecial, parseSpecl bool
		want                   []int32
	}{
		{"<|im_end|>", false, true, []int32{end}},
		// Leftmost, then longest: "<|im" would match first but "<|im_start|>" is longer.
		{"x<|im_start|><|im", false, true, []int32{'x', start, im}},
		{"<|im_end|>", false, false, byteIDs("<|im_end|>")},
		// User-defined tokens are matched even without parseSpecial.
		{"a<tool>b", false, false, []int32{'a', tool, 'b'}},
		{"hi", true, true, []int32{start, 'h', 'i'}},
	}
	for _, tc := range tests {
		got := tk.Encode(tc.text, tc.addSpecial, tc.parseSpecl)
		if !slices.Equal(got, tc.want) {
			t.Errorf("Encode(%q, %v, %v) = %v, want %v", tc.text, tc.addSpecial, tc.parseSpecl, got, tc.want)
		}
	}
	if !tk.IsEOG(end) || tk.IsEOG(start) {
		t.Errorf("IsEOG(<|im_end|>) = %v, IsEOG(<|im_start|>) = %v", tk.IsEOG(end), tk.IsEOG(start))
	}
	if got := tk.DecodeWith([]int32{start, 'h', end}, DecodeOptions{SkipSpecial: true}); got != "h" {
		t.Errorf("DecodeWith(SkipSpecial) = %q, want %q", got, "h")
	}
	if got := tk.Decode([]int32{start, 'h', tool}); got != "<|im_start|>h<tool>" {
		t.Errorf("Decode = %q", got)
	}
}

func TestEOG(t *testing.T) {
	v := byteVocab(t, nil, "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|custom_stop|>")
	v.EOS = 256
	v.EOG = []int32{260}
	tk := newTokenizer(t, v)
	if got, want := tk.EOG(), []int32{256, 257, 258, 259, 260}; !slices.Equal(got, want) {
		t.Errorf("EOG() = %v, want %v", got, want)
	}
	if tk.IsEOG('a') || tk.IsEOG(-1) || tk.IsEOG(1<<20) {
		t.Error("IsEOG is true for an ordinary or invalid id")
	}
	// "</s>" ends generation when it is a control token, not as plain text.
	plain := byteVocab(t, nil, "</s>")
	plain.Types[256] = TypeNormal
	if newTokenizer(t, plain).IsEOG(256) || !newTokenizer(t, byteVocab(t, nil, "</s>")).IsEOG(256) {
		t.Error("</s>: IsEOG wrong for a normal or a control token")
	}
	v.EOG = []int32{999}
	if _, err := New(v); err == nil {
		t.Error("New accepts an end-of-generation id outside the vocabulary")
	}
}

func TestStreamDecoder(t *testing.T) {
	// "é" is C3 A9, "😀" F0 9F 98 80: fed a byte at a time they must come out whole.
	tk := newTokenizer(t, byteVocab(t, nil, "<|end|>"))
	text := "aé😀b"
	var ids []int32
	for i := 0; i < len(text); i++ {
		ids = append(ids, int32(text[i]))
	}
	ids = append(ids, 256)
	d := tk.NewStreamDecoder(true)
	var got []string
	for _, id := range ids {
		if s := d.Add(id); s != "" {
			if !utf8.ValidString(s) {
				t.Fatalf("Add returned invalid UTF-8 %q", s)
			}
			got = append(got, s)
		}
	}
	if want := []string{"a", "é", "😀", "b"}; !slices.Equal(got, want) {
		t.Errorf("stream pieces = %q, want %q", got, want)
	}
	// A lone continuation byte can never complete: it comes out as U+FFFD.
	if s := d.Add(0x80); s != "\uFFFD" {
		t.Errorf("Add(0x80) = %q", s)
	}
	// An incomplete character at the end is flushed as U+FFFD.
	d.Add(0xE2)
	if s := d.Flush(); s != "\uFFFD" {
		t.Errorf("Flush = %q", s)
	}
	if s := tk.NewStreamDecoder(false).Add(256); s != "<|end|>" {
		t.Errorf("Add(<|end|>) without skipping = %q", s)
	}
}

func TestPieceAndDecodeOptions(t *testing.T) {
	tk := newTokenizer(t, byteVocab(t, []string{"Ġ .", "Ġ n", "Ġn 't"}))
	if got := tk.Piece(' '); got != " " {
		t.Errorf("Piece(' ') = %q", got)
	}
	if tk.Piece(-1) != "" || tk.Piece(1<<20) != "" {
		t.Error("Piece of an invalid id is not empty")
	}
	ids := tk.Encode("do n't stop .", false, false)
	if got := tk.Decode(ids); got != "do n't stop ." {
		t.Errorf("Decode = %q", got)
	}
	if got := tk.DecodeWith(ids, DecodeOptions{CleanUp: true}); got != "don't stop." {
		t.Errorf("DecodeWith(CleanUp) = %q", got)
	}
}

func TestNewErrors(t *testing.T) {
	base := func() *Vocab { return byteVocab(t, nil) }
	tests := []struct {
		name   string
		change func(v *Vocab)
		want   string
	}{
		{"empty", func(v *Vocab) { v.Tokens = nil }, "empty vocabulary"},
		{"types", func(v *Vocab) { v.Types = v.Types[:3] }, "3 token types for 256 tokens"},
		{"bos", func(v *Vocab) { v.BOS = 256 }, "BOS id 256 outside"},
		{"model", func(v *Vocab) { v.Model = "t5" }, `unsupported tokenizer model "t5"`},
		{"pre", func(v *Vocab) { v.Pre = "nope" }, `unknown pre-tokenizer "nope"`},
		{"merge", func(v *Vocab) { v.Merges = []string{"ab"} }, `merge 0 "ab"`},
	}
	for _, tc := range tests {
		v := base()
		tc.change(v)
		if _, err := New(v); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New error = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// TestConcurrentEncode encodes from several goroutines at once; run with
// -race it checks that the shared scratch pools and caches are safe.
func TestConcurrentEncode(t *testing.T) {
	tk := newTokenizer(t, byteVocab(t, []string{"h e", "he l", "l o", "hel lo"}, "<|end|>"))
	texts := []string{"hello world", "hello<|end|>", strings.Repeat("hello ", 50), strings.Repeat("l", 200)}
	want := make([][]int32, len(texts))
	for i, s := range texts {
		want[i] = tk.Encode(s, true, true)
	}
	done := make(chan error)
	for g := range 4 {
		go func() {
			for i := range 200 {
				k := (g + i) % len(texts)
				if got := tk.Encode(texts[k], true, true); !slices.Equal(got, want[k]) {
					done <- fmt.Errorf("goroutine %d: Encode(%q) = %v, want %v", g, texts[k], got, want[k])
					return
				}
			}
			done <- nil
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// TestMistralControlTokens checks the control tokens of Mistral's v3
// SentencePiece model: parsed from text only when asked, and EOS ends
// generation.
func TestMistralControlTokens(t *testing.T) {
	tk := loadTokenizer(t, testdataDir(t, "mistral-spm", "mistral_instruct_tokenizer_240323.model.v3"))
	inst, ok1 := tk.ID("[INST]")
	end, ok2 := tk.ID("[/INST]")
	if !ok1 || !ok2 {
		t.Fatal("no [INST] / [/INST] tokens")
	}
	ids := tk.Encode("[INST] Hi [/INST]", true, true)
	if len(ids) < 4 || ids[0] != tk.BOS() || ids[1] != inst || ids[len(ids)-1] != end {
		t.Errorf("Encode with special parsing = %v, want BOS %d, %d, ..., %d", ids, tk.BOS(), inst, end)
	}
	if plain := tk.Encode("[INST] Hi [/INST]", false, false); slices.Contains(plain, inst) || tk.Decode(plain) != "[INST] Hi [/INST]" {
		t.Errorf("Encode without special parsing = %v (%q)", plain, tk.Decode(plain))
	}
	if !tk.IsEOG(tk.EOS()) || tk.IsEOG(inst) {
		t.Errorf("IsEOG(EOS %d) = %v, IsEOG([INST]) = %v", tk.EOS(), tk.IsEOG(tk.EOS()), tk.IsEOG(inst))
	}
}
