//go:build amd64 && !purego

package cpu

//go:noescape
func expSubAVX2(x *float32, n int, m float32) float32

//go:noescape
func siluMulAVX2(a, b, out *float32, n int)

//go:noescape
func geluMulAVX2(a, b, out *float32, n int)

//go:noescape
func scoresAVX2(q, k *float32, hd, kstride, n int, out *float32, scale float32)

//go:noescape
func wsumAVX2(p *float32, n int, v *float32, vstride, hd int, out *float32)

//go:noescape
func scores16AVX2(q *float32, k *uint16, hd, kstride, n int, out *float32, scale float32)

//go:noescape
func wsum16AVX2(p *float32, n int, v *uint16, vstride, hd int, out *float32)

//go:noescape
func quantQ8AVX2(x *float32, nb int, dst *byte, stride int)

//go:noescape
func quantQ8KAVX2(x *float32, nb int, dst *byte, stride int)

//go:noescape
func streamXorAVX2(p *byte, n int) uint64

// streamRead reads x once (the bandwidth benchmark's loop).
func streamRead(x []byte) uint64 {
	n := len(x) &^ 255
	if n == 0 || !hasAVX2 {
		return streamReadGo(x)
	}
	return streamXorAVX2(&x[0], n)
}

// convertSIMD is actLayout.convertRow with the quantizers in assembly.
func convertSIMD(l actLayout, x []float32, dst []byte, c int) {
	off, st := l.rowOff(c), l.stride()
	if l.rec == f32Rec || l.nb == 0 || len(x) < l.nb*l.elems || len(dst) < off+(l.nb-1)*st+l.rec {
		l.convertRow(x, dst, c)
		return
	}
	if l.rec == q8Rec {
		quantQ8AVX2(&x[0], l.nb, &dst[off], st)
	} else {
		quantQ8KAVX2(&x[0], l.nb, &dst[off], st)
	}
}

// The wrappers check the extents the kernels touch and do the tails (or
// the shapes the kernels do not take) in Go.

func scoresSIMD(q, k []float32, kstride int, out []float32, scale float32) {
	hd, n := len(q), len(out)
	if n == 0 {
		return
	}
	if hd%16 != 0 || len(k) < (n-1)*kstride+hd {
		scoresGo(q, k, kstride, out, scale)
		return
	}
	scoresAVX2(&q[0], &k[0], hd, 4*kstride, n, &out[0], scale)
}

func scores16SIMD(q []float32, k []uint16, kstride int, out []float32, scale float32) {
	hd, n := len(q), len(out)
	if n == 0 {
		return
	}
	if hd%16 != 0 || len(k) < (n-1)*kstride+hd {
		scores16Go(q, k, kstride, out, scale)
		return
	}
	scores16AVX2(&q[0], &k[0], hd, 2*kstride, n, &out[0], scale)
}

func wsum16SIMD(p []float32, v []uint16, vstride int, out []float32) {
	hd, n := len(out), len(p)
	if n == 0 || hd%8 != 0 || len(v) < (n-1)*vstride+hd {
		wsum16Go(p, v, vstride, out)
		return
	}
	wsum16AVX2(&p[0], n, &v[0], 2*vstride, hd, &out[0])
}

func expSubSIMD(x []float32, m float32) float32 {
	n := len(x) &^ 7
	var sum float32
	if n > 0 {
		sum = expSubAVX2(&x[0], n, m)
	}
	return sum + expSubGo(x[n:], m)
}

func wsumSIMD(p, v []float32, vstride int, out []float32) {
	hd, n := len(out), len(p)
	if n == 0 || hd%8 != 0 || len(v) < (n-1)*vstride+hd {
		wsumGo(p, v, vstride, out)
		return
	}
	wsumAVX2(&p[0], n, &v[0], 4*vstride, hd, &out[0])
}

func siluMulSIMD(a, b, out []float32) {
	n := len(a) &^ 7
	if len(b) < len(a) || len(out) < len(a) {
		panic("cpu: siluMul operands of unequal lengths")
	}
	if n > 0 {
		siluMulAVX2(&a[0], &b[0], &out[0], n)
	}
	siluMulGo(a[n:], b[n:], out[n:])
}

func geluMulSIMD(a, b, out []float32) {
	n := len(a) &^ 7
	if len(b) < len(a) || len(out) < len(a) {
		panic("cpu: geluMul operands of unequal lengths")
	}
	if n > 0 {
		geluMulAVX2(&a[0], &b[0], &out[0], n)
	}
	geluMulGo(a[n:], b[n:], out[n:])
}
