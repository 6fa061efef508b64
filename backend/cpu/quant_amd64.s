//go:build amd64 && !purego

#include "textflag.h"

// Activation quantizers, AVX2: the same float32 operations as
// quantQ8Block and quantQ8KBlock in act.go, so the records are identical.

DATA ·qc<>+0(SB)/4, $0x7fffffff // |x| mask
DATA ·qc<>+4(SB)/4, $127.0
DATA ·qc<>+8(SB)/4, $-127.0
DATA ·qc<>+12(SB)/4, $1.0
DATA ·qc<>+16(SB)/4, $127 // int
GLOBL ·qc<>(SB), RODATA|NOPTR, $20

// dword order that undoes the lane interleaving of two pack steps
DATA ·qperm<>+0(SB)/4, $0
DATA ·qperm<>+4(SB)/4, $4
DATA ·qperm<>+8(SB)/4, $1
DATA ·qperm<>+12(SB)/4, $5
DATA ·qperm<>+16(SB)/4, $2
DATA ·qperm<>+20(SB)/4, $6
DATA ·qperm<>+24(SB)/4, $3
DATA ·qperm<>+28(SB)/4, $7
GLOBL ·qperm<>(SB), RODATA|NOPTR, $32

// PACK32 packs 32 int32 in A, B, C, D (elements 0-7, 8-15, ...) to 32
// int8 in A, in order. Y15 holds qperm.
#define PACK32(A, B, C, D) \
	VPACKSSDW B, A, A; \
	VPACKSSDW D, C, C; \
	VPACKSSWB C, A, A; \
	VPERMD A, Y15, A

// HSUMD leaves the sum of Y's 8 int32 lanes in X's low lane (T scratch).
#define HSUMD(Y, X, T) \
	VEXTRACTI128 $1, Y, T; \
	VPADDD T, X, X; \
	VPHADDD X, X, X; \
	VPHADDD X, X, X

// HMAX leaves the largest of Y's 8 lanes in every lane of X (T scratch).
#define HMAX(Y, X, T) \
	VEXTRACTF128 $1, Y, T; \
	VMAXPS T, X, X; \
	VPERMILPS $0x4e, X, T; \
	VMAXPS T, X, X; \
	VPERMILPS $0xb1, X, T; \
	VMAXPS T, X, X

// func quantQ8AVX2(x *float32, nb int, dst *byte, stride int)
// Quantizes nb blocks of 32 floats into q8Rec records stride bytes apart.
TEXT ·quantQ8AVX2(SB), NOSPLIT, $0-32
	MOVQ x+0(FP), SI
	MOVQ nb+8(FP), CX
	MOVQ dst+16(FP), DI
	MOVQ stride+24(FP), R8
	VBROADCASTSS ·qc<>+0(SB), Y14
	VMOVDQU ·qperm<>(SB), Y15
	VBROADCASTSS ·qc<>+4(SB), X13
	VXORPS X12, X12, X12
q8_block:
	VMOVUPS 0(SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VANDPS Y14, Y0, Y4
	VANDPS Y14, Y1, Y5
	VANDPS Y14, Y2, Y6
	VANDPS Y14, Y3, Y7
	VMAXPS Y5, Y4, Y4
	VMAXPS Y7, Y6, Y6
	VMAXPS Y6, Y4, Y4
	HMAX(Y4, X4, X5)
	// d = amax/127; id = 127/amax, or 0 when amax is 0
	VDIVSS X13, X4, X5
	VMOVSS X5, 32(DI)
	VDIVSS X4, X13, X6
	VCMPSS $4, X12, X4, X7
	VANDPS X7, X6, X6
	VBROADCASTSS X6, Y6
	VMULPS Y6, Y0, Y0
	VMULPS Y6, Y1, Y1
	VMULPS Y6, Y2, Y2
	VMULPS Y6, Y3, Y3
	VCVTPS2DQ Y0, Y0
	VCVTPS2DQ Y1, Y1
	VCVTPS2DQ Y2, Y2
	VCVTPS2DQ Y3, Y3
	VPADDD Y1, Y0, Y8
	VPADDD Y3, Y2, Y9
	VPADDD Y9, Y8, Y8
	HSUMD(Y8, X8, X9)
	VMOVD X8, 36(DI)
	PACK32(Y0, Y1, Y2, Y3)
	VMOVDQU Y0, (DI)
	ADDQ $128, SI
	ADDQ R8, DI
	DECQ CX
	JNZ q8_block
	VZEROUPPER
	RET

// func quantQ8KAVX2(x *float32, nb int, dst *byte, stride int)
// Quantizes nb blocks of 256 floats into q8KRec records stride bytes
// apart: the element of largest magnitude maps to −127 (the positive one
// on a tie), levels are clamped to 127, and the sums per 32 and per 16
// follow the levels.
TEXT ·quantQ8KAVX2(SB), NOSPLIT, $0-32
	MOVQ x+0(FP), SI
	MOVQ nb+8(FP), CX
	MOVQ dst+16(FP), DI
	MOVQ stride+24(FP), R8
	VMOVDQU ·qperm<>(SB), Y15
	VPBROADCASTD ·qc<>+16(SB), Y14
	VXORPS X12, X12, X12
q8k_block:
	// largest and smallest element
	VMOVUPS (SI), Y0
	VMOVAPS Y0, Y1
	MOVQ $32, AX
q8k_minmax:
	VMOVUPS (SI)(AX*1), Y2
	VMAXPS Y2, Y0, Y0
	VMINPS Y2, Y1, Y1
	ADDQ $32, AX
	CMPQ AX, $1024
	JLT q8k_minmax
	HMAX(Y0, X0, X2)
	VXORPS Y3, Y3, Y3
	VSUBPS Y1, Y3, Y1 // −min, so its maximum is −(smallest)
	HMAX(Y1, X1, X2)
	// mx = max if max ≥ −min, else min; amax = max(max, −min)
	VMAXSS X1, X0, X4
	VUCOMISS X12, X4
	JEQ q8k_zero
	VCMPSS $5, X1, X0, X5 // max ≥ −min
	VSUBSS X1, X12, X6 // min
	VBLENDVPS X5, X0, X6, X6
	// iscale = −127/mx, d = 1/iscale
	VMOVSS ·qc<>+8(SB), X7
	VDIVSS X6, X7, X7
	VMOVSS ·qc<>+12(SB), X8
	VDIVSS X7, X8, X8
	VMOVSS X8, 256(DI)
	VBROADCASTSS X7, Y7
	XORQ AX, AX
	XORQ BX, BX
q8k_group:
	VMULPS (SI)(AX*4), Y7, Y0
	VMULPS 32(SI)(AX*4), Y7, Y1
	VMULPS 64(SI)(AX*4), Y7, Y2
	VMULPS 96(SI)(AX*4), Y7, Y3
	VCVTPS2DQ Y0, Y0
	VCVTPS2DQ Y1, Y1
	VCVTPS2DQ Y2, Y2
	VCVTPS2DQ Y3, Y3
	VPMINSD Y14, Y0, Y0
	VPMINSD Y14, Y1, Y1
	VPMINSD Y14, Y2, Y2
	VPMINSD Y14, Y3, Y3
	VPADDD Y1, Y0, Y8
	HSUMD(Y8, X8, X9)
	VMOVD X8, 292(DI)(BX*8)
	VPADDD Y3, Y2, Y10
	HSUMD(Y10, X10, X9)
	VMOVD X10, 296(DI)(BX*8)
	VPADDD X10, X8, X8
	VMOVD X8, 260(DI)(BX*4)
	PACK32(Y0, Y1, Y2, Y3)
	VMOVDQU Y0, (DI)(AX*1)
	ADDQ $32, AX
	INCQ BX
	CMPQ BX, $8
	JLT q8k_group
	JMP q8k_next
q8k_zero:
	// an all-zero block: levels, d and sums all zero
	VXORPS Y0, Y0, Y0
	MOVQ $0, AX
q8k_clear:
	VMOVDQU Y0, (DI)(AX*1)
	ADDQ $32, AX
	CMPQ AX, $352
	JLT q8k_clear
	MOVL $0, 352(DI)
q8k_next:
	ADDQ $1024, SI
	ADDQ R8, DI
	DECQ CX
	JNZ q8k_block
	VZEROUPPER
	RET
