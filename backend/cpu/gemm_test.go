package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/quant"
)

// randomWeight returns rows×cols values quantized to t, and their
// dequantized float32 values.
func randomWeight(t *testing.T, typ ggml.Type, rows, cols int, rng *rand.Rand) ([]byte, []float32) {
	t.Helper()
	x := make([]float32, rows*cols)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
		if i%97 == 0 {
			x[i] *= 8 // outliers widen the blocks' ranges
		}
	}
	rb, err := typ.RowBytes(uint64(cols))
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, rows*int(rb))
	if err := quant.Quantize(typ, x, raw); err != nil {
		t.Fatal(err)
	}
	if typ == ggml.Q8_0 {
		// -128 never comes out of the quantizer but is a valid level.
		for i := 2; i < len(raw); i += 34 * 7 {
			raw[i+rng.IntN(32)] = 0x80
		}
	}
	w := make([]float32, rows*cols)
	if err := quant.Dequantize(typ, raw, w); err != nil {
		t.Fatal(err)
	}
	return raw, w
}

// dequantAct returns the values the activation records of row c stand for.
func dequantAct(lay actLayout, act []byte, c, cols int) []float32 {
	out := make([]float32, cols)
	off, st := lay.rowOff(c), lay.stride()
	for b := 0; b < lay.nb; b++ {
		r := act[off+b*st:]
		switch lay.rec {
		case q8Rec:
			for j := range 32 {
				out[32*b+j] = float32(int8(r[j])) * f32At(r[32:])
			}
		case q8KRec:
			for j := range 256 {
				out[256*b+j] = float32(int8(r[j])) * f32At(r[q8KD:])
			}
		default:
			out[b] = f32At(r)
		}
	}
	return out
}

var allTypes = []ggml.Type{ggml.F32, ggml.F16, ggml.BF16, ggml.Q4_0, ggml.Q4_1, ggml.Q5_0, ggml.Q5_1, ggml.Q8_0,
	ggml.IQ4_NL, ggml.Q2_K, ggml.Q3_K, ggml.Q4_K, ggml.Q5_K, ggml.Q6_K, ggml.IQ4_XS}

// TestGEMM multiplies random weights of every packed type by random
// activations with every kernel level and compares with a float64 product
// of the dequantized weights and the dequantized activation records. The
// integer dot products are exact, so the bar is float32 rounding: 1e-5 of
// Σ|w·a|. Shapes cover one block, odd row counts (partial tiles), several
// column groups and long rows.
func TestGEMM(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, typ := range allTypes {
		f := formats[typ]
		// columns: one block, a few, many; floats also lengths that are
		// not whole vectors or unrolled steps
		colCounts := []int{32, 96, 1280}
		switch f.family {
		case famK:
			colCounts = []int{256, 768, 2304}
		case famFloat:
			colCounts = append(colCounts, 1, 7, 37)
		}
		for _, cols := range colCounts {
			for _, rows := range []int{1, 7, 8, 9, 35} {
				raw, w := randomWeight(t, typ, rows, cols, rng)
				for _, k := range isas {
					p, err := pack(f, rows, cols, raw, k.signed8, 2)
					if err != nil {
						t.Fatal(err)
					}
					for _, n := range []int{1, 3, k.group, 2*k.group + 1} {
						name := fmt.Sprintf("%s/%s/%dx%d/n%d", k.name, typ, rows, cols, n)
						checkGEMM(t, name, k, p, w, n, rng)
					}
				}
			}
		}
	}
}

func checkGEMM(t *testing.T, name string, k *isa, p *packed, w []float32, n int, rng *rand.Rand) {
	t.Helper()
	rows, cols := p.rows, p.cols
	x := make([]float32, n*cols)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	lay := layoutFor(p.f, cols, k.group)
	act := make([]byte, lay.bytes(n))
	for c := range n {
		k.convert(lay, x[c*cols:(c+1)*cols], act, c)
	}
	ld := rows + 3 // a leading dimension wider than the rows
	dst := make([]float32, n*ld)
	for i := range dst {
		dst[i] = float32(math.NaN())
	}
	scratch := make([]float32, tileRows*k.group)
	// two calls over a split tile range, as the worker pool makes them
	mid := p.tiles / 2
	p.mulTiles(k, act, lay, n, dst, ld, 0, mid, scratch)
	p.mulTiles(k, act, lay, n, dst, ld, mid, p.tiles, scratch)
	for c := range n {
		a := dequantAct(lay, act, c, cols)
		for j := range rows {
			var ref, mag float64
			for i := range cols {
				v := float64(w[j*cols+i]) * float64(a[i])
				ref += v
				mag += math.Abs(v)
			}
			got := float64(dst[c*ld+j])
			if !(math.Abs(got-ref) <= 1e-5*mag+1e-30) {
				t.Fatalf("%s: out[%d][%d] = %g, want %g (|Σ| %g)", name, c, j, got, ref, mag)
			}
		}
		for j := rows; j < ld; j++ {
			if !math.IsNaN(float64(dst[c*ld+j])) {
				t.Fatalf("%s: wrote past the rows at [%d][%d]", name, c, j)
			}
		}
	}
}

// TestActivationQuantization checks the records against their definition:
// levels within [-127, 127], the block's largest magnitude at ±127, the
// sums, and the round trip within half a step.
func TestActivationQuantization(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, k := range isas {
		for _, f := range []*format{formats[ggml.Q8_0], formats[ggml.Q4_K]} {
			cols := 512
			lay := layoutFor(f, cols, k.group)
			n := k.group + 1
			x := make([]float32, n*cols)
			for i := range x {
				x[i] = float32(rng.NormFloat64() * math.Exp(rng.NormFloat64()))
			}
			clear(x[cols : cols+lay.elems]) // an all-zero block
			act := make([]byte, lay.bytes(n))
			for c := range n {
				k.convert(lay, x[c*cols:(c+1)*cols], act, c)
			}
			for c := range n {
				a := dequantAct(lay, act, c, cols)
				for b := 0; b < lay.nb; b++ {
					rec := act[lay.rowOff(c)+b*lay.stride():]
					d := abs32(f32At(rec[lay.elems:])) // Q8_K scales are negative for a positive extreme
					var sum int32
					var top int
					for j := range lay.elems {
						q := int32(int8(rec[j]))
						sum += q
						top = max(top, int(math.Abs(float64(q))))
						if e := math.Abs(float64(a[b*lay.elems+j] - x[c*cols+b*lay.elems+j])); e > 0.5001*float64(d)+1e-30 {
							t.Fatalf("%s %s row %d block %d elem %d: error %g > half step %g", k.name, f.typ, c, b, j, e, d/2)
						}
					}
					if d != 0 && top != 127 {
						t.Errorf("%s %s row %d block %d: largest level %d", k.name, f.typ, c, b, top)
					}
					if lay.rec == q8Rec && i32At(rec[36:]) != sum {
						t.Errorf("%s row %d block %d: sum %d, want %d", k.name, c, b, i32At(rec[36:]), sum)
					}
					if lay.rec == q8KRec {
						var s16 int32
						for i := range 16 {
							s16 += i32At(rec[q8KSum16+4*i:])
						}
						if s16 != sum {
							t.Errorf("%s row %d block %d: 16-sums add to %d, want %d", k.name, c, b, s16, sum)
						}
					}
				}
			}
		}
	}
}

// BenchmarkGEMM times one thread multiplying a 2048×2048 weight (a 1B
// model's attention projection) by 1 activation row (decode) and by 64
// (a prefill chunk), per kernel level; GB/s counts weight bytes.
func BenchmarkGEMM(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	const rows, cols = 2048, 2048
	for _, typ := range []ggml.Type{ggml.Q4_0, ggml.Q8_0, ggml.Q4_K, ggml.Q6_K, ggml.F16} {
		t := &testing.T{}
		raw, _ := randomWeight(t, typ, rows, cols, rng)
		for _, k := range isas {
			p, err := pack(formats[typ], rows, cols, raw, k.signed8, 2)
			if err != nil {
				b.Fatal(err)
			}
			for _, n := range []int{1, 64} {
				b.Run(fmt.Sprintf("%s/%s/n%d", typ, k.name, n), func(b *testing.B) {
					lay := layoutFor(p.f, cols, min(n, k.group))
					act := make([]byte, lay.bytes(n))
					x := make([]float32, cols)
					for i := range x {
						x[i] = float32(rng.NormFloat64())
					}
					for c := range n {
						k.convert(lay, x, act, c)
					}
					dst := make([]float32, n*rows)
					scratch := make([]float32, tileRows*k.group)
					b.SetBytes(int64(len(raw)))
					for b.Loop() {
						p.mulTiles(k, act, lay, n, dst, rows, 0, p.tiles, scratch)
					}
				})
			}
		}
	}
}
