package quant

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/weftlm/weft/ggml"
)

func TestDequantizeRejectsBadSizes(t *testing.T) {
	tests := []struct {
		name    string
		typ     ggml.Type
		nSrc    int
		nDst    int
		wantErr string
	}{
		{"empty is fine", ggml.Q4_K, 0, 0, ""},
		{"one block", ggml.Q4_0, 18, 32, ""},
		{"partial block", ggml.Q4_0, 18, 31, "not a whole number of 32-element blocks"},
		{"short source", ggml.Q6_K, 209, 256, "take 210 bytes"},
		{"long source", ggml.Q8_0, 35, 32, "take 34 bytes"},
		{"plain type", ggml.F16, 6, 3, ""},
		{"plain type short", ggml.I64, 15, 2, "take 16 bytes"},
		{"removed id", ggml.Type(4), 18, 32, "unknown tensor type id 4"},
		{"id past the table", ggml.Type(1000), 0, 0, "unknown tensor type id 1000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Dequantize(tc.typ, make([]byte, tc.nSrc), make([]float32, tc.nDst))
			checkErr(t, err, tc.wantErr)
		})
	}
}

func TestQuantizeRejectsBadInput(t *testing.T) {
	tests := []struct {
		name    string
		typ     ggml.Type
		src     []float32
		nDst    int
		wantErr string
	}{
		{"fine", ggml.Q8_0, make([]float32, 32), 34, ""},
		{"unsupported", ggml.IQ2_XXS, make([]float32, 256), 66, "not supported"},
		{"unknown", ggml.Type(77), nil, 0, "not supported"},
		{"partial block", ggml.Q4_K, make([]float32, 255), 144, "not a whole number of 256-element blocks"},
		{"wrong dst", ggml.Q4_0, make([]float32, 64), 35, "take 36 bytes"},
		{"NaN", ggml.Q5_1, withValue(32, 7, float32(math.NaN())), 24, "element 7 is NaN"},
		{"inf", ggml.Q3_K, withValue(256, 3, float32(math.Inf(-1))), 110, "element 3 is -Inf"},
		{"F16 keeps NaN", ggml.F16, withValue(4, 1, float32(math.NaN())), 8, ""},
		{"scale overflow Q8_0", ggml.Q8_0, withValue(64, 40, 1e10), 68, "block 1: scale"},
		{"scale overflow Q4_K", ggml.Q4_K, withValue(256, 0, 3e38), 144, "overflows fp16"},
		{"scale overflow Q6_K", ggml.Q6_K, withValue(256, 0, 1e9), 210, "overflows fp16"},
		{"scale overflow IQ4_XS", ggml.IQ4_XS, withValue(256, 0, 1e12), 136, "overflows fp16"},
		{"Q8_K has a float32 scale", ggml.Q8_K, withValue(256, 0, 3e38), 292, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Quantize(tc.typ, tc.src, make([]byte, tc.nDst))
			checkErr(t, err, tc.wantErr)
			if tc.name == "unsupported" && !errors.Is(err, ErrUnsupported) {
				t.Errorf("error %v does not wrap ErrUnsupported", err)
			}
		})
	}
}

func withValue(n, i int, v float32) []float32 {
	x := make([]float32, n)
	x[i] = v
	return x
}

func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case want != "" && err == nil:
		t.Fatalf("no error, want one containing %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("error %q does not contain %q", err, want)
	}
}

// Dequantize is meant for per-row use on hot paths: it must not allocate.
func TestDequantizeDoesNotAllocate(t *testing.T) {
	for _, typ := range ggml.Types() {
		src := benchRow(typ, 512)
		dst := make([]float32, 512)
		allocs := testing.AllocsPerRun(20, func() {
			if err := DequantizeRow(typ, src, dst); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per row", typ, allocs)
		}
	}
}

func TestQuantizeSupported(t *testing.T) {
	want := map[ggml.Type]bool{
		ggml.F32: true, ggml.F16: true, ggml.BF16: true,
		ggml.Q4_0: true, ggml.Q4_1: true, ggml.Q5_0: true, ggml.Q5_1: true, ggml.Q8_0: true, ggml.Q8_1: true,
		ggml.Q2_K: true, ggml.Q3_K: true, ggml.Q4_K: true, ggml.Q5_K: true, ggml.Q6_K: true, ggml.Q8_K: true,
		ggml.IQ4_NL: true, ggml.IQ4_XS: true, ggml.TQ1_0: true, ggml.TQ2_0: true,
	}
	for _, typ := range append(ggml.Types(), ggml.Type(4), ggml.Type(500)) {
		if got := QuantizeSupported(typ); got != want[typ] {
			t.Errorf("QuantizeSupported(%s) = %v, want %v", typ, got, want[typ])
		}
	}
}

// The types gguf-py cannot dequantize, checked against hand-built blocks.
func TestDequantizeWithoutGGUFPy(t *testing.T) {
	t.Run("Q8_1", func(t *testing.T) {
		blk := make([]byte, 36)
		binary.LittleEndian.PutUint16(blk, F32ToF16(0.5))
		binary.LittleEndian.PutUint16(blk[2:], F32ToF16(1234)) // s is not used
		for j := range 32 {
			blk[4+j] = byte(int8(j*8 - 128))
		}
		got := make([]float32, 32)
		if err := Dequantize(ggml.Q8_1, blk, got); err != nil {
			t.Fatal(err)
		}
		for j, v := range got {
			if want := float32(j*8-128) * 0.5; v != want {
				t.Fatalf("element %d: got %g, want %g", j, v, want)
			}
		}
	})
	t.Run("Q8_K", func(t *testing.T) {
		blk := make([]byte, 292)
		binary.LittleEndian.PutUint32(blk, math.Float32bits(-0.125))
		for j := range 256 {
			blk[4+j] = byte(j)
		}
		got := make([]float32, 256)
		if err := Dequantize(ggml.Q8_K, blk, got); err != nil {
			t.Fatal(err)
		}
		for j, v := range got {
			if want := float32(int8(j)) * -0.125; v != want {
				t.Fatalf("element %d: got %g, want %g", j, v, want)
			}
		}
	})
	t.Run("MXFP4", func(t *testing.T) {
		fp4 := []float64{0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6}
		for _, e := range []int{0, 1, 2, 100, 127, 128, 200, 254, 255} {
			blk := make([]byte, 17)
			blk[0] = byte(e)
			for j := range 16 {
				blk[1+j] = byte(j) | byte(15-j)<<4
			}
			got := make([]float32, 32)
			if err := Dequantize(ggml.MXFP4, blk, got); err != nil {
				t.Fatal(err)
			}
			for j := range 32 {
				code := j
				if j >= 16 {
					code = 15 - (j - 16)
				}
				want := float32(math.Ldexp(fp4[code], e-127))
				if !sameFloat(got[j], want) {
					t.Fatalf("e=%d element %d: got %g, want %g", e, j, got[j], want)
				}
			}
		}
	})
}

// quantErrorBound is the largest relative RMS error dequantize(quantize(x))
// may have for Gaussian x. For the uniform types the error is the rounding
// error of a uniform quantizer, step/√12: with block max |x| ≈ 2.35σ (32
// Gaussians) that is 2.35/(qmax·√12) relative, e.g. 0.53% for Q8_0 (qmax
// 127), 8.5% for Q4_0 (step max/8), and with range ≈ 4.1σ, 7.9% for Q4_1
// (15 steps); Q8_K's 256-element blocks have max ≈ 3σ, 0.68%. The bounds
// sit about 10% above these. The k-quants must beat the best quantizer with
// one global scale and as many levels (Lloyd–Max for a Gaussian: 34.3% at 4
// levels, 18.6% at 8, 9.7% at 16, 5.0% at 32, 2.5% at 64), which their
// per-sub-block scales and searched mins make possible; their bounds again
// sit about 10% above what the reference algorithm achieves. Plain types
// round the significand: 2^-11 (f16) and 2^-8 (bf16) relative steps.
var quantErrorBound = map[ggml.Type]float64{
	ggml.F32:    0,
	ggml.F16:    0.0003,
	ggml.BF16:   0.0025,
	ggml.Q8_0:   0.006,
	ggml.Q8_1:   0.006,
	ggml.Q8_K:   0.0078,
	ggml.Q4_0:   0.095,
	ggml.Q4_1:   0.087,
	ggml.Q5_0:   0.047,
	ggml.Q5_1:   0.042,
	ggml.Q2_K:   0.32,
	ggml.Q3_K:   0.165,
	ggml.Q4_K:   0.078,
	ggml.Q5_K:   0.040,
	ggml.Q6_K:   0.0195,
	ggml.IQ4_NL: 0.084,
	ggml.IQ4_XS: 0.084,
}

func gaussian(n int, sigma float64, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 7))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * sigma)
	}
	return x
}

// roundTrip quantizes x to typ and back.
func roundTrip(t *testing.T, typ ggml.Type, x []float32) []float32 {
	t.Helper()
	n, err := typ.RowBytes(uint64(len(x)))
	if err != nil {
		t.Fatal(err)
	}
	q := make([]byte, n)
	if err := Quantize(typ, x, q); err != nil {
		t.Fatal(err)
	}
	y := make([]float32, len(x))
	if err := Dequantize(typ, q, y); err != nil {
		t.Fatal(err)
	}
	return y
}

func relRMS(x, y []float32) float64 {
	var se, sx float64
	for i := range x {
		d := float64(x[i]) - float64(y[i])
		se += d * d
		sx += float64(x[i]) * float64(x[i])
	}
	return math.Sqrt(se / sx)
}

func TestQuantizationError(t *testing.T) {
	for _, typ := range ggml.Types() {
		if !QuantizeSupported(typ) || typ == ggml.TQ1_0 || typ == ggml.TQ2_0 {
			continue
		}
		bound, ok := quantErrorBound[typ]
		if !ok {
			t.Errorf("%s: no error bound", typ)
			continue
		}
		// σ = 0.02 is typical of LLM weights and puts some k-quant
		// super-block scales in fp16's subnormal range; σ = 30 does not.
		for _, sigma := range []float64{0.02, 30} {
			x := gaussian(1<<14, sigma, uint64(typ))
			e := relRMS(x, roundTrip(t, typ, x))
			if e > bound {
				t.Errorf("%s σ=%g: relative RMS error %.4f%% above %.4f%%", typ, sigma, 100*e, 100*bound)
			}
			t.Logf("%-7s σ=%-5g %.4f%%", typ, sigma, 100*e)
		}
	}
}

// The ternary types represent {-a, 0, a} exactly when a is an fp16 value.
func TestTernaryExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	x := make([]float32, 4*256)
	for i := range x {
		x[i] = float32(rng.IntN(3)-1) * 0.375
	}
	for _, typ := range []ggml.Type{ggml.TQ1_0, ggml.TQ2_0} {
		y := roundTrip(t, typ, x)
		for i := range x {
			if x[i] != y[i] {
				t.Fatalf("%s element %d: %g came back as %g", typ, i, x[i], y[i])
			}
		}
	}
}

// Blocks of zeros come back as zeros, and a block of one repeated value
// comes back close to it, for every quantizer.
func TestQuantizeDegenerateBlocks(t *testing.T) {
	for _, typ := range ggml.Types() {
		if !QuantizeSupported(typ) {
			continue
		}
		x := make([]float32, 512)
		for i := 256; i < 512; i++ {
			x[i] = -0.75
		}
		y := roundTrip(t, typ, x)
		for i, v := range y {
			want := x[i]
			if math.Abs(float64(v-want)) > 0.75*0.02 {
				t.Fatalf("%s element %d: %g came back as %g", typ, i, want, v)
			}
		}
	}
}

// TestQ3KToQ6K: Q3_K super-blocks rewritten as Q6_K dequantize to the same
// float32 values bit for bit, including blocks of every level and scale
// extreme, and bad lengths are refused.
func TestQ3KToQ6K(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 6))
	x := make([]float32, 256*20)
	for i := range x {
		x[i] = float32(rng.NormFloat64()) * float32(1+i%9)
	}
	src := make([]byte, 20*110)
	if err := Quantize(ggml.Q3_K, x, src); err != nil {
		t.Fatal(err)
	}
	// Random bytes are valid Q3_K too (every level and scale pattern),
	// with d kept finite.
	for i := 110 * 15; i < len(src); i++ {
		src[i] = byte(rng.Uint32())
	}
	for b := 15; b < 20; b++ {
		binary.LittleEndian.PutUint16(src[110*b+108:], F32ToF16(float32(b)*0.01))
	}
	dst := make([]byte, 20*210)
	if err := Q3KToQ6K(src, dst); err != nil {
		t.Fatal(err)
	}
	want, got := make([]float32, len(x)), make([]float32, len(x))
	if err := Dequantize(ggml.Q3_K, src, want); err != nil {
		t.Fatal(err)
	}
	if err := Dequantize(ggml.Q6_K, dst, got); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("element %d: %g as Q6_K, %g as Q3_K", i, got[i], want[i])
		}
	}
	if err := Q3KToQ6K(src[1:], dst); err == nil {
		t.Error("a partial super-block converted")
	}
	if err := Q3KToQ6K(src, dst[210:]); err == nil {
		t.Error("converted into too little room")
	}
}
