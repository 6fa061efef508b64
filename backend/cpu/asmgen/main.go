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

// zmm names the 512-bit register whose low half is the ymm register r.
func zmm(r string) string { return "Z" + r[1:] }

// ymm names the 256-bit low half of register r.
func ymm(r string) string { return "Y" + r[1:] }

// zero clears a vector register (EVEX form for Y16-Y31).
func (g *gen) zero(is isa, r string) {
	if is.vnni {
		g.op("VPXORD %s, %s, %s", r, r, r)
	} else {
		g.op("VPXOR %s, %s, %s", r, r, r)
	}
}

// variant is one form of a family's weights.
type variant struct {
	name   string
	u4     bool // levels packed as nibbles
	hbits  int  // u4: bits above the nibble, in planes after the nibbles
	hasMin bool // affine: x = d·q + m (legacy) or d·sc·q − dmin·m (k)
	offset bool // x = d·(q − offset)
	signed bool // AVX2 only: levels stored signed, sign trick instead of offset
	sub    int  // k-quants: elements per sub-block (16 or 32)
}

// isa is an instruction-set level.
type isa struct {
	name string
	vnni bool // AVX-512 VNNI on ymm (VPDPBUSD) and 32 vector registers
	// exact (with vnni): the exact level's kernels (../exact.go): each
	// block's term widened to float64 and added to float64 accumulators,
	// a zmm of 8 rows each, rounded to float32 as the tile is stored.
	exact bool
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
func (g *gen) levels(v variant, is isa, off int, half int, w, w2, mask string, hi []string, tmp string, each func(w string, actOff int)) {
	if v.u4 {
		for j, h := range hi {
			g.op("VMOVDQU %d(AX), %s", off+128+32*j, h)
		}
		for p := range 4 {
			g.op("VMOVDQU %d(AX), %s", off+32*p, w2)
			if half != 1 {
				g.op("VPAND %s, %s, %s", mask, w2, w)
				g.highBits(v, is, hi, tmp, w, p)
				each(w, 4*p)
			}
			if half != 0 {
				g.op("VPSRLW $4, %s, %s", w2, w2)
				g.op("VPAND %s, %s, %s", mask, w2, w2)
				g.highBits(v, is, hi, tmp, w2, p+4)
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

// highBits ORs bits 4 (and 5) of the levels of vector t into w from the
// high-bit planes: plane bit t (one plane) or bits 2k..2k+1 of plane t/4
// (two planes, k = t%4) move to bit 4 by a 16-bit shift, which carries no
// bit of the neighbouring byte into the bits kept.
func (g *gen) highBits(v variant, is isa, hi []string, tmp, w string, t int) {
	if v.hbits == 0 {
		return
	}
	src, shift, mask := hi[0], 4-t, "·hmask1<>(SB)"
	if v.hbits == 2 {
		src, shift, mask = hi[t/4], 4-2*(t%4), "·hmask2<>(SB)"
	}
	switch {
	case shift > 0:
		g.op("VPSLLW $%d, %s, %s", shift, src, tmp)
		src = tmp
	case shift < 0:
		g.op("VPSRLW $%d, %s, %s", -shift, src, tmp)
		src = tmp
	}
	if is.vnni {
		// w |= src & mask in one instruction (truth table 0xf8)
		g.op("VPTERNLOGD $0xf8, %s, %s, %s", mask, src, w)
		return
	}
	g.op("VPAND %s, %s, %s", mask, src, tmp)
	g.op("VPOR %s, %s, %s", tmp, w, w)
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
		if r[0] == 'Z' {
			g.op("VCVTPD2PS %s, %s", r, ymm(r))
			r = ymm(r)
		}
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

DATA ·hmask1<>+0(SB)/8, $0x1010101010101010
DATA ·hmask1<>+8(SB)/8, $0x1010101010101010
DATA ·hmask1<>+16(SB)/8, $0x1010101010101010
DATA ·hmask1<>+24(SB)/8, $0x1010101010101010
GLOBL ·hmask1<>(SB), RODATA|NOPTR, $32

DATA ·hmask2<>+0(SB)/8, $0x3030303030303030
DATA ·hmask2<>+8(SB)/8, $0x3030303030303030
DATA ·hmask2<>+16(SB)/8, $0x3030303030303030
DATA ·hmask2<>+24(SB)/8, $0x3030303030303030
GLOBL ·hmask2<>(SB), RODATA|NOPTR, $32
`

func main() {
	out := flag.String("o", "kernels_amd64.s", "assembly output file")
	decls := flag.String("go", "kernels_amd64.go", "Go declarations output file")
	flag.Parse()
	g := &gen{}
	g.b.WriteString(header)
	vnni, avx2 := isa{name: "VNNI", vnni: true}, isa{name: "AVX2"}
	vnnix := isa{name: "VNNIX", vnni: true, exact: true}
	legacy := []variant{
		{name: "U4", u4: true, offset: true},                // Q4_0
		{name: "U4Min", u4: true, hasMin: true},             // Q4_1
		{name: "U4H1", u4: true, hbits: 1, offset: true},    // Q5_0
		{name: "U4H1Min", u4: true, hbits: 1, hasMin: true}, // Q5_1
	}
	for _, v := range legacy {
		for _, c := range []int{1, 8} {
			g.legacy(v, vnni, c)
			g.legacy(v, vnnix, c)
		}
		for _, c := range []int{1, 4} {
			g.legacy(v, avx2, c)
		}
	}
	// Q8_0 and IQ4_NL: offset 128 on VNNI, signed levels on AVX2
	for _, c := range []int{1, 8} {
		g.legacy(variant{name: "U8", offset: true}, vnni, c)
		g.legacy(variant{name: "U8", offset: true}, vnnix, c)
	}
	for _, c := range []int{1, 4} {
		g.legacy(variant{name: "S8", signed: true}, avx2, c)
	}
	kvariants := []variant{
		{name: "U4Min", sub: 32, u4: true, hasMin: true},             // Q4_K
		{name: "U4H1Min", sub: 32, u4: true, hbits: 1, hasMin: true}, // Q5_K
		{name: "U4H2", sub: 16, u4: true, hbits: 2, offset: true},    // Q6_K
		{name: "U4", sub: 16, u4: true, offset: true},                // Q3_K
		{name: "U4Min", sub: 16, u4: true, hasMin: true},             // Q2_K
	}
	for _, v := range kvariants {
		for _, c := range []int{1, 4} {
			g.kquant(v, vnni, c)
			g.kquant(v, vnnix, c)
		}
		for _, c := range []int{1, 2} {
			g.kquant(v, avx2, c)
		}
	}
	// IQ4_XS
	for _, c := range []int{1, 4} {
		g.kquant(variant{name: "U8", sub: 32, offset: true}, vnni, c)
		g.kquant(variant{name: "U8", sub: 32, offset: true}, vnnix, c)
	}
	for _, c := range []int{1, 2} {
		g.kquant(variant{name: "S8", sub: 32, signed: true}, avx2, c)
	}
	for _, typ := range []string{"F32", "F16", "BF16"} {
		for _, c := range []int{1, 8} {
			g.float(typ, vnni, c)
			g.float(typ, vnnix, c)
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
