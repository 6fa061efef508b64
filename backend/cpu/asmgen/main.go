// Command asmgen writes the amd64 assembly of the CPU backend's matmul
// kernels (../kernels_amd64.s). The kernels are many variants of a few
// loops — per weight family, level width (4 or 8 bits), affine or offset
// scales, instruction set and number of activation columns — so they are
// generated from one description each rather than written out by hand.
//
// Run it with `go generate` in backend/cpu.
package main

import (
	"flag"
	"fmt"
	"go/format"
	"os"
	"strings"
)

// kargs field offsets; keep in step with kargs in gemm_amd64.go.
const (
	argW          = 0
	argTiles      = 8
	argTileBytes  = 16
	argNB         = 24
	argBlockBytes = 32
	argAct        = 40
	argStride     = 48
	argDst        = 56
	argLd4        = 64
	argNegOff     = 72 // [8]int32: -offset in every lane
	argLvOff      = 104
	argScOff      = 112
	argMnOff      = 120
)

// activation record layouts; keep in step with act.go.
const (
	q8Rec    = 40
	q8KRec   = 356
	q8KD     = 256
	q8KSum32 = 260
	q8KSum16 = 292
)

type gen struct {
	b     strings.Builder
	names []string
}

func (g *gen) op(format string, args ...any) { fmt.Fprintf(&g.b, "\t"+format+"\n", args...) }
func (g *gen) label(l string)                { fmt.Fprintf(&g.b, "%s:\n", l) }
func (g *gen) text(name string) {
	g.names = append(g.names, name)
	fmt.Fprintf(&g.b, "\n// func %s(a *kargs)\nTEXT ·%s(SB), NOSPLIT, $0-8\n", name, name)
	g.op("MOVQ a+0(FP), R13")
}

func y(i int) string { return fmt.Sprintf("Y%d", i) }

// zero clears a vector register (EVEX form for Y16-Y31).
func (g *gen) zero(is isa, r string) {
	if is.vnni {
		g.op("VPXORD %s, %s, %s", r, r, r)
	} else {
		g.op("VPXOR %s, %s, %s", r, r, r)
	}
}

// level is how a kernel gets the u8 level vectors of the weights.
type variant struct {
	name   string
	u4     bool // levels packed as nibbles
	hasMin bool // affine: x = d·q + m (legacy) or d·sc·q − dmin·m (k)
	offset bool // x = d·(q − offset)
	signed bool // AVX2 only: levels stored signed, sign trick instead of offset
	sub    int  // k-quants: elements per sub-block (16 or 32)
}

// isa is an instruction-set level.
type isa struct {
	name string
	vnni bool // AVX-512 VNNI on ymm (VPDPBUSD) and 32 vector registers
}

// regs hands out vector registers.
type regs struct{ next int }

func (r *regs) get() string {
	s := y(r.next)
	r.next++
	return s
}

// dotter emits T += Σ (4 u8 levels of W) · (4 s8 activations at mem) per
// lane for one column: one VPDPBUSD with VNNI; broadcast, multiply-add
// pairs to int16, then pairs to int32, add on AVX2.
type dotter struct {
	g          *gen
	isa        isa
	a, a2      string // AVX2 temporaries
	wabs       string // AVX2 signed: |W|
	signedMode bool
}

func (d *dotter) dot(mem, w, t string) {
	g := d.g
	if d.isa.vnni {
		g.op("VPDPBUSD.BCST %s, %s, %s", mem, w, t)
		return
	}
	g.op("VPBROADCASTD %s, %s", mem, d.a)
	if d.signedMode {
		g.op("VPSIGNB %s, %s, %s", w, d.a, d.a)
		g.op("VPMADDUBSW %s, %s, %s", d.a, d.wabs, d.a2)
	} else {
		g.op("VPMADDUBSW %s, %s, %s", d.a, w, d.a2)
	}
	g.op("VPMADDWD ·ones16<>(SB), %s, %s", d.a2, d.a2)
	g.op("VPADDD %s, %s, %s", d.a2, t, t)
}

// levels emits the loads of the level vectors of one group of 32 elements
// at byte offset off from AX, calling each(w, actOffset) for
// each vector with the activation byte offset it pairs with. For u4 the
// low nibbles are elements 4p+i, the high ones 16+4p+i; half limits to
// the first (0) or second (1) 16 elements, -1 for all.
func (g *gen) levels(v variant, off int, half int, w, w2, mask string, each func(w string, actOff int)) {
	if v.u4 {
		for p := range 4 {
			g.op("VMOVDQU %d(AX), %s", off+32*p, w2)
			if half != 1 {
				g.op("VPAND %s, %s, %s", mask, w2, w)
				each(w, 4*p)
			}
			if half != 0 {
				g.op("VPSRLW $4, %s, %s", w2, w2)
				g.op("VPAND %s, %s, %s", mask, w2, w2)
				each(w2, 16+4*p)
			}
		}
		return
	}
	t0, t1 := 0, 8
	switch half {
	case 0:
		t1 = 4
	case 1:
		t0 = 4
	}
	for t := t0; t < t1; t++ {
		g.op("VMOVDQU %d(AX), %s", off+32*t, w)
		each(w, 4*t)
	}
}

// prologue loads the pointers and constants shared by every kernel.
//
//	DI tile, CX tiles left, DX dst, R10 stride, R11 ld4, R12 blockBytes,
//	R9 level offset within a block.
func (g *gen) prologue() {
	g.op("MOVQ %d(R13), DI", argW)
	g.op("MOVQ %d(R13), CX", argTiles)
	g.op("MOVQ %d(R13), DX", argDst)
	g.op("MOVQ %d(R13), R10", argStride)
	g.op("MOVQ %d(R13), R11", argLd4)
	g.op("MOVQ %d(R13), R12", argBlockBytes)
}

// epilogue stores the accumulators (one per column) and steps to the next
// tile.
func (g *gen) epilogue(acc []string, loop string) {
	g.op("MOVQ DX, AX")
	for c, r := range acc {
		g.op("VMOVUPS %s, (AX)", r)
		if c < len(acc)-1 {
			g.op("ADDQ R11, AX")
		}
	}
	g.op("ADDQ $32, DX")
	g.op("ADDQ %d(R13), DI", argTileBytes)
	g.op("DECQ CX")
	g.op("JNZ %s", loop)
	g.op("VZEROUPPER")
	g.op("RET")
}

// legacy emits a kernel for the 32-element block types: per block and
// column, T = Σ levels·a − offset·Σa, acc += float(T)·(dw·da) and for
// the affine types acc += float(Σa)·(m·da).
func (g *gen) legacy(v variant, is isa, cols int) {
	name := fmt.Sprintf("legacy%s%s%d", v.name, is.name, cols)
	g.text(name)
	g.prologue()
	r := regs{}
	w, w2, dw, mask := r.get(), r.get(), r.get(), r.get()
	var nego, s0, a, a2, wabs string
	if is.vnni {
		nego, s0 = r.get(), r.get()
		r.next = 16
	} else {
		a, a2 = r.get(), r.get()
		s0 = a
		if v.signed {
			wabs = r.get()
		}
	}
	acc := make([]string, cols)
	ts := make([]string, cols)
	for c := range cols {
		acc[c] = r.get()
	}
	for c := range cols {
		ts[c] = r.get()
	}
	// A single column splits its dot products over several chains, which
	// start from zero; the offset term joins them at the end.
	var chains []string
	if cols == 1 {
		chains = append(chains, ts[0])
		for range 3 {
			chains = append(chains, r.get())
		}
	}
	if r.next > 32 || (!is.vnni && r.next > 16) {
		panic(name + ": out of registers")
	}
	d := &dotter{g: g, isa: is, a: a, a2: a2, wabs: wabs, signedMode: v.signed}
	g.op("MOVQ %d(R13), R9", argLvOff)
	if v.u4 {
		g.op("VPBROADCASTB ·nibble<>(SB), %s", mask)
	}
	if v.offset && is.vnni {
		g.op("VPBROADCASTD %d(R13), %s", argNegOff, nego)
	}
	g.label(name + "_tile")
	for c := range cols {
		g.zero(is, acc[c])
	}
	g.op("MOVQ DI, BX")
	g.op("MOVQ %d(R13), SI", argAct)
	g.op("MOVQ %d(R13), R8", argNB)
	g.label(name + "_block")
	offsetInto := func(c int, t string) {
		if is.vnni {
			g.op("VPMULLD.BCST %d(SI), %s, %s", c*q8Rec+36, nego, t)
		} else {
			g.op("VPBROADCASTD %d(SI), %s", c*q8Rec+36, t)
			g.op("VPMULLD %d(R13), %s, %s", argNegOff, t, t)
		}
	}
	if chains != nil {
		for _, t := range chains {
			g.zero(is, t)
		}
	} else {
		// T starts at −offset·Σa
		for c := range cols {
			if v.offset {
				offsetInto(c, ts[c])
			} else {
				g.zero(is, ts[c])
			}
		}
	}
	g.op("LEAQ (BX)(R9*1), AX")
	n := 0
	g.levels(v, 0, -1, w, w2, mask, func(wr string, actOff int) {
		if v.signed {
			g.op("VPABSB %s, %s", wr, wabs)
		}
		for c := range cols {
			t := ts[c]
			if chains != nil {
				t = chains[n%len(chains)]
			}
			d.dot(fmt.Sprintf("%d(SI)", c*q8Rec+actOff), wr, t)
		}
		n++
	})
	if chains != nil {
		if v.offset {
			offsetInto(0, w)
			g.op("VPADDD %s, %s, %s", w, chains[0], chains[0])
		}
		g.op("VPADDD %s, %s, %s", chains[1], chains[0], chains[0])
		g.op("VPADDD %s, %s, %s", chains[3], chains[2], chains[2])
		g.op("VPADDD %s, %s, %s", chains[2], chains[0], chains[0])
	}
	g.op("VCVTPH2PS (BX), %s", dw)
	for c := range cols {
		g.op("VCVTDQ2PS %s, %s", ts[c], ts[c])
		g.scaleFMA(is, fmt.Sprintf("%d(SI)", c*q8Rec+32), dw, s0, ts[c], acc[c], false)
	}
	if v.hasMin {
		g.op("VCVTPH2PS %d(BX), %s", 2*8, dw)
		for c := range cols {
			g.op("VPBROADCASTD %d(SI), %s", c*q8Rec+36, ts[c])
			g.op("VCVTDQ2PS %s, %s", ts[c], ts[c])
			g.scaleFMA(is, fmt.Sprintf("%d(SI)", c*q8Rec+32), dw, s0, ts[c], acc[c], false)
		}
	}
	g.op("ADDQ R12, BX")
	g.op("ADDQ R10, SI")
	g.op("DECQ R8")
	g.op("JNZ %s_block", name)
	g.epilogue(acc, name+"_tile")
}

// scaleFMA emits acc ±= f · (scale · bcast(da at mem)).
func (g *gen) scaleFMA(is isa, daMem, scale, s, f, acc string, neg bool) {
	if is.vnni {
		g.op("VMULPS.BCST %s, %s, %s", daMem, scale, s)
	} else {
		g.op("VBROADCASTSS %s, %s", daMem, s)
		g.op("VMULPS %s, %s, %s", s, scale, s)
	}
	if neg {
		g.op("VFNMADD231PS %s, %s, %s", s, f, acc)
	} else {
		g.op("VFMADD231PS %s, %s, %s", s, f, acc)
	}
}

// kquant emits a kernel for the 256-element super-block types: per
// sub-block and column T = Σ levels·a − offset·Σa, ISUM += sc·T, and for
// the affine types MSUM += m·Σa; per super-block acc += float(ISUM)·(d·da)
// − float(MSUM)·(dmin·da).
func (g *gen) kquant(v variant, is isa, cols int) {
	name := fmt.Sprintf("k%d%s%s%d", v.sub, v.name, is.name, cols)
	g.text(name)
	g.prologue()
	nsub := 256 / v.sub
	scOff := 16
	if v.hasMin {
		scOff = 32
	}
	mnOff := scOff + 8*nsub
	lvOff := mnOff
	if v.hasMin {
		lvOff += 8 * nsub
	}
	gb := 256
	if v.u4 {
		gb = 128
	}
	sumOff := q8KSum16
	if v.sub == 32 {
		sumOff = q8KSum32
	}
	r := regs{}
	w, w2, mask, sc, dw := r.get(), r.get(), r.get(), r.get(), r.get()
	var nego, a, a2, wabs, mn, s0 string
	if is.vnni {
		nego, mn, s0 = r.get(), r.get(), r.get()
		r.next = 16
	} else {
		// AVX2 has half the registers: the mins share the scales' register
		// and the scale product the broadcast temporary.
		a, a2 = r.get(), r.get()
		mn, s0 = sc, a
		if v.signed {
			wabs = r.get()
		}
	}
	acc, isum, msum, ts := make([]string, cols), make([]string, cols), make([]string, cols), make([]string, cols)
	for c := range cols {
		acc[c], isum[c], ts[c] = r.get(), r.get(), r.get()
		if v.hasMin {
			msum[c] = r.get()
		}
	}
	var t2 string
	if cols == 1 {
		t2 = r.get()
	}
	if r.next > 32 || (!is.vnni && r.next > 16) {
		panic(name + ": out of registers")
	}
	d := &dotter{g: g, isa: is, a: a, a2: a2, wabs: wabs, signedMode: v.signed}
	if v.u4 {
		g.op("VPBROADCASTB ·nibble<>(SB), %s", mask)
	}
	if v.offset && is.vnni {
		g.op("VPBROADCASTD %d(R13), %s", argNegOff, nego)
	}
	g.label(name + "_tile")
	for c := range cols {
		g.zero(is, acc[c])
	}
	g.op("MOVQ DI, BX")
	g.op("MOVQ %d(R13), SI", argAct)
	g.op("MOVQ %d(R13), R8", argNB)
	g.label(name + "_block")
	for c := range cols {
		g.zero(is, isum[c])
		if v.hasMin {
			g.zero(is, msum[c])
		}
	}
	g.op("LEAQ %d(BX), AX", lvOff)
	for s := range nsub {
		for c := range cols {
			sum := fmt.Sprintf("%d(SI)", c*q8KRec+sumOff+4*s)
			switch {
			case v.offset && is.vnni:
				g.op("VPMULLD.BCST %s, %s, %s", sum, nego, ts[c])
			case v.offset:
				g.op("VPBROADCASTD %s, %s", sum, ts[c])
				g.op("VPMULLD %d(R13), %s, %s", argNegOff, ts[c], ts[c])
			default:
				g.zero(is, ts[c])
			}
		}
		if t2 != "" {
			g.zero(is, t2)
		}
		group, half := s, -1
		if v.sub == 16 {
			group, half = s/2, s%2
		}
		n := 0
		g.levels(v, group*gb, half, w, w2, mask, func(wr string, actOff int) {
			if v.signed {
				g.op("VPABSB %s, %s", wr, wabs)
			}
			for c := range cols {
				t := ts[c]
				if t2 != "" && n%2 == 1 {
					t = t2
				}
				d.dot(fmt.Sprintf("%d(SI)", c*q8KRec+32*group+actOff), wr, t)
			}
			n++
		})
		if t2 != "" {
			g.op("VPADDD %s, %s, %s", t2, ts[0], ts[0])
		}
		g.op("VPMOVSXBD %d(BX), %s", scOff+8*s, sc)
		for c := range cols {
			g.op("VPMULLD %s, %s, %s", sc, ts[c], ts[c])
			g.op("VPADDD %s, %s, %s", ts[c], isum[c], isum[c])
		}
		if v.hasMin {
			g.op("VPMOVZXBD %d(BX), %s", mnOff+8*s, mn)
			for c := range cols {
				sum := fmt.Sprintf("%d(SI)", c*q8KRec+sumOff+4*s)
				if is.vnni {
					g.op("VPMULLD.BCST %s, %s, %s", sum, mn, ts[c])
				} else {
					g.op("VPBROADCASTD %s, %s", sum, ts[c])
					g.op("VPMULLD %s, %s, %s", mn, ts[c], ts[c])
				}
				g.op("VPADDD %s, %s, %s", ts[c], msum[c], msum[c])
			}
		}
	}
	g.op("VCVTPH2PS (BX), %s", dw)
	for c := range cols {
		g.op("VCVTDQ2PS %s, %s", isum[c], isum[c])
		g.scaleFMA(is, fmt.Sprintf("%d(SI)", c*q8KRec+q8KD), dw, s0, isum[c], acc[c], false)
	}
	if v.hasMin {
		g.op("VCVTPH2PS 16(BX), %s", dw)
		for c := range cols {
			g.op("VCVTDQ2PS %s, %s", msum[c], msum[c])
			g.scaleFMA(is, fmt.Sprintf("%d(SI)", c*q8KRec+q8KD), dw, s0, msum[c], acc[c], true)
		}
	}
	g.op("ADDQ R12, BX")
	g.op("ADDQ R10, SI")
	g.op("DECQ R8")
	g.op("JNZ %s_block", name)
	g.epilogue(acc, name+"_tile")
}

// float emits a kernel for F32 / F16 / BF16 weights: per element k and
// column, acc += W[k] (8 rows) · a[k]. A single column keeps four chains.
func (g *gen) float(typ string, is isa, cols int) {
	name := fmt.Sprintf("float%s%s%d", typ, is.name, cols)
	g.text(name)
	g.prologue()
	r := regs{}
	w, a := r.get(), r.get()
	if is.vnni {
		r.next = 16
	}
	chains := 1
	if cols == 1 {
		chains = 4
	}
	acc := make([][]string, chains)
	for i := range acc {
		acc[i] = make([]string, cols)
		for c := range cols {
			acc[i][c] = r.get()
		}
	}
	if r.next > 32 || (!is.vnni && r.next > 16) {
		panic(name + ": out of registers")
	}
	load := func(off int) {
		switch typ {
		case "F32":
			g.op("VMOVUPS %d(BX), %s", off, w)
		case "F16":
			g.op("VCVTPH2PS %d(BX), %s", off, w)
		default:
			g.op("VPMOVZXWD %d(BX), %s", off, w)
			g.op("VPSLLD $16, %s, %s", w, w)
		}
	}
	fma := func(mem, acc string) {
		if is.vnni {
			g.op("VFMADD231PS.BCST %s, %s, %s", mem, w, acc)
		} else {
			g.op("VBROADCASTSS %s, %s", mem, a)
			g.op("VFMADD231PS %s, %s, %s", a, w, acc)
		}
	}
	g.label(name + "_tile")
	for i := range acc {
		for c := range cols {
			g.zero(is, acc[i][c])
		}
	}
	g.op("MOVQ DI, BX")
	g.op("MOVQ %d(R13), SI", argAct)
	g.op("MOVQ %d(R13), R8", argNB)
	if chains > 1 {
		// four elements per step while at least four remain
		g.op("CMPQ R8, $%d", chains)
		g.op("JLT %s_one", name)
		g.label(name + "_four")
		g.op("MOVQ SI, AX")
		for i := range chains {
			load(0)
			fma("(AX)", acc[i][0])
			g.op("ADDQ R12, BX")
			g.op("ADDQ R10, AX")
		}
		g.op("LEAQ (SI)(R10*4), SI")
		g.op("SUBQ $%d, R8", chains)
		g.op("CMPQ R8, $%d", chains)
		g.op("JGE %s_four", name)
		g.op("TESTQ R8, R8")
		g.op("JZ %s_sum", name)
	}
	g.label(name + "_one")
	load(0)
	for c := range cols {
		fma(fmt.Sprintf("%d(SI)", 4*c), acc[0][c])
	}
	g.op("ADDQ R12, BX")
	g.op("ADDQ R10, SI")
	g.op("DECQ R8")
	g.op("JNZ %s_one", name)
	if chains > 1 {
		g.label(name + "_sum")
		g.op("VADDPS %s, %s, %s", acc[1][0], acc[0][0], acc[0][0])
		g.op("VADDPS %s, %s, %s", acc[3][0], acc[2][0], acc[2][0])
		g.op("VADDPS %s, %s, %s", acc[2][0], acc[0][0], acc[0][0])
	}
	g.epilogue(acc[0], name+"_tile")
}

const header = `// Code generated by asmgen; DO NOT EDIT.

//go:build amd64 && !purego

#include "textflag.h"

DATA ·nibble<>+0(SB)/1, $0x0f
GLOBL ·nibble<>(SB), RODATA|NOPTR, $1

DATA ·ones16<>+0(SB)/8, $0x0001000100010001
DATA ·ones16<>+8(SB)/8, $0x0001000100010001
DATA ·ones16<>+16(SB)/8, $0x0001000100010001
DATA ·ones16<>+24(SB)/8, $0x0001000100010001
GLOBL ·ones16<>(SB), RODATA|NOPTR, $32
`

func main() {
	out := flag.String("o", "kernels_amd64.s", "assembly output file")
	decls := flag.String("go", "kernels_amd64.go", "Go declarations output file")
	flag.Parse()
	g := &gen{}
	g.b.WriteString(header)
	vnni, avx2 := isa{name: "VNNI", vnni: true}, isa{name: "AVX2"}
	legacy := []variant{
		{name: "U4", u4: true, offset: true},
		{name: "U4Min", u4: true, hasMin: true},
		{name: "U8", offset: true},
		{name: "U8Min", hasMin: true},
	}
	for _, v := range legacy {
		for _, c := range []int{1, 8} {
			g.legacy(v, vnni, c)
		}
		for _, c := range []int{1, 4} {
			g.legacy(v, avx2, c)
		}
	}
	for _, c := range []int{1, 4} {
		g.legacy(variant{name: "S8", signed: true}, avx2, c)
	}
	kvariants := []variant{
		{name: "U4Min", sub: 32, u4: true, hasMin: true}, // Q4_K
		{name: "U8Min", sub: 32, hasMin: true},           // Q5_K
		{name: "U8", sub: 32, offset: true},              // IQ4_XS
		{name: "U8", sub: 16, offset: true},              // Q6_K
		{name: "U4", sub: 16, u4: true, offset: true},    // Q3_K
		{name: "U4Min", sub: 16, u4: true, hasMin: true}, // Q2_K
	}
	for _, v := range kvariants {
		for _, c := range []int{1, 4} {
			g.kquant(v, vnni, c)
		}
		for _, c := range []int{1, 2} {
			g.kquant(v, avx2, c)
		}
	}
	for _, c := range []int{1, 2} {
		g.kquant(variant{name: "S8", sub: 32, signed: true}, avx2, c) // IQ4_XS
	}
	for _, typ := range []string{"F32", "F16", "BF16"} {
		for _, c := range []int{1, 8} {
			g.float(typ, vnni, c)
		}
		for _, c := range []int{1, 4} {
			g.float(typ, avx2, c)
		}
	}
	var d strings.Builder
	d.WriteString("// Code generated by asmgen; DO NOT EDIT.\n\n//go:build amd64 && !purego\n\npackage cpu\n")
	for _, n := range g.names {
		fmt.Fprintf(&d, "\n//go:noescape\nfunc %s(a *kargs)\n", n)
	}
	// Calls through func values would make every kargs escape to the
	// heap; kernels are named by number and called directly instead.
	d.WriteString("\n// kernelIDs numbers the kernels for callKernel.\nvar kernelIDs = map[string]int{\n")
	for i, n := range g.names {
		fmt.Fprintf(&d, "\t%q: %d,\n", n, i)
	}
	d.WriteString("}\n\n// callKernel runs kernel id on a.\nfunc callKernel(id int, a *kargs) {\n\tswitch id {\n")
	for i, n := range g.names {
		fmt.Fprintf(&d, "\tcase %d:\n\t\t%s(a)\n", i, n)
	}
	d.WriteString("\t}\n}\n")
	src, err := format.Source([]byte(d.String()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for path, text := range map[string]string{*out: g.b.String(), *decls: string(src)} {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
