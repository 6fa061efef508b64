package quant

import (
	"encoding/binary"
	"math"
)

// Reference quantizers for the k-quants, following ggml's
// quantize_row_q*_K_ref (what llama.cpp uses without an importance matrix):
// each sub-block gets a scale (and min) from a small search that minimises
// a weighted squared or absolute error, the sub-block scales are themselves
// quantized against the super-block's fp16 d (and dmin), and finally every
// element is re-rounded against the scale the reader will actually see.

// groupMaxEps is the magnitude under which a group counts as all zeros.
const groupMaxEps = 1e-15

// nearestInt rounds to the nearest integer, ties to even, like ggml's
// nearest_int; values beyond ±2^22 (never reached by finite, in-range
// inputs) saturate instead of wrapping.
func nearestInt(f float32) int {
	const lim = 1 << 22
	if !(f > -lim) {
		return -lim
	}
	if f > lim {
		return lim
	}
	return int(math.RoundToEven(float64(f)))
}

func clampInt(v, lo, hi int) int { return min(max(v, lo), hi) }

// errMeasure is |diff| (mad) or diff² weighted by w.
func errMeasure(w, diff float32, mad bool) float32 {
	if mad {
		return w * abs32(diff)
	}
	return w * (diff * diff)
}

// affineQuants finds levels L in 0..nmax, a scale and a min ≤ 0 such that
// x ≈ scale·L + min, minimising the w-weighted error (absolute when mad is
// set, squared otherwise). It first rounds on the plain range, then tries
// nstep+1 stretched scales (nmax + rmin + rdelta·k levels across the range),
// each followed by a weighted least-squares fit of scale and min, and keeps
// the best. It returns the scale and -min (ggml's make_qkx2_quants).
func affineQuants(x, w []float32, L, aux []uint8, nmax int, rmin, rdelta float32, nstep int, mad bool) (scale, negMin float32) {
	lo, hi := x[0], x[0]
	sumW := w[0]
	sumX := sumW * x[0]
	for i := 1; i < len(x); i++ {
		lo, hi = min(lo, x[i]), max(hi, x[i])
		sumW += w[i]
		sumX += w[i] * x[i]
	}
	lo = min(lo, 0)
	if hi == lo {
		clear(L)
		return 0, -lo
	}
	iscale := float32(nmax) / (hi - lo)
	scale = 1 / iscale
	var best float32
	for i, v := range x {
		l := clampInt(nearestInt(iscale*(v-lo)), 0, nmax)
		L[i] = uint8(l)
		best += errMeasure(w[i], scale*float32(l)+lo-v, mad)
	}
	for k := 0; k <= nstep; k++ {
		iscale = (rmin + rdelta*float32(k) + float32(nmax)) / (hi - lo)
		var sumL, sumL2, sumXL float32
		for i, v := range x {
			l := clampInt(nearestInt(iscale*(v-lo)), 0, nmax)
			aux[i] = uint8(l)
			fl := float32(l)
			sumL += w[i] * fl
			sumL2 += w[i] * fl * fl
			sumXL += w[i] * fl * v
		}
		det := sumW*sumL2 - sumL*sumL
		if det <= 0 {
			continue
		}
		s := (sumW*sumXL - sumX*sumL) / det
		m := (sumL2*sumX - sumL*sumXL) / det
		if m > 0 {
			m = 0
			s = sumXL / sumL2
		}
		var e float32
		for i, v := range x {
			e += errMeasure(w[i], s*float32(aux[i])+m-v, mad)
		}
		if e < best {
			copy(L, aux[:len(x)])
			best, scale, lo = e, s, m
		}
	}
	return scale, -lo
}

// symmetricQuants finds levels L = l + nmax with l in -nmax..nmax-1 and a
// scale such that x ≈ scale·l, weighting by x² (ggml's make_qx_quants with
// rmse_type 1): it tries 19 scales around nmax/max|x| and keeps the one with
// the best weighted least-squares fit.
func symmetricQuants(x []float32, L []uint8, nmax int) float32 {
	mx := absMax(x)
	if abs32(mx) < groupMaxEps {
		clear(L)
		return 0
	}
	fit := func(iscale float32) (sumLX, sumL2 float32) {
		for _, v := range x {
			l := float32(clampInt(nearestInt(iscale*v), -nmax, nmax-1))
			w := v * v
			sumLX += w * v * l
			sumL2 += w * l * l
		}
		return sumLX, sumL2
	}
	assign := func(iscale float32) {
		for i, v := range x {
			L[i] = uint8(nmax + clampInt(nearestInt(iscale*v), -nmax, nmax-1))
		}
	}
	iscale := -float32(nmax) / mx
	assign(iscale)
	sumLX, sumL2 := fit(iscale)
	var scale float32
	if sumL2 != 0 {
		scale = sumLX / sumL2
	}
	best := scale * sumLX
	for k := -9; k <= 9; k++ {
		if k == 0 {
			continue
		}
		iscale = -(float32(nmax) + 0.1*float32(k)) / mx
		sumLX, sumL2 = fit(iscale)
		if sumL2 > 0 && sumLX*sumLX > best*sumL2 {
			assign(iscale)
			scale = sumLX / sumL2
			best = scale * sumLX
		}
	}
	return scale
}

// q3Quants finds signed levels l in -nmax..nmax-1 for x ≈ scale·l, weighting
// by x²: it rounds against nmax/max|x| and then moves single elements to the
// level that improves the weighted least-squares fit, for up to five passes
// (ggml's make_q3_quants with do_rmse). L receives l + nmax.
func q3Quants(x []float32, L []int8, nmax int) float32 {
	mx := absMax(x)
	if abs32(mx) < groupMaxEps {
		clear(L)
		return 0
	}
	iscale := -float32(nmax) / mx
	var sumLX, sumL2 float32
	for i, v := range x {
		l := clampInt(nearestInt(iscale*v), -nmax, nmax-1)
		L[i] = int8(l)
		w := v * v
		sumLX += w * v * float32(l)
		sumL2 += w * float32(l) * float32(l)
	}
	for range 5 {
		changed := false
		for i, v := range x {
			w := v * v
			li := float32(L[i])
			slx := sumLX - w*v*li
			if slx <= 0 {
				continue
			}
			sl2 := sumL2 - w*li*li
			nl := clampInt(nearestInt(v*sl2/slx), -nmax, nmax-1)
			if nl == int(L[i]) {
				continue
			}
			slx += w * v * float32(nl)
			sl2 += w * float32(nl) * float32(nl)
			if sl2 > 0 && slx*slx*sumL2 > sumLX*sumLX*sl2 {
				L[i] = int8(nl)
				sumLX, sumL2 = slx, sl2
				changed = true
			}
		}
		if !changed {
			break
		}
	}
	for i := range L[:len(x)] {
		L[i] += int8(nmax)
	}
	return sumLX / sumL2
}

// packQ2 packs 2-bit levels as Q2_K and Q3_K store them: element
// 128h + 32j + l in bits 2j..2j+1 of qs[32h + l].
func packQ2(L []uint8, qs []byte) {
	for h := range 2 {
		for l := range 32 {
			e := 128*h + l
			qs[32*h+l] = L[e] | L[e+32]<<2 | L[e+64]<<4 | L[e+96]<<6
		}
	}
}

func quantQ2_K(src []float32, dst []byte) error {
	var L [qkK]uint8
	var aux [16]uint8
	var w, scales, mins [16]float32
	for bi := 0; len(src) >= qkK; bi, src, dst = bi+1, src[qkK:], dst[84:] {
		x, blk := src[:qkK], dst[:84]
		var maxScale, maxMin float32
		for j := range 16 {
			xs := x[16*j : 16*j+16]
			for l, v := range xs {
				w[l] = abs32(v)
			}
			scales[j], mins[j] = affineQuants(xs, w[:], L[16*j:16*j+16], aux[:], 3, -0.5, 0.1, 15, true)
			maxScale, maxMin = max(maxScale, scales[j]), max(maxMin, mins[j])
		}
		sc := blk[0:16]
		clear(sc)
		if maxScale > 0 {
			iscale := 15 / maxScale
			for j := range sc {
				sc[j] = byte(clampInt(nearestInt(iscale*scales[j]), 0, 15))
			}
		}
		if maxMin > 0 {
			iscale := 15 / maxMin
			for j := range sc {
				sc[j] |= byte(clampInt(nearestInt(iscale*mins[j]), 0, 15)) << 4
			}
		}
		d := putF16(blk[80:], maxScale/15)
		dmin := putF16(blk[82:], maxMin/15)
		if nonFinite(d) || nonFinite(dmin) {
			return scaleOverflow(bi, max(maxScale, maxMin)/15)
		}
		for j := range 16 {
			dl := d * float32(sc[j]&0xf)
			if dl == 0 {
				continue
			}
			ml := dmin * float32(sc[j]>>4)
			for l := 16 * j; l < 16*j+16; l++ {
				L[l] = uint8(clampInt(nearestInt((x[l]+ml)/dl), 0, 3))
			}
		}
		packQ2(L[:], blk[16:80])
	}
	return nil
}

func quantQ3_K(src []float32, dst []byte) error {
	var L [qkK]int8
	var scales [16]float32
	var sc [16]int8
	for bi := 0; len(src) >= qkK; bi, src, dst = bi+1, src[qkK:], dst[110:] {
		x, blk := src[:qkK], dst[:110]
		var maxScale, amax float32
		for j := range 16 {
			scales[j] = q3Quants(x[16*j:16*j+16], L[16*j:16*j+16], 4)
			if a := abs32(scales[j]); a > amax {
				amax, maxScale = a, scales[j]
			}
		}
		packed := blk[96:108]
		clear(packed)
		var d float32
		if maxScale != 0 {
			iscale := -32 / maxScale
			for j := range 16 {
				l := byte(clampInt(nearestInt(iscale*scales[j]), -32, 31) + 32)
				packed[j%8] |= (l & 0xf) << (4 * (j / 8))
				packed[8+j%4] |= (l >> 4) << (2 * (j / 4))
			}
			d = putF16(blk[108:], 1/iscale)
		} else {
			d = putF16(blk[108:], 0)
		}
		if nonFinite(d) {
			return scaleOverflow(bi, -maxScale/32)
		}
		unpackQ3Scales(packed, &sc)
		for j := range 16 {
			dl := d * float32(sc[j])
			if dl == 0 {
				continue
			}
			for l := 16 * j; l < 16*j+16; l++ {
				L[l] = int8(clampInt(nearestInt(x[l]/dl), -4, 3) + 4)
			}
		}
		hmask := blk[0:32]
		clear(hmask)
		var low [qkK]uint8
		for j, l := range L {
			if l > 3 {
				hmask[j%32] |= 1 << (j / 32)
				l -= 4
			}
			low[j] = uint8(l)
		}
		packQ2(low[:], blk[32:96])
	}
	return nil
}

// packScaleMinK4 stores eight 6-bit scales and mins in the twelve bytes
// ScaleMinK4 reads.
func packScaleMinK4(ls, lm *[8]uint8, q []byte) {
	clear(q[:12])
	for j := range 8 {
		if j < 4 {
			q[j], q[j+4] = ls[j], lm[j]
			continue
		}
		q[j+4] = ls[j]&0xf | (lm[j]&0xf)<<4
		q[j-4] |= (ls[j] >> 4) << 6
		q[j] |= (lm[j] >> 4) << 6
	}
}

// quantAffineK quantizes one Q4_K (nmax 15) or Q5_K (nmax 31) super-block:
// 8 sub-blocks of 32 weighted by rms(x) + |x|, 6-bit scales and mins, then
// levels re-rounded against the stored scales, returned in L. It fails,
// returning the scale that overflowed fp16, when the values are too large.
func quantAffineK(x []float32, blk []byte, nmax int, rmin float32, nstep int, L *[qkK]uint8) (float32, bool) {
	var aux [32]uint8
	var w [32]float32
	var scales, mins [8]float32
	var maxScale, maxMin float32
	for j := range 8 {
		xs := x[32*j : 32*j+32]
		var sumX2 float32
		for _, v := range xs {
			sumX2 += v * v
		}
		av := float32(math.Sqrt(float64(sumX2 / 32)))
		for l, v := range xs {
			w[l] = av + abs32(v)
		}
		scales[j], mins[j] = affineQuants(xs, w[:], L[32*j:32*j+32], aux[:], nmax, rmin, 0.1, nstep, false)
		maxScale, maxMin = max(maxScale, scales[j]), max(maxMin, mins[j])
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	var ls, lm [8]uint8
	for j := range 8 {
		ls[j] = uint8(clampInt(nearestInt(invScale*scales[j]), 0, 63))
		lm[j] = uint8(clampInt(nearestInt(invMin*mins[j]), 0, 63))
	}
	packScaleMinK4(&ls, &lm, blk[4:16])
	d := putF16(blk[0:], maxScale/63)
	dmin := putF16(blk[2:], maxMin/63)
	if nonFinite(d) || nonFinite(dmin) {
		return max(maxScale, maxMin) / 63, false
	}
	for j := range 8 {
		dl := d * float32(ls[j])
		if dl == 0 {
			continue
		}
		ml := dmin * float32(lm[j])
		for l := 32 * j; l < 32*j+32; l++ {
			L[l] = uint8(clampInt(nearestInt((x[l]+ml)/dl), 0, nmax))
		}
	}
	return 0, true
}

func quantQ4_K(src []float32, dst []byte) error {
	var L [qkK]uint8
	for bi := 0; len(src) >= qkK; bi, src, dst = bi+1, src[qkK:], dst[144:] {
		if s, ok := quantAffineK(src[:qkK], dst[:144], 15, -1, 20, &L); !ok {
			return scaleOverflow(bi, s)
		}
		qs := dst[16:144]
		for c := range 4 {
			for l := range 32 {
				qs[32*c+l] = L[64*c+l] | L[64*c+32+l]<<4
			}
		}
	}
	return nil
}

func quantQ5_K(src []float32, dst []byte) error {
	var L [qkK]uint8
	for bi := 0; len(src) >= qkK; bi, src, dst = bi+1, src[qkK:], dst[176:] {
		if s, ok := quantAffineK(src[:qkK], dst[:176], 31, -0.5, 15, &L); !ok {
			return scaleOverflow(bi, s)
		}
		qh, qs := dst[16:48], dst[48:176]
		clear(qh)
		for c := range 4 {
			for l := range 32 {
				lo, hi := L[64*c+l], L[64*c+32+l]
				qh[l] |= (lo>>4)<<(2*c) | (hi>>4)<<(2*c+1)
				qs[32*c+l] = lo&0xf | (hi&0xf)<<4
			}
		}
	}
	return nil
}

func quantQ6_K(src []float32, dst []byte) error {
	var L [qkK]uint8
	var scales [16]float32
	for bi := 0; len(src) >= qkK; bi, src, dst = bi+1, src[qkK:], dst[210:] {
		x, blk := src[:qkK], dst[:210]
		var maxScale, maxAbs float32
		for j := range 16 {
			scales[j] = symmetricQuants(x[16*j:16*j+16], L[16*j:16*j+16], 32)
			if a := abs32(scales[j]); a > maxAbs {
				maxAbs, maxScale = a, scales[j]
			}
		}
		if maxAbs < groupMaxEps {
			clear(blk)
			continue
		}
		iscale := -128 / maxScale
		d := putF16(blk[208:], 1/iscale)
		if nonFinite(d) {
			return scaleOverflow(bi, 1/iscale)
		}
		for j := range 16 {
			sc := int8(min(127, nearestInt(iscale*scales[j])))
			blk[192+j] = byte(sc)
			dl := d * float32(sc)
			if dl == 0 {
				continue
			}
			for l := 16 * j; l < 16*j+16; l++ {
				L[l] = uint8(clampInt(nearestInt(x[l]/dl), -32, 31) + 32)
			}
		}
		ql, qh := blk[0:128], blk[128:192]
		for h := range 2 {
			for l := range 32 {
				e := 128*h + l
				q0, q1, q2, q3 := L[e], L[e+32], L[e+64], L[e+96]
				ql[64*h+l] = q0&0xf | (q2&0xf)<<4
				ql[64*h+l+32] = q1&0xf | (q3&0xf)<<4
				qh[32*h+l] = q0>>4 | (q1>>4)<<2 | (q2>>4)<<4 | (q3>>4)<<6
			}
		}
	}
	return nil
}

// quantQ8_K maps the element of largest magnitude to -127 (ggml's choice,
// which keeps the int8 range symmetric) with a float32 d, and stores the
// sums of each 16 quants.
func quantQ8_K(src []float32, dst []byte) error {
	for ; len(src) >= qkK; src, dst = src[qkK:], dst[292:] {
		x, blk := src[:qkK], dst[:292]
		mx := absMax(x)
		if mx == 0 {
			clear(blk)
			continue
		}
		iscale := -127 / mx
		qs := blk[4:260]
		for j, v := range x {
			qs[j] = byte(int8(min(127, nearestInt(iscale*v))))
		}
		for j := range 16 {
			sum := 0
			for _, b := range qs[16*j : 16*j+16] {
				sum += int(int8(b))
			}
			binary.LittleEndian.PutUint16(blk[260+2*j:], uint16(int16(sum)))
		}
		binary.LittleEndian.PutUint32(blk, math.Float32bits(1/iscale))
	}
	return nil
}
