package tokenizer

import (
	"bytes"
	"encoding/binary"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var spUpdateSeeds = flag.Bool("update-sp-seeds", false, "rewrite the FuzzSentencePiece seed corpus")

// spProto builds protobuf messages for tests.
type spProto []byte

func (p spProto) tag(num, wire int) spProto {
	return binary.AppendUvarint(p, uint64(num)<<3|uint64(wire))
}

func (p spProto) varint(num int, x uint64) spProto {
	return binary.AppendUvarint(p.tag(num, spWireVarint), x)
}

func (p spProto) int32(num int, x int32) spProto { return p.varint(num, uint64(int64(x))) }

func (p spProto) float(num int, f float32) spProto {
	return binary.LittleEndian.AppendUint32(p.tag(num, spWireFixed32), math.Float32bits(f))
}

func (p spProto) bytes(num int, b []byte) spProto {
	return append(binary.AppendUvarint(p.tag(num, spWireBytes), uint64(len(b))), b...)
}

func (p spProto) str(num int, s string) spProto { return p.bytes(num, []byte(s)) }

// spTestPiece is one SentencePiece message.
func spTestPiece(piece string, score float32, typ TokenType) []byte {
	p := spProto(nil).str(spFieldPiece, piece).float(spFieldScore, score)
	if typ != TypeNormal { // NORMAL is the default, usually left out
		p = p.varint(spFieldType, uint64(typ))
	}
	return p
}

// spTestModels are small ModelProtos: the unit tests' inputs and the fuzz
// target's seed corpus.
var spTestModels = map[string]func() []byte{
	// A Llama-style BPE model: byte fallback, no extra-space removal.
	"bpe": func() []byte {
		var m spProto
		for _, p := range []struct {
			s   string
			f   float32
			typ TokenType
		}{
			{"<unk>", 0, TypeUnknown}, {"<s>", 0, TypeControl}, {"</s>", 0, TypeControl},
			{"<0x0A>", 0, TypeByte}, {"<0xE2>", 0, TypeByte},
			{"▁", -1, TypeNormal}, {"a", -2, TypeNormal}, {"b", -3, TypeNormal}, {"▁a", -4, TypeNormal},
			{"ab", -5, TypeNormal}, {"▁ab", -6, TypeNormal}, {"<pad>", 0, TypeUserDefined}, {"zz", 0, TypeUnused},
		} {
			m = m.bytes(spFieldPieces, spTestPiece(p.s, p.f, p.typ))
		}
		trainer := spProto(nil).str(1, "corpus.txt").varint(spFieldModelType, 2).int32(4, 13).
			varint(35, 1).int32(spFieldUnkID, 0).int32(spFieldBosID, 1).int32(spFieldEosID, 2).int32(spFieldPadID, 11)
		norm := spProto(nil).str(1, "identity").varint(spFieldAddDummyPrefix, 1).
			varint(spFieldRemoveExtraSpaces, 0).varint(spFieldEscapeWhitespaces, 1)
		return m.bytes(spFieldTrainer, trainer).bytes(spFieldNormalizer, norm)
	},
	// A unigram model that relies on every default, with no BOS and fields
	// of every wire type this reader skips.
	"unigram": func() []byte {
		m := spProto(nil).bytes(spFieldPieces, spTestPiece("<unk>", 0, TypeUnknown)).
			bytes(spFieldPieces, spTestPiece("</s>", 0, TypeControl)).
			bytes(spFieldPieces, spTestPiece("▁x", -1.5, TypeNormal))
		m = m.bytes(spFieldTrainer, spProto(nil).int32(spFieldBosID, -1).int32(spFieldEosID, 1).float(10, 0.9995))
		m = binary.LittleEndian.AppendUint64(m.tag(200, spWireFixed64), 7)
		return m.bytes(4, spProto(nil).bytes(1, spProto(nil).str(1, "x").str(2, "▁x")))
	},
	// Only pieces: no specs at all.
	"pieces-only": func() []byte {
		return spProto(nil).bytes(spFieldPieces, spTestPiece("<unk>", 0, TypeUnknown)).
			bytes(spFieldPieces, spTestPiece("<s>", 0, TypeControl)).
			bytes(spFieldPieces, spTestPiece("</s>", 0, TypeControl))
	},
}

func TestParseSentencePiece(t *testing.T) {
	v, err := parseSentencePiece(spTestModels["bpe"]())
	if err != nil {
		t.Fatal(err)
	}
	if v.Model != "llama" || len(v.Tokens) != 13 || v.Tokens[8] != "▁a" || v.Scores[9] != -5 || v.Types[11] != TypeUserDefined || v.Types[6] != TypeNormal {
		t.Errorf("bpe model read as %+v", v)
	}
	if v.UNK != 0 || v.BOS != 1 || v.EOS != 2 || v.PAD != 11 || v.SEP != -1 || v.MASK != -1 ||
		!v.AddBOS || v.AddEOS || !v.AddSpacePrefix || v.RemoveExtraSpaces || !v.EscapeWhitespaces || v.TreatWhitespaceAsSuffix {
		t.Errorf("bpe model: ids or flags %+v", v)
	}
	s, err := newSPM(v)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.encode(nil, "ab\n", true); !slices.Equal(got, []int32{10, 3}) {
		t.Errorf("encode with the bpe model = %v, want [10 3]", got)
	}

	v, err = parseSentencePiece(spTestModels["unigram"]())
	if err != nil {
		t.Fatal(err)
	}
	if v.Model != "t5" || len(v.Tokens) != 3 || v.Scores[2] != -1.5 || v.BOS != -1 || v.EOS != 1 || v.PAD != -1 || v.AddBOS ||
		!v.AddSpacePrefix || !v.RemoveExtraSpaces || !v.EscapeWhitespaces {
		t.Errorf("unigram model read as %+v", v)
	}
}

func TestParseSentencePieceErrors(t *testing.T) {
	pieces := slices.Clip(spTestModels["pieces-only"]()) // three pieces, defaults valid; appends copy
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "no pieces"},
		{"truncated tag", []byte{0x80}, "bad field tag at byte 0"},
		{"field zero", []byte{0x00, 0x00}, "field number 0"},
		{"group", []byte{0x0b}, "unsupported wire type 3"},
		{"truncated varint", append(pieces, 0x08, 0xff), "bad varint at byte"},
		{"overlong varint", append(pieces, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), "bad varint"},
		{"length past end", append(pieces, 0x0a, 0x05, 'a'), "length 5 at byte"},
		{"huge length", append(pieces, 0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f), "runs past the end"},
		{"truncated fixed32", append(pieces, 0x15, 1, 2), "truncated fixed32"},
		{"truncated fixed64", append(pieces, 0x11, 1, 2), "truncated fixed64"},
		{"pieces not a message", spProto(nil).varint(spFieldPieces, 3), "pieces at byte 1: wire type 0, want 2"},
		{"score as varint", spProto(pieces).bytes(spFieldPieces, spProto(nil).str(1, "a").varint(spFieldScore, 1)), "pieces[3]: score at byte"},
		{"bad type", spProto(pieces).bytes(spFieldPieces, spTestPiece("a", 0, 9)), "pieces[3]: type 9"},
		{"empty piece", spProto(pieces).bytes(spFieldPieces, spTestPiece("", 0, TypeNormal)), "pieces[3]: empty piece"},
		{"broken piece", spProto(pieces).bytes(spFieldPieces, []byte{0x0a, 0x09}), "pieces[3]: field 1: length 9"},
		{"word model", spProto(pieces).bytes(spFieldTrainer, spProto(nil).varint(spFieldModelType, 3)), "model_type 3 is not supported"},
		{"model type as string", spProto(pieces).bytes(spFieldTrainer, spProto(nil).str(spFieldModelType, "bpe")), "trainer_spec: model_type at byte"},
		{"unk out of range", spProto(pieces).bytes(spFieldTrainer, spProto(nil).int32(spFieldUnkID, 5)), "unk_id 5 is outside the 3 pieces"},
		{"no unk", spProto(pieces).bytes(spFieldTrainer, spProto(nil).int32(spFieldUnkID, -1)), "unk_id is -1"},
		{"bos below -1", spProto(pieces).bytes(spFieldTrainer, spProto(nil).int32(spFieldBosID, -2)), "bos_id -2"},
		{"eos as float", spProto(pieces).bytes(spFieldTrainer, spProto(nil).float(spFieldEosID, 2)), "trainer_spec: field 42 at byte"},
		{"prefix as string", spProto(pieces).bytes(spFieldNormalizer, spProto(nil).str(spFieldAddDummyPrefix, "y")), "normalizer_spec: field 3"},
		{"trainer truncated", append(spProto(pieces).tag(spFieldTrainer, spWireBytes), 0x01, 0x80), "trainer_spec: bad field tag"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := parseSentencePiece(tc.data)
			if err == nil {
				t.Fatalf("no error; vocab %+v", v)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to say %q", err, tc.want)
			}
		})
	}
	if _, err := VocabFromSentencePiece(filepath.Join(t.TempDir(), "none.model")); err == nil {
		t.Error("no error for a missing file")
	}
	bad := filepath.Join(t.TempDir(), "bad.model")
	if err := os.WriteFile(bad, []byte{0x80}, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := VocabFromSentencePiece(bad); err == nil || !strings.Contains(err.Error(), "sentencepiece "+bad+": ") {
		t.Errorf("error %v does not name the file", err)
	}
}

// TestSentencePieceFiles reads the shared Llama 2 and Mistral models; the
// Llama 2 one must agree with llama.cpp's GGUF conversion of it token for
// token and pass the same vectors.
func TestSentencePieceFiles(t *testing.T) {
	tests := []struct {
		file     string
		n        int
		userDef  int
		id       int32
		piece    string
		typ      TokenType
		prefixed bool
	}{
		{"llama2-tokenizer/tokenizer.model", 32000, 0, 259, "▁▁", TypeNormal, true},
		{"mistral-spm/tokenizer.model.v1", 32000, 0, 771, "▁work", TypeNormal, true},
		{"mistral-spm/mistral_instruct_tokenizer_240323.model.v3", 32768, 20, 3, "[INST]", TypeControl, true},
	}
	for _, tc := range tests {
		t.Run(filepath.Base(tc.file), func(t *testing.T) {
			v, err := VocabFromSentencePiece(spTestdata(t, strings.Split(tc.file, "/")...))
			if err != nil {
				t.Fatal(err)
			}
			if v.Model != "llama" || len(v.Tokens) != tc.n || v.UNK != 0 || v.BOS != 1 || v.EOS != 2 || v.PAD != -1 {
				t.Errorf("model %q, %d pieces, unk %d bos %d eos %d pad %d", v.Model, len(v.Tokens), v.UNK, v.BOS, v.EOS, v.PAD)
			}
			if v.Tokens[tc.id] != tc.piece || v.Types[tc.id] != tc.typ {
				t.Errorf("piece %d = %q type %d, want %q type %d", tc.id, v.Tokens[tc.id], v.Types[tc.id], tc.piece, tc.typ)
			}
			userDef := 0
			for _, typ := range v.Types {
				if typ == TypeUserDefined {
					userDef++
				}
			}
			if n := userDef; n != tc.userDef {
				t.Errorf("%d user-defined pieces, want %d", n, tc.userDef)
			}
			if !v.AddBOS || v.AddEOS || v.AddSpacePrefix != tc.prefixed || v.RemoveExtraSpaces || !v.EscapeWhitespaces {
				t.Errorf("flags %+v", v)
			}
			if _, err := newSPM(v); err != nil {
				t.Error(err)
			}
		})
	}

	t.Run("llama2 = gguf", func(t *testing.T) {
		sp, err := VocabFromSentencePiece(spTestdata(t, "llama2-tokenizer", "tokenizer.model"))
		if err != nil {
			t.Fatal(err)
		}
		gg := spOpenGGUF(t, "llamacpp-vocab", "ggml-vocab-llama-spm.gguf")
		if !slices.Equal(sp.Tokens, gg.Tokens) || !slices.Equal(sp.Scores, gg.Scores) || !slices.Equal(sp.Types, gg.Types) {
			t.Error("pieces, scores or types differ from ggml-vocab-llama-spm.gguf")
		}
		s, err := newSPM(sp)
		if err != nil {
			t.Fatal(err)
		}
		spRunVectors(t, "llama-spm", func(dst []int32, text string) []int32 {
			return s.encode(dst, text, sp.AddSpacePrefix)
		})
	})
}

// TestSentencePieceSeeds keeps the committed seed corpus equal to
// spTestModels; -update-sp-seeds rewrites it.
func TestSentencePieceSeeds(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzSentencePiece")
	for name, build := range spTestModels {
		want := []byte("go test fuzz v1\n[]byte(" + strconv.Quote(string(build())) + ")\n")
		path := filepath.Join(dir, name)
		if *spUpdateSeeds {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run with -update-sp-seeds)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale (run with -update-sp-seeds)", path)
		}
	}
}

// FuzzSentencePiece feeds arbitrary bytes to the ModelProto reader, and
// what it accepts as a BPE model to the segmenter.
func FuzzSentencePiece(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := parseSentencePiece(data)
		if err != nil {
			return
		}
		n := len(v.Tokens)
		if n == 0 || len(v.Scores) != n || len(v.Types) != n {
			t.Fatalf("%d tokens, %d scores, %d types", n, len(v.Scores), len(v.Types))
		}
		for _, id := range []int32{v.UNK, v.BOS, v.EOS, v.PAD} {
			if id < -1 || int(id) >= n {
				t.Fatalf("special id %d outside %d tokens", id, n)
			}
		}
		if v.Model != "llama" {
			return
		}
		s, err := newSPM(v)
		if err != nil {
			return
		}
		for _, id := range s.encode(nil, "ab a\n\xe2\x96 zz€", true) {
			if id < 0 || int(id) >= n {
				t.Fatalf("encode gave id %d of %d tokens", id, n)
			}
		}
	})
}
