package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// FromHF builds a tokenizer from a directory of Hugging Face files:
//
//   - tokenizer.json (BPE, byte-level or SentencePiece-style with byte
//     fallback, or WordPiece), or else
//   - vocab.json + merges.txt (GPT-2 style; encoder.json + vocab.bpe are
//     read too), whose pre-tokenizer is told by tokenizer_config.json's
//     tokenizer_class, or else
//   - tokenizer.model (SentencePiece).
//
// tokenizer_config.json adds tokens, names the special tokens, says whether
// to add BOS/EOS and carries the chat template (or chat_template.jinja
// does); generation_config.json's eos_token_id lists end-of-generation ids.
func FromHF(dir string) (*Tokenizer, error) {
	v, err := VocabFromHF(dir)
	if err != nil {
		return nil, err
	}
	t, err := New(v)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, dir)
	}
	return t, nil
}

// VocabFromHF reads the vocabulary of a directory of Hugging Face tokenizer
// files (see FromHF).
func VocabFromHF(dir string) (*Vocab, error) {
	cfg, err := readHFConfig(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, err
	}
	var v *Vocab
	switch {
	case exists(filepath.Join(dir, "tokenizer.json")):
		v, err = readTokenizerJSON(filepath.Join(dir, "tokenizer.json"))
	case exists(filepath.Join(dir, "vocab.json")) || exists(filepath.Join(dir, "encoder.json")):
		v, err = readBPEDir(dir)
		if err == nil {
			v.Pre, v.NFC, err = preFromClass(dir, cfg.TokenizerClass)
		}
	case exists(filepath.Join(dir, "tokenizer.model")):
		v, err = VocabFromSentencePiece(filepath.Join(dir, "tokenizer.model"))
	default:
		return nil, fmt.Errorf("tokenizer: %s: no tokenizer.json, vocab.json or tokenizer.model", dir)
	}
	if err != nil {
		return nil, err
	}
	if err := cfg.apply(v); err != nil {
		return nil, err
	}
	if err := applyGenerationConfig(v, filepath.Join(dir, "generation_config.json")); err != nil {
		return nil, err
	}
	if v.ChatTemplate == "" {
		b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		v.ChatTemplate = string(b)
	}
	return v, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// preFromClass names the pre-tokenizer of a vocab.json + merges.txt pair
// from the tokenizer class, which is all such a directory says about it.
func preFromClass(dir, class string) (pre string, nfc bool, err error) {
	switch strings.TrimSuffix(class, "Fast") {
	case "GPT2Tokenizer", "CodeGenTokenizer", "RobertaTokenizer":
		return "gpt-2", false, nil
	case "Qwen2Tokenizer":
		return "qwen2", true, nil
	case "":
		return "", false, fmt.Errorf("tokenizer: %s: vocab.json without tokenizer.json or a tokenizer_class in tokenizer_config.json: cannot tell the pre-tokenizer", dir)
	}
	return "", false, fmt.Errorf("tokenizer: %s: tokenizer_class %q: unknown pre-tokenizer for vocab.json (need tokenizer.json)", dir, class)
}

// readBPEDir reads vocab.json + merges.txt, or encoder.json + vocab.bpe.
func readBPEDir(dir string) (*Vocab, error) {
	vocabPath, mergesPath := filepath.Join(dir, "vocab.json"), filepath.Join(dir, "merges.txt")
	if !exists(vocabPath) {
		vocabPath, mergesPath = filepath.Join(dir, "encoder.json"), filepath.Join(dir, "vocab.bpe")
	}
	return ReadBPEFiles(vocabPath, mergesPath)
}

// ReadBPEFiles reads a GPT-2 style byte-level BPE vocabulary: a JSON object
// from token to id and a merges file of "left right" lines in rank order,
// with or without a leading "#version" line. The result has Model "gpt2"
// and no pre-tokenizer; set Vocab.Pre before calling New.
func ReadBPEFiles(vocabPath, mergesPath string) (*Vocab, error) {
	vocab, err := os.ReadFile(vocabPath)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	merges, err := os.ReadFile(mergesPath)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	v, err := parseBPEFiles(vocab, merges)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s, %s: %w", vocabPath, mergesPath, err)
	}
	return v, nil
}

// parseBPEFiles reads the contents of a vocab.json and a merges.txt.
func parseBPEFiles(vocab, merges []byte) (*Vocab, error) {
	var m map[string]int64
	if err := json.Unmarshal(vocab, &m); err != nil {
		return nil, fmt.Errorf("vocab: %w", err)
	}
	tokens, types, err := denseVocab(m)
	if err != nil {
		return nil, fmt.Errorf("vocab: %w", err)
	}
	ms, err := parseMergesTxt(merges)
	if err != nil {
		return nil, err
	}
	return &Vocab{Model: "gpt2", Tokens: tokens, Types: types, Merges: ms,
		BOS: -1, EOS: -1, UNK: -1, PAD: -1, SEP: -1, MASK: -1}, nil
}

// denseVocab turns a token -> id map into a token list. Ids must be
// below the number of entries plus a margin for gaps; gaps become unused
// "[PADn]" tokens, as llama.cpp's converter fills them.
func denseVocab(m map[string]int64) ([]string, []TokenType, error) {
	if len(m) == 0 {
		return nil, nil, fmt.Errorf("empty vocabulary")
	}
	n := int64(0)
	for tok, id := range m {
		if id < 0 || id >= int64(len(m))+maxAddedTokens {
			return nil, nil, fmt.Errorf("token %q has id %d, outside 0..%d", tok, id, int64(len(m))+maxAddedTokens-1)
		}
		n = max(n, id+1)
	}
	tokens := make([]string, n)
	types := make([]TokenType, n)
	seen := make([]bool, n)
	for tok, id := range m {
		if seen[id] {
			return nil, nil, fmt.Errorf("two tokens with id %d (%q, %q)", id, tokens[id], tok)
		}
		seen[id] = true
		tokens[id], types[id] = tok, TypeNormal
	}
	for id := range tokens {
		if !seen[id] {
			tokens[id], types[id] = fmt.Sprintf("[PAD%d]", id), TypeUnused
		}
	}
	return tokens, types, nil
}

// maxAddedTokens bounds how far token ids may run past a vocabulary's size,
// so that a corrupt id cannot ask for a huge allocation.
const maxAddedTokens = 1 << 20

// parseMergesTxt reads "left right" lines, skipping a first "#version"
// line and blank lines.
func parseMergesTxt(b []byte) ([]string, error) {
	var merges []string
	for i, line := range strings.Split(string(b), "\n") {
		s := strings.TrimRight(line, "\r")
		if s == "" || (i == 0 && strings.HasPrefix(s, "#version")) {
			continue
		}
		if sp := strings.IndexByte(s[1:], ' ') + 1; sp < 1 || sp == len(s)-1 {
			return nil, fmt.Errorf("merges line %d: %q is not two pieces separated by a space", i+1, s)
		}
		if len(merges) == math.MaxInt32 {
			return nil, fmt.Errorf("merges: more than %d", math.MaxInt32)
		}
		merges = append(merges, s)
	}
	return merges, nil
}

// hfConfig is the part of tokenizer_config.json a tokenizer uses.
type hfConfig struct {
	path           string
	TokenizerClass string                         `json:"tokenizer_class"`
	AddBOS         *bool                          `json:"add_bos_token"`
	AddEOS         *bool                          `json:"add_eos_token"`
	BOS            hfTokenName                    `json:"bos_token"`
	EOS            hfTokenName                    `json:"eos_token"`
	UNK            hfTokenName                    `json:"unk_token"`
	PAD            hfTokenName                    `json:"pad_token"`
	AddedTokens    map[string]hfAddedTokenContent `json:"added_tokens_decoder"`
	ChatTemplate   json.RawMessage                `json:"chat_template"`
}

type hfAddedTokenContent struct {
	Content string `json:"content"`
	Special bool   `json:"special"`
	LStrip  bool   `json:"lstrip"`
	RStrip  bool   `json:"rstrip"`
}

// hfTokenName is a special token given as a string or as an AddedToken
// object {"content": ...}.
type hfTokenName string

func (n *hfTokenName) UnmarshalJSON(b []byte) error {
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*n = hfTokenName(s)
		return nil
	}
	var o struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(b, &o); err != nil {
		return fmt.Errorf("want a string or an object with content: %w", err)
	}
	*n = hfTokenName(o.Content)
	return nil
}

func readHFConfig(path string) (*hfConfig, error) {
	cfg := &hfConfig{path: path}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cfg, nil
	}
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if err := json.Unmarshal(b, cfg); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	return cfg, nil
}

// apply adds the config's tokens to v and sets its special tokens, flags
// and chat template.
func (c *hfConfig) apply(v *Vocab) error {
	for key, at := range c.AddedTokens {
		var id int64
		if _, err := fmt.Sscan(key, &id); err != nil || fmt.Sprint(id) != key {
			return fmt.Errorf("tokenizer: %s: added_tokens_decoder: key %q is not a token id", c.path, key)
		}
		if err := addToken(v, id, at); err != nil {
			return fmt.Errorf("tokenizer: %s: added_tokens_decoder: %w", c.path, err)
		}
	}
	for _, s := range []struct {
		name hfTokenName
		key  string
		dst  *int32
	}{{c.BOS, "bos_token", &v.BOS}, {c.EOS, "eos_token", &v.EOS}, {c.UNK, "unk_token", &v.UNK}, {c.PAD, "pad_token", &v.PAD}} {
		if s.name == "" {
			continue
		}
		id, ok := findToken(v, string(s.name))
		if !ok {
			return fmt.Errorf("tokenizer: %s: %s %q is not in the vocabulary", c.path, s.key, s.name)
		}
		*s.dst = id
	}
	if c.AddBOS != nil {
		v.AddBOS = *c.AddBOS
	}
	if c.AddEOS != nil {
		v.AddEOS = *c.AddEOS
	}
	if len(c.ChatTemplate) > 0 && !bytes.Equal(c.ChatTemplate, []byte("null")) {
		tmpl, err := chatTemplateJSON(c.ChatTemplate)
		if err != nil {
			return fmt.Errorf("tokenizer: %s: chat_template: %w", c.path, err)
		}
		v.ChatTemplate = tmpl
	}
	return nil
}

// chatTemplateJSON reads a chat_template: a string, or a list of named
// templates of which the "default" one is taken.
func chatTemplateJSON(b []byte) (string, error) {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(b, &named); err != nil {
		return "", fmt.Errorf("want a string or a list of {name, template}")
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	if len(named) > 0 {
		return named[0].Template, nil
	}
	return "", nil
}

// addToken puts an added token at id, extending the vocabulary with unused
// filler tokens when id is past its end.
func addToken(v *Vocab, id int64, at hfAddedTokenContent) error {
	if id < 0 || id >= int64(len(v.Tokens))+maxAddedTokens {
		return fmt.Errorf("token %q has id %d, outside 0..%d", at.Content, id, int64(len(v.Tokens))+maxAddedTokens-1)
	}
	if at.Content == "" {
		return fmt.Errorf("token %d is empty", id)
	}
	if len(v.Types) == 0 {
		v.Types = make([]TokenType, len(v.Tokens))
		for i := range v.Types {
			v.Types[i] = TypeNormal
		}
	}
	for int64(len(v.Tokens)) <= id {
		v.Tokens = append(v.Tokens, fmt.Sprintf("[PAD%d]", len(v.Tokens)))
		v.Types = append(v.Types, TypeUnused)
		if v.Scores != nil {
			v.Scores = append(v.Scores, 0)
		}
	}
	v.Tokens[id] = at.Content
	v.Types[id] = TypeUserDefined
	if at.Special {
		v.Types[id] = TypeControl
	}
	if at.LStrip && !slices.Contains(v.LStrip, int32(id)) {
		v.LStrip = append(v.LStrip, int32(id))
	}
	if at.RStrip && !slices.Contains(v.RStrip, int32(id)) {
		v.RStrip = append(v.RStrip, int32(id))
	}
	return nil
}

func findToken(v *Vocab, text string) (int32, bool) {
	for id, s := range v.Tokens {
		if s == text {
			return int32(id), true
		}
	}
	return -1, false
}

// applyGenerationConfig reads eos_token_id (one id or a list) of
// generation_config.json as end-of-generation ids.
func applyGenerationConfig(v *Vocab, path string) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("tokenizer: %w", err)
	}
	var gc struct {
		EOS json.RawMessage `json:"eos_token_id"`
	}
	if err := json.Unmarshal(b, &gc); err != nil {
		return fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	if len(gc.EOS) == 0 || bytes.Equal(gc.EOS, []byte("null")) {
		return nil
	}
	var ids []int64
	var one int64
	if err := json.Unmarshal(gc.EOS, &one); err == nil {
		ids = []int64{one}
	} else if err := json.Unmarshal(gc.EOS, &ids); err != nil {
		return fmt.Errorf("tokenizer: %s: eos_token_id: want an id or a list of ids", path)
	}
	for _, id := range ids {
		if id < 0 || id >= int64(len(v.Tokens)) {
			return fmt.Errorf("tokenizer: %s: eos_token_id %d outside the vocabulary of %d tokens", path, id, len(v.Tokens))
		}
		v.EOG = append(v.EOG, int32(id))
	}
	return nil
}
