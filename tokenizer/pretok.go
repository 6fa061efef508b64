package tokenizer

import "fmt"

// A pre-tokenizer cuts text into pieces that BPE then segments one by one.
// Hugging Face writes them as regexes with lookahead (\s+(?!\S)), which Go's
// regexp lacks, so each regex here is a hand-written matcher over code points
// with the same leftmost-first semantics; that is also what makes it fast.
//
// A pre-tokenizer is a sequence of stages, as HF's Sequence of Split
// pre-tokenizers with the "Isolated" behaviour: each stage cuts every piece
// of the previous stage into its matches and the gaps between them, and both
// go on to the next stage.

// A splitter is one stage.
type splitter interface {
	// find returns the first match in s at or after byte i as s[start:end],
	// with start = -1 when there is none. Matches are never empty.
	find(s string, i int) (start, end int)
}

// matchFunc is a regex tried at each position in turn: it returns the end
// of the match starting at i, or -1. It must not scan far before failing, or
// find would be quadratic.
type matchFunc func(s string, i int) int

func (m matchFunc) find(s string, i int) (int, int) {
	for i < len(s) {
		if e := m(s, i); e > i {
			return i, e
		}
		_, _, n := classAt(s, i)
		i += n
	}
	return -1, -1
}

// preTokenizer is a named sequence of stages.
type preTokenizer struct {
	name   string
	stages []splitter
}

// split calls emit with each piece of s, in order. The pieces cover s.
func (p *preTokenizer) split(s string, emit func(string)) {
	p.splitFrom(s, 0, emit)
}

func (p *preTokenizer) splitFrom(s string, stage int, emit func(string)) {
	if stage == len(p.stages) {
		if s != "" {
			emit(s)
		}
		return
	}
	sp := p.stages[stage]
	i := 0
	for i < len(s) {
		start, end := sp.find(s, i)
		if start < 0 {
			break
		}
		if start > i {
			p.splitFrom(s[i:start], stage+1, emit)
		}
		p.splitFrom(s[start:end], stage+1, emit)
		i = end
	}
	if i < len(s) {
		p.splitFrom(s[i:], stage+1, emit)
	}
}

// Regexes of the pre-tokenizers, as Hugging Face tokenizer.json files and
// llama.cpp spell them. regexSplitters maps each to its matcher.
const (
	reGPT2       = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	reGPT2NoWS   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
	reLlama3     = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	reLlama3Alt  = `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	reQwen2      = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	reQwen2Alt   = `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	rePunctRun   = `[\p{P}\$\+<=>\^~\|]+`
	rePunctRunBT = "[\\p{P}\\$\\+<=>\\^~\\|`]+"
	reDigit      = `\p{N}`
	reDigits     = `\p{N}+`
	reDigits3    = `[0-9][0-9][0-9]`
	reCRLF       = `[\r\n]`
	reSpaceLet   = `\s?\p{L}+`
	reSpacePunct = `\s?\p{P}+`
	reTrailingWS = `\s+$`
	reCJK        = `[一-龥ࠀ-一가-퟿]+`
	reBloom      = ` ?[^(\s|.,!?…。，、।۔،)]+`
	reDigits1to3 = `\p{N}{1,3}`
	reCJKKana    = `[一-龥぀-ゟ゠-ヿ]+`
	// DeepSeek V3 writes CR and LF as the characters themselves.
	reDeepseekV3 = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
	reTekken     = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

var regexSplitters = map[string]splitter{
	reGPT2:       matchFunc(func(s string, i int) int { return matchGPT2(s, i, true) }),
	reGPT2NoWS:   matchFunc(func(s string, i int) int { return matchGPT2(s, i, false) }),
	reLlama3:     matchFunc(func(s string, i int) int { return matchLlama3(s, i, 3) }),
	reLlama3Alt:  matchFunc(func(s string, i int) int { return matchLlama3(s, i, 3) }),
	reQwen2:      matchFunc(func(s string, i int) int { return matchLlama3(s, i, 1) }),
	reQwen2Alt:   matchFunc(func(s string, i int) int { return matchLlama3(s, i, 1) }),
	rePunctRun:   matchFunc(func(s string, i int) int { return matchPunctRun(s, i, false) }),
	rePunctRunBT: matchFunc(func(s string, i int) int { return matchPunctRun(s, i, true) }),
	reDigit:      matchFunc(matchDigit),
	reDigits:     matchFunc(matchDigits),
	reDigits3:    matchFunc(matchDigits3),
	reCRLF:       matchFunc(matchCRLF),
	reSpaceLet: matchFunc(func(s string, i int) int {
		return matchSpaceThen(s, i, func(_ rune, c charClass) bool { return c&clL != 0 })
	}),
	reSpacePunct: matchFunc(func(s string, i int) int {
		return matchSpaceThen(s, i, func(_ rune, c charClass) bool { return c&clP != 0 })
	}),
	reTrailingWS: trailingWS{},
	reCJK:        matchFunc(func(s string, i int) int { return matchSet(s, i, cjkSet) }),
	reBloom:      matchFunc(matchBloom),
	reTekken:     matchFunc(matchTekken),
	reDigits1to3: matchFunc(matchDigits1to3),
	reCJKKana:    matchFunc(func(s string, i int) int { return matchSet(s, i, cjkKanaSet) }),
	reDeepseekV3: matchFunc(matchDeepseekV3),
	reDeepseekLetters: matchFunc(func(s string, i int) int {
		return matchSpaceThen(s, i, func(r rune, _ charClass) bool { return deepseekLetters.has(r) })
	}),
	reDeepseekPunct: matchFunc(func(s string, i int) int {
		return matchSpaceThen(s, i, func(r rune, _ charClass) bool { return deepseekPunct.has(r) })
	}),
}

// preTokenizerSpec is what a GGUF tokenizer.ggml.pre name stands for: its
// regexes (as llama.cpp lists them) and the BPE flags that go with it.
type preTokenizerSpec struct {
	regexes      []string
	ignoreMerges bool // Llama 3 style: a piece that is a token is not merged
}

var (
	specGPT2      = preTokenizerSpec{regexes: []string{reGPT2}}
	specLlama3    = preTokenizerSpec{regexes: []string{reLlama3}, ignoreMerges: true}
	specQwen2     = preTokenizerSpec{regexes: []string{reQwen2}}
	specStarcoder = preTokenizerSpec{regexes: []string{reDigit, reGPT2NoWS}}
)

// ggufPreTokenizers maps the tokenizer.ggml.pre names of byte-level BPE
// vocabularies to their pre-tokenizers, grouped as llama.cpp groups them.
var ggufPreTokenizers = map[string]preTokenizerSpec{
	// "default" is what llama.cpp uses when a converter did not know the
	// model, and for files written before the key existed.
	"default": {regexes: []string{rePunctRun, reGPT2NoWS, reDigits, reDigits3}},

	"llama3": specLlama3, "llama-v3": specLlama3, "llama-bpe": specLlama3, "falcon3": specLlama3,
	"dbrx": {regexes: []string{reLlama3}}, "smaug-bpe": {regexes: []string{reLlama3}},
	"chatglm-bpe": {regexes: []string{reLlama3}},

	"qwen2": specQwen2, "deepseek-r1-qwen": specQwen2, "stablelm2": specQwen2, "megrez": specQwen2,

	"gpt-2": specGPT2, "phi-2": specGPT2, "jina-es": specGPT2, "jina-de": specGPT2,
	"gigachat": specGPT2, "jina-v1-en": specGPT2, "jina-v2-es": specGPT2, "jina-v2-de": specGPT2,
	"jina-v2-code": specGPT2, "roberta-bpe": specGPT2, "mpt": specGPT2, "olmo": specGPT2, "jais": specGPT2,

	"starcoder": specStarcoder, "refact": specStarcoder, "command-r": specStarcoder,
	"smollm": specStarcoder, "codeshell": specStarcoder, "exaone": specStarcoder, "minerva-7b": specStarcoder,

	"falcon": {regexes: []string{rePunctRunBT, reGPT2NoWS, reDigits3}},

	"deepseek-llm":   {regexes: []string{reCRLF, reDeepseekLetters, reDeepseekPunct, reTrailingWS, reCJK, reDigits}},
	"deepseek-v3":    {regexes: []string{reDigits1to3, reCJKKana, reDeepseekV3}},
	"deepseek-coder": {regexes: []string{reCRLF, reSpaceLet, reSpacePunct, reCJK, reDigit}},

	"tekken": {regexes: []string{reTekken}, ignoreMerges: true},

	"bloom": {regexes: []string{reBloom}}, "poro-chat": {regexes: []string{reBloom}},
	"gpt3-finnish": {regexes: []string{reBloom}}, "viking": {regexes: []string{reBloom, reDigit}},
}

// newPreTokenizer builds the pre-tokenizer named name from its regexes.
func newPreTokenizer(name string, regexes []string) (*preTokenizer, error) {
	p := &preTokenizer{name: name}
	for _, re := range regexes {
		sp, ok := regexSplitters[re]
		if !ok {
			return nil, fmt.Errorf("pre-tokenizer %q: unsupported regex %q", name, re)
		}
		p.stages = append(p.stages, sp)
	}
	return p, nil
}

// ggufPreTokenizer returns the pre-tokenizer a GGUF tokenizer.ggml.pre
// names. An empty name is llama.cpp's "default".
func ggufPreTokenizer(name string) (*preTokenizer, preTokenizerSpec, error) {
	if name == "" {
		name = "default"
	}
	spec, ok := ggufPreTokenizers[name]
	if !ok {
		return nil, spec, fmt.Errorf("unknown pre-tokenizer %q (tokenizer.ggml.pre)", name)
	}
	p, err := newPreTokenizer(name, spec.regexes)
	return p, spec, err
}
