package cpu

import (
	"fmt"
	"strings"
)

// isa is the set of kernels for one instruction-set level. The best level
// the CPU supports is chosen once, at start-up; tests run every level the
// machine has against the portable one.
type isa struct {
	name string
	// group is how many activation rows gemm multiplies a tile by at once.
	group int
	// signed8 stores offset-128 u8 levels as signed bytes (see packed).
	signed8 bool
	// exact: the norm, rope and attention steps keep the exact level's
	// contract too (exact.go).
	exact bool
	// gemm multiplies tiles of a packed weight by up to group activation
	// rows (see gemmGo for the contract).
	gemm func(p *packed, w []byte, tiles int, act []byte, stride, cols int, dst []float32, ld int)
	// quantize converts one float32 row into its activation records.
	convert func(l actLayout, x []float32, dst []byte, c int)
	// dot returns Σ a[i]·b[i].
	dot func(a, b []float32) float32
	// attention and activation kernels (see vec.go)
	scores  func(q, k []float32, kstride int, out []float32, scale float32)
	expSub  func(x []float32, m float32) float32
	wsum    func(p, v []float32, vstride int, out []float32)
	siluMul func(a, b, out []float32)
	geluMul func(a, b, out []float32)
	// scores and wsum over a cache of IEEE half floats
	scores16 func(q []float32, k []uint16, kstride int, out []float32, scale float32)
	wsum16   func(p []float32, v []uint16, vstride int, out []float32)
}

var portable = &isa{
	name:    "go",
	group:   4,
	gemm:    gemmGo,
	convert: actLayout.convertRow,
	dot:     dotGo,
	scores:  scoresGo,
	expSub:  expSubGo,
	wsum:    wsumGo,
	siluMul: siluMulGo,
	geluMul: geluMulGo,

	scores16: scores16Go,
	wsum16:   wsum16Go,
}

// isas lists the levels this machine can run, best first; the portable
// one and the exact one (the reference for other backends) are always
// last.
var isas = []*isa{portable, exactLevel}

// best is the level compiled plans use.
func best() *isa { return isas[0] }

// levelNamed finds a level this machine runs by name.
func levelNamed(name string) (*isa, error) {
	var have []string
	for _, k := range isas {
		if k.name == name {
			return k, nil
		}
		have = append(have, k.name)
	}
	return nil, fmt.Errorf("cpu: WEFT_CPU_KERNELS=%q names no kernel level this machine runs (it has %s)", name, strings.Join(have, ", "))
}

// dotGo returns the dot product of a and b (equal lengths). Four partial
// sums keep the dependency chains short.
func dotGo(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func axpyGo(s float32, x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += s * v
	}
}
