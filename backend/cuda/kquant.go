package cuda

import (
	_ "embed"
	"fmt"
	"os"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/quant"
)

// K-quant weights (Q4_K, Q5_K, Q6_K: the types of Q4_K_M, Q5_K_M and Q6_K
// files) run on kernels of their own (matvec_k.cu). Each GGUF super-block
// of 256 elements is split on upload into its quants, kept per row and
// 16-byte aligned so the decode product streams them in 16-byte loads,
// and its 16-byte header of scales (with, for Q6_K, its f16 scale in an
// array of its own). A tensor of rows × nsb super-blocks takes exactly the
// bytes it takes in the file:
//
//	quants  [rows][nsb][quants]   Q4_K qs[128]; Q5_K qh[32] qs[128]; Q6_K ql[128] qh[64]
//	headers [rows·nsb][16]        at dOff: Q4_K, Q5_K d, dmin f16, scales[12]; Q6_K scales[16] int8
//	d       [rows·nsb] f16        Q6_K only, after the headers
//
// Decode products quantize their input per 256 elements as ggml's Q8_K
// (the CPU backend's form for these types), so the two backends compute
// the same integer dot products.

//go:embed matvec_k.cu
var matvecKCU string

// kLayout says where the parts of a GGUF super-block go.
type kLayout struct {
	block  int // bytes of a GGUF super-block
	quants int // of them, quants (they start the block but for Q4_K and Q5_K's 16-byte header)
	head   int // where the 16-byte header starts in the block
	dBytes int // bytes of scales kept in an array of their own: Q6_K's d (2), Q2_K's d and dmin (4)
	// repack, where set, writes a block's three parts itself (Q2_K's
	// levels go to nibbles).
	repack func(blk, quants, head, d []byte)
	// pairs: the header's twelve bytes of 6-bit scales and minimums
	// (Q4_K) are regrouped by pair of sub-blocks (pairScales).
	pairs bool
}

// kHeadGGML keeps Q4_K's headers in the file's order on the device
// (WEFT_CUDA_KHEAD=ggml, for comparisons; compileOptions then defines
// KHEAD_GGML, so the kernels read what was uploaded).
var kHeadGGML = os.Getenv("WEFT_CUDA_KHEAD") == "ggml"

// kActQ8K keeps the K-quant products of a backend opened while it is set
// on ggml's Q8_K activation records outside the exact contract too
// (WEFT_CUDA_KACT=q8k, for comparisons; its target then defines K_A32=0).
// By default they read the int8 records of Q4_0's products (kernels.cu's
// K_A32; planOptions.kA32).
var kActQ8K = os.Getenv("WEFT_CUDA_KACT") == "q8k"

// kA32 says whether b's K-quant products read Q4_0's int8 activations
// (planOptions.kA32): not under the exact contract, whose CPU products
// read Q8_K records, nor where b was opened with kActQ8K.
func (b *Backend) kA32() bool { return !b.exact && !b.target.kq8k }

// pairScales rewrites the twelve scale bytes s of a Q4_K or Q5_K header
// (ggml's packing, quant.ScaleMinK4: sub-blocks 0-3 in the low six bits
// of bytes 0-7, sub-blocks 4-7 split over the nibbles of bytes 8-11 and
// the top bits of bytes 0-7) as four 24-bit little-endian fields, one a
// pair of sub-blocks 2p and 2p+1: scale 2p, scale 2p+1, minimum 2p,
// minimum 2p+1, six bits each from bit 0. A decode product's 16-byte
// chunk spans exactly such a pair, so it takes its four values from one
// funnel shift and four bit-field extracts (matvec_k.cu's kscale_pair)
// instead of ggml's selects; the bytes and values are the same. On an
// H100 (tg128 drawn, two rounds, against WEFT_CUDA_KHEAD=ggml):
// Llama-3.2-1B's shape Q4_K 1,610 / 1,610 against 1,535 / 1,538,
// Llama-3-8B's 376.3 / 376.3 against 354.7 / 354.7. Q5_K's products lost
// with it (1B 1,223 against 1,268, 8B 272 against 293: their registers),
// so Q5_K keeps the file's order.
func pairScales(s []byte) {
	var sc, m [8]uint32
	for j := range 8 {
		c, n := quant.ScaleMinK4(j, s)
		sc[j], m[j] = uint32(c), uint32(n)
	}
	for p := range 4 {
		f := sc[2*p] | sc[2*p+1]<<6 | m[2*p]<<12 | m[2*p+1]<<18
		s[3*p], s[3*p+1], s[3*p+2] = byte(f), byte(f>>8), byte(f>>16)
	}
}

var kLayouts = map[string]*kLayout{
	"Q4_K": {block: 144, quants: 128, head: 0, pairs: true},
	"Q5_K": {block: 176, quants: 160, head: 0},
	"Q6_K": {block: 210, quants: 192, head: 192, dBytes: 2},
	// Q2_K (scales[16] | qs[64] | d | dmin): its 2-bit levels as nibbles
	// in Q4_K's order (byte 32p + l: elements 64p + l and 64p + 32 + l),
	// so the decode product runs Q4_K's chunk loop with Q2_K's scales and
	// mins a 16 elements; the 16 scale bytes are the header, d and dmin
	// a u32 after the headers. 148 bytes a super-block on the device
	// (84 in the file): 0.58 bytes an element, against F16's 2.
	"Q2_K": {block: 84, quants: 128, dBytes: 4, repack: repackQ2K},
	// IQ4_XS (d | scales_h | scales_l[4] | qs[128]): its 4-bit codebook
	// indices in Q4_K's order, the header d and the 8 scales ls - 32 as
	// int8; the kernel looks the levels up (iq4_map). 144 bytes a
	// super-block (136 in the file).
	"IQ4_XS": {block: 136, quants: 128, repack: repackIQ4XS},
}

// repackIQ4XS writes an IQ4_XS super-block's indices in Q4_K's order and
// its header (kLayouts).
func repackIQ4XS(blk, quants, head, _ []byte) {
	qs := blk[8:136]
	index := func(e int) byte { return qs[16*(e/32)+e%16] >> (4 * (e % 32 / 16)) & 15 }
	for p := range 4 {
		for l := range 32 {
			quants[32*p+l] = index(64*p+l) | index(64*p+32+l)<<4
		}
	}
	clear(head)
	copy(head[:2], blk[:2])
	sh := uint16(blk[2]) | uint16(blk[3])<<8
	for ib := range 8 {
		ls := int(blk[4+ib/2]>>(4*(ib%2))&15) | int(sh>>(2*ib)&3)<<4
		head[2+ib] = byte(int8(ls - 32))
	}
}

// repackQ2K writes a Q2_K super-block's levels as nibbles (kLayouts).
func repackQ2K(blk, quants, head, d []byte) {
	qs := blk[16:80]
	level := func(e int) byte { return qs[32*(e/128)+e%32] >> (2 * ((e % 128) / 32)) & 3 }
	for p := range 4 {
		for l := range 32 {
			quants[32*p+l] = level(64*p+l) | level(64*p+32+l)<<4
		}
	}
	copy(head, blk[:16])
	copy(d, blk[80:84])
}

// deviceBlock is the bytes a super-block takes on the device.
func (k *kLayout) deviceBlock() int { return k.quants + 16 + k.dBytes }

// kquantKernels are the kernels of matvec_k.cu besides the per-type
// embed_, matvec_ and deq_f16_ ones that weightTypes names.
var kquantKernels = []string{"quantize_q8k", "to_f16_q8k", "rmsnorm_q8k", "glu_q8k",
	"quantize_q8k_first", "rmsnorm_q8k_first", "glu_q8k_first"} // plan.go's triggerFirst

// q8kRecBytes is the size of a Q8_K activation record of matvec_k.cu:
// d float32 and the sums of its 16 groups of 16 levels as int16.
const q8kRecBytes = 36

// split writes super-block blk's quants, header and (Q6_K) f16 scale.
func (k *kLayout) split(blk, quants, head, d []byte) {
	if k.repack != nil {
		k.repack(blk, quants, head, d)
		return
	}
	if k.dBytes != 0 {
		copy(quants, blk[:k.quants])
		copy(head, blk[k.head:k.head+16])
		copy(d, blk[k.head+16:k.head+18])
		return
	}
	copy(head, blk[:16])
	copy(quants, blk[16:16+k.quants])
	if k.pairs && !kHeadGGML {
		pairScales(head[4:16])
	}
}

// layOut writes rows [r0, r1) of GGUF data src (every row of the tensor)
// as their three device parts.
func (k *kLayout) layOut(src []byte, nsb, r0, r1 int, quants, heads, ds []byte) {
	for r := r0; r < r1; r++ {
		for s := range nsb {
			b := (r-r0)*nsb + s
			blk := src[(r*nsb+s)*k.block:]
			d := ds[k.dBytes*b : k.dBytes*(b+1)]
			k.split(blk, quants[b*k.quants:(b+1)*k.quants], heads[16*b:16*b+16], d)
		}
	}
}

// uploadK copies a K-quant weight into ptr in the device layout, a chunk
// of rows at a time through host.
func (e *exec) uploadK(ptr uint64, w *backend.Weight, m *matInfo, k *kLayout, host *[]byte) error {
	what := fmt.Sprintf("tensor %q", m.name)
	nsb := m.cols / 256
	step := max(1, convertChunk/m.cols)
	heads := uint64(m.dOff)
	ds := heads + uint64(m.rows)*uint64(nsb)*16
	var q6 []byte // a Q3_K weight's rows rewritten as Q6_K (describeConverted)
	for r0 := 0; r0 < m.rows; r0 += step {
		r1 := min(m.rows, r0+step)
		n := (r1 - r0) * nsb
		b := grow(host, n*k.deviceBlock())
		q, h, d := b[:n*k.quants], b[n*k.quants:n*(k.quants+16)], b[n*(k.quants+16):]
		src, rows := w.Data.Bytes, [2]int{r0, r1}
		if m.src == "Q3_K" {
			if len(src) != m.rows*nsb*110 {
				return fmt.Errorf("cuda: %s: %d bytes, want %d for Q3_K", what, len(src), m.rows*nsb*110)
			}
			src = grow(&q6, n*k.block)
			if err := quant.Q3KToQ6K(w.Data.Bytes[r0*nsb*110:r1*nsb*110], src); err != nil {
				return fmt.Errorf("cuda: %s: %w", what, err)
			}
			rows = [2]int{0, r1 - r0}
		}
		k.layOut(src, nsb, rows[0], rows[1], q, h, d)
		first := uint64(r0) * uint64(nsb)
		if err := e.copyIn(ptr+first*uint64(k.quants), q, what); err != nil {
			return err
		}
		if err := e.copyIn(ptr+heads+16*first, h, what); err != nil {
			return err
		}
		if k.dBytes != 0 {
			if err := e.copyIn(ptr+ds+uint64(k.dBytes)*first, d, what); err != nil {
				return err
			}
		}
	}
	return nil
}

// planMatMulK is planMatMul for a K-quant weight: the input quantized
// (once for the products sharing it) to int8 rows, with opt.kA32 as for
// Q4_0 (quantize_q8's records) and else to Q8_K records, and the
// matrix-vector kernel, and where cuBLAS takes large counts, the input
// rounded to Q8_K's levels in f16, the weight dequantized to f16, the
// product and the bias.
func planMatMulK(p *backend.Program, pl *planned, st *planState, op *backend.Op, m *matInfo, which int, opt planOptions, resid backend.BufID) []call {
	t := weightTypes[m.typ]
	meta := metaField(-1, p.MaxRows)
	k, n := m.cols, m.rows
	useGemm := gemmUsable(m, opt)
	mvCond := always
	if useGemm {
		mvCond = small
	}
	var calls []call
	x, ds := scratch(scratchQ8K), scratch(scratchQ8KRec)
	switch {
	case opt.kA32:
		calls, x, ds = q8Input(p, pl, st, op, which, k, mvCond)
	default:
		if !st.holds(st.q8k, op.A, which, mvCond) {
			calls = append(calls, call{kernel: "quantize_q8k", gridX: blocks(k/256, 8), gridY: rowsOf(which), block: 256, cond: mvCond,
				args: []arg{scratch(scratchQ8K), scratch(scratchQ8KRec), buf(op.A), meta, i32(which), i32(k)}})
			st.q8k = &scratchHolds{buf: op.A, which: which, cond: mvCond}
		}
		pl.need(scratchQ8K, p.MaxRows*k)
		pl.need(scratchQ8KRec, p.MaxRows*k/256*q8kRecBytes)
	}
	r, b := null, null
	if resid >= 0 {
		r = buf(resid)
	}
	if op.Bias != backend.NoWeight {
		b = weight(op.Bias)
	}
	rpb := rowsPerBlock(n, m.chunks(), opt.sms)
	calls = append(calls, call{kernel: "matvec_" + t, gridX: min(blocks(n, rpb), uint32(mvGridPerSM*opt.sms)), gridY: gridOne, block: 32 * mvWarps, cond: mvCond,
		args: []arg{buf(op.Out), r, x, ds, weight(op.W), i64(m.rowBytes), i64(int(m.dOff)), b, meta, i32(which), i32(k), i32(n), i32(rpb)}})
	if !useGemm {
		return calls
	}
	conv := call{kernel: "to_f16_q8k", gridX: blocks(k/256, 8), gridY: rowsOf(which), block: 256, cond: large,
		args: []arg{scratch(scratchX16), buf(op.A), meta, i32(which), i32(k)}}
	if !st.holds(st.x16, op.A, which, large) || st.x16.kernel != conv.kernel {
		calls = append(calls, conv)
		st.x16 = &scratchHolds{buf: op.A, which: which, cond: large, kernel: conv.kernel}
	}
	pl.need(scratchX16, p.MaxRows*k*2)
	pl.need(scratchW16, n*k*2)
	calls = append(calls,
		call{kernel: "deq_f16_" + t, gridX: blocks(n*k/8, elemBlock), gridY: gridOne, block: elemBlock, cond: large,
			args: []arg{scratch(scratchW16), weight(op.W), i64(m.rowBytes), i64(int(m.dOff)), i32(n), i32(k)}},
		call{cond: large, gemm: &gemm{out: buf(op.Out), x: scratch(scratchX16), w: scratch(scratchW16), n: n, k: k}})
	if op.Bias != backend.NoWeight {
		calls = append(calls, call{kernel: "add_bias", gridX: blocks(n, elemBlock), gridY: rowsOf(which), block: elemBlock, cond: large,
			args: []arg{buf(op.Out), weight(op.Bias), meta, i32(which), i32(n)}})
	}
	return calls
}

// withQ8K is a norm or GLU launch c turned into its variant kernel that
// also writes Q8_K records of its output (rows of cols) for the K-quant
// product after it, under the condition when. glu_q8k takes a block per
// super-block.
func withQ8K(c call, kernel string, when cond, cols int) call {
	c.kernel, c.cond = kernel, when
	c.args = append(append([]arg(nil), c.args...), scratch(scratchQ8K), scratch(scratchQ8KRec))
	if kernel == "glu_q8k" {
		c.gridX, c.block = uint32(cols/256), 256
	}
	return c
}
