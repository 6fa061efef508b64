//go:build amd64 && !purego

#include "textflag.h"

// Vector kernels for attention and activations, AVX2 + FMA. Lengths are
// whole vectors of 8 (or 16) floats; the Go wrappers in vec_amd64.go do
// the tails and check the extents.

// Constants, 32 bytes each: log2 e, ln 2 in two parts (hi, lo), Cephes'
// expf polynomial p0..p5, 1, 127 (int), the clamp range of x, 0.5·√(2/π)·2
// and 0.044715 for GELU.
#define C_LOG2E 0
#define C_LN2HI 32
#define C_LN2LO 64
#define C_P0 96
#define C_P1 128
#define C_P2 160
#define C_P3 192
#define C_P4 224
#define C_P5 256
#define C_ONE 288
#define C_BIAS 320
#define C_MINX 352
#define C_MAXX 384
#define C_GELU2C 416
#define C_GELUK 448

#define VEC(off, val) \
	DATA ·vc<>+(off+0)(SB)/4, val; \
	DATA ·vc<>+(off+4)(SB)/4, val; \
	DATA ·vc<>+(off+8)(SB)/4, val; \
	DATA ·vc<>+(off+12)(SB)/4, val; \
	DATA ·vc<>+(off+16)(SB)/4, val; \
	DATA ·vc<>+(off+20)(SB)/4, val; \
	DATA ·vc<>+(off+24)(SB)/4, val; \
	DATA ·vc<>+(off+28)(SB)/4, val

VEC(C_LOG2E, $1.44269504088896341)
VEC(C_LN2HI, $0.693359375)
VEC(C_LN2LO, $-2.12194440e-4)
VEC(C_P0, $1.9875691500e-4)
VEC(C_P1, $1.3981999507e-3)
VEC(C_P2, $8.3334519073e-3)
VEC(C_P3, $4.1665795894e-2)
VEC(C_P4, $1.6666665459e-1)
VEC(C_P5, $5.0000001201e-1)
VEC(C_ONE, $1.0)
VEC(C_BIAS, $127)
VEC(C_MINX, $-87.3)
VEC(C_MAXX, $88.3)
VEC(C_GELU2C, $-1.5957691216057308)
VEC(C_GELUK, $0.044715)
GLOBL ·vc<>(SB), RODATA|NOPTR, $480

// EXP sets X to e^X for 8 floats: n = round(X·log2 e), r = X − n·ln 2,
// e^r by the polynomial, times 2^n built in the exponent bits. X is
// clamped to [−87.3, 88.3] so 2^n stays a normal float, and lanes below
// the range are zeroed afterwards (T3 holds that mask). About 1 ulp.
#define EXP(X, T1, T2, T3) \
	VCMPPS $13, ·vc<>+C_MINX(SB), X, T3; \
	VMAXPS ·vc<>+C_MINX(SB), X, X; \
	VMINPS ·vc<>+C_MAXX(SB), X, X; \
	VMULPS ·vc<>+C_LOG2E(SB), X, T1; \
	VROUNDPS $0, T1, T1; \
	VFNMADD231PS ·vc<>+C_LN2HI(SB), T1, X; \
	VFNMADD231PS ·vc<>+C_LN2LO(SB), T1, X; \
	VMOVUPS ·vc<>+C_P0(SB), T2; \
	VFMADD213PS ·vc<>+C_P1(SB), X, T2; \
	VFMADD213PS ·vc<>+C_P2(SB), X, T2; \
	VFMADD213PS ·vc<>+C_P3(SB), X, T2; \
	VFMADD213PS ·vc<>+C_P4(SB), X, T2; \
	VFMADD213PS ·vc<>+C_P5(SB), X, T2; \
	VMULPS X, T2, T2; \
	VFMADD213PS X, X, T2; \
	VADDPS ·vc<>+C_ONE(SB), T2, T2; \
	VCVTPS2DQ T1, T1; \
	VPADDD ·vc<>+C_BIAS(SB), T1, T1; \
	VPSLLD $23, T1, T1; \
	VMULPS T1, T2, X; \
	VANDPS T3, X, X

// HSUM leaves the sum of Y's 8 lanes in the low lane of X (T scratch).
#define HSUM(Y, X, T) \
	VEXTRACTF128 $1, Y, T; \
	VADDPS T, X, X; \
	VHADDPS X, X, X; \
	VHADDPS X, X, X

// func expSubAVX2(x *float32, n int, m float32) float32
// x[i] = e^(x[i]−m); returns Σ x[i]. n > 0, a multiple of 8.
TEXT ·expSubAVX2(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), DI
	MOVQ n+8(FP), CX
	VBROADCASTSS m+16(FP), Y5
	VXORPS Y4, Y4, Y4
expsub_loop:
	VMOVUPS (DI), Y0
	VSUBPS Y5, Y0, Y0
	EXP(Y0, Y1, Y2, Y3)
	VMOVUPS Y0, (DI)
	VADDPS Y0, Y4, Y4
	ADDQ $32, DI
	SUBQ $8, CX
	JNZ expsub_loop
	HSUM(Y4, X4, X1)
	VMOVSS X4, ret+24(FP)
	VZEROUPPER
	RET

// func siluMulAVX2(a, b, out *float32, n int)
// out = a·sigmoid(a)·b. n > 0, a multiple of 8.
TEXT ·siluMulAVX2(SB), NOSPLIT, $0-32
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), BX
	MOVQ out+16(FP), DX
	MOVQ n+24(FP), CX
	VXORPS Y6, Y6, Y6
silu_loop:
	VMOVUPS (SI), Y0
	VSUBPS Y0, Y6, Y3
	EXP(Y3, Y1, Y2, Y4)
	VADDPS ·vc<>+C_ONE(SB), Y3, Y3
	VDIVPS Y3, Y0, Y0
	VMULPS (BX), Y0, Y0
	VMOVUPS Y0, (DX)
	ADDQ $32, SI
	ADDQ $32, BX
	ADDQ $32, DX
	SUBQ $8, CX
	JNZ silu_loop
	VZEROUPPER
	RET

// func geluMulAVX2(a, b, out *float32, n int)
// out = gelu_tanh(a)·b, using 0.5·x·(1 + tanh(u)) = x·sigmoid(2u) with
// u = √(2/π)·(x + 0.044715·x³). n > 0, a multiple of 8.
TEXT ·geluMulAVX2(SB), NOSPLIT, $0-32
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), BX
	MOVQ out+16(FP), DX
	MOVQ n+24(FP), CX
gelu_loop:
	VMOVUPS (SI), Y0
	VMULPS Y0, Y0, Y3
	VMULPS ·vc<>+C_GELUK(SB), Y3, Y3
	VFMADD213PS Y0, Y0, Y3
	VMULPS ·vc<>+C_GELU2C(SB), Y3, Y3
	EXP(Y3, Y1, Y2, Y4)
	VADDPS ·vc<>+C_ONE(SB), Y3, Y3
	VDIVPS Y3, Y0, Y0
	VMULPS (BX), Y0, Y0
	VMOVUPS Y0, (DX)
	ADDQ $32, SI
	ADDQ $32, BX
	ADDQ $32, DX
	SUBQ $8, CX
	JNZ gelu_loop
	VZEROUPPER
	RET

// func scoresAVX2(q, k *float32, hd, kstride, n int, out *float32, scale float32)
// out[j] = scale · q·k[j] for n keys kstride bytes apart. hd a multiple
// of 16, n > 0.
TEXT ·scoresAVX2(SB), NOSPLIT, $0-52
	MOVQ q+0(FP), SI
	MOVQ k+8(FP), DI
	MOVQ hd+16(FP), R8
	MOVQ kstride+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ out+40(FP), DX
	VMOVSS scale+48(FP), X7
scores_key:
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	XORQ AX, AX
	MOVQ R8, BX
scores_d:
	VMOVUPS (DI)(AX*1), Y2
	VFMADD231PS (SI)(AX*1), Y2, Y0
	VMOVUPS 32(DI)(AX*1), Y3
	VFMADD231PS 32(SI)(AX*1), Y3, Y1
	ADDQ $64, AX
	SUBQ $16, BX
	JNZ scores_d
	VADDPS Y1, Y0, Y0
	HSUM(Y0, X0, X1)
	VMULSS X7, X0, X0
	VMOVSS X0, (DX)
	ADDQ $4, DX
	ADDQ R9, DI
	DECQ CX
	JNZ scores_key
	VZEROUPPER
	RET

// func wsumAVX2(p *float32, n int, v *float32, vstride, hd int, out *float32)
// out[d] = Σ_j p[j]·v[j][d] for n rows vstride bytes apart. hd a multiple
// of 8, n > 0.
TEXT ·wsumAVX2(SB), NOSPLIT, $0-48
	MOVQ hd+32(FP), R8
	MOVQ out+40(FP), DX
	MOVQ vstride+24(FP), R9
	XORQ AX, AX
wsum_chunk32:
	CMPQ R8, $32
	JLT wsum_chunk8
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ v+16(FP), DI
	ADDQ AX, DI
wsum_row32:
	VBROADCASTSS (SI), Y4
	VFMADD231PS (DI), Y4, Y0
	VFMADD231PS 32(DI), Y4, Y1
	VFMADD231PS 64(DI), Y4, Y2
	VFMADD231PS 96(DI), Y4, Y3
	ADDQ $4, SI
	ADDQ R9, DI
	DECQ CX
	JNZ wsum_row32
	VMOVUPS Y0, (DX)(AX*1)
	VMOVUPS Y1, 32(DX)(AX*1)
	VMOVUPS Y2, 64(DX)(AX*1)
	VMOVUPS Y3, 96(DX)(AX*1)
	ADDQ $128, AX
	SUBQ $32, R8
	JMP wsum_chunk32
wsum_chunk8:
	TESTQ R8, R8
	JZ wsum_done
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ v+16(FP), DI
	ADDQ AX, DI
wsum_row8:
	VBROADCASTSS (SI), Y4
	VFMADD231PS (DI), Y4, Y0
	ADDQ $4, SI
	ADDQ R9, DI
	DECQ CX
	JNZ wsum_row8
	VMOVUPS Y0, (DX)(AX*1)
	ADDQ $32, AX
	SUBQ $8, R8
	JMP wsum_chunk8
wsum_done:
	VZEROUPPER
	RET

// func scores16AVX2(q *float32, k *uint16, hd, kstride, n int, out *float32, scale float32)
// scoresAVX2 over keys of IEEE half floats (F16C), kstride bytes apart.
TEXT ·scores16AVX2(SB), NOSPLIT, $0-52
	MOVQ q+0(FP), SI
	MOVQ k+8(FP), DI
	MOVQ hd+16(FP), R8
	MOVQ kstride+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ out+40(FP), DX
	VMOVSS scale+48(FP), X7
scores16_key:
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	XORQ AX, AX
	XORQ R10, R10
	MOVQ R8, BX
scores16_d:
	VCVTPH2PS (DI)(R10*1), Y2
	VFMADD231PS (SI)(AX*1), Y2, Y0
	VCVTPH2PS 16(DI)(R10*1), Y3
	VFMADD231PS 32(SI)(AX*1), Y3, Y1
	ADDQ $64, AX
	ADDQ $32, R10
	SUBQ $16, BX
	JNZ scores16_d
	VADDPS Y1, Y0, Y0
	HSUM(Y0, X0, X1)
	VMULSS X7, X0, X0
	VMOVSS X0, (DX)
	ADDQ $4, DX
	ADDQ R9, DI
	DECQ CX
	JNZ scores16_key
	VZEROUPPER
	RET

// func wsum16AVX2(p *float32, n int, v *uint16, vstride, hd int, out *float32)
// wsumAVX2 over values of IEEE half floats (F16C), vstride bytes apart.
TEXT ·wsum16AVX2(SB), NOSPLIT, $0-48
	MOVQ hd+32(FP), R8
	MOVQ out+40(FP), DX
	MOVQ vstride+24(FP), R9
	XORQ AX, AX
wsum16_chunk32:
	CMPQ R8, $32
	JLT wsum16_chunk8
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ v+16(FP), DI
	MOVQ AX, R10
	SHRQ $1, R10
	ADDQ R10, DI
wsum16_row32:
	VBROADCASTSS (SI), Y4
	VCVTPH2PS (DI), Y5
	VFMADD231PS Y5, Y4, Y0
	VCVTPH2PS 16(DI), Y6
	VFMADD231PS Y6, Y4, Y1
	VCVTPH2PS 32(DI), Y5
	VFMADD231PS Y5, Y4, Y2
	VCVTPH2PS 48(DI), Y6
	VFMADD231PS Y6, Y4, Y3
	ADDQ $4, SI
	ADDQ R9, DI
	DECQ CX
	JNZ wsum16_row32
	VMOVUPS Y0, (DX)(AX*1)
	VMOVUPS Y1, 32(DX)(AX*1)
	VMOVUPS Y2, 64(DX)(AX*1)
	VMOVUPS Y3, 96(DX)(AX*1)
	ADDQ $128, AX
	SUBQ $32, R8
	JMP wsum16_chunk32
wsum16_chunk8:
	TESTQ R8, R8
	JZ wsum16_done
	VXORPS Y0, Y0, Y0
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ v+16(FP), DI
	MOVQ AX, R10
	SHRQ $1, R10
	ADDQ R10, DI
wsum16_row8:
	VBROADCASTSS (SI), Y4
	VCVTPH2PS (DI), Y5
	VFMADD231PS Y5, Y4, Y0
	ADDQ $4, SI
	ADDQ R9, DI
	DECQ CX
	JNZ wsum16_row8
	VMOVUPS Y0, (DX)(AX*1)
	ADDQ $32, AX
	SUBQ $8, R8
	JMP wsum16_chunk8
wsum16_done:
	VZEROUPPER
	RET

// func streamXorAVX2(p *byte, n int) uint64
// XORs n bytes (a multiple of 256) 32 bytes at a time into eight chains:
// a streaming read with no work attached, for the bandwidth benchmark.
TEXT ·streamXorAVX2(SB), NOSPLIT, $0-24
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	VPXOR Y0, Y0, Y0
	VPXOR Y1, Y1, Y1
	VPXOR Y2, Y2, Y2
	VPXOR Y3, Y3, Y3
	VPXOR Y4, Y4, Y4
	VPXOR Y5, Y5, Y5
	VPXOR Y6, Y6, Y6
	VPXOR Y7, Y7, Y7
stream_loop:
	VPXOR 0(SI), Y0, Y0
	VPXOR 32(SI), Y1, Y1
	VPXOR 64(SI), Y2, Y2
	VPXOR 96(SI), Y3, Y3
	VPXOR 128(SI), Y4, Y4
	VPXOR 160(SI), Y5, Y5
	VPXOR 192(SI), Y6, Y6
	VPXOR 224(SI), Y7, Y7
	ADDQ $256, SI
	SUBQ $256, CX
	JNZ stream_loop
	VPXOR Y1, Y0, Y0
	VPXOR Y3, Y2, Y2
	VPXOR Y5, Y4, Y4
	VPXOR Y7, Y6, Y6
	VPXOR Y2, Y0, Y0
	VPXOR Y6, Y4, Y4
	VPXOR Y4, Y0, Y0
	VEXTRACTI128 $1, Y0, X1
	VPXOR X1, X0, X0
	VPEXTRQ $0, X0, AX
	VPEXTRQ $1, X0, BX
	XORQ BX, AX
	MOVQ AX, ret+16(FP)
	VZEROUPPER
	RET
