// Package tokenizer turns text into token ids and back for the vocabularies
// LLMs ship: SentencePiece-style (llama), GPT-2 byte-level BPE and WordPiece
// (bert), loaded from GGUF metadata or Hugging Face tokenizer files.
package tokenizer

// TokenType is a token's kind, numbered as GGUF's tokenizer.ggml.token_type
// and SentencePiece number them.
type TokenType int32

// Token kinds.
const (
	TypeUndefined   TokenType = 0
	TypeNormal      TokenType = 1
	TypeUnknown     TokenType = 2
	TypeControl     TokenType = 3
	TypeUserDefined TokenType = 4
	TypeUnused      TokenType = 5
	TypeByte        TokenType = 6
)

// Vocab is the raw material of a tokenizer, whatever file it came from.
// Ids index Tokens, Scores and Types. An id of -1 means "none".
type Vocab struct {
	Model  string      // "llama" (SentencePiece-style), "gpt2" (byte-level BPE), "bert" (WordPiece)
	Pre    string      // pre-tokenizer name, as GGUF's tokenizer.ggml.pre spells it
	Tokens []string    // piece text per id
	Scores []float32   // per id; SentencePiece merge priority (higher merges first); may be nil
	Types  []TokenType // per id; may be nil (all normal)
	Merges []string    // BPE merges "a b", highest priority first

	BOS, EOS, UNK, PAD, SEP, MASK int32

	AddBOS, AddEOS          bool
	AddSpacePrefix          bool // SentencePiece: prepend "▁" to the text
	RemoveExtraSpaces       bool
	EscapeWhitespaces       bool // SentencePiece: spaces become "▁" (true for llama)
	TreatWhitespaceAsSuffix bool

	// Set by loaders that know them; the zero values are llama.cpp's defaults.
	IgnoreMerges bool    // BPE: a pre-token that is a normal token is kept whole (HF ignore_merges)
	NFC          bool    // normalize text to Unicode NFC before segmenting it
	EOG          []int32 // end-of-generation ids besides EOS (GGUF eot/eom ids, HF generation_config)
	ChatTemplate string  // Jinja chat template shipped with the vocabulary, if any

	// SpacePrefixFirstOnly limits AddSpacePrefix to the start of the text,
	// not each text after a special token (HF Metaspace prepend_scheme "first").
	SpacePrefixFirstOnly bool

	// LStrip and RStrip list special tokens that, matched in text, take the
	// white space before / after them along (HF added tokens' lstrip/rstrip).
	LStrip, RStrip []int32

	// SpacePrefixUnlessSpace skips AddSpacePrefix for text that already
	// starts with a space (HF's Metaspace; llama.cpp always adds it).
	SpacePrefixUnlessSpace bool
}
