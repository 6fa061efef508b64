package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/quant"
	"github.com/weftlm/weft/weights"
)

// matrix is a weight as the CPU multiplies by it: rows of cols elements in
// their stored type. A vector is a 1-row matrix.
type matrix struct {
	name       string
	rows, cols int
	f32        []float32 // set when the elements are float32 (no decoding)
	data       []byte    // stored bytes of all rows otherwise
	raw        []byte    // stored bytes of all rows, whatever the type
	pk         *packed   // the rows repacked for the matmul kernels
	rowBytes   int
	typ        ggml.Type
	// MLX affine quantization: w = scale*q + bias per group.
	mlxBits   int
	groupSize int
	scales    []float32 // [rows, cols/groupSize]
	biases    []float32
}

// supported lists the stored types this backend multiplies by.
var supported = map[string]bool{
	"F32": true, "F16": true, "BF16": true,
	"Q4_0": true, "Q4_1": true, "Q5_0": true, "Q5_1": true, "Q8_0": true,
	"Q2_K": true, "Q3_K": true, "Q4_K": true, "Q5_K": true, "Q6_K": true,
	"IQ4_NL": true, "IQ4_XS": true,
	"MLX_Q4": true, "MLX_Q8": true,
}

// newMatrix prepares a program weight for multiplication.
func newMatrix(w *backend.Weight) (*matrix, error) {
	if w.F32 != nil {
		return &matrix{name: w.Name, rows: 1, cols: len(w.F32), f32: w.F32}, nil
	}
	t := w.Tensor
	m := &matrix{name: w.Name, rows: int(t.Rows()), cols: int(t.Cols())}
	for _, d := range t.Shape[:max(0, len(t.Shape)-2)] {
		m.rows *= int(d)
	}
	if !supported[t.Type] {
		return nil, fmt.Errorf("cpu: tensor %q: type %s is not supported by the CPU backend", w.Name, t.Type)
	}
	if t.MLX != nil {
		return newMLXMatrix(m, t, w.Data)
	}
	m.typ = t.GGML
	rb, err := t.GGML.RowBytes(uint64(m.cols))
	if err != nil {
		return nil, fmt.Errorf("cpu: tensor %q: %w", w.Name, err)
	}
	m.rowBytes = int(rb)
	if len(w.Data.Bytes) != m.rows*m.rowBytes {
		return nil, fmt.Errorf("cpu: tensor %q: %d bytes, want %d for %s %v", w.Name, len(w.Data.Bytes), m.rows*m.rowBytes, t.Type, t.Shape)
	}
	m.raw = w.Data.Bytes
	if t.GGML == ggml.F32 {
		m.f32 = bytesToF32(w.Data.Bytes)
		return m, nil
	}
	m.data = w.Data.Bytes
	return m, nil
}

// bytesToF32 views little-endian float32 bytes as []float32 without
// copying when the slice is suitably aligned, else copies.
func bytesToF32(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	if uintptr(unsafe.Pointer(&b[0]))%4 == 0 {
		return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
	}
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func newMLXMatrix(m *matrix, t *weights.Tensor, d weights.Data) (*matrix, error) {
	q := t.MLX
	m.mlxBits, m.groupSize = q.Bits, q.GroupSize
	m.data = d.Bytes
	m.rowBytes = m.cols * q.Bits / 8
	if len(d.Bytes) != m.rows*m.rowBytes {
		return nil, fmt.Errorf("cpu: tensor %q: %d packed bytes, want %d", t.Name, len(d.Bytes), m.rows*m.rowBytes)
	}
	groups := m.rows * m.cols / q.GroupSize
	var err error
	if m.scales, err = toF32(q.ScalesType, d.Scales, groups); err != nil {
		return nil, fmt.Errorf("cpu: tensor %q scales: %w", t.Name, err)
	}
	if m.biases, err = toF32(q.ScalesType, d.Biases, groups); err != nil {
		return nil, fmt.Errorf("cpu: tensor %q biases: %w", t.Name, err)
	}
	return m, nil
}

// toF32 decodes n floats stored as F32, F16 or BF16.
func toF32(typ string, b []byte, n int) ([]float32, error) {
	gt, err := ggml.ParseType(typ)
	if err != nil {
		return nil, err
	}
	out := make([]float32, n)
	if err := quant.Dequantize(gt, b, out); err != nil {
		return nil, err
	}
	return out, nil
}

// row decodes row r into dst (len cols). For float32 weights it returns the
// stored row itself and leaves dst untouched.
func (m *matrix) row(r int, dst []float32) []float32 {
	if m.f32 != nil {
		return m.f32[r*m.cols : (r+1)*m.cols]
	}
	src := m.data[r*m.rowBytes : (r+1)*m.rowBytes]
	if m.mlxBits != 0 {
		m.mlxRow(r, src, dst)
		return dst
	}
	switch m.typ {
	case ggml.F16:
		for i := range dst {
			dst[i] = quant.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case ggml.BF16:
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
		}
	default:
		// Sizes were checked when the matrix was built.
		_ = quant.Dequantize(m.typ, src, dst)
	}
	return dst
}

// mlxRow unpacks an MLX affine-quantized row: elements are packed Bits at a
// time into little-endian uint32 words, lowest bits first.
func (m *matrix) mlxRow(r int, src []byte, dst []float32) {
	groups := m.cols / m.groupSize
	sc, bi := m.scales[r*groups:(r+1)*groups], m.biases[r*groups:(r+1)*groups]
	mask := uint32(1)<<m.mlxBits - 1
	perWord := 32 / m.mlxBits
	for w := 0; w < len(src)/4; w++ {
		word := binary.LittleEndian.Uint32(src[4*w:])
		for k := 0; k < perWord; k++ {
			i := w*perWord + k
			g := i / m.groupSize
			dst[i] = sc[g]*float32((word>>(uint(k*m.mlxBits)))&mask) + bi[g]
		}
	}
}

// format returns how the matrix is packed for the matmul kernels, or nil
// when it takes the row-by-row path (MLX affine types, float32 vectors).
func (m *matrix) format() *format {
	if m.mlxBits != 0 || m.raw == nil {
		return nil
	}
	return formats[m.typ]
}
