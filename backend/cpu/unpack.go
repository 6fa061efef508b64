package cpu

import (
	"encoding/binary"

	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/quant"
)

// The unpackers read one stored block of a ggml type as small unsigned
// integers and the scales that turn them into values, so that every
// quantized type becomes
//
//	x = d·sc·(u − offset) − dmin·m
//
// with u an unsigned byte (u4 types fit a nibble), sc and m per sub-block
// integers, d and dmin fp16 bits copied verbatim. The legacy types have one
// sub-block per block and sc = 1. Bit layouts are ggml's (see package quant,
// whose dequantizers these must agree with; the tests check that they do).

// legacyUnpack fills q with a 32-element block's levels and returns d and,
// for the affine types, m as fp16 bits.
type legacyUnpack func(blk []byte, q *[32]uint8) (d, m uint16)

// kUnpack fills q with a 256-element super-block's levels and sc, mn with
// its sub-block scales and mins, returning d and dmin as fp16 bits.
type kUnpack func(sb []byte, q *[256]uint8, sc *[16]int8, mn *[16]uint8) (d, dmin uint16)

func le16(b []byte) uint16 { return binary.LittleEndian.Uint16(b) }

func nibbles(qs []byte, q *[32]uint8) {
	for j, b := range qs[:16] {
		q[j], q[j+16] = b&0xf, b>>4
	}
}

func unpackQ4_0(b []byte, q *[32]uint8) (uint16, uint16) {
	nibbles(b[2:18], q)
	return le16(b), 0
}

func unpackQ4_1(b []byte, q *[32]uint8) (uint16, uint16) {
	nibbles(b[4:20], q)
	return le16(b), le16(b[2:])
}

func highBits(qh uint32, q *[32]uint8) {
	for j := range q {
		q[j] |= uint8(qh>>j&1) << 4
	}
}

func unpackQ5_0(b []byte, q *[32]uint8) (uint16, uint16) {
	nibbles(b[6:22], q)
	highBits(binary.LittleEndian.Uint32(b[2:]), q)
	return le16(b), 0
}

func unpackQ5_1(b []byte, q *[32]uint8) (uint16, uint16) {
	nibbles(b[8:24], q)
	highBits(binary.LittleEndian.Uint32(b[4:]), q)
	return le16(b), le16(b[2:])
}

// unpackQ8_0 shifts the signed quants by 128 (offset 128).
func unpackQ8_0(b []byte, q *[32]uint8) (uint16, uint16) {
	for j, v := range b[2:34] {
		q[j] = v ^ 0x80
	}
	return le16(b), 0
}

// iq4Levels is the IQ4_NL / IQ4_XS codebook shifted by 128 (offset 128).
var iq4Levels = func() (t [16]uint8) {
	for i, v := range [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113} {
		t[i] = uint8(int(v) + 128)
	}
	return t
}()

func unpackIQ4_NL(b []byte, q *[32]uint8) (uint16, uint16) {
	nibbles(b[2:18], q)
	for j := range q {
		q[j] = iq4Levels[q[j]]
	}
	return le16(b), 0
}

func unpackQ2_K(b []byte, q *[256]uint8, sc *[16]int8, mn *[16]uint8) (uint16, uint16) {
	for i, s := range b[0:16] {
		sc[i], mn[i] = int8(s&0xf), s>>4
	}
	qs := b[16:80]
	for i := range 256 {
		h, j, l := i/128, (i%128)/32, i%32
		q[i] = qs[32*h+l] >> (2 * j) & 3
	}
	return le16(b[80:]), le16(b[82:])
}

func unpackQ3_K(b []byte, q *[256]uint8, sc *[16]int8, _ *[16]uint8) (uint16, uint16) {
	hmask, qs, s := b[0:32], b[32:96], b[96:108]
	for j := range 16 {
		lo := s[j%8] >> (4 * (j / 8)) & 0xf
		hi := s[8+j%4] >> (2 * (j / 4)) & 3
		sc[j] = int8(lo|hi<<4) - 32
	}
	for i := range 256 {
		h, j, l := i/128, (i%128)/32, i%32
		// level u = low two bits + 4·(high bit); value u − 4
		q[i] = qs[32*h+l]>>(2*j)&3 | (hmask[l]>>(i/32)&1)<<2
	}
	return le16(b[108:]), 0
}

func unpackQ4_K(b []byte, q *[256]uint8, sc *[16]int8, mn *[16]uint8) (uint16, uint16) {
	qs := b[16:144]
	for s := range 8 {
		c, m := quant.ScaleMinK4(s, b[4:16])
		sc[s], mn[s] = int8(c), m
		for l := range 32 {
			q[32*s+l] = qs[32*(s/2)+l] >> (4 * (s % 2)) & 0xf
		}
	}
	return le16(b), le16(b[2:])
}

func unpackQ5_K(b []byte, q *[256]uint8, sc *[16]int8, mn *[16]uint8) (uint16, uint16) {
	qh, qs := b[16:48], b[48:176]
	for s := range 8 {
		c, m := quant.ScaleMinK4(s, b[4:16])
		sc[s], mn[s] = int8(c), m
		for l := range 32 {
			q[32*s+l] = qs[32*(s/2)+l]>>(4*(s%2))&0xf | (qh[l]>>s&1)<<4
		}
	}
	return le16(b), le16(b[2:])
}

func unpackQ6_K(b []byte, q *[256]uint8, sc *[16]int8, _ *[16]uint8) (uint16, uint16) {
	for s, v := range b[192:208] {
		sc[s] = int8(v)
	}
	for h := range 2 {
		ql, qh := b[64*h:64*h+64], b[128+32*h:128+32*h+32]
		y := q[128*h : 128*h+128]
		for l := range 32 {
			a, c, hb := ql[l], ql[l+32], qh[l]
			y[l] = a&0xf | (hb&3)<<4
			y[l+32] = c&0xf | (hb>>2&3)<<4
			y[l+64] = a>>4 | (hb>>4&3)<<4
			y[l+96] = c>>4 | (hb>>6)<<4
		}
	}
	return le16(b[208:]), 0
}

func unpackIQ4_XS(b []byte, q *[256]uint8, sc *[16]int8, _ *[16]uint8) (uint16, uint16) {
	sh, sl, qs := le16(b[2:]), b[4:8], b[8:136]
	for ib := range 8 {
		ls := int(sl[ib/2]>>(4*(ib%2))&0xf) | int(sh>>(2*ib)&3)<<4
		sc[ib] = int8(ls - 32)
		for j, v := range qs[16*ib : 16*ib+16] {
			q[32*ib+j], q[32*ib+j+16] = iq4Levels[v&0xf], iq4Levels[v>>4]
		}
	}
	return le16(b), 0
}

// format describes how a stored type is repacked and multiplied.
type format struct {
	typ    ggml.Type
	family family
	block  int  // elements per stored block (1 for floats)
	sub    int  // elements per sub-block scale (k-quants: 16 or 32)
	u4     bool // levels stored as nibbles, two per byte
	hbits  int  // u4: bits above the nibble, kept in planes beside it (5- and 6-bit types)
	hasMin bool // x has a − dmin·m term (affine types)
	offset int32
	legacy legacyUnpack
	kquant kUnpack
	elem   int // bytes per element for the float family
}

type family int

const (
	famLegacy family = iota // 32-element blocks × Q8 activations
	famK                    // 256-element super-blocks × Q8_K activations
	famFloat                // F32 / F16 / BF16 × float32 activations
)

// formats lists the types the packed kernels multiply by; others (MLX
// affine types) take the row-by-row dequantizing path.
var formats = map[ggml.Type]*format{
	ggml.Q4_0:   {family: famLegacy, block: 32, u4: true, offset: 8, legacy: unpackQ4_0},
	ggml.Q4_1:   {family: famLegacy, block: 32, u4: true, hasMin: true, legacy: unpackQ4_1},
	ggml.Q5_0:   {family: famLegacy, block: 32, u4: true, hbits: 1, offset: 16, legacy: unpackQ5_0},
	ggml.Q5_1:   {family: famLegacy, block: 32, u4: true, hbits: 1, hasMin: true, legacy: unpackQ5_1},
	ggml.Q8_0:   {family: famLegacy, block: 32, offset: 128, legacy: unpackQ8_0},
	ggml.IQ4_NL: {family: famLegacy, block: 32, offset: 128, legacy: unpackIQ4_NL},
	ggml.Q2_K:   {family: famK, block: 256, sub: 16, u4: true, hasMin: true, kquant: unpackQ2_K},
	ggml.Q3_K:   {family: famK, block: 256, sub: 16, u4: true, offset: 4, kquant: unpackQ3_K},
	ggml.Q4_K:   {family: famK, block: 256, sub: 32, u4: true, hasMin: true, kquant: unpackQ4_K},
	ggml.Q5_K:   {family: famK, block: 256, sub: 32, u4: true, hbits: 1, hasMin: true, kquant: unpackQ5_K},
	ggml.Q6_K:   {family: famK, block: 256, sub: 16, u4: true, hbits: 2, offset: 32, kquant: unpackQ6_K},
	ggml.IQ4_XS: {family: famK, block: 256, sub: 32, offset: 128, kquant: unpackIQ4_XS},
	ggml.F32:    {family: famFloat, block: 1, elem: 4},
	ggml.F16:    {family: famFloat, block: 1, elem: 2},
	ggml.BF16:   {family: famFloat, block: 1, elem: 2},
}

func init() {
	for t, f := range formats {
		f.typ = t
	}
}
