package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// fuzzTexts are encoded by the loader fuzz targets with whatever
// vocabulary the input describes.
var fuzzTexts = []string{"", "hello world", " \t\n  x", "<|endoftext|>hi", "héllo 😀 123", "\xff\xfe"}

// FuzzTokenizerJSON feeds arbitrary bytes to the tokenizer.json parser,
// and encodes and decodes with what it accepts: no panic, no hang.
func FuzzTokenizerJSON(f *testing.F) {
	f.Add([]byte(wordPieceJSON))
	f.Add([]byte(byteLevelJSON(`{"type": "ByteLevel"}`)))
	f.Add([]byte(`{"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
	 "model": {"type": "BPE", "byte_fallback": true, "vocab": {"<unk>": 0, "▁": 1, "a": 2, "▁a": 3, "<0x41>": 4}, "merges": ["▁ a"], "unk_token": "<unk>"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := parseTokenizerJSON(data)
		if err != nil {
			return
		}
		tk, err := New(v)
		if err != nil {
			return
		}
		for _, s := range append(fuzzTexts, string(data[:min(len(data), 64)])) {
			tk.Decode(tk.Encode(s, true, true))
		}
	})
}

// FuzzBPEFiles feeds arbitrary vocab.json and merges.txt contents to their
// parser; a byte-level vocabulary that spells every byte must decode its
// encodings back to the text.
func FuzzBPEFiles(f *testing.F) {
	var all []string
	for b := range 256 {
		all = append(all, quoteJSON(string(byteRune[b]))+": "+itoa(b))
	}
	f.Add([]byte("{"+strings.Join(all, ",")+`, "hi": 256}`), []byte("#version: 0.2\nh i\n"))
	f.Add([]byte(`{"a": 0, "b": 1, "ab": 2}`), []byte("a b\n"))
	f.Add([]byte(`{"a": 5}`), []byte("a a\r\n\n"))
	f.Fuzz(func(t *testing.T, vocab, merges []byte) {
		v, err := parseBPEFiles(vocab, merges)
		if err != nil {
			return
		}
		v.Pre = "gpt-2"
		tk, err := New(v)
		if err != nil {
			return
		}
		spellsAll := true
		for b := range 256 {
			spellsAll = spellsAll && tk.byteBPE.byteIDs[b] >= 0
		}
		for _, s := range fuzzTexts {
			if got := tk.Decode(tk.Encode(s, false, false)); spellsAll && got != s {
				t.Errorf("round trip of %q gave %q", s, got)
			}
		}
	})
}

// FuzzEncode encodes arbitrary text with a byte-level vocabulary that has
// merges and special tokens: the pre-tokenizers' pieces must cover the
// text, decoding must give the text back, and the stream decoder must
// emit valid UTF-8 (the text itself when it is valid).
func FuzzEncode(f *testing.F) {
	for _, s := range fuzzTexts {
		f.Add(s)
	}
	f.Add("you'll see 1234567 things\r\n\r\n  ok<|im_end|>")
	tk := newTokenizer(f, byteVocab(f, []string{"h e", "he l", "l o", "hel lo", "Ġ w", "Ġ Ġ", "ĠĠ ĠĠ"}, "<|im_end|>", "user:<tool>"))
	f.Fuzz(func(t *testing.T, text string) {
		for name := range ggufPreTokenizers {
			p, _, err := ggufPreTokenizer(name)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			p.split(text, func(s string) {
				if s == "" {
					t.Fatalf("%s: empty piece of %q", name, text)
				}
				b.WriteString(s)
			})
			if b.String() != text {
				t.Fatalf("%s: pieces of %q join to %q", name, text, b.String())
			}
		}
		for _, parse := range []bool{false, true} {
			ids := tk.Encode(text, true, parse)
			if got := tk.Decode(ids); got != text {
				t.Fatalf("Decode(Encode(%q, parseSpecial=%v)) = %q", text, parse, got)
			}
			d := tk.NewStreamDecoder(false)
			var b strings.Builder
			for _, id := range ids {
				b.WriteString(d.Add(id))
			}
			b.WriteString(d.Flush())
			if out := b.String(); !utf8.ValidString(out) || (utf8.ValidString(text) && out != text) {
				t.Fatalf("stream decode of %q gave %q", text, out)
			}
		}
	})
}
