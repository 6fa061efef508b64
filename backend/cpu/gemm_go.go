package cpu

import (
	"encoding/binary"
	"math"

	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/quant"
)

// The portable kernels: the same arithmetic as the assembly ones on the
// same packed tiles and activation records, in plain Go. They serve
// machines without the SIMD kernels and are the reference the SIMD kernels
// are tested against.
//
// Every kernel computes, for the tiles of w and cols activation rows whose
// records start at act (row c's at act[c·rec:], consecutive records stride
// bytes apart),
//
//	dst[c·ld + tileRows·t + r] = Σ_k W[tileRows·t + r, k] · A[c, k]
//
// with the integer dot products exact and one float multiply-add per block.
// The accumulator type A is float32 for the portable level and float64 for
// the exact one (exact.go).

func gemmGo(p *packed, w []byte, tiles int, act []byte, stride, cols int, dst []float32, ld int) {
	gemmAcc[float32](p, w, tiles, act, stride, cols, dst, ld)
}

// gemmAcc is the portable kernel with accumulators of type A, stored
// into dst as type D (float64 partial sums in the exact level's tests).
func gemmAcc[A, D float32 | float64](p *packed, w []byte, tiles int, act []byte, stride, cols int, dst []D, ld int) {
	switch p.f.family {
	case famLegacy:
		gemmLegacyGo[A](p, w, tiles, act, stride, cols, dst, ld)
	case famK:
		gemmKGo[A](p, w, tiles, act, stride, cols, dst, ld)
	default:
		gemmFloatGo[A](p, w, tiles, act, stride, cols, dst, ld)
	}
}

// store rounds a tile's accumulators into dst.
func store[A, D float32 | float64](dst []D, acc *[tileRows]A) {
	for r, v := range acc {
		dst[r] = D(v)
	}
}

func f32At(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }
func i32At(b []byte) int32   { return int32(binary.LittleEndian.Uint32(b)) }
func f16At(b []byte) float32 { return quant.F16ToF32(binary.LittleEndian.Uint16(b)) }

func (p *packed) offset() int32 {
	if p.signed8 {
		return 0
	}
	return p.f.offset
}

// unpackGroup writes the 32 levels of each lane of a group as int32 into
// w[r][k0 : k0+32] (signed when the levels are stored signed).
func unpackGroup(g []byte, f *format, signed bool, w *[tileRows][256]int32, k0 int) {
	if f.u4 {
		for p := range 4 {
			for r := range tileRows {
				for i, b := range g[p*32+r*4 : p*32+r*4+4] {
					w[r][k0+4*p+i], w[r][k0+16+4*p+i] = int32(b&0xf), int32(b>>4)
				}
			}
		}
		if f.hbits == 0 {
			return
		}
		for r := range tileRows {
			for k := range 32 {
				t, i := k/4, k%4
				var hb byte
				if f.hbits == 1 {
					hb = g[128+r*4+i] >> t & 1
				} else {
					hb = g[128+(t/4)*32+r*4+i] >> (2 * (t % 4)) & 3
				}
				w[r][k0+k] |= int32(hb) << 4
			}
		}
		return
	}
	for t := range 8 {
		for r := range tileRows {
			for i, b := range g[t*32+r*4 : t*32+r*4+4] {
				if signed {
					w[r][k0+4*t+i] = int32(int8(b))
				} else {
					w[r][k0+4*t+i] = int32(b)
				}
			}
		}
	}
}

// dot8 is Σ w[i]·a[i] over len(w) int8 activations.
func dot8(w []int32, a []byte) int32 {
	a = a[:len(w)]
	var s0, s1, s2, s3 int32
	for i := 0; i+4 <= len(w); i += 4 {
		s0 += w[i] * int32(int8(a[i]))
		s1 += w[i+1] * int32(int8(a[i+1]))
		s2 += w[i+2] * int32(int8(a[i+2]))
		s3 += w[i+3] * int32(int8(a[i+3]))
	}
	return s0 + s1 + s2 + s3
}

// The kernels unpack a block's levels once and use them for up to
// maxCols activation rows at a time.
const maxCols = 8

func gemmLegacyGo[A, D float32 | float64](p *packed, w []byte, tiles int, act []byte, stride, cols int, dst []D, ld int) {
	f, o, lv := p.f, p.offset(), p.levelsOff()
	var lev [tileRows][256]int32
	for c0 := 0; c0 < cols; c0 += maxCols {
		nc := min(maxCols, cols-c0)
		for t := range tiles {
			tile := w[t*p.tileBytes:]
			var acc [maxCols][tileRows]A
			for b := 0; b < p.nb; b++ {
				blk := tile[b*p.blockBytes:]
				unpackGroup(blk[lv:], f, p.signed8, &lev, 0)
				var dw, dm [tileRows]float32
				for r := range tileRows {
					dw[r] = f16At(blk[2*r:])
					if f.hasMin {
						dm[r] = f16At(blk[p.minOff()+2*r:])
					}
				}
				for c := range nc {
					ar := act[(c0+c)*q8Rec+b*stride:]
					da, sa := f32At(ar[32:]), i32At(ar[36:])
					for r := range tileRows {
						dot := dot8(lev[r][:32], ar) - o*sa
						acc[c][r] += A(dot) * A(dw[r]*da)
						if f.hasMin {
							acc[c][r] += A(sa) * A(dm[r]*da)
						}
					}
				}
			}
			for c := range nc {
				store(dst[(c0+c)*ld+t*tileRows:], &acc[c])
			}
		}
	}
}

func gemmKGo[A, D float32 | float64](p *packed, w []byte, tiles int, act []byte, stride, cols int, dst []D, ld int) {
	f, o, lv := p.f, p.offset(), p.levelsOff()
	gb := f.groupBytes()
	sumOff := q8KSum16
	if f.sub == 32 {
		sumOff = q8KSum32
	}
	var lev [tileRows][256]int32
	for c0 := 0; c0 < cols; c0 += maxCols {
		nc := min(maxCols, cols-c0)
		for t := range tiles {
			tile := w[t*p.tileBytes:]
			var acc [maxCols][tileRows]A
			for b := 0; b < p.nb; b++ {
				blk := tile[b*p.blockBytes:]
				for g := range 8 {
					unpackGroup(blk[lv+g*gb:], f, p.signed8, &lev, 32*g)
				}
				for c := range nc {
					ar := act[(c0+c)*q8KRec+b*stride:]
					da := f32At(ar[q8KD:])
					var isum, msum [tileRows]int32
					for s := range p.nsub {
						sum := i32At(ar[sumOff+4*s:])
						e0 := s * f.sub
						for r := range tileRows {
							dot := dot8(lev[r][e0:e0+f.sub], ar[e0:]) - o*sum
							isum[r] += int32(int8(blk[p.scOff()+s*tileRows+r])) * dot
							if f.hasMin {
								msum[r] += int32(blk[p.mnOff()+s*tileRows+r]) * sum
							}
						}
					}
					for r := range tileRows {
						acc[c][r] += A(isum[r]) * A(f16At(blk[2*r:])*da)
						if f.hasMin {
							acc[c][r] -= A(msum[r]) * A(f16At(blk[p.minOff()+2*r:])*da)
						}
					}
				}
			}
			for c := range nc {
				store(dst[(c0+c)*ld+t*tileRows:], &acc[c])
			}
		}
	}
}

func gemmFloatGo[A, D float32 | float64](p *packed, w []byte, tiles int, act []byte, stride, cols int, dst []D, ld int) {
	typ := p.f.typ
	for c0 := 0; c0 < cols; c0 += maxCols {
		nc := min(maxCols, cols-c0)
		for t := range tiles {
			tile := w[t*p.tileBytes:]
			var acc [maxCols][tileRows]A
			var v [tileRows]float32
			for k := 0; k < p.nb; k++ {
				blk := tile[k*p.blockBytes:]
				for r := range tileRows {
					switch typ {
					case ggml.F32:
						v[r] = f32At(blk[4*r:])
					case ggml.F16:
						v[r] = f16At(blk[2*r:])
					default:
						v[r] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(blk[2*r:])) << 16)
					}
				}
				for c := range nc {
					x := f32At(act[(c0+c)*f32Rec+k*stride:])
					for r := range tileRows {
						acc[c][r] += A(v[r]) * A(x)
					}
				}
			}
			for c := range nc {
				store(dst[(c0+c)*ld+t*tileRows:], &acc[c])
			}
		}
	}
}
