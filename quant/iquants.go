package quant

import "encoding/binary"

// The lattice i-quants: groups of 8 (or 4) elements are an index into a
// table of magnitude patterns (iqgrid.go, iqgrid1.go) plus per-element sign
// bits, scaled by a 4-bit sub-block scale times the super-block's fp16 d.
// Elements run in table order: entry byte j is element j of its group.

// ksigns expands a 7-bit sign index into 8 sign bits: the eighth bit makes
// the number of negative signs even (ggml's ksigns_iq2xs).
var ksigns = func() (t [128]uint8) {
	for i := range t {
		p := uint8(0)
		for b := i; b != 0; b >>= 1 {
			p ^= uint8(b & 1)
		}
		t[i] = uint8(i) | p<<7
	}
	return t
}()

// putGrid8 writes the eight elements db·g_j of grid entry g, negated where
// bit j of signs is set.
func putGrid8(y []float32, db float32, g uint64, signs uint8) {
	y = y[:8:8]
	for j := range 8 {
		v := db * float32(uint8(g>>(8*j)))
		if signs>>j&1 != 0 {
			v = -v
		}
		y[j] = v
	}
}

// putGrid4 writes four elements of a 4-wide grid entry, with sign bits
// starting at bit first of signs.
func putGrid4(y []float32, db float32, g uint32, signs uint8, first int) {
	y = y[:4:4]
	for j := range 4 {
		v := db * float32(uint8(g>>(8*j)))
		if signs>>(first+j)&1 != 0 {
			v = -v
		}
		y[j] = v
	}
}

// IQ2_XXS: d fp16 | 8 × (4 grid indices | u32 aux) = 66 bytes. For each 32
// elements, aux holds four 7-bit sign indices (bits 7l..7l+6) and a 4-bit
// scale s (bits 28..31): db = d·(0.5+s)·0.25.
func dequantIQ2_XXS(src []byte, dst []float32) {
	for ; len(dst) >= qkK; src, dst = src[66:], dst[qkK:] {
		d := f16(src)
		qs := src[2:66:66]
		for ib := range 8 {
			g := qs[8*ib : 8*ib+8]
			aux := binary.LittleEndian.Uint32(g[4:])
			db := d * (0.5 + float32(aux>>28)) * 0.25
			for l := range 4 {
				putGrid8(dst[32*ib+8*l:], db, iq2xxsGrid[g[l]], ksigns[aux>>(7*l)&127])
			}
		}
	}
}

// IQ2_XS: d fp16 | qs[32] u16 | scales[8] = 74 bytes. Each u16 is a 9-bit
// grid index and a 7-bit sign index; scale nibble k of scales[ib] covers
// the ib-th 32 elements' half k: db = d·(0.5+s)·0.25.
func dequantIQ2_XS(src []byte, dst []float32) {
	for ; len(dst) >= qkK; src, dst = src[74:], dst[qkK:] {
		d := f16(src)
		qs := src[2:66:66]
		scales := src[66:74:74]
		for ib := range 8 {
			db := [2]float32{
				d * (0.5 + float32(scales[ib]&0xf)) * 0.25,
				d * (0.5 + float32(scales[ib]>>4)) * 0.25,
			}
			for l := range 4 {
				q := binary.LittleEndian.Uint16(qs[2*(4*ib+l):])
				putGrid8(dst[32*ib+8*l:], db[l/2], iq2xsGrid[q&511], ksigns[q>>9])
			}
		}
	}
}

// IQ2_S: d fp16 | qs[32] | signs[32] | qh[8] | scales[8] = 82 bytes. Group
// l of the ib-th 32 elements uses grid index qs[4ib+l] | bits 2l..2l+1 of
// qh[ib] << 8 and the sign byte signs[4ib+l] directly.
func dequantIQ2_S(src []byte, dst []float32) {
	for ; len(dst) >= qkK; src, dst = src[82:], dst[qkK:] {
		d := f16(src)
		qs := src[2:34:34]
		signs := src[34:66:66]
		qh := src[66:74:74]
		scales := src[74:82:82]
		for ib := range 8 {
			db := [2]float32{
				d * (0.5 + float32(scales[ib]&0xf)) * 0.25,
				d * (0.5 + float32(scales[ib]>>4)) * 0.25,
			}
			for l := range 4 {
				idx := int(qs[4*ib+l]) | int(qh[ib]>>(2*l)&3)<<8
				putGrid8(dst[32*ib+8*l:], db[l/2], iq2sGrid[idx], signs[4*ib+l])
			}
		}
	}
}

// IQ3_XXS: d fp16 | qs[64] grid indices | 8 × u32 aux = 98 bytes. Each 32
// elements are 8 groups of 4; aux is as in IQ2_XXS, each sign byte covering
// two groups, with db = d·(0.5+s)·0.5.
func dequantIQ3_XXS(src []byte, dst []float32) {
	for ; len(dst) >= qkK; src, dst = src[98:], dst[qkK:] {
		d := f16(src)
		qs := src[2:66:66]
		aux := src[66:98:98]
		for ib := range 8 {
			a := binary.LittleEndian.Uint32(aux[4*ib:])
			db := d * (0.5 + float32(a>>28)) * 0.5
			for l := range 4 {
				signs := ksigns[a>>(7*l)&127]
				y := dst[32*ib+8*l:]
				putGrid4(y, db, iq3xxsGrid[qs[8*ib+2*l]], signs, 0)
				putGrid4(y[4:], db, iq3xxsGrid[qs[8*ib+2*l+1]], signs, 4)
			}
		}
	}
}

// IQ3_S: d fp16 | qs[64] | qh[8] | signs[32] | scales[4] = 110 bytes.
// Group k of the ib-th 32 elements has grid index qs[8ib+k] | bit k of
// qh[ib] << 8; sign byte signs[4ib + k/2] covers groups k and k+1; the
// scale is db = d·(1 + 2s) with s nibble ib%2 of scales[ib/2].
func dequantIQ3_S(src []byte, dst []float32) {
	for ; len(dst) >= qkK; src, dst = src[110:], dst[qkK:] {
		d := f16(src)
		qs := src[2:66:66]
		qh := src[66:74:74]
		signs := src[74:106:106]
		scales := src[106:110:110]
		for ib := range 8 {
			s := scales[ib/2] >> (4 * (ib % 2)) & 0xf
			db := d * float32(1+2*s)
			for l := range 4 {
				i1 := int(qs[8*ib+2*l]) | int(qh[ib]>>(2*l)&1)<<8
				i2 := int(qs[8*ib+2*l+1]) | int(qh[ib]>>(2*l+1)&1)<<8
				y := dst[32*ib+8*l:]
				putGrid4(y, db, iq3sGrid[i1], signs[4*ib+l], 0)
				putGrid4(y[4:], db, iq3sGrid[i2], signs[4*ib+l], 4)
			}
		}
	}
}

// iq1Delta shifts every IQ1 lattice point by ±1/8.
const iq1Delta = 0.125

// putGrid1 writes dl·(g_j + delta) for the eight signed bytes of an IQ1
// grid entry.
func putGrid1(y []float32, dl float32, g uint64, delta float32) {
	y = y[:8:8]
	for j := range 8 {
		y[j] = dl * (float32(int8(g>>(8*j))) + delta)
	}
}

// IQ1_S: d fp16 | qs[32] | qh[8] u16 = 50 bytes. For the ib-th 32 elements
// qh[ib] holds four 3-bit index extensions (bits 3l..3l+2), a 3-bit scale s
// (bits 12..14, dl = d·(2s+1)) and the delta's sign (bit 15).
func dequantIQ1_S(src []byte, dst []float32) {
	for ; len(dst) >= qkK; src, dst = src[50:], dst[qkK:] {
		d := f16(src)
		qs := src[2:34:34]
		qhb := src[34:50:50]
		for ib := range 8 {
			qh := binary.LittleEndian.Uint16(qhb[2*ib:])
			dl := d * float32(2*(qh>>12&7)+1)
			delta := float32(iq1Delta)
			if qh&0x8000 != 0 {
				delta = -iq1Delta
			}
			for l := range 4 {
				idx := int(qs[4*ib+l]) | int(qh>>(3*l)&7)<<8
				putGrid1(dst[32*ib+8*l:], dl, iq1sGrid[idx], delta)
			}
		}
	}
}

// IQ1_M: qs[32] | qh[16] | scales[8] = 56 bytes, no separate d: the fp16 d
// is spread over the top nibbles of the four u16 scale words (bits 12..15
// of word k are bits 4k..4k+3 of d). Each 16 elements have a 3-bit scale
// (word ib/2, bits 6(ib%2) + 3h), dl = d·(2s+1). Group l of the ib-th 32
// elements extends qs[4ib+l] with bits 0..2 (even l) or 4..6 (odd l) of
// qh[2ib + l/2]; bit 3 or 7 there is the delta's sign.
func dequantIQ1_M(src []byte, dst []float32) {
	for ; len(dst) >= qkK; src, dst = src[56:], dst[qkK:] {
		qs := src[0:32:32]
		qh := src[32:48:48]
		var sc [4]uint16
		for k := range sc {
			sc[k] = binary.LittleEndian.Uint16(src[48+2*k:])
		}
		d := F16ToF32(sc[0]>>12 | sc[1]>>8&0x00f0 | sc[2]>>4&0x0f00 | sc[3]&0xf000)
		for ib := range 8 {
			w := sc[ib/2] >> (6 * (ib % 2))
			dl := [2]float32{
				d * float32(2*(w&7)+1),
				d * float32(2*(w>>3&7)+1),
			}
			for l := range 4 {
				h := qh[2*ib+l/2] >> (4 * (l % 2))
				idx := int(qs[4*ib+l]) | int(h&7)<<8
				delta := float32(iq1Delta)
				if h&8 != 0 {
					delta = -iq1Delta
				}
				putGrid1(dst[32*ib+8*l:], dl[l/2], iq1sGrid[idx], delta)
			}
		}
	}
}
