package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/quant"
)

// TestExactSplitK: the exact level's products do not depend on how K is
// split. Each weight is multiplied whole, and in three pieces of K (as a
// GPU kernel gives a row's K to several lanes), the pieces' float64 sums
// added in reverse order; the rounded results must be bit-identical. The
// same split with float32 accumulators must differ somewhere, or the test
// would prove nothing.
func TestExactSplitK(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	types := slices.Sorted(func(yield func(ggml.Type) bool) {
		for typ := range formats {
			if !yield(typ) {
				return
			}
		}
	})
	const rows = 67
	for _, typ := range types {
		f := formats[typ]
		bs := int(typ.BlockSize())
		if f.family == famFloat {
			bs = 25
		}
		pieces := []int{5, 4, 3} // blocks of K in each piece
		cols := 12 * bs
		raw, _ := randomWeight(t, typ, rows, cols, rng)
		rb, err := typ.RowBytes(uint64(cols))
		if err != nil {
			t.Fatal(err)
		}
		blockBytes := int(rb) / 12
		x := make([]float32, cols)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		// product returns the tile-padded float64 sums of the weight's
		// columns [k0, k1) against x's.
		product := func(k0, k1 int, acc32 bool) []float64 {
			n := k1 - k0
			part := make([]byte, 0, rows*(n/bs)*blockBytes)
			for r := range rows {
				row := raw[r*int(rb):]
				part = append(part, row[k0/bs*blockBytes:k1/bs*blockBytes]...)
			}
			p, err := pack(f, rows, n, part, false, 1)
			if err != nil {
				t.Fatal(err)
			}
			lay := layoutFor(f, n, 1)
			act := make([]byte, lay.bytes(1))
			exactLevel.convert(lay, x[k0:k1], act, 0)
			dst := make([]float64, p.tiles*tileRows)
			if acc32 {
				gemmAcc[float32](p, p.data, p.tiles, act, lay.stride(), 1, dst, len(dst))
			} else {
				gemmAcc[float64](p, p.data, p.tiles, act, lay.stride(), 1, dst, len(dst))
			}
			return dst
		}
		for _, acc32 := range []bool{false, true} {
			whole := product(0, cols, acc32)
			sum := make([]float64, len(whole))
			k1 := cols
			for i := len(pieces) - 1; i >= 0; i-- {
				k0 := k1 - pieces[i]*bs
				for j, v := range product(k0, k1, acc32) {
					if acc32 {
						sum[j] = float64(float32(sum[j]) + float32(v))
					} else {
						sum[j] += v
					}
				}
				k1 = k0
			}
			differ := 0
			for j := range rows {
				a, b := float32(whole[j]), float32(sum[j])
				if math.Float32bits(a) == math.Float32bits(b) {
					continue
				}
				differ++
				if !acc32 {
					t.Errorf("%s: row %d: whole K %g (%#x), split %g (%#x)", typ, j, a, math.Float32bits(a), b, math.Float32bits(b))
				}
			}
			if acc32 {
				t.Logf("%s: with float32 accumulators %d of %d rows differ when K is split", typ, differ, rows)
				if differ == 0 {
					t.Errorf("%s: float32 accumulators gave the same rows whole and split: the test shows nothing", typ)
				}
			}
		}
	}
}

// TestExactAttentionSplits: the exact level's attention agrees bit for bit
// with flash-decoding's order, computed here in float64: keys in runs
// whose partial maxima, sums and weighted values are merged by rescaling,
// and each score's dot product summed in two halves of the head.
func TestExactAttentionSplits(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	const capacity, heads, nkv, hd = 48, 4, 2, 64
	kvDim := nkv * hd
	pos := []int32{0, 5, 30, 47, 100} // 100: the ring cache wrapped
	for _, f16 := range []bool{false, true} {
		for _, window := range []int{0, 17} {
			for _, softcap := range []float32{0, 20} {
				name := fmt.Sprintf("f16=%v/window=%d/cap=%g", f16, window, softcap)
				rows := len(pos)
				kv := kvCache{capacity: capacity, kvDim: kvDim}
				kf, vf := randFloats(rng, capacity*kvDim, 2), randFloats(rng, capacity*kvDim, 1)
				if f16 {
					kv.k16, kv.v16 = make([]uint16, len(kf)), make([]uint16, len(vf))
					toF16(kv.k16, kf)
					toF16(kv.v16, vf)
				} else {
					kv.k, kv.v = kf, vf
				}
				key := func(slot, h int) []float64 {
					out := make([]float64, hd)
					at := slot*kvDim + (h/(heads/nkv))*hd
					for d := range out {
						if f16 {
							out[d] = float64(f16At([]byte{byte(kv.k16[at+d]), byte(kv.k16[at+d] >> 8)}))
						} else {
							out[d] = float64(kv.k[at+d])
						}
					}
					return out
				}
				val := func(slot, h, d int) float64 {
					at := slot*kvDim + (h/(heads/nkv))*hd + d
					if f16 {
						return float64(f16At([]byte{byte(kv.v16[at]), byte(kv.v16[at] >> 8)}))
					}
					return float64(kv.v[at])
				}
				q := randFloats(rng, rows*heads*hd, 1)
				out := make([]float32, len(q))
				op := &backend.Op{A: 0, Out: 1, NHeads: heads, NKV: nkv, HeadDim: hd, Scale: 0.125, Cap: softcap, Window: window}
				e := &exec{bufs: [][]float32{q, out}, kv: []kvCache{kv}, batch: &backend.Batch{Pos: pos, Slots: make([]int32, rows)}}
				e.exactScratch = [][]float64{make([]float64, capacity+hd)}
				body := e.attentionExactBody(op)
				for r, p := range pos {
					if window > 0 || int(p) < capacity {
						body(r*heads, (r+1)*heads, 0)
					}
				}
				for r, p := range pos {
					if window == 0 && int(p) >= capacity {
						continue // not a position this cache could hold
					}
					first := 0
					if window > 0 {
						first = max(0, int(p)-window+1)
					}
					for h := range heads {
						qh := q[(r*heads+h)*hd:][:hd]
						score := func(j int) float64 {
							kj := key(j%capacity, h)
							var lo, hi float64
							for d := hd - 1; d >= hd/2; d-- {
								hi += float64(qh[d]) * kj[d]
							}
							for d := range hd / 2 {
								lo += float64(qh[d]) * kj[d]
							}
							s := (hi + lo) * 0.125
							if softcap > 0 {
								s = float64(softcap) * math.Tanh(s/float64(softcap))
							}
							return s
						}
						// runs of 7 positions, last run first
						mAll, lAll := math.Inf(-1), 0.0
						oAll := make([]float64, hd)
						for end := int(p) + 1; end > first; end -= 7 {
							start := max(first, end-7)
							m := math.Inf(-1)
							for j := start; j < end; j++ {
								m = max(m, score(j))
							}
							var l float64
							o := make([]float64, hd)
							for j := start; j < end; j++ {
								e := math.Exp(score(j) - m)
								l += e
								for d := range o {
									o[d] += e * val(j%capacity, h, d)
								}
							}
							mNew := max(mAll, m)
							a, b := math.Exp(mAll-mNew), math.Exp(m-mNew)
							lAll = lAll*a + l*b
							for d := range oAll {
								oAll[d] = oAll[d]*a + o[d]*b
							}
							mAll = mNew
						}
						for d := range hd {
							want := float32(oAll[d] / lAll)
							got := out[(r*heads+h)*hd+d]
							if math.Float32bits(want) != math.Float32bits(got) {
								t.Fatalf("%s: row %d head %d dim %d: %g, split in runs %g", name, r, h, d, got, want)
							}
						}
					}
				}
			}
		}
	}
}

// TestInt8ActivationsContract: the weight types the CPU packs with int8
// activations are exactly those backend.Int8Activations names, which the
// other backends follow.
func TestInt8ActivationsContract(t *testing.T) {
	n := 0
	for typ, f := range formats {
		if f.family == famFloat {
			if backend.Int8Activations(typ.String()) {
				t.Errorf("%s: float activations here, int8 in the contract", typ)
			}
			continue
		}
		n++
		if !backend.Int8Activations(typ.String()) {
			t.Errorf("%s: int8 activations here, float in the contract", typ)
		}
	}
	for _, typ := range []string{"IQ2_XXS", "IQ3_S", "TQ2_0", "MXFP4", "MLX_Q4", "F16"} {
		if backend.Int8Activations(typ) {
			t.Errorf("%s: in the contract's int8 types, but the CPU multiplies it by float activations", typ)
		}
	}
	if n != 12 {
		t.Errorf("%d packed quantized types, want the contract's 12", n)
	}
}

// TestExactLevelsAgree: every exact level this machine has (the VNNI
// kernels where present) multiplies every format bit for bit as the
// portable float64 kernels do, for one column and for several; and float
// weights whose products cancel (where float64 sums round by their order)
// too.
func TestExactLevelsAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	const rows = 37
	for _, k := range isas {
		if !k.exact {
			continue
		}
		// 8 rows of {2^15, 1, -2^15, 1} against {2^45, 1, 2^45, 1}: 0 or 1
		// by the order of the sums.
		for _, typ := range []ggml.Type{ggml.F32, ggml.F16, ggml.BF16} {
			f := formats[typ]
			w := make([]float32, 8*4)
			for r := range 8 {
				copy(w[4*r:], []float32{1 << 15, 1, -(1 << 15), 1})
			}
			raw := make([]byte, len(w)*int(typ.BlockBytes()))
			if err := quant.Quantize(typ, w, raw); err != nil {
				t.Fatal(err)
			}
			p, err := pack(f, 8, 4, raw, k.signed8, 1)
			if err != nil {
				t.Fatal(err)
			}
			lay := layoutFor(f, 4, 1)
			act := make([]byte, lay.bytes(1))
			k.convert(lay, []float32{1 << 45, 1, 1 << 45, 1}, act, 0)
			got, want := make([]float32, 8), make([]float32, 8)
			scratch := make([]float32, tileRows*k.group)
			p.mulTiles(k, act, lay, 1, got, 8, 0, p.tiles, scratch)
			p.mulTiles(&isa{group: k.group, gemm: gemmAcc[float64, float32]}, act, lay, 1, want, 8, 0, p.tiles, scratch)
			if !slices.Equal(got, want) {
				t.Errorf("%s: %s, cancelling sums: %v, the portable kernels %v", k.name, typ, got, want)
			}
		}
		for typ, f := range formats {
			cols := 3 * int(typ.BlockSize())
			if f.family == famFloat {
				cols = 75
			}
			raw, _ := randomWeight(t, typ, rows, cols, rng)
			p, err := pack(f, rows, cols, raw, k.signed8, 1)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range []int{1, 3, k.group, k.group + 3} {
				lay := layoutFor(f, cols, min(n, k.group))
				act := make([]byte, lay.bytes(n))
				for c := range n {
					k.convert(lay, randFloats(rng, cols, 1), act, c)
				}
				got, want := make([]float32, n*rows), make([]float32, n*rows)
				scratch := make([]float32, tileRows*k.group)
				p.mulTiles(k, act, lay, n, got, rows, 0, p.tiles, scratch)
				p.mulTiles(&isa{group: k.group, gemm: gemmAcc[float64, float32]}, act, lay, n, want, rows, 0, p.tiles, scratch)
				if !slices.Equal(got, want) {
					t.Errorf("%s: %s, %d columns: differs from the portable float64 kernels", k.name, typ, n)
				}
			}
		}
	}
}
