package cpu

// mulTiles computes output rows [tileRows·t0, tileRows·t1) of W·Aᵀ for
// the n activation rows in act (laid out by lay): dst[c·ld + j] for row j
// of the weight and activation row c. The tile past the matrix's last row
// is computed into scratch (tileRows·lay.group floats) and only its real
// rows copied, so dst needs no padding.
func (p *packed) mulTiles(k *isa, act []byte, lay actLayout, n int, dst []float32, ld, t0, t1 int, scratch []float32) {
	full := t1
	if t1 == p.tiles && p.rows%tileRows != 0 {
		full = t1 - 1
	}
	st := lay.stride()
	for g0 := 0; g0 < n; g0 += lay.group {
		cols := min(lay.group, n-g0)
		a := act[lay.rowOff(g0):]
		if full > t0 {
			k.gemm(p, p.data[t0*p.tileBytes:full*p.tileBytes], full-t0, a, st, cols, dst[g0*ld+t0*tileRows:], ld)
		}
		if full < t1 {
			k.gemm(p, p.data[full*p.tileBytes:t1*p.tileBytes], 1, a, st, cols, scratch, tileRows)
			rows := p.rows - full*tileRows
			for c := range cols {
				copy(dst[(g0+c)*ld+full*tileRows:(g0+c)*ld+p.rows], scratch[c*tileRows:c*tileRows+rows])
			}
		}
	}
}
