package tokenizer

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/weftlm/weft/gguf"
)

// GGUF keys read beside those of VocabFromGGUF.
const (
	keyChatTemplate = "tokenizer.chat_template"
	keyEOT          = "tokenizer.ggml.eot_token_id"
	keyEOM          = "tokenizer.ggml.eom_token_id"
)

// Load reads a tokenizer from a GGUF file, a directory of Hugging Face
// tokenizer files (see FromHF), a tokenizer.json file or a SentencePiece
// model file (a name containing ".model").
func Load(path string) (*Tokenizer, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if st.IsDir() {
		return FromHF(path)
	}
	var v *Vocab
	switch {
	case isGGUF(path) || strings.HasSuffix(path, ".gguf"):
		m, err := gguf.Open(path, gguf.Options{})
		if err != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		defer m.Close()
		return FromGGUF(m)
	case strings.HasSuffix(path, ".json"):
		v, err = readTokenizerJSON(path)
	case strings.Contains(filepath.Base(path), ".model"): // tokenizer.model, Mistral's tokenizer.model.v3
		v, err = VocabFromSentencePiece(path)
	default:
		return nil, fmt.Errorf("tokenizer: %s: not a GGUF file, a tokenizer.json or a SentencePiece .model", path)
	}
	if err != nil {
		return nil, err
	}
	t, err := New(v)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	return t, nil
}

// isGGUF reports whether the file at path starts with the GGUF magic.
func isGGUF(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var magic [4]byte
	_, err = io.ReadFull(f, magic[:])
	return err == nil && string(magic[:]) == "GGUF"
}

// FromGGUF builds a tokenizer from GGUF metadata: the vocabulary
// (VocabFromGGUF), the chat template and the end-of-turn ids.
func FromGGUF(md gguf.Metadata) (*Tokenizer, error) {
	v, err := VocabFromGGUF(md)
	if err != nil {
		return nil, err
	}
	if val, ok := md.KV(keyChatTemplate); ok {
		s, ok := val.Str()
		if !ok {
			return nil, fmt.Errorf("tokenizer: gguf: key %q is %s, want a string", keyChatTemplate, val.Type())
		}
		v.ChatTemplate = s
	}
	for _, key := range []string{keyEOT, keyEOM} {
		id := int32(-1)
		if err := (ggufReader{md: md}).idInto(key, len(v.Tokens), &id); err != nil {
			return nil, fmt.Errorf("tokenizer: gguf: %w", err)
		}
		if id >= 0 {
			v.EOG = append(v.EOG, id)
		}
	}
	t, err := New(v)
	if err != nil {
		return nil, fmt.Errorf("%w (gguf %s)", err, ggufName(md))
	}
	return t, nil
}

func ggufName(md gguf.Metadata) string {
	switch f := md.(type) {
	case interface{ Name() string }:
		return f.Name()
	case *gguf.File:
		return f.Name
	}
	return "metadata"
}
