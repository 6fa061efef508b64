package cpu

import (
	"encoding/binary"
	"math"
)

// Activations are converted once per matmul into the form the kernels of
// the weight's family read, as ggml does (its vec_dot_type): rows of
// float32 become records of int8 levels and a float32 scale. Records are
// grouped for the kernels that multiply a tile by several activation rows
// at once: rows c of a group of g rows sit side by side, so record b of row
// c is at
//
//	(c/g)·nb·g·rec + b·g·rec + (c%g)·rec
//
// and a kernel walks a row's records with a stride of g·rec bytes.
const (
	// q8Rec is a 32-element record for the legacy types:
	// qs[32] int8 | d float32 | Σqs int32.
	q8Rec = 40
	// q8KRec is a 256-element record for the k-quants: qs[256] int8 |
	// d float32 | Σqs per 32 elements [8]int32 | Σqs per 16 [16]int32.
	q8KRec = 356
	// f32Rec is one float32 element for the float family.
	f32Rec = 4
)

// record offsets within q8KRec
const (
	q8KD     = 256
	q8KSum32 = 260
	q8KSum16 = 292
)

// actLayout is the shape of one matmul input in record form.
type actLayout struct {
	rec   int // bytes per record
	elems int // elements per record
	nb    int // records per row
	group int // rows per group
}

func layoutFor(f *format, cols, group int) actLayout {
	switch f.family {
	case famLegacy:
		return actLayout{rec: q8Rec, elems: 32, nb: cols / 32, group: group}
	case famK:
		return actLayout{rec: q8KRec, elems: 256, nb: cols / 256, group: group}
	}
	return actLayout{rec: f32Rec, elems: 1, nb: cols, group: group}
}

// bytes is the buffer size for n rows.
func (l actLayout) bytes(n int) int {
	groups := (n + l.group - 1) / l.group
	return groups * l.nb * l.group * l.rec
}

// rowOff is the offset of row c's first record; stride the step between
// its records.
func (l actLayout) rowOff(c int) int {
	return (c/l.group)*l.nb*l.group*l.rec + (c%l.group)*l.rec
}

func (l actLayout) stride() int { return l.group * l.rec }

// convertRow writes one float32 row x into its records.
func (l actLayout) convertRow(x []float32, dst []byte, c int) {
	off, st := l.rowOff(c), l.stride()
	switch l.rec {
	case q8Rec:
		for b := 0; b < l.nb; b++ {
			quantQ8Block(x[32*b:32*b+32], dst[off+b*st:off+b*st+q8Rec])
		}
	case q8KRec:
		for b := 0; b < l.nb; b++ {
			quantQ8KBlock(x[256*b:256*b+256], dst[off+b*st:off+b*st+q8KRec])
		}
	default:
		for k, v := range x {
			binary.LittleEndian.PutUint32(dst[off+k*st:], math.Float32bits(v))
		}
	}
}

// quantQ8Block quantizes 32 floats as ggml's quantize_row_q8_0 does on
// x86: d = max|x|/127, levels round(x·127/max|x|) to nearest even.
func quantQ8Block(x []float32, rec []byte) {
	var amax float32
	for _, v := range x[:32] {
		amax = max(amax, abs32(v))
	}
	d := amax / 127
	var id float32
	if amax != 0 {
		id = 127 / amax
	}
	var sum int32
	for j, v := range x[:32] {
		q := int32(math.RoundToEven(float64(v * id)))
		rec[j] = uint8(int8(q))
		sum += q
	}
	binary.LittleEndian.PutUint32(rec[32:], math.Float32bits(d))
	binary.LittleEndian.PutUint32(rec[36:], uint32(sum))
}

// quantQ8KBlock quantizes 256 floats as ggml's quantize_row_q8_K_ref: the
// element of largest magnitude maps to -127, d = 1/iscale. On a tie
// between +m and −m the positive one is taken (ggml takes the first).
func quantQ8KBlock(x []float32, rec []byte) {
	hi, lo := x[0], x[0]
	for _, v := range x[:256] {
		hi, lo = max(hi, v), min(lo, v)
	}
	mx := hi
	if hi < -lo {
		mx = lo
	}
	var sums [24]int32 // 8 per 32, then 16 per 16
	if mx == 0 {
		clear(rec[:q8KRec])
		return
	}
	iscale := -127 / mx
	for j, v := range x[:256] {
		q := min(int32(math.RoundToEven(float64(iscale*v))), 127)
		rec[j] = uint8(int8(q))
		sums[j/32] += q
		sums[8+j/16] += q
	}
	binary.LittleEndian.PutUint32(rec[q8KD:], math.Float32bits(1/iscale))
	for i, s := range sums {
		binary.LittleEndian.PutUint32(rec[q8KSum32+4*i:], uint32(s))
	}
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }
