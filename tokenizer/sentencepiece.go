package tokenizer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// SentencePiece ModelProto field numbers (sentencepiece_model.proto).
const (
	spFieldPieces     = 1 // ModelProto.pieces: repeated SentencePiece
	spFieldTrainer    = 2 // ModelProto.trainer_spec
	spFieldNormalizer = 3 // ModelProto.normalizer_spec

	spFieldPiece = 1 // SentencePiece.piece: string
	spFieldScore = 2 // SentencePiece.score: float
	spFieldType  = 3 // SentencePiece.type: enum, NORMAL=1 … BYTE=6

	spFieldModelType        = 3  // TrainerSpec.model_type: UNIGRAM=1, BPE=2, WORD=3, CHAR=4
	spFieldWhitespaceSuffix = 24 // TrainerSpec.treat_whitespace_as_suffix
	spFieldUnkID            = 40 // TrainerSpec.unk_id, default 0
	spFieldBosID            = 41 // TrainerSpec.bos_id, default 1
	spFieldEosID            = 42 // TrainerSpec.eos_id, default 2
	spFieldPadID            = 43 // TrainerSpec.pad_id, default -1

	spFieldAddDummyPrefix    = 3 // NormalizerSpec.add_dummy_prefix, default true
	spFieldRemoveExtraSpaces = 4 // NormalizerSpec.remove_extra_whitespaces, default true
	spFieldEscapeWhitespaces = 5 // NormalizerSpec.escape_whitespaces, default true
)

// Protobuf wire types.
const (
	spWireVarint  = 0
	spWireFixed64 = 1
	spWireBytes   = 2
	spWireFixed32 = 5
)

// spMaxFile bounds the size of a .model file; real ones are a few MB.
const spMaxFile = 1 << 30

// VocabFromSentencePiece reads a SentencePiece model file (a serialized
// ModelProto, as tokenizer.model of Llama 2 or Mistral). A BPE model gives
// Model "llama", to be segmented by this package; a unigram model gives
// "t5", which it does not segment. BOS is added, as Llama's tokenizers do;
// EOS is not. The normalizer's precompiled rules are not applied (llama.cpp
// ignores them too); its flags are kept.
func VocabFromSentencePiece(path string) (*Vocab, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("sentencepiece: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("sentencepiece: %w", err)
	}
	if fi.Size() > spMaxFile {
		return nil, fmt.Errorf("sentencepiece %s: %d bytes is too large for a model", path, fi.Size())
	}
	data := make([]byte, fi.Size())
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, fmt.Errorf("sentencepiece %s: %w", path, err)
	}
	v, err := parseSentencePiece(data)
	if err != nil {
		return nil, fmt.Errorf("sentencepiece %s: %w", path, err)
	}
	return v, nil
}

// spSpecs holds the TrainerSpec and NormalizerSpec fields read, with
// sentencepiece_model.proto's defaults.
type spSpecs struct {
	modelType                    uint64
	unk, bos, eos, pad           int64
	whitespaceSuffix             bool
	dummyPrefix, removeExtra, ws bool
}

func parseSentencePiece(data []byte) (*Vocab, error) {
	v := &Vocab{}
	sp := spSpecs{modelType: 1, unk: 0, bos: 1, eos: 2, pad: -1, dummyPrefix: true, removeExtra: true, ws: true}
	err := spFields(data, 0, func(num, wire int, val uint64, b []byte, off int) error {
		switch num {
		case spFieldPieces:
			if wire != spWireBytes {
				return spWireError("pieces", wire, spWireBytes, off)
			}
			if err := spPiece(v, b, off); err != nil {
				return fmt.Errorf("pieces[%d]: %w", len(v.Tokens), err)
			}
		case spFieldTrainer:
			if wire != spWireBytes {
				return spWireError("trainer_spec", wire, spWireBytes, off)
			}
			if err := spTrainer(&sp, b, off); err != nil {
				return fmt.Errorf("trainer_spec: %w", err)
			}
		case spFieldNormalizer:
			if wire != spWireBytes {
				return spWireError("normalizer_spec", wire, spWireBytes, off)
			}
			if err := spNormalizer(&sp, b, off); err != nil {
				return fmt.Errorf("normalizer_spec: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	n := len(v.Tokens)
	if n == 0 {
		return nil, errors.New("no pieces")
	}
	switch sp.modelType {
	case 1:
		v.Model = "t5"
	case 2:
		v.Model, v.Pre = "llama", "default"
	default:
		return nil, fmt.Errorf("trainer_spec.model_type %d is not supported (want 1, unigram, or 2, BPE)", sp.modelType)
	}
	ids := []struct {
		name string
		x    int64
		dst  *int32
	}{{"unk_id", sp.unk, &v.UNK}, {"bos_id", sp.bos, &v.BOS}, {"eos_id", sp.eos, &v.EOS}, {"pad_id", sp.pad, &v.PAD}}
	for _, id := range ids {
		if id.x < -1 || id.x >= int64(n) {
			return nil, fmt.Errorf("trainer_spec.%s %d is outside the %d pieces", id.name, id.x, n)
		}
		*id.dst = int32(id.x)
	}
	if v.UNK < 0 {
		return nil, errors.New("trainer_spec.unk_id is -1: SentencePiece needs an unknown piece")
	}
	v.SEP, v.MASK = -1, -1
	v.AddBOS = v.BOS >= 0
	v.AddSpacePrefix = sp.dummyPrefix
	v.RemoveExtraSpaces = sp.removeExtra
	v.EscapeWhitespaces = sp.ws
	v.TreatWhitespaceAsSuffix = sp.whitespaceSuffix
	return v, nil
}

// spPiece appends one SentencePiece message, found at byte off, to v.
func spPiece(v *Vocab, data []byte, off int) error {
	piece, score, typ := "", float32(0), TypeNormal
	err := spFields(data, off, func(num, wire int, val uint64, b []byte, off int) error {
		switch num {
		case spFieldPiece:
			if wire != spWireBytes {
				return spWireError("piece", wire, spWireBytes, off)
			}
			piece = string(b)
		case spFieldScore:
			if wire != spWireFixed32 {
				return spWireError("score", wire, spWireFixed32, off)
			}
			score = math.Float32frombits(uint32(val))
		case spFieldType:
			if wire != spWireVarint {
				return spWireError("type", wire, spWireVarint, off)
			}
			if val < uint64(TypeNormal) || val > uint64(TypeByte) {
				return fmt.Errorf("type %d at byte %d is not a piece type (1..6)", val, off)
			}
			typ = TokenType(val)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if piece == "" {
		return fmt.Errorf("empty piece at byte %d", off)
	}
	v.Tokens = append(v.Tokens, piece)
	v.Scores = append(v.Scores, score)
	v.Types = append(v.Types, typ)
	return nil
}

func spTrainer(sp *spSpecs, data []byte, off int) error {
	return spFields(data, off, func(num, wire int, val uint64, b []byte, off int) error {
		var dst *int64
		switch num {
		case spFieldModelType:
			if wire != spWireVarint {
				return spWireError("model_type", wire, spWireVarint, off)
			}
			sp.modelType = val
		case spFieldWhitespaceSuffix:
			if wire != spWireVarint {
				return spWireError("treat_whitespace_as_suffix", wire, spWireVarint, off)
			}
			sp.whitespaceSuffix = val != 0
		case spFieldUnkID:
			dst = &sp.unk
		case spFieldBosID:
			dst = &sp.bos
		case spFieldEosID:
			dst = &sp.eos
		case spFieldPadID:
			dst = &sp.pad
		}
		if dst != nil {
			if wire != spWireVarint {
				return spWireError(fmt.Sprintf("field %d", num), wire, spWireVarint, off)
			}
			// An int32 on the wire is sign-extended to 64 bits; like
			// protobuf's own parsers, keep the low 32.
			*dst = int64(int32(val))
		}
		return nil
	})
}

func spNormalizer(sp *spSpecs, data []byte, off int) error {
	return spFields(data, off, func(num, wire int, val uint64, b []byte, off int) error {
		var dst *bool
		switch num {
		case spFieldAddDummyPrefix:
			dst = &sp.dummyPrefix
		case spFieldRemoveExtraSpaces:
			dst = &sp.removeExtra
		case spFieldEscapeWhitespaces:
			dst = &sp.ws
		default:
			return nil
		}
		if wire != spWireVarint {
			return spWireError(fmt.Sprintf("field %d", num), wire, spWireVarint, off)
		}
		*dst = val != 0
		return nil
	})
}

func spWireError(field string, got, want, off int) error {
	return fmt.Errorf("%s at byte %d: wire type %d, want %d", field, off, got, want)
}

// spFields walks the fields of one protobuf message that starts at byte
// base of the file, calling fn with each field's number, wire type and
// value: val for varint and fixed-size fields, b for length-delimited ones
// (a view of data), and the byte offset of the value. Every length is
// checked against the bytes left.
func spFields(data []byte, base int, fn func(num, wire int, val uint64, b []byte, off int) error) error {
	for p := 0; p < len(data); {
		start := base + p
		tag, n := binary.Uvarint(data[p:])
		if n <= 0 {
			return fmt.Errorf("bad field tag at byte %d", start)
		}
		p += n
		num, wire := tag>>3, int(tag&7)
		if num == 0 || num > math.MaxInt32>>3 {
			return fmt.Errorf("field number %d at byte %d", num, start)
		}
		var val uint64
		var b []byte
		off := base + p
		switch wire {
		case spWireVarint:
			if val, n = binary.Uvarint(data[p:]); n <= 0 {
				return fmt.Errorf("field %d: bad varint at byte %d", num, off)
			}
			p += n
		case spWireFixed64:
			if len(data)-p < 8 {
				return fmt.Errorf("field %d: truncated fixed64 at byte %d", num, off)
			}
			val = binary.LittleEndian.Uint64(data[p:])
			p += 8
		case spWireFixed32:
			if len(data)-p < 4 {
				return fmt.Errorf("field %d: truncated fixed32 at byte %d", num, off)
			}
			val = uint64(binary.LittleEndian.Uint32(data[p:]))
			p += 4
		case spWireBytes:
			size, n := binary.Uvarint(data[p:])
			if n <= 0 {
				return fmt.Errorf("field %d: bad length at byte %d", num, off)
			}
			p += n
			off = base + p
			if size > uint64(len(data)-p) {
				return fmt.Errorf("field %d: length %d at byte %d runs past the end of its message (%d bytes left)", num, size, off, len(data)-p)
			}
			b = data[p : p+int(size)]
			p += int(size)
		default:
			return fmt.Errorf("field %d: unsupported wire type %d at byte %d", num, wire, start)
		}
		if err := fn(int(num), wire, val, b, off); err != nil {
			return err
		}
	}
	return nil
}
