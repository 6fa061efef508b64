//go:build amd64 && !purego

package cpu

//go:generate go run ./asmgen -o kernels_amd64.s -go kernels_amd64.go

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// kargs is the argument block of the assembly kernels (field offsets are
// fixed in asmgen).
type kargs struct {
	w          unsafe.Pointer // first tile
	tiles      int
	tileBytes  int
	nb         int // blocks per row
	blockBytes int
	act        unsafe.Pointer // first record of the first column
	stride     int            // bytes between a column's records
	dst        unsafe.Pointer // first output of the first column
	ld4        int            // bytes between output columns
	negOff     [8]int32       // −offset in every lane
	lvOff      int            // legacy: levels within a block (k-quant offsets are constants of each kernel)
}

// kernelPair is the single-column kernel and the widest one of a format
// on one instruction set, by their numbers in kernelIDs.
type kernelPair struct {
	one, many int
	width     int // columns of many
}

// pair looks up two generated kernels by name.
func pair(one, many string, width int) kernelPair {
	a, ok1 := kernelIDs[one]
	b, ok2 := kernelIDs[many]
	if !ok1 || !ok2 {
		panic("cpu: kernel " + one + " or " + many + " was not generated")
	}
	return kernelPair{a, b, width}
}

// kernel tables by instruction set, family and variant (see variantOf)
var (
	avx2Kernels = map[family]map[string]kernelPair{
		famLegacy: {
			"U4":      pair("legacyU4AVX21", "legacyU4AVX24", 4),
			"U4Min":   pair("legacyU4MinAVX21", "legacyU4MinAVX24", 4),
			"U4H1":    pair("legacyU4H1AVX21", "legacyU4H1AVX24", 4),
			"U4H1Min": pair("legacyU4H1MinAVX21", "legacyU4H1MinAVX24", 4),
			"S8":      pair("legacyS8AVX21", "legacyS8AVX24", 4),
		},
		famK: {
			"32U4Min":   pair("k32U4MinAVX21", "k32U4MinAVX22", 2),
			"32U4H1Min": pair("k32U4H1MinAVX21", "k32U4H1MinAVX22", 2),
			"32S8":      pair("k32S8AVX21", "k32S8AVX22", 2),
			"16U4H2":    pair("k16U4H2AVX21", "k16U4H2AVX22", 2),
			"16U4":      pair("k16U4AVX21", "k16U4AVX22", 2),
			"16U4Min":   pair("k16U4MinAVX21", "k16U4MinAVX22", 2),
		},
		famFloat: {
			"F32":  pair("floatF32AVX21", "floatF32AVX24", 4),
			"F16":  pair("floatF16AVX21", "floatF16AVX24", 4),
			"BF16": pair("floatBF16AVX21", "floatBF16AVX24", 4),
		},
	}
	vnniKernels = map[family]map[string]kernelPair{
		famLegacy: {
			"U4":      pair("legacyU4VNNI1", "legacyU4VNNI8", 8),
			"U4Min":   pair("legacyU4MinVNNI1", "legacyU4MinVNNI8", 8),
			"U4H1":    pair("legacyU4H1VNNI1", "legacyU4H1VNNI8", 8),
			"U4H1Min": pair("legacyU4H1MinVNNI1", "legacyU4H1MinVNNI8", 8),
			"U8":      pair("legacyU8VNNI1", "legacyU8VNNI8", 8),
		},
		famK: {
			"32U4Min":   pair("k32U4MinVNNI1", "k32U4MinVNNI4", 4),
			"32U4H1Min": pair("k32U4H1MinVNNI1", "k32U4H1MinVNNI4", 4),
			"32U8":      pair("k32U8VNNI1", "k32U8VNNI4", 4),
			"16U4H2":    pair("k16U4H2VNNI1", "k16U4H2VNNI4", 4),
			"16U4":      pair("k16U4VNNI1", "k16U4VNNI4", 4),
			"16U4Min":   pair("k16U4MinVNNI1", "k16U4MinVNNI4", 4),
		},
		famFloat: {
			"F32":  pair("floatF32VNNI1", "floatF32VNNI8", 8),
			"F16":  pair("floatF16VNNI1", "floatF16VNNI8", 8),
			"BF16": pair("floatBF16VNNI1", "floatBF16VNNI8", 8),
		},
	}
)

// vnniExactKernels are the exact level's kernels on AVX-512 VNNI
// (asmgen's VNNIX: float64 accumulators, exact.go's contract).
var vnniExactKernels = map[family]map[string]kernelPair{
	famLegacy: {
		"U4":      pair("legacyU4VNNIX1", "legacyU4VNNIX8", 8),
		"U4Min":   pair("legacyU4MinVNNIX1", "legacyU4MinVNNIX8", 8),
		"U4H1":    pair("legacyU4H1VNNIX1", "legacyU4H1VNNIX8", 8),
		"U4H1Min": pair("legacyU4H1MinVNNIX1", "legacyU4H1MinVNNIX8", 8),
		"U8":      pair("legacyU8VNNIX1", "legacyU8VNNIX8", 8),
	},
	famK: {
		"32U4Min":   pair("k32U4MinVNNIX1", "k32U4MinVNNIX4", 4),
		"32U4H1Min": pair("k32U4H1MinVNNIX1", "k32U4H1MinVNNIX4", 4),
		"32U8":      pair("k32U8VNNIX1", "k32U8VNNIX4", 4),
		"16U4H2":    pair("k16U4H2VNNIX1", "k16U4H2VNNIX4", 4),
		"16U4":      pair("k16U4VNNIX1", "k16U4VNNIX4", 4),
		"16U4Min":   pair("k16U4MinVNNIX1", "k16U4MinVNNIX4", 4),
	},
	famFloat: {
		"F32":  pair("floatF32VNNIX1", "floatF32VNNIX8", 8),
		"F16":  pair("floatF16VNNIX1", "floatF16VNNIX8", 8),
		"BF16": pair("floatBF16VNNIX1", "floatBF16VNNIX8", 8),
	},
}

// hasAVX2 reports the AVX2 level (and with it FMA and F16C).
var hasAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasF16C

func init() {
	x := cpu.X86
	if !hasAVX2 {
		return
	}
	avx2 := &isa{name: "avx2", group: 4, signed8: true}
	avx2.setVector()
	avx2.gemm = func(p *packed, w []byte, tiles int, act []byte, stride, cols int, dst []float32, ld int) {
		gemmAsm(avx2Kernels, gemmGo, p, w, tiles, act, stride, cols, dst, ld)
	}
	isas = append([]*isa{avx2}, isas...)
	if x.HasAVX512F && x.HasAVX512VL && x.HasAVX512BW && x.HasAVX512VNNI {
		vnni := &isa{name: "avx512vnni", group: 8}
		vnni.setVector()
		vnni.gemm = func(p *packed, w []byte, tiles int, act []byte, stride, cols int, dst []float32, ld int) {
			gemmAsm(vnniKernels, gemmGo, p, w, tiles, act, stride, cols, dst, ld)
		}
		isas = append([]*isa{vnni}, isas...)
		// The exact level's products on VNNI, its other kernels as the
		// portable exact level's; that one stays, as "exact-go".
		x := *exactLevel
		x.group = 8
		x.gemm = func(p *packed, w []byte, tiles int, act []byte, stride, cols int, dst []float32, ld int) {
			gemmAsm(vnniExactKernels, gemmAcc[float64, float32], p, w, tiles, act, stride, cols, dst, ld)
		}
		exactLevel.name = "exact-go"
		isas = append(isas, &x)
	}
}

// setVector fills in the kernels every amd64 level shares.
func (k *isa) setVector() {
	k.convert, k.dot = convertSIMD, dotGo
	k.scores, k.expSub, k.wsum, k.siluMul, k.geluMul = scoresSIMD, expSubSIMD, wsumSIMD, siluMulSIMD, geluMulSIMD
	k.scores16, k.wsum16 = scores16SIMD, wsum16SIMD
}

// gemmAsm runs the assembly kernels of the packed matrix's format (the
// portable ones, fallback, for formats without them). The slices are
// checked against the extents the kernels touch.
func gemmAsm(kernels map[family]map[string]kernelPair, fallback func(p *packed, w []byte, tiles int, act []byte, stride, cols int, dst []float32, ld int),
	p *packed, w []byte, tiles int, act []byte, stride, cols int, dst []float32, ld int) {
	k, ok := kernels[p.f.family][p.variant]
	if !ok {
		fallback(p, w, tiles, act, stride, cols, dst, ld)
		return
	}
	rec := layoutFor(p.f, p.cols, 1).rec
	if len(w) < tiles*p.tileBytes || len(act) < (p.nb-1)*stride+cols*rec || len(dst) < (cols-1)*ld+tiles*tileRows {
		panic("cpu: gemm operands smaller than their shapes")
	}
	a := kargs{w: unsafe.Pointer(&w[0]), tiles: tiles, tileBytes: p.tileBytes, nb: p.nb, blockBytes: p.blockBytes,
		stride: stride, ld4: 4 * ld, lvOff: p.levelsOff()}
	for i := range a.negOff {
		a.negOff[i] = -p.offset()
	}
	c := 0
	for ; cols-c >= k.width; c += k.width {
		a.act, a.dst = unsafe.Pointer(&act[c*rec]), unsafe.Pointer(&dst[c*ld])
		callKernel(k.many, &a)
	}
	for ; c < cols; c++ {
		a.act, a.dst = unsafe.Pointer(&act[c*rec]), unsafe.Pointer(&dst[c*ld])
		callKernel(k.one, &a)
	}
}
