package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
)

// hfTokenizerJSON is the part of a Hugging Face tokenizer.json a tokenizer
// uses.
type hfTokenizerJSON struct {
	AddedTokens []struct {
		ID int64 `json:"id"`
		hfAddedTokenContent
	} `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Model         struct {
		Type                    string           `json:"type"`
		Vocab                   map[string]int64 `json:"vocab"`
		Merges                  json.RawMessage  `json:"merges"`
		UnkToken                *string          `json:"unk_token"`
		ByteFallback            bool             `json:"byte_fallback"`
		IgnoreMerges            bool             `json:"ignore_merges"`
		ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string          `json:"end_of_word_suffix"`
	} `json:"model"`
}

// hfComponent is a normalizer, pre-tokenizer or post-processor: a "type"
// and the fields of the types this package understands.
type hfComponent struct {
	Type          string            `json:"type"`
	Normalizers   []json.RawMessage `json:"normalizers"`
	PreTokenizers []json.RawMessage `json:"pretokenizers"`
	Processors    []json.RawMessage `json:"processors"`
	Pattern       struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	} `json:"pattern"`
	Content          string `json:"content"`
	Prepend          string `json:"prepend"`
	Behavior         string `json:"behavior"`
	Invert           bool   `json:"invert"`
	AddPrefixSpace   *bool  `json:"add_prefix_space"`
	UseRegex         *bool  `json:"use_regex"`
	IndividualDigits bool   `json:"individual_digits"`
	Replacement      string `json:"replacement"`
	PrependScheme    string `json:"prepend_scheme"`
	Split            *bool  `json:"split"`
	Single           []struct {
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
	} `json:"single"`
	SpecialTokens map[string]struct {
		IDs []int64 `json:"ids"`
	} `json:"special_tokens"`
	Cls []json.RawMessage `json:"cls"`
	Sep []json.RawMessage `json:"sep"`
}

func parseComponent(b json.RawMessage) (*hfComponent, error) {
	if len(b) == 0 || string(b) == "null" {
		return nil, nil
	}
	var c hfComponent
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// hfPipeline is what the normalizer and pre-tokenizer of a tokenizer.json
// amount to.
type hfPipeline struct {
	nfc          bool
	spaceToMeta  bool // spaces become ▁ (SentencePiece style)
	prependMeta  bool // ▁ goes before the text
	prependFirst bool // only before the text's first fragment
	metaspace    bool // the ▁ comes from a Metaspace pre-tokenizer, which adds none before a space
	byteLevel    bool
	bert         bool
	regexes      []string // pre-tokenizer stages
}

func (p *hfPipeline) normalizer(raw json.RawMessage) error {
	c, err := parseComponent(raw)
	if err != nil || c == nil {
		return err
	}
	switch c.Type {
	case "Sequence":
		for _, n := range c.Normalizers {
			if err := p.normalizer(n); err != nil {
				return err
			}
		}
	case "NFC":
		p.nfc = true
	case "Prepend":
		if c.Prepend != spmSpace {
			return fmt.Errorf("normalizer Prepend %q: only %q is supported", c.Prepend, spmSpace)
		}
		p.prependMeta = true
	case "Replace":
		if c.Pattern.String == nil || *c.Pattern.String != " " || c.Content != spmSpace {
			return fmt.Errorf("normalizer Replace: only \" \" -> %q is supported", spmSpace)
		}
		p.spaceToMeta = true
	case "BertNormalizer":
		p.bert = true
	default:
		return fmt.Errorf("unsupported normalizer %q", c.Type)
	}
	return nil
}

func (p *hfPipeline) preTokenizer(raw json.RawMessage) error {
	c, err := parseComponent(raw)
	if err != nil || c == nil {
		return err
	}
	switch c.Type {
	case "Sequence":
		for _, n := range c.PreTokenizers {
			if err := p.preTokenizer(n); err != nil {
				return err
			}
		}
	case "ByteLevel":
		if c.AddPrefixSpace != nil && *c.AddPrefixSpace {
			return fmt.Errorf("pre-tokenizer ByteLevel with add_prefix_space is not supported")
		}
		p.byteLevel = true
		if c.UseRegex == nil || *c.UseRegex {
			p.regexes = append(p.regexes, reGPT2)
		}
	case "Split":
		if c.Pattern.String != nil && *c.Pattern.String == " " && p.spaceToMeta {
			break // Gemma: the normalizer already turned every space into ▁, so there is nothing to split
		}
		if c.Pattern.Regex == nil || c.Behavior != "Isolated" || c.Invert {
			return fmt.Errorf("pre-tokenizer Split: only a regex with behavior Isolated is supported")
		}
		p.regexes = append(p.regexes, *c.Pattern.Regex)
	case "Digits":
		if c.IndividualDigits {
			p.regexes = append(p.regexes, reDigit)
		} else {
			p.regexes = append(p.regexes, reDigits)
		}
	case "Metaspace":
		if c.Replacement != spmSpace || (c.Split != nil && *c.Split) {
			return fmt.Errorf("pre-tokenizer Metaspace: only replacement %q without split is supported", spmSpace)
		}
		p.spaceToMeta, p.metaspace = true, true
		switch c.PrependScheme {
		case "always":
			p.prependMeta = true
		case "first":
			p.prependMeta, p.prependFirst = true, true
		case "never":
		case "":
			p.prependMeta = c.AddPrefixSpace == nil || *c.AddPrefixSpace
		default:
			return fmt.Errorf("pre-tokenizer Metaspace: unknown prepend_scheme %q", c.PrependScheme)
		}
	case "BertPreTokenizer":
		p.bert = true
	default:
		return fmt.Errorf("unsupported pre-tokenizer %q", c.Type)
	}
	return nil
}

// canonicalRegex maps the spellings of one split to a single one, so that
// a list of regexes can be compared with the named pre-tokenizers. GPT-2's
// regex with or without its final \s+ splits alike: what that alternative
// takes would be a one-character gap piece without it.
func canonicalRegex(re string) string {
	switch re {
	case reGPT2NoWS:
		return reGPT2
	case reLlama3Alt:
		return reLlama3
	case reQwen2Alt:
		return reQwen2
	}
	return re
}

// preferredPreNames orders the names preName tries first, so that a
// tokenizer.json gets the usual name of its regexes rather than an alias.
var preferredPreNames = []string{"gpt-2", "llama3", "dbrx", "qwen2", "starcoder", "falcon",
	"deepseek-llm", "deepseek-coder", "default", "bloom", "viking"}

// preName finds the GGUF pre-tokenizer name whose regexes are regexes and
// that adds no ignore_merges the file does not ask for.
func preName(regexes []string, ignoreMerges bool) (string, bool) {
	want := make([]string, len(regexes))
	for i, re := range regexes {
		want[i] = canonicalRegex(re)
	}
	names := make([]string, 0, len(ggufPreTokenizers))
	for name := range ggufPreTokenizers {
		if !slices.Contains(preferredPreNames, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range append(slices.Clone(preferredPreNames), names...) {
		spec := ggufPreTokenizers[name]
		if len(spec.regexes) != len(want) || (spec.ignoreMerges && !ignoreMerges) {
			continue
		}
		same := true
		for i, re := range spec.regexes {
			same = same && canonicalRegex(re) == want[i]
		}
		if same {
			return name, true
		}
	}
	return "", false
}

func readTokenizerJSON(path string) (*Vocab, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	v, err := parseTokenizerJSON(b)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	return v, nil
}

// parseTokenizerJSON reads the contents of a tokenizer.json.
func parseTokenizerJSON(b []byte) (*Vocab, error) {
	var tj hfTokenizerJSON
	if err := json.Unmarshal(b, &tj); err != nil {
		return nil, err
	}
	var p hfPipeline
	if err := p.normalizer(tj.Normalizer); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	if err := p.preTokenizer(tj.PreTokenizer); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	m := &tj.Model
	if m.Type == "" && len(m.Merges) > 0 {
		m.Type = "BPE"
	}
	tokens, types, err := denseVocab(m.Vocab)
	if err != nil {
		return nil, fmt.Errorf("model.vocab: %w", err)
	}
	v := &Vocab{Tokens: tokens, Types: types, BOS: -1, EOS: -1, UNK: -1, PAD: -1, SEP: -1, MASK: -1}
	switch m.Type {
	case "BPE":
		if err := hfBPE(v, &tj, &p); err != nil {
			return nil, err
		}
	case "WordPiece":
		if p.byteLevel || len(p.regexes) > 0 {
			return nil, fmt.Errorf("model WordPiece with a %v pre-tokenizer is not supported", p.regexes)
		}
		hfWordPiece(v)
	default:
		return nil, fmt.Errorf("model.type %q is not supported (want BPE or WordPiece)", m.Type)
	}
	if m.UnkToken != nil {
		if id, ok := findToken(v, *m.UnkToken); ok {
			v.UNK = id
			v.Types[id] = TypeUnknown
		}
	}
	for _, at := range tj.AddedTokens {
		if err := addToken(v, at.ID, at.hfAddedTokenContent); err != nil {
			return nil, fmt.Errorf("added_tokens: %w", err)
		}
	}
	if err := hfPostProcessor(v, tj.PostProcessor); err != nil {
		return nil, fmt.Errorf("post_processor: %w", err)
	}
	return v, nil
}

// hfBPE fills in a BPE model: byte-level (GPT-2 style, with a named
// pre-tokenizer) or SentencePiece-style (▁ for spaces, byte fallback).
func hfBPE(v *Vocab, tj *hfTokenizerJSON, p *hfPipeline) error {
	m := &tj.Model
	for _, affix := range []*string{m.ContinuingSubwordPrefix, m.EndOfWordSuffix} {
		if affix != nil && *affix != "" {
			return fmt.Errorf("BPE with continuing_subword_prefix or end_of_word_suffix %q is not supported", *affix)
		}
	}
	merges, err := hfMerges(m.Merges)
	if err != nil {
		return err
	}
	v.Merges, v.IgnoreMerges, v.NFC = merges, m.IgnoreMerges, p.nfc
	switch {
	case p.byteLevel:
		if p.spaceToMeta || p.prependMeta || p.bert {
			return fmt.Errorf("byte-level BPE with a SentencePiece or BERT normalizer is not supported")
		}
		name, ok := preName(p.regexes, m.IgnoreMerges)
		if !ok {
			return fmt.Errorf("unsupported pre-tokenizer regexes %q", p.regexes)
		}
		v.Model, v.Pre = "gpt2", name
	case p.spaceToMeta && len(p.regexes) == 0 && !p.bert:
		v.Model, v.Pre = "llama", "default"
		v.AddSpacePrefix, v.EscapeWhitespaces = p.prependMeta, true
		v.SpacePrefixFirstOnly, v.SpacePrefixUnlessSpace = p.prependFirst, p.metaspace
		for id, t := range v.Tokens {
			if _, ok := spmByteToken(t); ok && m.ByteFallback {
				v.Types[id] = TypeByte
			}
		}
	default:
		return fmt.Errorf("BPE without a byte-level or SentencePiece-style (▁) pre-tokenizer is not supported")
	}
	return nil
}

// hfMerges reads model.merges: "left right" strings, or [left, right]
// pairs as newer files write them.
func hfMerges(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var merges []string
	if err := json.Unmarshal(raw, &merges); err == nil {
		for i, mg := range merges {
			if sp := strings.IndexByte(mg[min(1, len(mg)):], ' ') + 1; sp < 1 || sp == len(mg)-1 {
				return nil, fmt.Errorf("model.merges[%d] %q is not two pieces separated by a space", i, mg)
			}
		}
		return merges, nil
	}
	var pairs [][]string
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, fmt.Errorf("model.merges: want strings or pairs of strings")
	}
	merges = make([]string, len(pairs))
	for i, pr := range pairs {
		if len(pr) != 2 || pr[0] == "" || pr[1] == "" {
			return nil, fmt.Errorf("model.merges[%d]: want two non-empty strings", i)
		}
		merges[i] = pr[0] + " " + pr[1]
	}
	return merges, nil
}

// hfWordPiece respells a WordPiece vocabulary as llama.cpp's converter
// does: a word-initial piece gets a ▁ prefix, a continuation piece loses
// its "##", and bracketed tokens ([CLS]) stay as they are.
func hfWordPiece(v *Vocab) {
	v.Model, v.Pre = "bert", "default"
	v.AddBOS, v.EscapeWhitespaces = true, true
	for id, t := range v.Tokens {
		switch {
		case v.Types[id] == TypeUnused:
		case strings.HasPrefix(t, "[") && strings.HasSuffix(t, "]"):
		case strings.HasPrefix(t, "##"):
			v.Tokens[id] = t[2:]
		default:
			v.Tokens[id] = spmSpace + t
		}
	}
}

// hfPostProcessor reads which special tokens wrap an encoded text: a
// TemplateProcessing's single template ("<s> $A" adds BOS, "$A </s>" adds
// EOS), or BERT's and RoBERTa's [CLS] ... [SEP].
func hfPostProcessor(v *Vocab, raw json.RawMessage) error {
	c, err := parseComponent(raw)
	if err != nil || c == nil {
		return err
	}
	tokenID := func(name string) (int32, error) {
		st, ok := c.SpecialTokens[name]
		if !ok || len(st.IDs) != 1 || st.IDs[0] < 0 || st.IDs[0] >= int64(len(v.Tokens)) {
			return -1, fmt.Errorf("special token %q has no single id in the vocabulary", name)
		}
		return int32(st.IDs[0]), nil
	}
	switch c.Type {
	case "Sequence":
		for _, p := range c.Processors {
			if err := hfPostProcessor(v, p); err != nil {
				return err
			}
		}
	case "TemplateProcessing":
		if n := len(c.Single); n > 0 {
			if st := c.Single[0].SpecialToken; st != nil {
				if v.BOS, err = tokenID(st.ID); err != nil {
					return err
				}
				v.AddBOS = true
			}
			if st := c.Single[n-1].SpecialToken; st != nil && n > 1 {
				if v.EOS, err = tokenID(st.ID); err != nil {
					return err
				}
				v.AddEOS = true
			}
		}
	case "BertProcessing", "RobertaProcessing":
		var cls, sep struct {
			name string
			id   int64
		}
		if len(c.Cls) != 2 || len(c.Sep) != 2 ||
			json.Unmarshal(c.Cls[0], &cls.name) != nil || json.Unmarshal(c.Cls[1], &cls.id) != nil ||
			json.Unmarshal(c.Sep[0], &sep.name) != nil || json.Unmarshal(c.Sep[1], &sep.id) != nil ||
			cls.id < 0 || cls.id >= int64(len(v.Tokens)) || sep.id < 0 || sep.id >= int64(len(v.Tokens)) {
			return fmt.Errorf("%s: want cls and sep as [token, id] in the vocabulary", c.Type)
		}
		v.BOS, v.AddBOS = int32(cls.id), true
		if v.Model == "bert" {
			v.SEP = int32(sep.id)
		} else {
			v.EOS, v.AddEOS = int32(sep.id), true
		}
	case "ByteLevel":
	default:
		return fmt.Errorf("unsupported post-processor %q", c.Type)
	}
	return nil
}
