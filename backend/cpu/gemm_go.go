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

func gemmGo(p *packed, w []byte, tiles int, act []byte, stride, cols int, dst []float32, ld int) {
	switch p.f.family {
	case famLegacy:
		gemmLegacyGo(p, w, tiles, act, stride, cols, dst, ld)
	case famK:
		gemmKGo(p, w, tiles, act, stride, cols, dst, ld)
	default:
		gemmFloatGo(p, w, tiles, act, stride, cols, dst, ld)
	}
}

func f32At(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }
func i32At(b []byte) int32   { return int32(binary.LittleEndian.Uint32(b)) }
func f16At(b []byte) float32 { return quant.F16ToF32(binary.LittleEndian.Uint16(b)) }

// dotLevels is Σ level·a over elements [k0, k0+n) of lane r of a group.
func dotLevels(g []byte, r, k0, n int, u4, signed bool, a []byte) int32 {
	var s int32
	for k := k0; k < k0+n; k++ {
		l := int32(level(g, r, k, u4))
		if signed {
			l = int32(int8(l))
		}
		s += l * int32(int8(a[k]))
	}
	return s
}

func (p *packed) offset() int32 {
	if p.signed8 {
		return 0
	}
	return p.f.offset
}

func gemmLegacyGo(p *packed, w []byte, tiles int, act []byte, stride, cols int, dst []float32, ld int) {
	f, o, lv := p.f, p.offset(), p.levelsOff()
	for t := range tiles {
		tile := w[t*p.tileBytes:]
		for c := range cols {
			a := act[c*q8Rec:]
			var acc [tileRows]float32
			for b := 0; b < p.nb; b++ {
				blk, ar := tile[b*p.blockBytes:], a[b*stride:]
				da, sa := f32At(ar[32:]), i32At(ar[36:])
				for r := range tileRows {
					dot := dotLevels(blk[lv:], r, 0, 32, f.u4, p.signed8, ar) - o*sa
					acc[r] += float32(dot) * (f16At(blk[2*r:]) * da)
					if f.hasMin {
						acc[r] += float32(sa) * (f16At(blk[p.minOff()+2*r:]) * da)
					}
				}
			}
			copy(dst[c*ld+t*tileRows:], acc[:])
		}
	}
}

func gemmKGo(p *packed, w []byte, tiles int, act []byte, stride, cols int, dst []float32, ld int) {
	f, o, lv := p.f, p.offset(), p.levelsOff()
	gb := f.groupBytes()
	sumOff := q8KSum16
	if f.sub == 32 {
		sumOff = q8KSum32
	}
	for t := range tiles {
		tile := w[t*p.tileBytes:]
		for c := range cols {
			a := act[c*q8KRec:]
			var acc [tileRows]float32
			for b := 0; b < p.nb; b++ {
				blk, ar := tile[b*p.blockBytes:], a[b*stride:]
				da := f32At(ar[q8KD:])
				var isum, msum [tileRows]int32
				for s := range p.nsub {
					sum := i32At(ar[sumOff+4*s:])
					e0 := s * f.sub
					g := blk[lv+(e0/32)*gb:]
					for r := range tileRows {
						dot := dotLevels(g, r, e0%32, f.sub, f.u4, p.signed8, ar[e0-e0%32:]) - o*sum
						isum[r] += int32(int8(blk[p.scOff()+s*tileRows+r])) * dot
						if f.hasMin {
							msum[r] += int32(blk[p.mnOff()+s*tileRows+r]) * sum
						}
					}
				}
				for r := range tileRows {
					acc[r] += float32(isum[r]) * (f16At(blk[2*r:]) * da)
					if f.hasMin {
						acc[r] -= float32(msum[r]) * (f16At(blk[p.minOff()+2*r:]) * da)
					}
				}
			}
			copy(dst[c*ld+t*tileRows:], acc[:])
		}
	}
}

func gemmFloatGo(p *packed, w []byte, tiles int, act []byte, stride, cols int, dst []float32, ld int) {
	typ := p.f.typ
	for t := range tiles {
		tile := w[t*p.tileBytes:]
		for c := range cols {
			a := act[c*f32Rec:]
			var acc [tileRows]float32
			for k := 0; k < p.nb; k++ {
				x := f32At(a[k*stride:])
				blk := tile[k*p.blockBytes:]
				for r := range tileRows {
					var v float32
					switch typ {
					case ggml.F32:
						v = f32At(blk[4*r:])
					case ggml.F16:
						v = f16At(blk[2*r:])
					default:
						v = math.Float32frombits(uint32(binary.LittleEndian.Uint16(blk[2*r:])) << 16)
					}
					acc[r] += v * x
				}
			}
			copy(dst[c*ld+t*tileRows:], acc[:])
		}
	}
}
