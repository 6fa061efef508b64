package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/quant"
	"github.com/weftlm/weft/weights"
)

// A weight whose type has no kernels of its own (Q5_0, Q3_K, the IQ
// types, MLX affine, ...) is dequantized on the host by package quant as
// it is uploaded and stored as F16, so that it runs on the F16 kernels:
// the decode matrix-vector product, the embedding and cuBLAS in prefill.
// A tensor with a value outside f16's range is stored as F32 instead.
// The types of q8Exact are stored as Q8_0 instead, those of q8Affine as
// Q8_A, and Q3_K as Q6_K, without loss.
// Conversion goes a chunk of rows at a time, so host memory stays at a few
// MiB whatever the tensor's size.

// q8Exact are the types whose blocks of 32 are an f16 scale times integer
// levels in [-127, 127] (Q5_0: q - 16; IQ4_NL: its codebook), with the
// scale in the block's first two bytes. Stored as Q8_0 (the same scale,
// the levels as int8) they lose nothing, take about half F16's bytes, and
// run on the Q8_0 kernels, which sum int8 levels exactly as the CPU
// backend does for these types.
var q8Exact = map[string]bool{"Q5_0": true, "IQ4_NL": true}

// q8Block is the bytes of a Q8_0 block of 32.
const q8Block = 34

// q8Affine are the types whose blocks of 32 are x = d·q + m with f16 d
// and m and integer levels q in [0, 31] (Q4_1, Q5_1). They are stored as
// Q8_A (kernels.cu's W_Q8_A: the levels as int8, d and m as stored) and
// run on the int8 kernels with the min's term, which sum as the CPU
// backend does for these types, in half F16's bytes. Staged as blocks of
// q8aBlock bytes: d, m, the 32 levels (repack_q8_a).
var q8Affine = map[string]bool{"Q4_1": true, "Q5_1": true}

// q8aBlock is the bytes of a staged Q8_A block of 32.
const q8aBlock = 36

// int8Store is a block form with int8 levels that a q8Exact or q8Affine
// type is staged in: each block's first head bytes (its f16 scale, and
// for the affine types its min) as stored, then its 32 levels in [lo, hi].
type int8Store struct {
	name   string
	head   int    // header bytes kept
	unit   uint32 // the header that makes a block dequantize to its levels (d = 1, m = 0)
	lo, hi float32
	block  int // bytes of a staged block
}

var (
	storeQ8  = int8Store{name: "Q8_0", head: 2, unit: 0x3c00, lo: -127, hi: 127, block: q8Block}
	storeQ8A = int8Store{name: "Q8_A", head: 4, unit: 0x3c00, lo: 0, hi: 31, block: q8aBlock}
)

// levels writes the GGUF rows src of type t as staged blocks into dst:
// each block's header as stored and its levels, read by dequantizing the
// block with its header set to unit (scratch holds that copy and the
// levels). It fails on a level outside [lo, hi] or not an integer, which
// no valid block of the types staged this way has.
func (st int8Store) levels(t ggml.Type, src, dst []byte, scratch *[]byte, levels *[]float32) error {
	bs := int(t.BlockBytes())
	nb := len(src) / bs
	if len(src) != nb*bs || len(dst) != nb*st.block {
		return fmt.Errorf("%d bytes of %s to %d of %s", len(src), t, len(dst), st.name)
	}
	one := grow(scratch, len(src))
	copy(one, src)
	for b := range nb {
		for i := range st.head {
			one[b*bs+i] = byte(st.unit >> (8 * i))
		}
	}
	if cap(*levels) < 32*nb {
		*levels = make([]float32, 32*nb)
	}
	lv := (*levels)[:32*nb]
	if err := quant.Dequantize(t, one, lv); err != nil {
		return err
	}
	for b := range nb {
		o := dst[b*st.block : (b+1)*st.block]
		copy(o[:st.head], src[b*bs:b*bs+st.head])
		for i, l := range lv[32*b : 32*b+32] {
			if l != float32(int8(l)) || l < st.lo || l > st.hi {
				return fmt.Errorf("%s block %d has level %g, not one %s holds", t, b, l, st.name)
			}
			o[st.head+i] = byte(int8(l))
		}
	}
	return nil
}

// convertChunk is the most elements converted at once (16 MiB as f32).
const convertChunk = 1 << 22

// f16Limit is the smallest magnitude that rounds to infinity in f16.
const f16Limit = 65520

// mlxBitsOf returns the bits of an MLX affine type name ("MLX_Q4" is 4).
func mlxBitsOf(typ string) (int, bool) {
	s, ok := strings.CutPrefix(typ, "MLX_Q")
	if !ok {
		return 0, false
	}
	bits, err := strconv.Atoi(s)
	return bits, err == nil
}

// convertible reports whether package quant can dequantize a tensor of
// type typ (as weights spells it), so the backend can run it converted.
func convertible(typ string) bool {
	if bits, ok := mlxBitsOf(typ); ok {
		return bits == 2 || bits == 4 || bits == 8
	}
	t, err := ggml.ParseType(typ)
	// Zero elements are a valid conversion exactly when quant knows t.
	return err == nil && quant.Dequantize(t, nil, nil) == nil
}

// converter dequantizes a weight's rows, a range at a time, into a
// reused float32 buffer.
type converter struct {
	w          *backend.Weight
	rows, cols int
	srcRow     int // bytes of a stored row (MLX: of its packed levels)
	typ        ggml.Type
	mlx        *weights.MLXQuant
	scaleType  ggml.Type // of MLX scales and biases
	vals       []float32
	sc, bi     []float32
}

func newConverter(w *backend.Weight) (*converter, error) {
	t := w.Tensor
	c := &converter{w: w, rows: int(t.Rows()), cols: int(t.Cols())}
	for _, d := range t.Shape[:max(0, len(t.Shape)-2)] {
		c.rows *= int(d)
	}
	if c.rows <= 0 || c.cols <= 0 {
		return nil, fmt.Errorf("tensor %q: shape %v", w.Name, t.Shape)
	}
	if t.MLX != nil {
		q := t.MLX
		if !convertible(t.Type) || q.GroupSize <= 0 || c.cols%q.GroupSize != 0 || q.GroupSize%(32/q.Bits) != 0 {
			return nil, fmt.Errorf("tensor %q: MLX %d-bit groups of %d over %d columns are not supported by the CUDA backend", w.Name, q.Bits, q.GroupSize, c.cols)
		}
		st, err := ggml.ParseType(q.ScalesType)
		if err != nil || (st != ggml.F16 && st != ggml.BF16 && st != ggml.F32) {
			return nil, fmt.Errorf("tensor %q: MLX scales of type %q", w.Name, q.ScalesType)
		}
		c.mlx, c.scaleType, c.srcRow = q, st, quant.MLXPackedBytes(c.cols, q.Bits)
		groups := c.rows * (c.cols / q.GroupSize)
		sb := groups * int(st.BlockBytes())
		if len(w.Data.Bytes) != c.rows*c.srcRow || len(w.Data.Scales) != sb || len(w.Data.Biases) != sb {
			return nil, fmt.Errorf("tensor %q: %d packed bytes, %d of scales and %d of biases, want %d, %d and %d",
				w.Name, len(w.Data.Bytes), len(w.Data.Scales), len(w.Data.Biases), c.rows*c.srcRow, sb, sb)
		}
		return c, nil
	}
	if !t.HasGGML || !convertible(t.Type) {
		return nil, fmt.Errorf("tensor %q: type %s is not supported by the CUDA backend", w.Name, t.Type)
	}
	rb, err := t.GGML.RowBytes(uint64(c.cols))
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", w.Name, err)
	}
	c.typ, c.srcRow = t.GGML, int(rb)
	if len(w.Data.Bytes) != c.rows*c.srcRow {
		return nil, fmt.Errorf("tensor %q: %d bytes, want %d for %s %v", w.Name, len(w.Data.Bytes), c.rows*c.srcRow, t.Type, t.Shape)
	}
	return c, nil
}

// chunkRows is how many rows one conversion takes.
func (c *converter) chunkRows() int { return max(1, convertChunk/c.cols) }

// convert dequantizes rows [r0, r1) and returns them, [r1-r0, cols].
func (c *converter) convert(r0, r1 int) ([]float32, error) {
	n := (r1 - r0) * c.cols
	if cap(c.vals) < n {
		c.vals = make([]float32, n)
	}
	vals := c.vals[:n]
	src := c.w.Data.Bytes[r0*c.srcRow : r1*c.srcRow]
	if c.mlx == nil {
		if err := quant.Dequantize(c.typ, src, vals); err != nil {
			return nil, fmt.Errorf("tensor %q: %w", c.w.Name, err)
		}
		return vals, nil
	}
	per := c.cols / c.mlx.GroupSize
	g0, g1 := r0*per, r1*per
	if cap(c.sc) < g1-g0 {
		c.sc, c.bi = make([]float32, g1-g0), make([]float32, g1-g0)
	}
	sc, bi := c.sc[:g1-g0], c.bi[:g1-g0]
	eb := int(c.scaleType.BlockBytes())
	if err := quant.Dequantize(c.scaleType, c.w.Data.Scales[g0*eb:g1*eb], sc); err != nil {
		return nil, fmt.Errorf("tensor %q: scales: %w", c.w.Name, err)
	}
	if err := quant.Dequantize(c.scaleType, c.w.Data.Biases[g0*eb:g1*eb], bi); err != nil {
		return nil, fmt.Errorf("tensor %q: biases: %w", c.w.Name, err)
	}
	if err := quant.MLXDequantize(c.mlx.Bits, c.mlx.GroupSize, src, sc, bi, vals); err != nil {
		return nil, fmt.Errorf("tensor %q: %w", c.w.Name, err)
	}
	return vals, nil
}

// fitsF16 reports whether every finite value of the weight rounds to a
// finite f16, scanning the rows on several goroutines.
func (c *converter) fitsF16() (bool, error) {
	workers := min(runtime.GOMAXPROCS(0), 8, (c.rows+c.chunkRows()-1)/c.chunkRows())
	var over atomic.Bool
	errs := make([]error, workers)
	var wg sync.WaitGroup
	step := c.chunkRows()
	for k := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			own := *c
			own.vals, own.sc, own.bi = nil, nil, nil
			for r0 := k * step; r0 < c.rows && !over.Load(); r0 += workers * step {
				vals, err := own.convert(r0, min(c.rows, r0+step))
				if err != nil {
					errs[k] = err
					return
				}
				for _, v := range vals {
					if a := math.Abs(float64(v)); a >= f16Limit && !math.IsInf(a, 0) {
						over.Store(true)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return false, err
		}
	}
	return !over.Load(), nil
}

// describeConverted describes a weight that is converted on upload: F16,
// or F32 where its values overflow f16. Under the exact contract (exact)
// the types whose products take float32 activations
// (backend.Int8Activations: MLX, the IQ1-IQ3, ternary and MXFP4 types)
// are stored as F32: the CPU multiplies their float32 dequantization by
// float32 activations, which an F16 copy would round.
func describeConverted(w *backend.Weight, exact bool) (matInfo, error) {
	c, err := newConverter(w)
	if err != nil {
		return matInfo{}, err
	}
	fits, err := c.fitsF16()
	if err != nil {
		return matInfo{}, err
	}
	m := matInfo{name: w.Name, rows: c.rows, cols: c.cols, typ: "F16", src: w.Tensor.Type, rowBytes: 2 * c.cols}
	m.ggufRow = m.rowBytes
	switch {
	case (!fits && !exact) || (exact && !backend.Int8Activations(w.Tensor.Type)):
		// Values past f16's range, which cuBLAS's f16 operands (Q8_0 too)
		// cannot hold; exact plans use no cuBLAS, and keep the int8 forms
		// below for the int8-activation types whatever their range.
		m.typ, m.rowBytes, m.ggufRow = "F32", 4*c.cols, 4*c.cols
	case q8Exact[w.Tensor.Type] && c.mlx == nil && c.cols%32 == 0:
		m.typ, m.rowBytes, m.ggufRow = "Q8_0", c.cols, c.cols/32*q8Block
	case q8Affine[w.Tensor.Type] && c.mlx == nil && c.cols%32 == 0:
		m.typ, m.rowBytes, m.ggufRow = "Q8_A", c.cols, c.cols/32*q8aBlock
	case w.Tensor.Type == "Q3_K" && c.mlx == nil && c.cols%256 == 0:
		// Rewritten as Q6_K without loss (quant.Q3KToQ6K) as it is
		// uploaded: the Q6_K kernels, int8 activations as on the CPU.
		k := kLayouts["Q6_K"]
		m.typ, m.rowBytes, m.ggufRow = "Q6_K", c.cols/256*k.quants, c.cols/256*k.block
	}
	m.dOff = int64(m.rows) * int64(m.rowBytes)
	return m, nil
}

// uploadOnHost lays a K-quant weight out (kquant.go) or converts one
// without kernels of its own, a chunk of rows at a time through host, and
// copies it into a new device allocation.
func (e *exec) uploadOnHost(w *backend.Weight, m *matInfo, host *[]byte) (uint64, error) {
	what := fmt.Sprintf("tensor %q", m.name)
	ptr, err := e.alloc(uint64(m.rows)*uint64(m.ggufRow), what)
	if err != nil {
		return 0, err
	}
	if k := kLayouts[m.typ]; k != nil {
		return ptr, e.uploadK(ptr, w, m, k, host)
	}
	pc, err := newParallelConverter(w, runtime.GOMAXPROCS(0))
	if err != nil {
		return 0, fmt.Errorf("cuda: %w", err)
	}
	step := pc.convs[0].chunkRows()
	for r0 := 0; r0 < m.rows; r0 += step {
		r1 := min(m.rows, r0+step)
		b := grow(host, (r1-r0)*m.rowBytes)
		if err := pc.convertTo(m.typ, r0, r1, b); err != nil {
			return 0, fmt.Errorf("cuda: %w", err)
		}
		if err := e.copyIn(ptr+uint64(r0)*uint64(m.rowBytes), b, what); err != nil {
			return 0, err
		}
	}
	return ptr, nil
}

// parallelConverter splits the rows of each conversion over goroutines,
// one converter each; together they hold at most one chunk of float32s.
type parallelConverter struct {
	convs []*converter
}

func newParallelConverter(w *backend.Weight, workers int) (*parallelConverter, error) {
	pc := &parallelConverter{}
	for range max(1, workers) {
		c, err := newConverter(w)
		if err != nil {
			return nil, err
		}
		pc.convs = append(pc.convs, c)
	}
	return pc, nil
}

// convertTo writes rows [r0, r1) into dst as typ ("F16" or "F32").
func (pc *parallelConverter) convertTo(typ string, r0, r1 int, dst []byte) error {
	cols := pc.convs[0].cols
	size := 2
	if typ == "F32" {
		size = 4
	}
	per := (r1 - r0 + len(pc.convs) - 1) / len(pc.convs)
	errs := make([]error, len(pc.convs))
	var wg sync.WaitGroup
	for k, c := range pc.convs {
		a, b := r0+k*per, min(r1, r0+(k+1)*per)
		if a >= b {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			vals, err := c.convert(a, b)
			if err != nil {
				errs[k] = err
				return
			}
			out := dst[(a-r0)*cols*size : (b-r0)*cols*size]
			if size == 4 {
				copy(out, f32Bytes(vals))
				return
			}
			for i, v := range vals {
				binary.LittleEndian.PutUint16(out[2*i:], quant.F32ToF16(v))
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// stageQ8 writes a q8Exact weight into staging as Q8_0 GGUF blocks (a
// q8Affine one as Q8_A blocks), a chunk of rows at a time through host,
// for the repack kernel.
func (e *exec) stageQ8(staging uint64, w *backend.Weight, m *matInfo, host *[]byte) error {
	st := storeQ8
	if m.typ == "Q8_A" {
		st = storeQ8A
	}
	t := w.Tensor.GGML
	srcRow := m.cols / 32 * int(t.BlockBytes())
	if len(w.Data.Bytes) != m.rows*srcRow {
		return fmt.Errorf("cuda: tensor %q: %d bytes, want %d for %s", m.name, len(w.Data.Bytes), m.rows*srcRow, t)
	}
	var scratch []byte
	var levels []float32
	step := max(1, convertChunk/m.cols)
	for r0 := 0; r0 < m.rows; r0 += step {
		r1 := min(m.rows, r0+step)
		b := grow(host, (r1-r0)*m.ggufRow)
		if err := st.levels(t, w.Data.Bytes[r0*srcRow:r1*srcRow], b, &scratch, &levels); err != nil {
			return fmt.Errorf("cuda: tensor %q: %w", m.name, err)
		}
		if err := e.copyIn(staging+uint64(r0)*uint64(m.ggufRow), b, fmt.Sprintf("tensor %q", m.name)); err != nil {
			return err
		}
	}
	return nil
}

// grow returns (*buf)[:n], reallocating when it is shorter.
func grow(buf *[]byte, n int) []byte {
	if cap(*buf) < n {
		*buf = make([]byte, n)
	}
	return (*buf)[:n]
}
