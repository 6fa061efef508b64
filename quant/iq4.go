package quant

import (
	"encoding/binary"
	"math"
)

// The 4-bit codebook types: each nibble indexes a fixed table of 16 levels
// instead of being a uniform level. IQ4_NL and IQ4_XS share a non-linear
// table denser near zero; MXFP4 uses the FP4 (E2M1) values with a
// power-of-two block scale.

// kvaluesIQ4NL is the IQ4_NL / IQ4_XS codebook, ascending.
var kvaluesIQ4NL = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// kvaluesMXFP4 holds the E2M1 values doubled to integers (0, ±0.5, ±1, ±1.5,
// ±2, ±3, ±4, ±6 times 2); the block scale is halved to compensate.
var kvaluesMXFP4 = [16]int8{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

// IQ4_NL: d fp16 | qs[16] = 18 bytes, 32 elements; byte j holds element j
// (low nibble) and j+16 (high). x = d·kvalue.
func dequantIQ4_NL(src []byte, dst []float32) {
	for ; len(dst) >= qk; src, dst = src[18:], dst[qk:] {
		d := f16(src)
		qs := src[2:18:18]
		y := dst[:qk:qk]
		for j, b := range qs {
			y[j] = d * float32(kvaluesIQ4NL[b&0xf])
			y[j+16] = d * float32(kvaluesIQ4NL[b>>4])
		}
	}
}

// IQ4_XS: d fp16 | scales_h u16 | scales_l[4] | qs[128] = 136 bytes. The
// ib-th 32 elements have the 6-bit scale ls = nibble ib%2 of scales_l[ib/2]
// | bits 2ib..2ib+1 of scales_h << 4, dl = d·(ls-32), and are laid out as
// one IQ4_NL block's quants.
func dequantIQ4_XS(src []byte, dst []float32) {
	for ; len(dst) >= qkK; src, dst = src[136:], dst[qkK:] {
		d := f16(src)
		sh := binary.LittleEndian.Uint16(src[2:])
		sl := src[4:8:8]
		qs := src[8:136:136]
		for ib := range 8 {
			ls := int(sl[ib/2]>>(4*(ib%2))&0xf) | int(sh>>(2*ib)&3)<<4
			dl := d * float32(ls-32)
			q := qs[16*ib : 16*ib+16]
			y := dst[32*ib : 32*ib+32]
			for j, b := range q {
				y[j] = dl * float32(kvaluesIQ4NL[b&0xf])
				y[j+16] = dl * float32(kvaluesIQ4NL[b>>4])
			}
		}
	}
}

// e8m0Half returns 2^(e-127)/2, the halved MXFP4 block scale; e of 0 and 1
// give float32 subnormals (ggml_e8m0_to_fp32_half).
func e8m0Half(e uint8) float32 {
	if e < 2 {
		return math.Float32frombits(0x00200000 << e)
	}
	return math.Float32frombits(uint32(e-1) << 23)
}

// MXFP4: e (E8M0 exponent) | qs[16] = 17 bytes, 32 elements, nibbles as in
// IQ4_NL. x = kvalue·2^(e-128).
func dequantMXFP4(src []byte, dst []float32) {
	for ; len(dst) >= qk; src, dst = src[17:], dst[qk:] {
		d := e8m0Half(src[0])
		qs := src[1:17:17]
		y := dst[:qk:qk]
		for j, b := range qs {
			y[j] = float32(kvaluesMXFP4[b&0xf]) * d
			y[j+16] = float32(kvaluesMXFP4[b>>4]) * d
		}
	}
}

// iq4Index returns the codebook index nearest v, the upper one on ties.
func iq4Index(v float32) uint8 {
	kv := &kvaluesIQ4NL
	if v <= float32(kv[0]) {
		return 0
	}
	if v >= float32(kv[15]) {
		return 15
	}
	lo, hi := 0, 15
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if v < float32(kv[mid]) {
			hi = mid
		} else {
			lo = mid
		}
	}
	if v-float32(kv[lo]) < float32(kv[hi])-v {
		return uint8(lo)
	}
	return uint8(hi)
}

// iq4Scale picks the scale of a 32-element block for the IQ4 codebook,
// weighting elements by x²: the least-squares scale after rounding at
// max|x| ↦ -127, then at 15 neighbouring trial scales, keeping the best fit
// (ggml's quantize_row_iq4_nl_impl with ntry 7 and no importance matrix).
func iq4Scale(x []float32) float32 {
	mx := absMax(x)
	if abs32(mx) < groupMaxEps {
		return 0
	}
	fit := func(id float32) (sumQX, sumQ2 float32) {
		for _, v := range x {
			q := float32(kvaluesIQ4NL[iq4Index(id*v)])
			w := v * v
			sumQX += w * q * v
			sumQ2 += w * q * q
		}
		return sumQX, sumQ2
	}
	d := -mx / float32(kvaluesIQ4NL[0])
	sumQX, sumQ2 := fit(1 / d)
	d = sumQX / sumQ2
	best := d * sumQX
	for k := -7; k <= 7; k++ {
		sumQX, sumQ2 = fit((float32(k) + float32(kvaluesIQ4NL[0])) / mx)
		if sumQ2 > 0 && sumQX*sumQX > best*sumQ2 {
			d = sumQX / sumQ2
			best = d * sumQX
		}
	}
	return d
}

// packIQ4 rounds x against scale d and packs the 32 indices as IQ4_NL's qs.
func packIQ4(x []float32, d float32, qs []byte) {
	id := inv(d)
	for j := range 16 {
		qs[j] = iq4Index(id*x[j]) | iq4Index(id*x[j+16])<<4
	}
}

func quantIQ4_NL(src []float32, dst []byte) error {
	for bi := 0; len(src) >= qk; bi, src, dst = bi+1, src[qk:], dst[18:] {
		x := src[:qk]
		d := putF16(dst, iq4Scale(x))
		if nonFinite(d) {
			return scaleOverflow(bi, iq4Scale(x))
		}
		packIQ4(x, d, dst[2:18])
	}
	return nil
}

// quantIQ4_XS picks each 32-element scale as IQ4_NL does, quantizes them to
// 6 bits against d = -max/32 (the largest maps to -32), then rounds the
// elements against the stored scales.
func quantIQ4_XS(src []float32, dst []byte) error {
	var scales [8]float32
	for bi := 0; len(src) >= qkK; bi, src, dst = bi+1, src[qkK:], dst[136:] {
		x, blk := src[:qkK], dst[:136]
		var maxScale, amax float32
		for ib := range 8 {
			scales[ib] = iq4Scale(x[32*ib : 32*ib+32])
			if a := abs32(scales[ib]); a > amax {
				amax, maxScale = a, scales[ib]
			}
		}
		d := putF16(blk, -maxScale/32)
		if nonFinite(d) {
			return scaleOverflow(bi, -maxScale/32)
		}
		id := inv(d)
		var sh uint16
		sl := blk[4:8]
		clear(sl)
		for ib := range 8 {
			l := clampInt(nearestInt(id*scales[ib]), -32, 31)
			packIQ4(x[32*ib:32*ib+32], d*float32(l), blk[8+16*ib:8+16*ib+16])
			u := uint8(l + 32)
			sl[ib/2] |= (u & 0xf) << (4 * (ib % 2))
			sh |= uint16(u>>4) << (2 * ib)
		}
		binary.LittleEndian.PutUint16(blk[2:], sh)
	}
	return nil
}
