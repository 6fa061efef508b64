package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// piece computes the bytes token id stands for, with no leading space
// stripped: a SentencePiece "▁the" is " the", a byte token "<0x0A>" is "\n",
// a byte-level "Ġthe" is " the", a WordPiece "▁the" is " the" and its
// continuation "ing" is "ing". Control, unknown and user-defined tokens are
// their text (a WordPiece control token with a space before it, as Hugging
// Face joins them); unused tokens are empty.
func (t *Tokenizer) piece(id int32) string {
	text := t.v.Tokens[id]
	switch typ := t.types[id]; {
	case typ == TypeUnused:
		return ""
	case typ == TypeControl || typ == TypeUnknown || typ == TypeUserDefined:
		if t.wpm != nil && typ != TypeUserDefined {
			return " " + text
		}
		return text
	case typ == TypeByte && t.byteBPE == nil:
		if b, ok := spmByteToken(text); ok {
			return string([]byte{b})
		}
		return text
	}
	switch {
	case t.byteBPE != nil:
		if b, ok := byteLevelDecode(nil, text); ok {
			return string(b)
		}
		return text
	default: // SentencePiece and WordPiece spell a space (or a word start) as ▁
		return strings.ReplaceAll(text, spmSpace, " ")
	}
}

// Piece returns the bytes token id stands for, as Decode would join them:
// " the" for SentencePiece's "▁the" or GPT-2's "Ġthe", "\n" for "<0x0A>",
// the text of a control token such as "<|im_end|>". A piece may be part of
// a UTF-8 character. An id outside the vocabulary has no piece.
func (t *Tokenizer) Piece(id int32) string {
	if id < 0 || int(id) >= len(t.pieces) {
		return ""
	}
	return t.pieces[id]
}

// DecodeOptions change how Decode renders ids.
type DecodeOptions struct {
	// SkipSpecial drops control and unknown tokens (BOS, <|im_end|>, <unk>),
	// as Hugging Face's skip_special_tokens does.
	SkipSpecial bool
	// CleanUp removes the space before punctuation and English
	// contractions (" ." -> ".", " n't" -> "n't"), as Hugging Face's
	// clean_up_tokenization_spaces does. It loses information.
	CleanUp bool
}

// Decode returns the text of ids: their pieces joined, less the one space a
// SentencePiece or WordPiece vocabulary puts before the first word. Control
// tokens appear as their text. Bytes of an incomplete UTF-8 character are
// kept as they are, so Decode(Encode(s)) == s for any s the vocabulary can
// spell. Ids outside the vocabulary are skipped.
func (t *Tokenizer) Decode(ids []int32) string { return t.DecodeWith(ids, DecodeOptions{}) }

// DecodeWith is Decode with options.
func (t *Tokenizer) DecodeWith(ids []int32, o DecodeOptions) string {
	var b strings.Builder
	for _, id := range ids {
		if o.SkipSpecial && t.isSpecial(id) {
			continue
		}
		b.WriteString(t.Piece(id))
	}
	s := b.String()
	if t.stripsLeadingSpace() {
		s = strings.TrimPrefix(s, " ")
	}
	if o.CleanUp {
		s = cleanUpSpaces(s)
	}
	return s
}

// isSpecial reports whether id is a control or unknown token.
func (t *Tokenizer) isSpecial(id int32) bool {
	typ := t.Type(id)
	return typ == TypeControl || typ == TypeUnknown
}

// stripsLeadingSpace reports whether decoding drops the space the encoder
// put before the first word.
func (t *Tokenizer) stripsLeadingSpace() bool {
	return t.wpm != nil || ((t.spm != nil || t.spmBPE != nil) && t.v.AddSpacePrefix)
}

// cleanUpSpaces is Hugging Face's clean_up_tokenization, replacement by
// replacement in its order.
func cleanUpSpaces(s string) string {
	for _, r := range [][2]string{
		{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
		{" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
	} {
		s = strings.ReplaceAll(s, r[0], r[1])
	}
	return s
}

// StreamDecoder turns ids generated one at a time into text, holding back
// the bytes of a UTF-8 character until its last byte arrives, so that what
// it returns is always whole characters. It keeps every piece's leading
// space. It is not safe for concurrent use.
type StreamDecoder struct {
	t           *Tokenizer
	skipSpecial bool
	pending     []byte // an incomplete character's first bytes
}

// NewStreamDecoder returns a decoder for ids generated in sequence. With
// skipSpecial, control and unknown tokens produce no text.
func (t *Tokenizer) NewStreamDecoder(skipSpecial bool) *StreamDecoder {
	return &StreamDecoder{t: t, skipSpecial: skipSpecial}
}

// Add decodes one more id and returns the text it completes, often "".
// Bytes that can never form a character come out as U+FFFD.
func (d *StreamDecoder) Add(id int32) string {
	if d.skipSpecial && d.t.isSpecial(id) {
		return ""
	}
	p := d.t.Piece(id)
	if len(d.pending) == 0 && utf8.ValidString(p) {
		return p
	}
	d.pending = append(d.pending, p...)
	keep := incompleteTail(d.pending)
	out := strings.ToValidUTF8(string(d.pending[:len(d.pending)-keep]), "\uFFFD")
	d.pending = append(d.pending[:0], d.pending[len(d.pending)-keep:]...)
	return out
}

// Flush returns what is held back, an incomplete character as U+FFFD, and
// resets the decoder.
func (d *StreamDecoder) Flush() string {
	out := strings.ToValidUTF8(string(d.pending), "\uFFFD")
	d.pending = d.pending[:0]
	return out
}

// incompleteTail returns how many bytes at the end of b are the start of a
// UTF-8 character that more bytes could still complete.
func incompleteTail(b []byte) int {
	for k := 1; k <= min(3, len(b)); k++ {
		c := b[len(b)-k]
		if c < 0x80 {
			return 0 // ASCII: nothing pending
		}
		if c >= 0xC0 { // a lead byte: pending if more bytes could complete it
			if !utf8.FullRune(b[len(b)-k:]) {
				return k
			}
			return 0
		}
	}
	return 0
}
