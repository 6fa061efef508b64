package cuda

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/quant"
	"github.com/weftlm/weft/weights"
)

// quantizeQ8KRef quantizes x (a multiple of 256 long) as ggml's Q8_K and
// the CPU backend do: per super-block, the element m of largest magnitude
// (the positive one on a tie) maps to -127, q = min(round(x·(-127/m)),
// 127), d = 1/(-127/m).
func quantizeQ8KRef(x []float32) (q []int8, d []float32, sums [][16]int32) {
	q = make([]int8, len(x))
	for b := 0; b < len(x)/256; b++ {
		blk := x[256*b : 256*b+256]
		hi, lo := slices.Max(blk), slices.Min(blk)
		mx := hi
		if hi < -lo {
			mx = lo
		}
		var s [16]int32
		if mx == 0 {
			d, sums = append(d, 0), append(sums, s)
			continue
		}
		iscale := -127 / mx
		for i, v := range blk {
			l := min(int32(math.RoundToEven(float64(iscale*v))), 127)
			q[256*b+i] = int8(l)
			s[i/16] += l
		}
		d, sums = append(d, 1/iscale), append(sums, s)
	}
	return q, d, sums
}

// quantizeQ8Ref quantizes x (a multiple of 32 long) as quantize_q8 and
// the CPU backend's Q8_0 products do: per block of 32, d = max|x|/127 and
// q = round-half-even(x·(127/max|x|)). It returns each element's value
// d·q, the activation that K-quant products read under kA32.
func quantizeQ8Ref(x []float32) []float32 {
	v := make([]float32, len(x))
	for b := 0; b < len(x)/32; b++ {
		var amax float32
		for _, e := range x[32*b : 32*b+32] {
			amax = max(amax, float32(math.Abs(float64(e))))
		}
		if amax == 0 {
			continue
		}
		d, id := amax/127, 127/amax
		for i, e := range x[32*b : 32*b+32] {
			v[32*b+i] = d * float32(math.RoundToEven(float64(e*id)))
		}
	}
	return v
}

// kDevice lays out a GGUF K-quant tensor as uploadK does, in one piece.
func kDevice(t *testing.T, typ string, data []byte, rows, cols int) []byte {
	k := kLayouts[typ]
	nsb := cols / 256
	n := rows * nsb
	dev := make([]byte, n*k.deviceBlock())
	k.layOut(data, nsb, 0, rows, dev[:n*k.quants], dev[n*k.quants:n*(k.quants+16)], dev[n*(k.quants+16):])
	if len(dev) != len(data) && k.repack == nil {
		t.Fatalf("%s: device layout of %d bytes for %d in the file", typ, len(dev), len(data))
	}
	return dev
}

func f16le(b []byte) float32 { return quant.F16ToF32(binary.LittleEndian.Uint16(b)) }

// kScaleMin mirrors kscale_pair of matvec_k.cu: sub-block j's scale and
// minimum from a device header of type typ (Q4_K: pairScales's fields,
// unless kHeadGGML; Q5_K: ggml's packing).
func kScaleMin(typ string, h []byte, j int) (sc, m int) {
	s := h[4:16]
	if kLayouts[typ].pairs && !kHeadGGML {
		p := j >> 1
		f := int(s[3*p]) | int(s[3*p+1])<<8 | int(s[3*p+2])<<16
		f >>= 6 * (j & 1)
		return f & 63, f >> 12 & 63
	}
	if j < 4 {
		return int(s[j] & 63), int(s[j+4] & 63)
	}
	return int(s[j+4]&15 | (s[j-4]>>6)<<4), int(s[j+4]>>4 | (s[j]>>6)<<4)
}

// kParts returns row r's super-block sb parts in the device layout: its
// quants, header and the scales kept apart (Q6_K's d; Q2_K's d, dmin).
func kParts(typ string, dev []byte, rows, cols, r, sb int) (q, h []byte, d, dmin float32) {
	k := kLayouts[typ]
	nsb := cols / 256
	rowBytes := nsb * k.quants
	q = dev[r*rowBytes+sb*k.quants:][:k.quants]
	dOff := rows * rowBytes
	blk := r*nsb + sb
	h = dev[dOff+16*blk:][:16]
	if k.dBytes != 0 {
		at := dev[dOff+rows*nsb*16+k.dBytes*blk:]
		d = f16le(at)
		if k.dBytes == 4 {
			dmin = f16le(at[2:])
		}
	}
	return q, h, d, dmin
}

// iq4Levels is the IQ4_NL / IQ4_XS codebook (kernels' iq4_map).
var iq4Levels = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// kLevels mirrors kq_chunk: chunk c's 16 low and 16 high levels and the
// super-block offsets of their elements.
func kLevels(typ string, c int, q []byte) (lo, hi [16]int32, elo, ehi int) {
	switch typ {
	case "Q6_K":
		isc := c >> 1 & 1
		elo = 128*(c>>2) + 32*isc + 16*(c&1)
		ehi = elo + 64
		ql, qh := q[16*c:], q[128+32*(c>>2)+16*(c&1):]
		for b := range 16 {
			lo[b] = int32(ql[b]&15 | (qh[b]>>(2*isc)&3)<<4)
			hi[b] = int32(ql[b]>>4 | (qh[b]>>(4+2*isc)&3)<<4)
		}
	default:
		p := c >> 1
		elo = 64*p + 16*(c&1)
		ehi = elo + 32
		qs := q[16*c:]
		if typ == "Q5_K" {
			qs = q[32+16*c:]
		}
		for b := range 16 {
			lo[b], hi[b] = int32(qs[b]&15), int32(qs[b]>>4)
			if typ == "IQ4_XS" {
				lo[b], hi[b] = int32(iq4Levels[lo[b]]), int32(iq4Levels[hi[b]])
			}
			if typ == "Q5_K" {
				qh := q[16*(c&1)+b]
				lo[b] |= int32(qh>>(2*p)&1) << 4
				hi[b] |= int32(qh>>(2*p+1)&1) << 4
			}
		}
	}
	return lo, hi, elo, ehi
}

// kDot mirrors mvk_pass for one weight row and one activation row: the
// chunks' integer dot products scaled per sub-block.
func kDot(typ string, dev []byte, rows, cols, r int, q []int8, d []float32, sums [][16]int32) float64 {
	var acc float64
	for sb := range cols / 256 {
		qb, h, d6, dmin := kParts(typ, dev, rows, cols, r, sb)
		for c := range 8 {
			lo, hi, elo, ehi := kLevels(typ, c, qb)
			var dl, dh int32
			for b := range 16 {
				dl += lo[b] * int32(q[256*sb+elo+b])
				dh += hi[b] * int32(q[256*sb+ehi+b])
			}
			slo, shi := sums[sb][elo/16], sums[sb][ehi/16]
			da := d[sb]
			if typ == "Q6_K" {
				sclo, schi := int32(int8(h[elo/16])), int32(int8(h[ehi/16]))
				acc += float64(float32(sclo*(dl-32*slo)+schi*(dh-32*shi)) * (d6 * da))
				continue
			}
			if typ == "IQ4_XS" {
				sclo, schi := int32(int8(h[2+elo/32])), int32(int8(h[2+ehi/32]))
				acc += float64(float32(sclo*dl+schi*dh) * (f16le(h) * da))
				continue
			}
			if typ == "Q2_K" {
				sclo, mlo, schi, mhi := int32(h[elo/16]&15), int32(h[elo/16]>>4), int32(h[ehi/16]&15), int32(h[ehi/16]>>4)
				acc += float64(float32(sclo*dl+schi*dh)*(d6*da) - float32(mlo*slo+mhi*shi)*(dmin*da))
				continue
			}
			sclo, mlo := kScaleMin(typ, h, 2*(c>>1))
			schi, mhi := kScaleMin(typ, h, 2*(c>>1)+1)
			acc += float64(float32(int32(sclo)*dl+int32(schi)*dh)*(f16le(h)*da) - float32(int32(mlo)*slo+int32(mhi)*shi)*(f16le(h[2:])*da))
		}
	}
	return acc
}

// kDeq mirrors deqk: element i of row r.
func kDeq(typ string, dev []byte, rows, cols, r, i int) float32 {
	sb, e := i/256, i%256
	q, h, d6, dmin := kParts(typ, dev, rows, cols, r, sb)
	if typ == "IQ4_XS" {
		v := q[32*(e>>6)+e&31] >> (4 * (e >> 5 & 1)) & 15
		return f16le(h) * float32(int8(h[2+e>>5])) * float32(iq4Levels[v])
	}
	if typ == "Q2_K" {
		s := e >> 4
		v := q[32*(e>>6)+e&31] >> (4 * (e >> 5 & 1)) & 15
		dl, ml := d6*float32(h[s]&15), dmin*float32(h[s]>>4)
		return float32(dl*float32(v)) - ml
	}
	if typ == "Q6_K" {
		hh, k, l := e>>7, e>>5&3, e&31
		b := q[64*hh+32*(k&1)+l]
		v := int(b & 15)
		if k >= 2 {
			v = int(b >> 4)
		}
		v |= int(q[128+32*hh+l]>>(2*k)&3) << 4
		return d6 * float32(int8(h[e>>4])) * float32(v-32)
	}
	s, l := e>>5, e&31
	sc, m := kScaleMin(typ, h, s)
	qs := q
	if typ == "Q5_K" {
		qs = q[32:]
	}
	v := int(qs[32*(s>>1)+l] >> (4 * (s & 1)) & 15)
	if typ == "Q5_K" {
		v |= int(q[l]>>s&1) << 4
	}
	return f16le(h)*float32(sc)*float32(v) - f16le(h[2:])*float32(m)
}

// TestKLayout checks the device layout of the K-quants through a model of
// the kernels' indexing: every element dequantizes as package quant does,
// and the chunked integer dot products match a float64 product.
// Both header orders of Q4_K (pairScales's, and the file's under
// WEFT_CUDA_KHEAD=ggml) are checked.
func TestKLayout(t *testing.T) {
	for _, ggmlOrder := range []bool{false, true} {
		old := kHeadGGML
		kHeadGGML = ggmlOrder
		t.Run(fmt.Sprintf("ggml-header=%v", ggmlOrder), testKLayout)
		kHeadGGML = old
	}
}

func testKLayout(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const rows, cols = 5, 768
	for _, typ := range []string{"Q4_K", "Q5_K", "Q6_K", "Q2_K", "IQ4_XS"} {
		t.Run(typ, func(t *testing.T) {
			gt, _ := ggml.ParseType(typ)
			vals := make([]float32, rows*cols)
			for i := range vals {
				vals[i] = float32(rng.NormFloat64())
			}
			rb, _ := gt.RowBytes(cols)
			data := make([]byte, rows*int(rb))
			if err := quant.Quantize(gt, vals, data); err != nil {
				t.Fatal(err)
			}
			deq := make([]float32, rows*cols)
			if err := quant.Dequantize(gt, data, deq); err != nil {
				t.Fatal(err)
			}
			dev := kDevice(t, typ, data, rows, cols)
			for r := range rows {
				for i := range cols {
					if got := kDeq(typ, dev, rows, cols, r, i); got != deq[r*cols+i] {
						t.Fatalf("row %d element %d: %g, want %g", r, i, got, deq[r*cols+i])
					}
				}
			}
			x := make([]float32, cols)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			x[7] = -9 // the largest magnitude negative
			q, d, sums := quantizeQ8KRef(x)
			for r := range rows {
				var want float64
				for i := range cols {
					want += float64(deq[r*cols+i]) * float64(q[i]) * float64(d[i/256])
				}
				got := kDot(typ, dev, rows, cols, r, q, d, sums)
				if math.Abs(got-want) > 1e-5*math.Max(1, math.Abs(want)) {
					t.Errorf("row %d: %g, want %g", r, got, want)
				}
			}
		})
	}
}

// TestPairScales: pairScales keeps every sub-block's scale and minimum,
// for every bit pattern of the twelve bytes (random ones here, and all
// ones).
func TestPairScales(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	h := make([]byte, 16)
	for n := range 2000 {
		for i := range h {
			h[i] = byte(rng.Uint32())
			if n == 0 {
				h[i] = 0xff
			}
		}
		kHeadGGML = true
		var want [8][2]int
		for j := range 8 {
			want[j][0], want[j][1] = kScaleMin("Q4_K", h, j)
		}
		kHeadGGML = false
		p := slices.Clone(h)
		pairScales(p[4:])
		for j := range 8 {
			if sc, m := kScaleMin("Q4_K", p, j); sc != want[j][0] || m != want[j][1] {
				t.Fatalf("header % x, sub-block %d: scale %d, min %d; want %d, %d", h, j, sc, m, want[j][0], want[j][1])
			}
		}
		if !bytes.Equal(p[:4], h[:4]) {
			t.Fatalf("header % x: d and dmin moved: % x", h, p[:4])
		}
	}
}

// mlxMat adds a [rows, cols] MLX affine weight (f16 scales and biases).
func (b *progBuilder) mlxMat(bits, group, rows, cols int, scale float32) backend.WeightID {
	vals := b.randn(rows*cols, scale)
	packed := make([]byte, quant.MLXPackedBytes(rows*cols, bits))
	sc, bi := make([]float32, rows*cols/group), make([]float32, rows*cols/group)
	if err := quant.MLXQuantize(bits, group, vals, packed, sc, bi); err != nil {
		b.t.Fatal(err)
	}
	f16 := func(v []float32) []byte {
		out := make([]byte, 2*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint16(out[2*i:], quant.F32ToF16(x))
		}
		return out
	}
	typ := "MLX_Q" + string(rune('0'+bits))
	tensor := &weights.Tensor{Name: typ + "-matrix", Type: typ, Shape: []int64{int64(rows), int64(cols)}, Bytes: uint64(len(packed)),
		MLX: &weights.MLXQuant{Bits: bits, GroupSize: group, ScalesType: "F16"}}
	b.p.Weights = append(b.p.Weights, backend.Weight{Name: tensor.Name, Tensor: tensor, Data: weights.Data{Bytes: packed, Scales: f16(sc), Biases: f16(bi)}})
	return backend.WeightID(len(b.p.Weights) - 1)
}

// TestDescribeConverted checks how weights without kernels of their own
// are stored: F16 (Q8_0 for q8Exact types, Q8_A for q8Affine ones, Q6_K
// for Q3_K), F32 when a value overflows
// f16, errors naming the tensor for bad data, and that chunked conversion
// matches quant's.
func TestDescribeConverted(t *testing.T) {
	b := newProg(t, 1, 4, 1, 8, 8)
	q50 := b.mat("Q5_0", 7, 96, 1)
	iqnl := b.mat("IQ4_NL", 5, 64, 1)
	q51 := b.mat("Q5_1", 3, 64, 1)
	big := b.mat("Q5_0", 3, 64, 1e5)
	iq := b.mat("TQ2_0", 3, 256, 1)
	q3k := b.mat("Q3_K", 3, 512, 1)
	mlx := b.mlxMat(4, 32, 5, 64, 1)
	short := b.mat("Q3_K", 2, 256, 1)
	b.p.Weights[short].Data.Bytes = b.p.Weights[short].Data.Bytes[:100]
	badScales := b.mlxMat(8, 32, 2, 64, 1)
	b.p.Weights[badScales].Data.Scales = b.p.Weights[badScales].Data.Scales[:2]
	for _, tc := range []struct {
		w        backend.WeightID
		typ, err string
	}{
		{q50, "Q8_0", ""}, {iqnl, "Q8_0", ""}, {q51, "Q8_A", ""}, {big, "F32", ""}, {iq, "F16", ""}, {q3k, "Q6_K", ""}, {mlx, "F16", ""},
		{short, "", `tensor "Q3_K-matrix": 100 bytes`}, {badScales, "", `tensor "MLX_Q8-matrix"`},
	} {
		w := &b.p.Weights[tc.w]
		m, err := describe(w, false)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want an error containing %q", w.Name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", w.Name, err)
		}
		size, stored := 2, 2*m.cols
		switch tc.typ {
		case "F32":
			size, stored = 4, 4*m.cols
		case "Q8_0":
			size, stored = 1, m.cols/32*q8Block
		case "Q8_A":
			size, stored = 1, m.cols/32*q8aBlock
		case "Q6_K":
			stored = m.cols / 256 * 210
		}
		rowBytes := size * m.cols
		if tc.typ == "Q6_K" {
			rowBytes = m.cols / 256 * 192
		}
		if m.typ != tc.typ || m.src != w.Tensor.Type || m.rowBytes != rowBytes || m.ggufRow != stored || m.dOff != int64(m.rows*m.rowBytes) {
			t.Errorf("%s: %+v, want %s rows of %d bytes", w.Name, m, tc.typ, size*m.cols)
		}
		c, err := newConverter(w)
		if err != nil {
			t.Fatal(err)
		}
		all, err := c.convert(0, m.rows)
		if err != nil {
			t.Fatal(err)
		}
		all = slices.Clone(all)
		for r0 := 0; r0 < m.rows; r0 += 2 {
			r1 := min(m.rows, r0+2)
			part, err := c.convert(r0, r1)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(part, all[r0*m.cols:r1*m.cols]) {
				t.Fatalf("%s: rows %d-%d convert differently alone", w.Name, r0, r1)
			}
		}
		if w.Tensor.MLX == nil {
			want := make([]float32, len(all))
			if err := quant.Dequantize(w.Tensor.GGML, w.Data.Bytes, want); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(all, want) {
				t.Errorf("%s: converted values differ from quant's", w.Name)
			}
		}
	}
}

// TestLevelsToQ8 checks that Q5_0 and IQ4_NL rows written as Q8_0 blocks
// dequantize to exactly the values of the blocks they came from, and that
// a block whose levels Q8_0 cannot hold is refused.
func TestLevelsToQ8(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	x := make([]float32, 32*50)
	for i := range x {
		x[i] = float32(rng.NormFloat64()) * float32(1+i%7)
	}
	x[40] = 0 // and a block of zeros
	for i := 64; i < 96; i++ {
		x[i] = 0
	}
	var scratch []byte
	var levels []float32
	for _, name := range []string{"Q5_0", "IQ4_NL"} {
		typ, _ := ggml.ParseType(name)
		src := make([]byte, len(x)/32*int(typ.BlockBytes()))
		if err := quant.Quantize(typ, x, src); err != nil {
			t.Fatal(err)
		}
		dst := make([]byte, len(x)/32*q8Block)
		if err := storeQ8.levels(typ, src, dst, &scratch, &levels); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want, got := make([]float32, len(x)), make([]float32, len(x))
		if err := quant.Dequantize(typ, src, want); err != nil {
			t.Fatal(err)
		}
		if err := quant.Dequantize(ggml.Q8_0, dst, got); err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: element %d is %g as Q8_0, %g as stored", name, i, got[i], want[i])
			}
		}
		if err := storeQ8.levels(typ, src[1:], dst, &scratch, &levels); err == nil {
			t.Errorf("%s: a partial block converted", name)
		}
	}
	// Q5_1's levels with their minimum are not one scale's integers.
	q51 := make([]byte, len(x)/32*int(ggml.Q5_1.BlockBytes()))
	if err := quant.Quantize(ggml.Q5_1, x, q51); err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint16(q51[2:], quant.F32ToF16(0.3)) // the first block's minimum
	if err := storeQ8.levels(ggml.Q5_1, q51, make([]byte, len(x)/32*q8Block), &scratch, &levels); err == nil {
		t.Error("Q5_1 blocks with a fractional minimum converted to Q8_0")
	}
}

// TestLevelsToQ8A checks that Q4_1 and Q5_1 rows written as staged Q8_A
// blocks hold d and m as stored and levels that give back every value as
// package quant computes it (float32(d·q) + m), and that bad input is
// refused.
func TestLevelsToQ8A(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	x := make([]float32, 32*40)
	for i := range x {
		x[i] = float32(rng.NormFloat64())*float32(1+i%5) + float32(i%3)
	}
	for i := 64; i < 96; i++ {
		x[i] = 0 // a block of zeros
	}
	var scratch []byte
	var levels []float32
	for _, typ := range []ggml.Type{ggml.Q4_1, ggml.Q5_1} {
		bs := int(typ.BlockBytes())
		src := make([]byte, len(x)/32*bs)
		if err := quant.Quantize(typ, x, src); err != nil {
			t.Fatal(err)
		}
		dst := make([]byte, len(x)/32*q8aBlock)
		if err := storeQ8A.levels(typ, src, dst, &scratch, &levels); err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		want := make([]float32, len(x))
		if err := quant.Dequantize(typ, src, want); err != nil {
			t.Fatal(err)
		}
		for b := range len(x) / 32 {
			blk := dst[b*q8aBlock:]
			if !slices.Equal(blk[:4], src[b*bs:b*bs+4]) {
				t.Fatalf("%s block %d: d, m %x, stored %x", typ, b, blk[:4], src[b*bs:b*bs+4])
			}
			d, m := quant.F16ToF32(binary.LittleEndian.Uint16(blk)), quant.F16ToF32(binary.LittleEndian.Uint16(blk[2:]))
			for i := range 32 {
				q := int8(blk[4+i])
				if got := float32(d*float32(q)) + m; math.Float32bits(got) != math.Float32bits(want[32*b+i]) || q < 0 || q > 31 {
					t.Fatalf("%s element %d: level %d gives %g, stored %g", typ, 32*b+i, q, got, want[32*b+i])
				}
			}
		}
		if err := storeQ8A.levels(typ, src[1:], dst, &scratch, &levels); err == nil {
			t.Errorf("%s: a partial block converted", typ)
		}
	}
	if err := storeQ8A.levels(ggml.Q4_1, make([]byte, 20), make([]byte, 2*q8aBlock), &scratch, &levels); err == nil {
		t.Error("one block converted into room for two")
	}
}

// TestConvertibleEveryType checks that asking about every ggml type id is
// safe and that the types quant dequantizes are accepted.
func TestConvertibleEveryType(t *testing.T) {
	n := 0
	for id := range 64 {
		typ := ggml.Type(id)
		if !typ.Valid() {
			continue
		}
		if convertible(typ.String()) {
			n++
		}
	}
	for _, typ := range []string{"Q2_K", "Q3_K", "Q5_0", "Q5_1", "Q4_1", "IQ1_S", "IQ2_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "MXFP4", "TQ2_0"} {
		if !convertible(typ) {
			t.Errorf("%s is not convertible", typ)
		}
	}
	if n < 25 {
		t.Errorf("only %d types are convertible", n)
	}
}

// TestPlanK checks the launches of products by K-quant weights: one
// Q8_K quantization for the products sharing an input, the matrix-vector
// kernel, and with cuBLAS the f16 conversions for large batches.
func TestPlanK(t *testing.T) {
	for _, gemm := range []bool{false, true} {
		b := newProg(t, 1, 16, 1, 32, 512)
		x, q, k, o := b.buf(512), b.buf(512), b.buf(256), b.buf(512)
		b.fill(x, 1)
		b.op(backend.Op{Kind: backend.OpMatMul, Out: q, A: x, W: b.mat("Q4_K", 512, 512, 1), Bias: backend.NoWeight})
		b.op(backend.Op{Kind: backend.OpMatMul, Out: k, A: x, W: b.mat("Q6_K", 256, 512, 1), Bias: backend.NoWeight})
		b.op(backend.Op{Kind: backend.OpMatMul, Out: o, A: q, W: b.mat("Q5_K", 512, 512, 1), Bias: b.vec(512, 0, 1)})
		b.p.Logits = o
		pl, err := plan(b.p, planOptions{gemm: gemm, first: "0"}) // the _first twins: TestTriggerFirst
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range pl.calls {
			name := c.kernel
			if c.gemm != nil {
				name = "gemm"
			}
			got = append(got, name)
		}
		want := []string{"embed_f32", "quantize_q8k", "matvec_q4_k", "matvec1_q4_k", "matvec_q6_k", "matvec1_q6_k", "quantize_q8k", "matvec_q5_k", "matvec1_q5_k"}
		if gemm {
			want = []string{"embed_f32", "quantize_q8k", "matvec_q4_k", "matvec1_q4_k", "to_f16_q8k", "deq_f16_q4_k", "gemm", "matvec_q6_k", "matvec1_q6_k",
				"deq_f16_q6_k", "gemm", "quantize_q8k", "matvec_q5_k", "matvec1_q5_k", "to_f16_q8k", "deq_f16_q5_k", "gemm", "add_bias"}
		}
		if !slices.Equal(got, want) {
			t.Errorf("gemm %v: launches\n %v\nwant\n %v", gemm, got, want)
		}
		if pl.scratch[scratchQ8K] != 16*512 || pl.scratch[scratchQ8KRec] != 16*2*q8kRecBytes {
			t.Errorf("scratch %v", pl.scratch)
		}
	}
}

// kChain adds to b, writing out (64 wide), a norm, a Q4_K product, a GLU,
// a Q6_K product, the store and attention over a cache of the given
// capacity, and a Q5_K product: the chain whose int8 producers quantize
// per 256 for the K-quant products after them.
func kChain(b *progBuilder, out backend.BufID, capacity int) {
	x, xn, g, u, q, k, v, att := b.buf(256), b.buf(256), b.buf(512), b.buf(512), b.buf(256), b.buf(128), b.buf(128), b.buf(256)
	for _, f := range []backend.BufID{x, u, k, v} {
		b.fill(f, 1)
	}
	b.cache(128, capacity)
	b.op(backend.Op{Kind: backend.OpRMSNorm, Out: xn, A: x, W: b.vec(256, 1, 0.1), Eps: 1e-5, Group: 256})
	b.op(backend.Op{Kind: backend.OpMatMul, Out: g, A: xn, W: b.mat("Q4_K", 512, 256, 0.5), Bias: backend.NoWeight})
	b.op(backend.Op{Kind: backend.OpGLU, Out: g, A: g, B: u, Act: backend.ActSiLU})
	b.op(backend.Op{Kind: backend.OpMatMul, Out: q, A: g, W: b.mat("Q6_K", 256, 512, 0.5), Bias: backend.NoWeight})
	b.op(backend.Op{Kind: backend.OpStoreKV, Layer: 0, A: k, B: v})
	b.op(backend.Op{Kind: backend.OpAttention, Layer: 0, Out: att, A: q, NHeads: 8, NKV: 4, HeadDim: 32, Scale: 0.2})
	b.op(backend.Op{Kind: backend.OpMatMul, Out: out, A: att, W: b.mat("Q5_K", 64, 256, 0.5), Bias: backend.NoWeight})
}

// TestPlanFusesQ8K checks that a norm and a GLU quantize their outputs
// for the K-quant product after them (the cuBLAS path keeping the plain
// kernels for large batches), and that attention, which cannot, leaves
// the product its own quantization.
func TestPlanFusesQ8K(t *testing.T) {
	for _, gemm := range []bool{false, true} {
		b := newProg(t, 1, 16, 1, 32, 64)
		out := b.buf(64)
		kChain(b, out, 32)
		b.p.Logits = out
		pl, err := plan(b.p, planOptions{gemm: gemm, first: "0"}) // the _first twins: TestTriggerFirst
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range pl.calls {
			if c.gemm == nil && !strings.HasPrefix(c.kernel, "embed") && c.kernel != "store_kv" && !strings.HasPrefix(c.kernel, "attention") {
				got = append(got, c.kernel)
			}
		}
		want := []string{"rmsnorm_q8k", "matvec_q4_k", "matvec1_q4_k", "glu_q8k", "matvec_q6_k", "matvec1_q6_k", "quantize_q8k", "matvec_q5_k", "matvec1_q5_k"}
		if gemm {
			want = []string{"rmsnorm_q8k", "rmsnorm", "matvec_q4_k", "matvec1_q4_k", "to_f16_q8k", "deq_f16_q4_k", "glu_q8k", "glu", "matvec_q6_k", "matvec1_q6_k",
				"to_f16_q8k", "deq_f16_q6_k", "quantize_q8k", "matvec_q5_k", "matvec1_q5_k", "to_f16_q8k", "deq_f16_q5_k"}
		}
		if !slices.Equal(got, want) {
			t.Errorf("gemm %v: launches\n %v\nwant\n %v", gemm, got, want)
		}
	}
}

// TestParallelConvert checks the rows converted for upload, split over
// goroutines, against quant's values in the device type.
func TestParallelConvert(t *testing.T) {
	b := newProg(t, 2, 4, 1, 8, 8)
	for _, tc := range []struct {
		w   backend.WeightID
		typ string
	}{{b.mat("Q5_0", 7, 96, 1), "F16"}, {b.mlxMat(4, 32, 5, 64, 1), "F16"}, {b.mat("Q3_K", 9, 256, 1), "F32"}} {
		w := &b.p.Weights[tc.w]
		ref, err := newConverter(w)
		if err != nil {
			t.Fatal(err)
		}
		all, err := ref.convert(0, ref.rows)
		if err != nil {
			t.Fatal(err)
		}
		for _, workers := range []int{1, 3, 8} {
			pc, err := newParallelConverter(w, workers)
			if err != nil {
				t.Fatal(err)
			}
			r0, r1 := 1, ref.rows-1
			size := map[string]int{"F16": 2, "F32": 4}[tc.typ]
			got := make([]byte, (r1-r0)*ref.cols*size)
			if err := pc.convertTo(tc.typ, r0, r1, got); err != nil {
				t.Fatal(err)
			}
			for i, v := range all[r0*ref.cols : r1*ref.cols] {
				var g float32
				if size == 2 {
					g, v = f16le(got[2*i:]), quant.F16ToF32(quant.F32ToF16(v))
				} else {
					g = math.Float32frombits(binary.LittleEndian.Uint32(got[4*i:]))
				}
				if g != v {
					t.Fatalf("%s, %d workers: element %d is %g, want %g", w.Name, workers, i, g, v)
				}
			}
		}
	}
}

// TestWeightBytes checks the placement estimate of a tensor's device
// memory against what describe says the upload takes.
func TestWeightBytes(t *testing.T) {
	b := newProg(t, 1, 4, 1, 8, 8)
	for _, typ := range []string{"Q8_0", "Q4_0", "Q5_0", "IQ4_NL", "Q5_1", "BF16"} {
		w := &b.p.Weights[b.mat(typ, 6, 64, 1)]
		m, err := describe(w, false)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := WeightBytes(w.Tensor), int64(m.rows*m.ggufRow); got != want {
			t.Errorf("%s: estimated %d bytes, the upload takes %d", typ, got, want)
		}
	}
	w := &b.p.Weights[b.mat("Q3_K", 6, 512, 1)] // as Q6_K
	m, err := describe(w, false)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := WeightBytes(w.Tensor), int64(m.rows*m.ggufRow); got != want || m.typ != "Q6_K" {
		t.Errorf("Q3_K: estimated %d bytes, the upload takes %d as %s", got, want, m.typ)
	}
	// Under the exact contract an MLX weight is uploaded as F32.
	t.Setenv("WEFT_CUDA_EXACT", "1")
	w = &b.p.Weights[b.mlxMat(4, 32, 6, 64, 1)]
	if m, err = describe(w, true); err != nil {
		t.Fatal(err)
	}
	if got, want := WeightBytes(w.Tensor), int64(m.rows*m.ggufRow); got != want || m.typ != "F32" {
		t.Errorf("MLX under the exact contract: estimated %d bytes, the upload takes %d as %s", got, want, m.typ)
	}
}

// TestIQ4Map checks matvec_k.cu's iq4_map, modelled here with
// __byte_perm's documented selection, against the codebook: every index in
// every byte.
func TestIQ4Map(t *testing.T) {
	bytePerm := func(x, y, s uint32) uint32 {
		in := uint64(y)<<32 | uint64(x)
		var r uint32
		for n := range 4 {
			sel := s >> (4 * n) & 7
			r |= uint32(in>>(8*sel)&0xff) << (8 * n)
		}
		return r
	}
	iq4Map := func(v uint32) uint32 { // the kernel's steps
		s := v&0x7 | v>>4&0x70 | v>>8&0x700 | v>>12&0x7000
		lo := bytePerm(0xBFAD9881, 0xF6EADDCF, s)
		hi := bytePerm(0x26190D01, 0x71594535, s)
		m := (v >> 3 & 0x01010101) * 0xff
		return lo&^m | hi&m
	}
	for a := range uint32(16) {
		v := a | (15-a)<<8 | (a^5)<<16 | (a*7%16)<<24
		got := iq4Map(v)
		for n, idx := range []uint32{a, 15 - a, a ^ 5, a * 7 % 16} {
			if l := int8(got >> (8 * n)); l != iq4Levels[idx] {
				t.Fatalf("index %d in byte %d: level %d, want %d", idx, n, l, iq4Levels[idx])
			}
		}
	}
}

// TestPlanKA32 checks a K-quant layer's launches where the products read
// Q4_0's int8 activations (planOptions.kA32): the norms and the attention
// quantize for them as for Q4_0 (no Q8_K record is written), and gate,
// up and the GLU are one launch that quantizes for the down product.
func TestPlanKA32(t *testing.T) {
	for _, tc := range []struct {
		gemm bool
		want []string
	}{
		{false, []string{"rmsnorm_q8", "matvec_q4_k", "matvec1_q4_k", "glu_q8", "matvec_q6_k", "matvec1_q6_k", "attention_split_g1d2",
			"attention_tiled_64", "quantize_q8", "matvec_q5_k", "matvec1_q5_k",
			"matvec_glu_q4_k", "matvec1_glu_q4_k", "matvec_q6_k", "matvec1_q6_k"}},
		{true, []string{"rmsnorm_q8", "rmsnorm", "matvec_q4_k", "matvec1_q4_k", "to_f16_q8k", "deq_f16_q4_k", "glu_q8", "glu",
			"matvec_q6_k", "matvec1_q6_k", "to_f16_q8k", "deq_f16_q6_k", "attention_split_g1d2", "attention_tiled_64", "matvec_q5_k",
			"matvec1_q5_k", "to_f16_q8k", "deq_f16_q5_k",
			"rmsnorm", "to_f16_q8k", "deq_f16_q4_k", "deq_f16_q4_k", "glu", "matvec_glu_q4_k", "matvec1_glu_q4_k",
			"matvec_q6_k", "matvec1_q6_k", "to_f16_q8k", "deq_f16_q6_k"}},
	} {
		b := newProg(t, 1, 16, 1, 32, 64)
		out := b.buf(64)
		kChain(b, out, 32)
		// then a norm (with the embedding before it, embed_norm_q8_*),
		// gate and up, their GLU and the down product
		x, xn, g, u, d := b.buf(256), b.buf(256), b.buf(512), b.buf(512), b.buf(64)
		b.fill(x, 1)
		b.op(backend.Op{Kind: backend.OpRMSNorm, Out: xn, A: x, W: b.vec(256, 1, 0.1), Eps: 1e-5, Group: 256})
		b.op(backend.Op{Kind: backend.OpMatMul, Out: g, A: xn, W: b.mat("Q4_K", 512, 256, 0.5), Bias: backend.NoWeight})
		b.op(backend.Op{Kind: backend.OpMatMul, Out: u, A: xn, W: b.mat("Q4_K", 512, 256, 0.5), Bias: backend.NoWeight})
		b.op(backend.Op{Kind: backend.OpGLU, Out: g, A: g, B: u, Act: backend.ActSiLU})
		b.op(backend.Op{Kind: backend.OpMatMul, Out: d, A: g, W: b.mat("Q6_K", 64, 512, 0.5), Bias: backend.NoWeight})
		b.p.Logits = d
		pl, err := plan(b.p, planOptions{gemm: tc.gemm, first: "0", kA32: true})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range pl.calls {
			if c.gemm == nil && !strings.HasPrefix(c.kernel, "embed") && c.kernel != "store_kv" {
				got = append(got, c.kernel)
			}
			if strings.HasPrefix(c.kernel, "matvec_glu_") && c.args[3] != scratch(scratchG8) {
				t.Errorf("gemm %v: the GLU writes no int8 rows for the down product: %+v", tc.gemm, c)
			}
			if strings.HasPrefix(c.kernel, "matvec") && c.cond != large && c.args[3] == scratch(scratchQ8KRec) {
				t.Errorf("gemm %v: %s reads Q8_K records", tc.gemm, c.kernel)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("gemm %v: launches\n %v\nwant\n %v", tc.gemm, got, tc.want)
		}
		if pl.scratch[scratchQ8K] != 0 || pl.scratch[scratchQ8KRec] != 0 {
			t.Errorf("gemm %v: Q8_K scratch %v", tc.gemm, pl.scratch)
		}
	}
}
