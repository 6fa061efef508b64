package tokenizer

import (
	"fmt"
	"math"
	"strings"

	"github.com/weftlm/weft/gguf"
)

// GGUF metadata keys of the tokenizer, spelled as llama.cpp writes them.
const (
	keyModel          = "tokenizer.ggml.model"
	keyPre            = "tokenizer.ggml.pre"
	keyTokens         = "tokenizer.ggml.tokens"
	keyScores         = "tokenizer.ggml.scores"
	keyTokenType      = "tokenizer.ggml.token_type"
	keyMerges         = "tokenizer.ggml.merges"
	keyBOS            = "tokenizer.ggml.bos_token_id"
	keyEOS            = "tokenizer.ggml.eos_token_id"
	keyUNK            = "tokenizer.ggml.unknown_token_id"
	keyPAD            = "tokenizer.ggml.padding_token_id"
	keySEP            = "tokenizer.ggml.seperator_token_id" // sic: llama.cpp's spelling
	keySEPAlt         = "tokenizer.ggml.separator_token_id"
	keyCLS            = "tokenizer.ggml.cls_token_id"
	keyMASK           = "tokenizer.ggml.mask_token_id"
	keyAddBOS         = "tokenizer.ggml.add_bos_token"
	keyAddEOS         = "tokenizer.ggml.add_eos_token"
	keyAddSpacePrefix = "tokenizer.ggml.add_space_prefix"
	keyRemoveExtraWS  = "tokenizer.ggml.remove_extra_whitespaces"
)

// addBOSPre lists the GPT-2-style pre-tokenizers for which llama.cpp adds a
// BOS token by default; every other byte-level BPE vocabulary adds none.
var addBOSPre = map[string]bool{
	"llama3": true, "llama-v3": true, "llama-bpe": true, "falcon3": true,
	"tekken": true, "chameleon": true,
}

// VocabFromGGUF reads a vocabulary from GGUF tokenizer metadata
// (tokenizer.ggml.*). A key that is absent takes the default llama.cpp
// applies for the tokenizer model:
//
//   - "llama" (SentencePiece): BOS 1, EOS 2, UNK 0; adds BOS and a space prefix.
//   - "bert" (WordPiece): BOS 101 ([CLS]), UNK 100, SEP 102, PAD 0, MASK 103;
//     adds BOS. llama.cpp ends a bert sequence with SEP, not EOS (there is none).
//   - "gpt2" (byte-level BPE): BOS = EOS = 11; adds BOS only for the
//     pre-tokenizers llama3, llama-v3, llama-bpe, falcon3, tekken, chameleon;
//     the merges are required.
//   - "t5" and "rwkv" are read with llama.cpp's defaults, though this
//     package segments neither.
//
// A special token id of -1 or 0xFFFFFFFF means "none" and becomes -1.
// Mismatched array lengths, ids outside the vocabulary and values of the
// wrong type are errors naming the key.
func VocabFromGGUF(md gguf.Metadata) (*Vocab, error) {
	r := ggufReader{md: md, where: "gguf"}
	switch f := md.(type) {
	case interface{ Name() string }:
		r.where = "gguf " + f.Name()
	case *gguf.File:
		r.where = "gguf " + f.Name
	}
	v, err := r.vocab()
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", r.where, err)
	}
	return v, nil
}

type ggufReader struct {
	md    gguf.Metadata
	where string
}

func (r ggufReader) vocab() (*Vocab, error) {
	model, ok, err := r.str(keyModel)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("key %q is missing", keyModel)
	}
	pre, _, err := r.str(keyPre)
	if err != nil {
		return nil, err
	}
	v := &Vocab{Model: model, Pre: pre, BOS: -1, EOS: -1, UNK: -1, PAD: -1, SEP: -1, MASK: -1}
	switch model {
	case "llama":
		v.BOS, v.EOS, v.UNK = 1, 2, 0
		v.AddBOS, v.AddSpacePrefix, v.EscapeWhitespaces = true, true, true
	case "bert":
		v.BOS, v.UNK, v.SEP, v.PAD, v.MASK = 101, 100, 102, 0, 103
		v.AddBOS, v.EscapeWhitespaces = true, true
	case "gpt2":
		v.BOS, v.EOS = 11, 11
		v.AddBOS = addBOSPre[pre]
		if pre == "chatglm-bpe" {
			v.BOS = -1
		}
	case "t5":
		v.EOS, v.UNK, v.PAD = 1, 2, 0
		v.AddEOS, v.EscapeWhitespaces = true, true
	case "rwkv":
	case "none", "no_vocab":
		return nil, fmt.Errorf("key %q is %q: the file has no vocabulary", keyModel, model)
	default:
		return nil, fmt.Errorf("key %q: unknown tokenizer model %q", keyModel, model)
	}

	if err := r.boolInto(keyAddSpacePrefix, &v.AddSpacePrefix); err != nil {
		return nil, err
	}
	if err := r.boolInto(keyRemoveExtraWS, &v.RemoveExtraSpaces); err != nil {
		return nil, err
	}
	if err := r.boolInto(keyAddBOS, &v.AddBOS); err != nil {
		return nil, err
	}
	if err := r.boolInto(keyAddEOS, &v.AddEOS); err != nil {
		return nil, err
	}

	if err := r.arrays(v); err != nil {
		return nil, err
	}

	n := len(v.Tokens)
	ids := []struct {
		key string
		dst *int32
	}{
		{keyBOS, &v.BOS}, {keyEOS, &v.EOS}, {keyUNK, &v.UNK}, {keyPAD, &v.PAD},
		{keySEPAlt, &v.SEP}, {keySEP, &v.SEP}, {keyMASK, &v.MASK},
	}
	for _, id := range ids {
		if err := r.idInto(id.key, n, id.dst); err != nil {
			return nil, err
		}
	}
	if _, hasBOS := r.md.KV(keyBOS); model == "bert" && !hasBOS {
		// BERT's first token is [CLS]; older converters name it only so.
		if err := r.idInto(keyCLS, n, &v.BOS); err != nil {
			return nil, err
		}
	}
	// The defaults above may not fit a small vocabulary; drop those that don't.
	for _, id := range []*int32{&v.BOS, &v.EOS, &v.UNK, &v.PAD, &v.SEP, &v.MASK} {
		if int(*id) >= n {
			*id = -1
		}
	}
	return v, nil
}

// arrays reads tokens, scores, token types and merges, checking that the
// per-token arrays are as long as the token list.
func (r ggufReader) arrays(v *Vocab) error {
	a, ok, err := r.array(keyTokens)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("key %q is missing", keyTokens)
	}
	if a.Elem() != gguf.TypeString {
		return fmt.Errorf("key %q: array of %s, want strings", keyTokens, a.Elem())
	}
	if a.Len() == 0 {
		return fmt.Errorf("key %q: no tokens", keyTokens)
	}
	if v.Tokens, err = a.Strings(); err != nil {
		return fmt.Errorf("key %q: %w", keyTokens, err)
	}
	n := len(v.Tokens)
	if n > math.MaxInt32 {
		return fmt.Errorf("key %q: %d tokens do not fit int32 ids", keyTokens, n)
	}

	if a, ok, err = r.array(keyScores); err != nil {
		return err
	} else if ok {
		if a.Len() != n {
			return fmt.Errorf("key %q: %d scores for %d tokens", keyScores, a.Len(), n)
		}
		if v.Scores, err = a.Float32s(); err != nil {
			return fmt.Errorf("key %q: %w", keyScores, err)
		}
	}

	if a, ok, err = r.array(keyTokenType); err != nil {
		return err
	} else if ok {
		if a.Len() != n {
			return fmt.Errorf("key %q: %d token types for %d tokens", keyTokenType, a.Len(), n)
		}
		types, err := a.Int64s()
		if err != nil {
			return fmt.Errorf("key %q: %w", keyTokenType, err)
		}
		v.Types = make([]TokenType, n)
		for i, t := range types {
			if t < int64(TypeUndefined) || t > int64(TypeByte) {
				return fmt.Errorf("key %q: token %d has type %d, want 0..6", keyTokenType, i, t)
			}
			v.Types[i] = TokenType(t)
		}
	}

	if a, ok, err = r.array(keyMerges); err != nil {
		return err
	} else if ok {
		if a.Elem() != gguf.TypeString {
			return fmt.Errorf("key %q: array of %s, want strings", keyMerges, a.Elem())
		}
		if v.Merges, err = a.Strings(); err != nil {
			return fmt.Errorf("key %q: %w", keyMerges, err)
		}
		for i, m := range v.Merges {
			// Either half is at least one byte, so the split is at or after 1.
			if sp := strings.IndexByte(m[min(1, len(m)):], ' ') + 1; sp < 1 || sp == len(m)-1 {
				return fmt.Errorf("key %q: merge %d %q is not two pieces separated by a space", keyMerges, i, m)
			}
		}
	} else if v.Model == "gpt2" {
		return fmt.Errorf("key %q is missing (required for a gpt2 tokenizer)", keyMerges)
	}
	return nil
}

// str reads an optional string key.
func (r ggufReader) str(key string) (string, bool, error) {
	val, ok := r.md.KV(key)
	if !ok {
		return "", false, nil
	}
	s, ok := val.Str()
	if !ok {
		return "", false, fmt.Errorf("key %q is %s, want a string", key, val.Type())
	}
	return s, true, nil
}

// array reads an optional array key.
func (r ggufReader) array(key string) (gguf.Array, bool, error) {
	val, ok := r.md.KV(key)
	if !ok {
		return gguf.Array{}, false, nil
	}
	a, ok := val.Array()
	if !ok {
		return gguf.Array{}, false, fmt.Errorf("key %q is %s, want an array", key, val.Type())
	}
	return a, true, nil
}

// boolInto overwrites *dst with an optional boolean key.
func (r ggufReader) boolInto(key string, dst *bool) error {
	val, ok := r.md.KV(key)
	if !ok {
		return nil
	}
	b, ok := val.Bool()
	if !ok {
		return fmt.Errorf("key %q is %s, want a bool", key, val.Type())
	}
	*dst = b
	return nil
}

// idInto overwrites *dst with an optional token id key. Converters write
// "none" as -1 or as its uint32 bit pattern.
func (r ggufReader) idInto(key string, n int, dst *int32) error {
	val, ok := r.md.KV(key)
	if !ok {
		return nil
	}
	x, ok := val.Int()
	if !ok {
		u, isUint := val.Uint()
		if !isUint {
			return fmt.Errorf("key %q is %s, want an integer token id", key, val.Type())
		}
		if u != math.MaxUint64 {
			return fmt.Errorf("key %q = %d is outside the vocabulary of %d tokens", key, u, n)
		}
		x = -1
	}
	switch {
	case x == -1 || x == math.MaxUint32:
		*dst = -1
	case x < 0 || x >= int64(n):
		return fmt.Errorf("key %q = %d is outside the vocabulary of %d tokens", key, x, n)
	default:
		*dst = int32(x)
	}
	return nil
}
