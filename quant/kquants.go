package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The k-quants: super-blocks of 256 elements split into sub-blocks of 16 or
// 32, each sub-block with a small integer scale (and for the affine types a
// min) that multiplies the super-block's fp16 d (and dmin).

const qkK = 256

// Q2_K: scales[16] (low nibble scale, high nibble min, one per 16 elements)
// | qs[64] | d fp16 | dmin fp16 = 84 bytes. Element i = 128h + 32j + l (h
// half, j 0..3, l 0..31) is bits 2j..2j+1 of qs[32h + l]. x = (d·sc)·q - dmin·m.
func dequantQ2_K(src []byte, dst []float32) {
	for ; len(dst) >= qkK; src, dst = src[84:], dst[qkK:] {
		scales := src[0:16:16]
		qs := src[16:80:80]
		d, dmin := f16(src[80:]), f16(src[82:])
		y := dst[:qkK:qkK]
		for i := range 16 {
			sc := scales[i]
			dl := d * float32(sc&0xf)
			ml := dmin * float32(sc>>4)
			h, j, l0 := i/8, (i%8)/2, (i%2)*16
			q := qs[32*h+l0 : 32*h+l0+16]
			out := y[16*i : 16*i+16]
			shift := 2 * j
			for l, b := range q {
				out[l] = float32(dl*float32(b>>shift&3)) - ml
			}
		}
	}
}

// unpackQ3Scales decodes Q3_K's twelve scale bytes into 16 signed 6-bit
// scales: bytes 0..7 hold the low nibbles (scale j and j+8 in byte j mod 8),
// bytes 8..11 the top two bits (scale j in byte 8 + j%4, bits 2(j/4)).
func unpackQ3Scales(b []byte, sc *[16]int8) {
	for j := range 16 {
		lo := b[j%8] >> (4 * (j / 8)) & 0xf
		hi := b[8+j%4] >> (2 * (j / 4)) & 3
		sc[j] = int8(lo|hi<<4) - 32
	}
}

// Q3_K: hmask[32] | qs[64] | scales[12] | d fp16 = 110 bytes. Element i =
// 128h + 32j + l takes its low two bits from qs[32h + l] >> 2j and its high
// bit from hmask[l] bit i/32; a clear high bit means q - 4. x = (d·sc)·q.
func dequantQ3_K(src []byte, dst []float32) {
	var sc [16]int8
	for ; len(dst) >= qkK; src, dst = src[110:], dst[qkK:] {
		hmask := src[0:32:32]
		qs := src[32:96:96]
		unpackQ3Scales(src[96:108], &sc)
		d := f16(src[108:])
		y := dst[:qkK:qkK]
		for i := range 16 {
			dl := d * float32(sc[i])
			h, j, l0 := i/8, (i%8)/2, (i%2)*16
			bit := uint(i / 2)
			shift := 2 * j
			for l := l0; l < l0+16; l++ {
				q := int(qs[32*h+l]>>shift&3) - 4*int(^hmask[l]>>bit&1)
				y[16*i+l-l0] = dl * float32(q)
			}
		}
	}
}

// ScaleMinK4 decodes sub-block j's 6-bit scale and min from the twelve
// packed bytes of Q4_K and Q5_K (for the backends, whose layouts unpack
// them too): for j < 4 the low six bits of bytes j and
// j+4; for j >= 4 a nibble of byte j+4 plus the top two bits of bytes j-4
// and j.
func ScaleMinK4(j int, q []byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xf | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

// Q4_K: d fp16 | dmin fp16 | scales[12] | qs[128] = 144 bytes. Sub-block
// s = 2c+k (32 elements) is nibble k of qs[32c .. 32c+31].
// x = (d·sc)·q - dmin·m.
func dequantQ4_K(src []byte, dst []float32) {
	for ; len(dst) >= qkK; src, dst = src[144:], dst[qkK:] {
		d, dmin := f16(src), f16(src[2:])
		scales := src[4:16:16]
		qs := src[16:144:144]
		y := dst[:qkK:qkK]
		for s := range 8 {
			sc, m := ScaleMinK4(s, scales)
			dl := d * float32(sc)
			ml := dmin * float32(m)
			q := qs[32*(s/2) : 32*(s/2)+32]
			out := y[32*s : 32*s+32]
			shift := 4 * (s % 2)
			for l, b := range q {
				out[l] = float32(dl*float32(b>>shift&0xf)) - ml
			}
		}
	}
}

// Q5_K: d fp16 | dmin fp16 | scales[12] | qh[32] | qs[128] = 176 bytes. As
// Q4_K, with bit 4 of element 32s + l in qh[l] bit s.
func dequantQ5_K(src []byte, dst []float32) {
	for ; len(dst) >= qkK; src, dst = src[176:], dst[qkK:] {
		d, dmin := f16(src), f16(src[2:])
		scales := src[4:16:16]
		qh := src[16:48:48]
		qs := src[48:176:176]
		y := dst[:qkK:qkK]
		for s := range 8 {
			sc, m := ScaleMinK4(s, scales)
			dl := d * float32(sc)
			ml := dmin * float32(m)
			q := qs[32*(s/2) : 32*(s/2)+32]
			out := y[32*s : 32*s+32]
			shift := 4 * (s % 2)
			for l, b := range q {
				v := b>>shift&0xf | (qh[l]>>s&1)<<4
				out[l] = float32(dl*float32(v)) - ml
			}
		}
	}
}

// Q6_K: ql[128] | qh[64] | scales[16] int8 | d fp16 = 210 bytes. In each
// half h, element 128h + 32k + l (k 0..3, l 0..31) takes its low nibble
// from ql[64h + 32(k%2) + l] (the high nibble for k >= 2) and its top two
// bits from qh[32h + l] >> 2k. x = (d·sc)·(q - 32).
func dequantQ6_K(src []byte, dst []float32) {
	var dl [16]float32
	for ; len(dst) >= qkK; src, dst = src[210:], dst[qkK:] {
		d := f16(src[208:])
		for s, b := range src[192:208] {
			dl[s] = d * float32(int8(b))
		}
		for h := range 2 {
			ql := src[64*h : 64*h+64 : 64*h+64]
			qh := src[128+32*h : 128+32*h+32 : 128+32*h+32]
			y := dst[128*h : 128*h+128 : 128*h+128]
			sc := dl[8*h : 8*h+8 : 8*h+8]
			for l := range 32 {
				is := l / 16
				a, b, c := ql[l], ql[l+32], qh[l]
				y[l] = sc[is] * float32(int(a&0xf|(c&3)<<4)-32)
				y[l+32] = sc[is+2] * float32(int(b&0xf|(c>>2&3)<<4)-32)
				y[l+64] = sc[is+4] * float32(int(a>>4|(c>>4&3)<<4)-32)
				y[l+96] = sc[is+6] * float32(int(b>>4|(c>>6)<<4)-32)
			}
		}
	}
}

// Q8_K: d float32 | qs[256] int8 | bsums[16] int16 (sums of 16 quants, for
// dot products) = 292 bytes. x = d·q.
func dequantQ8_K(src []byte, dst []float32) {
	for ; len(dst) >= qkK; src, dst = src[292:], dst[qkK:] {
		d := math.Float32frombits(binary.LittleEndian.Uint32(src))
		qs := src[4:260:260]
		y := dst[:qkK:qkK]
		for j, b := range qs {
			y[j] = d * float32(int8(b))
		}
	}
}

// TQ1_0 (ternary, 1.6875 bits): qs[48] | qh[4] | d fp16 = 54 bytes. Each
// byte packs five (qh: four) base-3 digits as a fixed-point fraction of
// 256: digit n of byte b is ((b·3^n mod 256)·3) >> 8. Elements 0..159 come
// from qs[0:32] (element 32n + m from byte m), 160..239 from qs[32:48]
// (160 + 16n + m), 240..255 from qh (240 + 4n + m). x = (digit - 1)·d.
func dequantTQ1_0(src []byte, dst []float32) {
	pow3 := [5]uint8{1, 3, 9, 27, 81}
	for ; len(dst) >= qkK; src, dst = src[54:], dst[qkK:] {
		d := f16(src[52:])
		y := dst[:qkK:qkK]
		groups := [3]struct {
			bytes  []byte
			digits int
			base   int
		}{{src[0:32], 5, 0}, {src[32:48], 5, 160}, {src[48:52], 4, 240}}
		for _, g := range groups {
			for n := range g.digits {
				for m, b := range g.bytes {
					q := b * pow3[n]
					xi := int(uint16(q)*3>>8) - 1
					y[g.base+n*len(g.bytes)+m] = float32(xi) * d
				}
			}
		}
	}
}

// TQ2_0 (ternary, 2.0625 bits): qs[64] | d fp16 = 66 bytes. Element
// 128c + 32n + m is bits 2n..2n+1 of qs[32c + m]. x = (q - 1)·d.
func dequantTQ2_0(src []byte, dst []float32) {
	for ; len(dst) >= qkK; src, dst = src[66:], dst[qkK:] {
		d := f16(src[64:])
		qs := src[0:64:64]
		y := dst[:qkK:qkK]
		for c := range 2 {
			for n := range 4 {
				for m := range 32 {
					q := int(qs[32*c+m]>>(2*n)&3) - 1
					y[128*c+32*n+m] = float32(q) * d
				}
			}
		}
	}
}

// quantTernary maps x/max|x| to the digits 0, 1, 2 (for -1, 0, +1) and
// stores d = max|x| as fp16 at b.
func quantTernary(x []float32, b []byte, q *[qkK]uint8) float32 {
	var amax float32
	for _, v := range x {
		amax = max(amax, abs32(v))
	}
	id := inv(amax)
	for j, v := range x {
		q[j] = uint8(int(math.Round(float64(v*id))) + 1)
	}
	return putF16(b, amax)
}

func quantTQ1_0(src []float32, dst []byte) error {
	var q [qkK]uint8
	for i := 0; len(src) >= qkK; i, src, dst = i+1, src[qkK:], dst[54:] {
		if d := quantTernary(src[:qkK], dst[52:], &q); nonFinite(d) {
			return scaleOverflow(i, d)
		}
		// pack writes the digits of group elements base + stride·n + m,
		// most significant first, as a ceiling fraction of 243 = 3^5.
		pack := func(out []byte, base, stride, digits int) {
			for m := range out {
				v := 0
				for n := range digits {
					v = 3*v + int(q[base+stride*n+m])
				}
				for n := digits; n < 5; n++ {
					v *= 3
				}
				out[m] = byte((v*256 + 242) / 243)
			}
		}
		pack(dst[0:32], 0, 32, 5)
		pack(dst[32:48], 160, 16, 5)
		pack(dst[48:52], 240, 4, 4)
	}
	return nil
}

func quantTQ2_0(src []float32, dst []byte) error {
	var q [qkK]uint8
	for i := 0; len(src) >= qkK; i, src, dst = i+1, src[qkK:], dst[66:] {
		if d := quantTernary(src[:qkK], dst[64:], &q); nonFinite(d) {
			return scaleOverflow(i, d)
		}
		for c := range 2 {
			for m := range 32 {
				e := 128*c + m
				dst[32*c+m] = q[e] | q[e+32]<<2 | q[e+64]<<4 | q[e+96]<<6
			}
		}
	}
	return nil
}

// Q3KToQ6K rewrites Q3_K super-blocks (src, 110 bytes each) as Q6_K ones
// (dst, 210 bytes each) that dequantize to the same float32 values: Q3_K's
// signed 6-bit scales become Q6_K's int8 ones, its levels q in [-4, 3]
// Q6_K's q+32, and d is kept. Both dequantize as (d·sc)·q, so every value
// is the same float32, and a product over int8 activations sums the same
// integers (sc·Σq·a) for either. It fails on lengths that are not whole,
// matching numbers of super-blocks.
func Q3KToQ6K(src, dst []byte) error {
	n := len(src) / 110
	if len(src) != 110*n || len(dst) != 210*n {
		return fmt.Errorf("quant: Q3_K to Q6_K: %d bytes of Q3_K (%d super-blocks) into %d of Q6_K", len(src), n, len(dst))
	}
	var sc [16]int8
	var q [qkK]int
	for b := range n {
		s, o := src[110*b:110*b+110], dst[210*b:210*b+210]
		hmask, qs := s[0:32], s[32:96]
		unpackQ3Scales(s[96:108], &sc)
		for e := range qkK {
			h, j, l := e/128, (e%128)/32, e%32
			q[e] = int(qs[32*h+l]>>(2*j)&3) - 4*int(^hmask[l]>>(e/32)&1) + 32
		}
		clear(o)
		for h := range 2 {
			ql, qh, v := o[64*h:64*h+64], o[128+32*h:128+32*h+32], q[128*h:128*h+128]
			for l := range 32 {
				ql[l] = byte(v[l]&0xf) | byte(v[l+64]&0xf)<<4
				ql[l+32] = byte(v[l+32]&0xf) | byte(v[l+96]&0xf)<<4
				qh[l] = byte(v[l]>>4) | byte(v[l+32]>>4)<<2 | byte(v[l+64]>>4)<<4 | byte(v[l+96]>>4)<<6
			}
		}
		for i, v := range sc {
			o[192+i] = byte(v)
		}
		copy(o[208:210], s[108:110])
	}
	return nil
}
