package tokenizer

import (
	"fmt"
	"strings"
	"sync"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// Tokenizer encodes text to token ids and decodes ids to text for one
// vocabulary. It is safe for concurrent use.
type Tokenizer struct {
	v       *Vocab
	types   []TokenType // per id, with end-of-generation tokens forced to control
	special *specialSplitter
	pieces  []string // per id: the bytes the token stands for (see Piece)
	eog     map[int32]bool
	strip   map[int32]uint8 // stripLeft | stripRight of special tokens that take white space along
	idsOnce sync.Once
	ids     map[string]int32 // token text -> id, built by the first ID call

	// One segmenter, by Vocab.Model.
	spm     *spm          // "llama" with scores
	spmBPE  *bpe          // "llama" with merges and no scores (HF BPE with byte fallback)
	byteBPE *bpe          // "gpt2"
	pre     *preTokenizer // with byteBPE
	wpm     *wpm          // "bert"
}

// Bits of Tokenizer.strip.
const (
	stripLeft uint8 = 1 << iota
	stripRight
)

// eogTexts are tokens that end a turn or a document in common chat models;
// like llama.cpp, a vocabulary that has one stops generation on it.
var eogTexts = []string{
	"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
	"<|endoftext|>", "</s>", "<EOT>", "<｜end▁of▁sentence｜>",
	"<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
}

// New builds a tokenizer for v. v must not be changed afterwards.
func New(v *Vocab) (*Tokenizer, error) {
	n := len(v.Tokens)
	if n == 0 {
		return nil, fmt.Errorf("tokenizer: empty vocabulary")
	}
	if len(v.Types) != 0 && len(v.Types) != n {
		return nil, fmt.Errorf("tokenizer: %d token types for %d tokens", len(v.Types), n)
	}
	for _, id := range []struct {
		name string
		id   int32
	}{{"BOS", v.BOS}, {"EOS", v.EOS}, {"UNK", v.UNK}, {"PAD", v.PAD}, {"SEP", v.SEP}, {"MASK", v.MASK}} {
		if id.id < -1 || int(id.id) >= n {
			return nil, fmt.Errorf("tokenizer: %s id %d outside the vocabulary of %d tokens", id.name, id.id, n)
		}
	}
	t := &Tokenizer{v: v, types: make([]TokenType, n), eog: map[int32]bool{}}
	for i := range t.types {
		t.types[i] = tokenTypeOf(v, int32(i))
	}
	if err := t.findEOG(); err != nil {
		return nil, err
	}
	t.strip = map[int32]uint8{}
	for _, s := range []struct {
		ids []int32
		bit uint8
	}{{v.LStrip, stripLeft}, {v.RStrip, stripRight}} {
		for _, id := range s.ids {
			if id < 0 || int(id) >= n {
				return nil, fmt.Errorf("tokenizer: strip token id %d outside the vocabulary of %d tokens", id, n)
			}
			t.strip[id] |= s.bit
		}
	}
	var err error
	switch v.Model {
	case "llama":
		if len(v.Scores) == 0 && len(v.Merges) > 0 {
			t.spmBPE, err = newBPE(v, false, v.IgnoreMerges)
		} else {
			t.spm, err = newSPM(v)
		}
	case "bert":
		t.wpm, err = newWPM(v)
	case "gpt2":
		var spec preTokenizerSpec
		if t.pre, spec, err = ggufPreTokenizer(v.Pre); err == nil {
			t.byteBPE, err = newBPE(v, true, v.IgnoreMerges || spec.ignoreMerges)
		}
	default:
		err = fmt.Errorf("unsupported tokenizer model %q", v.Model)
	}
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t.special = newSpecialSplitter(v, t.types)
	t.pieces = make([]string, n)
	for i := range t.pieces {
		t.pieces[i] = t.piece(int32(i))
	}
	return t, nil
}

// tokenTypeOf returns the type of token id; a vocabulary without types has
// only normal tokens.
func tokenTypeOf(v *Vocab, id int32) TokenType {
	if len(v.Types) == 0 {
		return TypeNormal
	}
	return v.Types[id]
}

// findEOG collects the end-of-generation ids: EOS, Vocab.EOG and the tokens
// named in eogTexts, which are then treated as control tokens.
func (t *Tokenizer) findEOG() error {
	if t.v.EOS >= 0 {
		t.eog[t.v.EOS] = true
	}
	for _, id := range t.v.EOG {
		if id < 0 || int(id) >= len(t.v.Tokens) {
			return fmt.Errorf("tokenizer: end-of-generation id %d outside the vocabulary of %d tokens", id, len(t.v.Tokens))
		}
		t.eog[id] = true
	}
	want := make(map[string]bool, len(eogTexts))
	for _, s := range eogTexts {
		want[s] = true
	}
	for id, text := range t.v.Tokens {
		if !want[text] {
			continue
		}
		if text == "</s>" && t.types[id] == TypeNormal {
			continue // plain text in some vocabularies, not an end marker
		}
		t.eog[int32(id)] = true
		t.types[id] = TypeControl
	}
	return nil
}

// Vocab returns the vocabulary the tokenizer was built from.
func (t *Tokenizer) Vocab() *Vocab { return t.v }

// Len returns the number of tokens in the vocabulary.
func (t *Tokenizer) Len() int { return len(t.v.Tokens) }

// BOS returns the beginning-of-sequence id, -1 if none.
func (t *Tokenizer) BOS() int32 { return t.v.BOS }

// EOS returns the end-of-sequence id, -1 if none.
func (t *Tokenizer) EOS() int32 { return t.v.EOS }

// IsEOG reports whether generating id ends the generation: EOS, or a token
// that ends a turn (<|eot_id|>, <|im_end|>, <end_of_turn>, ...).
func (t *Tokenizer) IsEOG(id int32) bool { return t.eog[id] }

// EOG returns the end-of-generation ids in increasing order.
func (t *Tokenizer) EOG() []int32 {
	ids := make([]int32, 0, len(t.eog))
	for id := range int32(len(t.v.Tokens)) {
		if t.eog[id] {
			ids = append(ids, id)
		}
	}
	return ids
}

// ChatTemplate returns the Jinja chat template that came with the
// vocabulary, or "".
func (t *Tokenizer) ChatTemplate() string { return t.v.ChatTemplate }

// Type returns the type of token id, TypeUndefined for an id outside the
// vocabulary.
func (t *Tokenizer) Type(id int32) TokenType {
	if id < 0 || int(id) >= len(t.types) {
		return TypeUndefined
	}
	return t.types[id]
}

// ID returns the id of the token whose text is exactly text (for
// SentencePiece "▁the", for GPT-2 "Ġthe"); of two such tokens, the first.
func (t *Tokenizer) ID(text string) (int32, bool) {
	t.idsOnce.Do(func() {
		t.ids = make(map[string]int32, len(t.v.Tokens))
		for id := len(t.v.Tokens) - 1; id >= 0; id-- {
			t.ids[t.v.Tokens[id]] = int32(id)
		}
	})
	id, ok := t.ids[text]
	if !ok {
		return -1, false
	}
	return id, true
}

// Encode returns the ids of text. With addSpecial it adds the BOS and EOS
// tokens the model asks for (a WordPiece model: [CLS] and [SEP]). With
// parseSpecial the text of control tokens ("<|im_start|>") becomes those
// tokens; without it, it is encoded as text. User-defined tokens are always
// matched, as llama.cpp and Hugging Face do.
func (t *Tokenizer) Encode(text string, addSpecial, parseSpecial bool) []int32 {
	return t.AppendEncode(nil, text, addSpecial, parseSpecial)
}

// AppendEncode is Encode appending to dst.
func (t *Tokenizer) AppendEncode(dst []int32, text string, addSpecial, parseSpecial bool) []int32 {
	v := t.v
	bert := v.Model == "bert"
	if addSpecial && (v.AddBOS || bert) && v.BOS >= 0 {
		dst = append(dst, v.BOS)
	}
	prevSpecial := true // SentencePiece adds its space prefix at the start and after a special token
	for i := 0; i < len(text); {
		start, end, id := t.special.next(text, i, parseSpecial)
		if start < 0 {
			start, end = len(text), len(text)
		}
		fragEnd := start
		if id >= 0 && t.strip[id]&stripLeft != 0 {
			fragEnd = i + len(strings.TrimRightFunc(text[i:start], unicode.IsSpace))
		}
		if fragEnd > i {
			frag := text[i:fragEnd]
			prefix := v.AddSpacePrefix && prevSpecial && (i == 0 || !v.SpacePrefixFirstOnly) &&
				!(v.SpacePrefixUnlessSpace && frag[0] == ' ')
			dst = t.encodeFragment(dst, frag, prefix)
			prevSpecial = false
		}
		if id >= 0 {
			dst = append(dst, id)
			prevSpecial = true
			if t.strip[id]&stripRight != 0 {
				end = len(text) - len(strings.TrimLeftFunc(text[end:], unicode.IsSpace))
			}
		}
		i = end
	}
	switch {
	case addSpecial && bert && v.SEP >= 0:
		dst = append(dst, v.SEP)
	case addSpecial && v.AddEOS && v.EOS >= 0:
		dst = append(dst, v.EOS)
	}
	return dst
}

// encodeFragment segments text that holds no special token. prefix asks
// for SentencePiece's leading space.
func (t *Tokenizer) encodeFragment(dst []int32, text string, prefix bool) []int32 {
	if t.v.NFC {
		text = norm.NFC.String(text)
	}
	switch {
	case t.spm != nil:
		return t.spm.encode(dst, text, prefix)
	case t.spmBPE != nil:
		var b strings.Builder
		if prefix {
			b.WriteString(spmSpace)
		}
		b.WriteString(strings.ReplaceAll(text, " ", spmSpace))
		return t.spmBPE.encode(dst, b.String())
	case t.byteBPE != nil:
		t.pre.split(text, func(piece string) { dst = t.byteBPE.encode(dst, piece) })
		return dst
	default:
		return t.wpm.encode(dst, text)
	}
}
