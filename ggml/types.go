// Package ggml holds the tensor element types of the ggml family of formats
// (GGUF and llama.cpp): their numeric ids, names and block geometry.
//
// A quantized type stores elements in blocks: BlockSize elements take
// BlockBytes bytes. A row of n elements of type t therefore takes
// n/BlockSize*BlockBytes bytes, and n must be a multiple of BlockSize.
package ggml

import (
	"fmt"
	"math"
	"math/bits"
)

// Type is a ggml tensor element type id as stored in GGUF tensor infos.
type Type uint32

// Type ids as assigned by ggml. Ids 4 and 5 (Q4_2, Q4_3), 31–33 (Q4_0_4_4,
// Q4_0_4_8, Q4_0_8_8) and 36–38 (IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8) were
// removed from ggml and are rejected.
const (
	F32     Type = 0
	F16     Type = 1
	Q4_0    Type = 2
	Q4_1    Type = 3
	Q5_0    Type = 6
	Q5_1    Type = 7
	Q8_0    Type = 8
	Q8_1    Type = 9
	Q2_K    Type = 10
	Q3_K    Type = 11
	Q4_K    Type = 12
	Q5_K    Type = 13
	Q6_K    Type = 14
	Q8_K    Type = 15
	IQ2_XXS Type = 16
	IQ2_XS  Type = 17
	IQ3_XXS Type = 18
	IQ1_S   Type = 19
	IQ4_NL  Type = 20
	IQ3_S   Type = 21
	IQ2_S   Type = 22
	IQ4_XS  Type = 23
	I8      Type = 24
	I16     Type = 25
	I32     Type = 26
	I64     Type = 27
	F64     Type = 28
	IQ1_M   Type = 29
	BF16    Type = 30
	TQ1_0   Type = 34
	TQ2_0   Type = 35
	MXFP4   Type = 39
)

// QK_K is the super-block size of the k-quants and i-quants.
const QK_K = 256

type traits struct {
	name       string
	blockSize  uint64
	blockBytes uint64
	quantized  bool
}

// table is indexed by Type. Block geometry follows ggml's block structs
// (ggml-common.h); sizes are checked against gguf-py's GGML_QUANT_SIZES in
// the tests.
var table = [...]traits{
	F32:     {"F32", 1, 4, false},
	F16:     {"F16", 1, 2, false},
	Q4_0:    {"Q4_0", 32, 2 + 16, true},
	Q4_1:    {"Q4_1", 32, 2 + 2 + 16, true},
	Q5_0:    {"Q5_0", 32, 2 + 4 + 16, true},
	Q5_1:    {"Q5_1", 32, 2 + 2 + 4 + 16, true},
	Q8_0:    {"Q8_0", 32, 2 + 32, true},
	Q8_1:    {"Q8_1", 32, 2 + 2 + 32, true},
	Q2_K:    {"Q2_K", QK_K, QK_K/16 + QK_K/4 + 2 + 2, true},
	Q3_K:    {"Q3_K", QK_K, QK_K/8 + QK_K/4 + 12 + 2, true},
	Q4_K:    {"Q4_K", QK_K, 2 + 2 + 12 + QK_K/2, true},
	Q5_K:    {"Q5_K", QK_K, 2 + 2 + 12 + QK_K/8 + QK_K/2, true},
	Q6_K:    {"Q6_K", QK_K, QK_K/2 + QK_K/4 + QK_K/16 + 2, true},
	Q8_K:    {"Q8_K", QK_K, 4 + QK_K + QK_K/16*2, true},
	IQ2_XXS: {"IQ2_XXS", QK_K, 2 + QK_K/8*2, true},
	IQ2_XS:  {"IQ2_XS", QK_K, 2 + QK_K/8*2 + QK_K/32, true},
	IQ3_XXS: {"IQ3_XXS", QK_K, 2 + 3*QK_K/8, true},
	IQ1_S:   {"IQ1_S", QK_K, 2 + QK_K/8 + QK_K/32*2, true},
	IQ4_NL:  {"IQ4_NL", 32, 2 + 16, true},
	IQ3_S:   {"IQ3_S", QK_K, 2 + QK_K/4 + QK_K/32 + QK_K/8 + QK_K/64, true},
	IQ2_S:   {"IQ2_S", QK_K, 2 + QK_K/4 + QK_K/32 + QK_K/32, true},
	IQ4_XS:  {"IQ4_XS", QK_K, 2 + 2 + QK_K/64 + QK_K/2, true},
	I8:      {"I8", 1, 1, false},
	I16:     {"I16", 1, 2, false},
	I32:     {"I32", 1, 4, false},
	I64:     {"I64", 1, 8, false},
	F64:     {"F64", 1, 8, false},
	IQ1_M:   {"IQ1_M", QK_K, QK_K/8 + QK_K/16 + QK_K/32, true},
	BF16:    {"BF16", 1, 2, false},
	TQ1_0:   {"TQ1_0", QK_K, (QK_K-4*QK_K/64)/5 + QK_K/64 + 2, true},
	TQ2_0:   {"TQ2_0", QK_K, QK_K/4 + 2, true},
	MXFP4:   {"MXFP4", 32, 1 + 16, true},
}

func (t Type) traits() (traits, bool) {
	if uint64(t) >= uint64(len(table)) || table[t].name == "" {
		return traits{}, false
	}
	return table[t], true
}

// Valid reports whether t is a type id this package knows.
func (t Type) Valid() bool {
	_, ok := t.traits()
	return ok
}

// String returns the type's name as ggml spells it ("Q4_0", "BF16").
func (t Type) String() string {
	if tr, ok := t.traits(); ok {
		return tr.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockSize is the number of elements in one block (1 for plain types).
func (t Type) BlockSize() uint64 {
	tr, _ := t.traits()
	return tr.blockSize
}

// BlockBytes is the number of bytes one block occupies.
func (t Type) BlockBytes() uint64 {
	tr, _ := t.traits()
	return tr.blockBytes
}

// Quantized reports whether t is a block-quantized type.
func (t Type) Quantized() bool {
	tr, _ := t.traits()
	return tr.quantized
}

// ParseType returns the type whose name is s (as String spells it).
func ParseType(s string) (Type, error) {
	for i, tr := range table {
		if tr.name != "" && tr.name == s {
			return Type(i), nil
		}
	}
	return 0, fmt.Errorf("ggml: unknown tensor type %q", s)
}

// Types returns every known type in id order.
func Types() []Type {
	var out []Type
	for i, tr := range table {
		if tr.name != "" {
			out = append(out, Type(i))
		}
	}
	return out
}

// RowBytes returns the bytes taken by a row of n elements of type t. It fails
// when t is unknown or n is not a multiple of the block size.
func (t Type) RowBytes(n uint64) (uint64, error) {
	tr, ok := t.traits()
	if !ok {
		return 0, fmt.Errorf("unknown tensor type id %d", uint32(t))
	}
	if n%tr.blockSize != 0 {
		return 0, fmt.Errorf("%d elements is not a multiple of %s's block size %d", n, tr.name, tr.blockSize)
	}
	hi, lo := bits.Mul64(n/tr.blockSize, tr.blockBytes)
	if hi != 0 || lo > math.MaxInt64 {
		return 0, fmt.Errorf("%d elements of %s overflow a byte count", n, tr.name)
	}
	return lo, nil
}

// TensorBytes returns the bytes taken by a tensor of type t with the given
// dimensions (innermost first, as GGUF stores them). Every row (dims[0]
// elements) must be a whole number of blocks. Overflow is an error.
func (t Type) TensorBytes(dims []uint64) (uint64, error) {
	n, err := Elements(dims)
	if err != nil {
		return 0, err
	}
	if len(dims) > 0 {
		tr, ok := t.traits()
		if !ok {
			return 0, fmt.Errorf("unknown tensor type id %d", uint32(t))
		}
		if dims[0]%tr.blockSize != 0 {
			return 0, fmt.Errorf("row length %d is not a multiple of %s's block size %d", dims[0], tr.name, tr.blockSize)
		}
	}
	return t.RowBytes(n)
}

// Elements returns the product of dims, failing on overflow past 2^63.
func Elements(dims []uint64) (uint64, error) {
	n := uint64(1)
	for _, d := range dims {
		hi, lo := bits.Mul64(n, d)
		if hi != 0 || lo > math.MaxInt64 {
			return 0, fmt.Errorf("dimensions %v overflow an element count", dims)
		}
		n = lo
	}
	return n, nil
}
