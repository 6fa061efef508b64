package tokenizer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// spCase is one test string of llama.cpp's tokenizer vectors and the
// ids Hugging Face's tokenizer gives it without special tokens.
type spCase struct {
	text string
	ids  []int32
}

// spReadVectors parses ggml-vocab-NAME.gguf.inp/.out: test strings each
// followed by "\n__ggml_vocab_test__\n", and one line of space-separated ids
// per string.
func spReadVectors(t testing.TB, name string) []spCase {
	t.Helper()
	inp, err := os.ReadFile(spTestdata(t, "llamacpp-vocab", "ggml-vocab-"+name+".gguf.inp"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(spTestdata(t, "llamacpp-vocab", "ggml-vocab-"+name+".gguf.out"))
	if err != nil {
		t.Fatal(err)
	}
	texts := strings.Split(string(inp), "\n__ggml_vocab_test__\n")
	if texts[len(texts)-1] != "" {
		t.Fatalf("%s.inp does not end with the separator", name)
	}
	texts = texts[:len(texts)-1]
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != len(texts) {
		t.Fatalf("%s: %d test strings, %d lines of ids", name, len(texts), len(lines))
	}
	cases := make([]spCase, len(texts))
	for i, text := range texts {
		cases[i].text = text
		for _, f := range strings.Fields(lines[i]) {
			id, err := strconv.ParseInt(f, 10, 32)
			if err != nil {
				t.Fatalf("%s.out line %d: %v", name, i+1, err)
			}
			cases[i].ids = append(cases[i].ids, int32(id))
		}
	}
	return cases
}

// spRunVectors encodes every test string of a vector file and reports
// the pass rate; llama.cpp's test asks for all of them to pass.
func spRunVectors(t *testing.T, name string, encode func([]int32, string) []int32) {
	cases := spReadVectors(t, name)
	pass := 0
	for i, c := range cases {
		var got []int32
		if c.text != "" { // llama.cpp makes no fragment of empty text
			got = encode(nil, c.text)
		}
		if slices.Equal(got, c.ids) {
			pass++
		} else {
			t.Errorf("%s #%d %q:\n got %v\nwant %v", name, i, c.text, got, c.ids)
		}
	}
	t.Logf("%s: %d/%d vectors pass", name, pass, len(cases))
}

func spLoadSPM(t testing.TB, file string) (*Vocab, *spm) {
	t.Helper()
	v := spOpenGGUF(t, "llamacpp-vocab", file)
	s, err := newSPM(v)
	if err != nil {
		t.Fatal(err)
	}
	return v, s
}

func TestSPMLlamacppVectors(t *testing.T) {
	for _, name := range []string{"llama-spm", "phi-3"} {
		t.Run(name, func(t *testing.T) {
			v, s := spLoadSPM(t, "ggml-vocab-"+name+".gguf")
			if v.Model != "llama" {
				t.Fatalf("model %q is not SentencePiece-style", v.Model)
			}
			spRunVectors(t, name, func(dst []int32, text string) []int32 {
				return s.encode(dst, text, v.AddSpacePrefix)
			})
		})
	}
}

// TestSPMMerges checks the algorithm on a vocabulary small enough to follow
// by hand.
func TestSPMMerges(t *testing.T) {
	v := &Vocab{
		Tokens: []string{"<unk>", "<s>", "a", "b", "c", "ab", "bc", "abc", "▁", "▁a", "<0x41>", "<0xE2>", "<0x82>", "<0xAC>", "x", "xx", "xxx", "<s", "q"},
		Scores: []float32{0, 0, -1, -1, -1, -3, -2, -4, -1, -5, 0, 0, 0, 0, -1, -1, -2, -1, -1},
		Types: []TokenType{TypeUnknown, TypeControl, TypeNormal, TypeNormal, TypeNormal, TypeNormal, TypeNormal,
			TypeNormal, TypeNormal, TypeNormal, TypeByte, TypeByte, TypeByte, TypeByte, TypeNormal, TypeNormal, TypeUnused, TypeNormal, TypeNormal},
		UNK: 0,
	}
	s, err := newSPM(v)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		text   string
		prefix bool
		want   []int32
	}{
		{"abc", false, []int32{7}},           // "bc" (-2) beats "ab" (-3), then "a"+"bc" is "abc"
		{"cab", false, []int32{4, 5}},        // the only merge
		{"ab", true, []int32{8, 5}},          // "ab" (-3) beats "▁a" (-5); "▁ab" is no piece
		{"a", true, []int32{9}},              // the dummy prefix merges with the first character
		{"ba b", false, []int32{3, 2, 8, 3}}, // the space is "▁"; "a▁" and "▁b" are no pieces
		{"A", false, []int32{10}},            // byte fallback
		{"€", false, []int32{11, 12, 13}},    // three bytes
		{"é", false, []int32{0}},             // bytes lack tokens: one UNK
		{"<s>", false, []int32{17, 0}},       // "<s" is text; "<s>" a control token that text never forms; ">" UNK
		{"xxxx", false, []int32{15, 15}},     // leftmost "xx" first, then the two "xx" cannot join
		{"xxx", false, []int32{15, 14}},      // "xxx" is unused: split back into "xx"+"x"
		{"", true, []int32{8}},               // the dummy prefix alone
		{"", false, nil},                     //
		{"\xe2\x82", false, []int32{11, 12}}, // a truncated sequence is one symbol
		{"\x82q", false, []int32{12, 18}},    // a stray continuation byte
		{"qqqqqqqq", false, slices.Repeat([]int32{18}, 8)},
	}
	for _, tc := range tests {
		got := s.encode(nil, tc.text, tc.prefix)
		if !slices.Equal(got, tc.want) {
			t.Errorf("encode(%q, %v) = %v, want %v", tc.text, tc.prefix, got, tc.want)
		}
	}
}

// TestSPMSmallMatchesHeap checks that the scan for short words and the
// priority queue merge alike, on words of the novel and on random strings
// over a few characters (where ties abound).
func TestSPMSmallMatchesHeap(t *testing.T) {
	_, s := spLoadSPM(t, "ggml-vocab-llama-spm.gguf")
	if s.unusedReach {
		t.Fatal("llama-spm should merge without unused pieces")
	}
	_, lines, _ := spWarAndPeace(t)
	var words []string
	for _, l := range lines[:2000] {
		for _, w := range strings.Fields(l) {
			words = append(words, spmSpace+w)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "b", "e", "r", "t", "▁", "é", "\xe2", "0"}
	for range 3000 {
		var b strings.Builder
		for range 1 + rng.IntN(spmSmall) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		words = append(words, b.String())
	}
	sc := new(spmScratch)
	symbols := func(w string) []spmSymbol {
		sc.syms = sc.syms[:0]
		for off := int32(0); off < int32(len(w)); {
			n := min(spmCharLen[w[off]>>4], int32(len(w))-off)
			id, ok := s.ids[w[off:off+n]]
			if !ok {
				id = -1
			}
			k := int32(len(sc.syms))
			sc.syms = append(sc.syms, spmSymbol{start: off, n: n, prev: k - 1, next: k + 1, id: id})
			off += n
		}
		sc.syms[len(sc.syms)-1].next = -1
		return sc.syms
	}
	checked := 0
	for _, w := range words {
		if len(symbols(w)) > spmSmall {
			continue
		}
		small := s.mergeSmall(nil, sc, []byte(w), symbols(w))
		heap := s.mergeHeap(nil, sc, []byte(w), symbols(w))
		if !slices.Equal(small, heap) {
			t.Errorf("%q: scan %v, queue %v", w, small, heap)
		}
		checked++
	}
	if checked < 10000 {
		t.Errorf("only %d words checked", checked)
	}
}

func TestNewSPMErrors(t *testing.T) {
	tests := []struct {
		name string
		v    Vocab
		want string
	}{
		{"short scores", Vocab{Tokens: []string{"a", "b"}, Scores: []float32{0}, UNK: 0}, "1 scores for 2 tokens"},
		{"short types", Vocab{Tokens: []string{"a", "b"}, Types: []TokenType{1}, UNK: 0}, "1 token types for 2 tokens"},
		{"duplicate", Vocab{Tokens: []string{"a", "b", "a"}, UNK: 0}, `token 2 "a" repeats token 0`},
		{"unk out of range", Vocab{Tokens: []string{"a"}, UNK: 1}, "unknown token id 1"},
		{"no fallback", Vocab{Tokens: []string{"a"}, UNK: -1}, "no token for byte 0x00"},
	}
	for _, tc := range tests {
		if _, err := newSPM(&tc.v); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
}

// spWarAndPeace returns the shared novel cut into lines and into paragraphs
// (blocks between blank lines), the fragments a chat prompt is made of.
func spWarAndPeace(b testing.TB) (text string, lines, paragraphs []string) {
	b.Helper()
	data, err := os.ReadFile(spTestdata(b, "ollama-tokenizer", "war-and-peace.txt"))
	if err != nil {
		b.Fatal(err)
	}
	text = strings.ReplaceAll(string(data), "\r\n", "\n")
	for _, l := range strings.Split(text, "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	for _, p := range strings.Split(text, "\n\n") {
		if p = strings.Trim(p, "\n"); p != "" {
			paragraphs = append(paragraphs, p)
		}
	}
	return text, lines, paragraphs
}

func BenchmarkSPMEncode(b *testing.B) {
	_, s := spLoadSPM(b, "ggml-vocab-llama-spm.gguf")
	text, lines, paragraphs := spWarAndPeace(b)
	noSpaces := strings.Join(strings.Fields(text), "")
	for _, bc := range []struct {
		name  string
		frags []string
	}{
		{"lines", lines},
		{"paragraphs", paragraphs},
		{"nospace-100KB", []string{noSpaces[:100_000]}},
		{"nospace-1MB", []string{noSpaces[:1_000_000]}},
		{"same-char-1MB", []string{strings.Repeat("a", 1_000_000)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			n := 0
			for _, f := range bc.frags {
				n += len(f)
			}
			b.SetBytes(int64(n))
			b.ReportAllocs()
			dst := make([]int32, 0, n)
			for b.Loop() {
				for _, f := range bc.frags {
					dst = s.encode(dst[:0], f, true)
				}
			}
		})
	}
}

// BenchmarkSPMEncodeCold encodes the novel's lines with an empty word cache
// each time: a first pass over new text.
func BenchmarkSPMEncodeCold(b *testing.B) {
	v, _ := spLoadSPM(b, "ggml-vocab-llama-spm.gguf")
	_, lines, _ := spWarAndPeace(b)
	n := 0
	for _, l := range lines {
		n += len(l)
	}
	b.SetBytes(int64(n))
	var dst []int32
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		s, err := newSPM(v)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		for _, l := range lines {
			dst = s.encode(dst[:0], l, true)
		}
	}
}

// BenchmarkSPMMergeLines runs the merge alone on whole lines, with neither
// the word cache nor the cut into words: llama.cpp's path.
func BenchmarkSPMMergeLines(b *testing.B) {
	_, s := spLoadSPM(b, "ggml-vocab-llama-spm.gguf")
	_, lines, _ := spWarAndPeace(b)
	escaped := make([][]byte, len(lines))
	n := 0
	for i, l := range lines {
		escaped[i] = []byte(spmSpace + strings.ReplaceAll(l, " ", spmSpace))
		n += len(l)
	}
	b.SetBytes(int64(n))
	b.ReportAllocs()
	sc := new(spmScratch)
	var dst []int32
	for b.Loop() {
		for _, e := range escaped {
			dst = s.merge(dst[:0], sc, e)
		}
	}
}

func TestSPMEncodeAllocs(t *testing.T) {
	_, s := spLoadSPM(t, "ggml-vocab-llama-spm.gguf")
	text := "It was in July, 1805, and the speaker was the well-known Anna Pavlovna\nScherer, maid of honor and favorite of the Empress Marya Fedorovna. ¿Qué? 😁"
	dst := s.encode(nil, text, true)
	if n := testing.AllocsPerRun(100, func() { dst = s.encode(dst[:0], text, true) }); n != 0 {
		t.Errorf("%v allocations per encode once warm, want 0", n)
	}
}

// spReference is testdata/spm_wpm_reference.json, made by the script beside
// it with SentencePiece and Hugging Face's tokenizers.
type spReference struct {
	Chunk  int `json:"chunk"`
	Counts struct {
		Lines, Paragraphs, Multilingual int
	} `json:"counts"`
	SPMLines        []string  `json:"spm_lines"`
	SPMParagraphs   []string  `json:"spm_paragraphs"`
	WPMLines        []string  `json:"wpm_lines"`
	WPMMultilingual [][]int32 `json:"wpm_multilingual"`
}

func spReadReference(t testing.TB) *spReference {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "spm_wpm_reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r spReference
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.Chunk <= 0 {
		t.Fatalf("spm_wpm_reference.json: chunk %d", r.Chunk)
	}
	return &r
}

// spCheckDigests encodes texts and compares the SHA-256 of each chunk of
// r.Chunk texts' ids (decimal, space-separated, one text a line) with want.
func spCheckDigests(t *testing.T, name string, r *spReference, want []string, texts []string, encode func([]int32, string) []int32) {
	t.Helper()
	if got := (len(texts) + r.Chunk - 1) / r.Chunk; got != len(want) {
		t.Fatalf("%s: %d texts make %d chunks, the reference has %d", name, len(texts), got, len(want))
	}
	var ids []int32
	var line []byte
	pass := 0
	for c := range want {
		h := sha256.New()
		for _, text := range texts[c*r.Chunk : min(len(texts), (c+1)*r.Chunk)] {
			ids = encode(ids[:0], text)
			line = line[:0]
			for i, id := range ids {
				if i > 0 {
					line = append(line, ' ')
				}
				line = strconv.AppendInt(line, int64(id), 10)
			}
			h.Write(append(line, '\n'))
		}
		if hex.EncodeToString(h.Sum(nil)) == want[c] {
			pass++
		} else {
			t.Errorf("%s: texts %d..%d differ from the reference", name, c*r.Chunk, min(len(texts), (c+1)*r.Chunk)-1)
		}
	}
	t.Logf("%s: %d/%d chunks of %d texts agree with the reference", name, pass, len(want), r.Chunk)
}

// TestSPMReference checks every line and paragraph of the novel against
// SentencePiece itself.
func TestSPMReference(t *testing.T) {
	r := spReadReference(t)
	v, s := spLoadSPM(t, "ggml-vocab-llama-spm.gguf")
	_, lines, paragraphs := spWarAndPeace(t)
	if len(lines) != r.Counts.Lines || len(paragraphs) != r.Counts.Paragraphs {
		t.Fatalf("%d lines, %d paragraphs; the reference cut %d, %d", len(lines), len(paragraphs), r.Counts.Lines, r.Counts.Paragraphs)
	}
	encode := func(dst []int32, text string) []int32 { return s.encode(dst, text, v.AddSpacePrefix) }
	spCheckDigests(t, "spm lines", r, r.SPMLines, lines, encode)
	spCheckDigests(t, "spm paragraphs", r, r.SPMParagraphs, paragraphs, encode)
}

// FuzzSPMEncode checks, on any text, that cutting it into words, the word
// cache and the scan for short words give what llama.cpp's single queue
// over the whole text gives.
func FuzzSPMEncode(f *testing.F) {
	_, s := spLoadSPM(f, "ggml-vocab-llama-spm.gguf")
	sc := new(spmScratch)
	f.Fuzz(func(t *testing.T, text string, prefix bool) {
		got := s.encode(nil, text, prefix)
		buf := []byte(strings.ReplaceAll(text, " ", spmSpace))
		if prefix {
			buf = append([]byte(spmSpace), buf...)
		}
		var want []int32
		if len(buf) > 0 {
			sc.syms = sc.syms[:0]
			for off := int32(0); off < int32(len(buf)); {
				n := min(spmCharLen[buf[off]>>4], int32(len(buf))-off)
				id, ok := s.ids[string(buf[off:off+n])]
				if !ok {
					id = -1
				}
				k := int32(len(sc.syms))
				sc.syms = append(sc.syms, spmSymbol{start: off, n: n, prev: k - 1, next: k + 1, id: id})
				off += n
			}
			sc.syms[len(sc.syms)-1].next = -1
			want = s.mergeHeap(nil, sc, buf, sc.syms)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("encode(%q, %v) = %v, one queue gives %v", text, prefix, got, want)
		}
	})
}
