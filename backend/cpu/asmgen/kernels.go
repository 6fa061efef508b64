package main

import "fmt"

// legacy emits a kernel for the 32-element block types: per block and
// column, T = Σ levels·a − offset·Σa, acc += float(T)·(dw·da) and for
// the affine types acc += float(Σa)·(m·da).
func (g *gen) legacy(v variant, is isa, cols int) {
	name := fmt.Sprintf("legacy%s%s%d", v.name, is.name, cols)
	g.text(name)
	g.prologue()
	r := regs{}
	w, w2, dw, mask := r.get(), r.get(), r.get(), r.get()
	var nego, s0, a, a2, wabs, tmp string
	hi := make([]string, v.hbits)
	for j := range hi {
		hi[j] = r.get()
	}
	if is.vnni {
		nego, s0 = r.get(), r.get()
		if v.hbits > 0 {
			tmp = r.get()
		}
		r.next = 16
	} else {
		// the dot products' temporary is free while levels are unpacked
		a, a2 = r.get(), r.get()
		s0, tmp = a, a2
		if v.signed {
			wabs = r.get()
		}
	}
	acc := make([]string, cols)
	ts := make([]string, cols)
	for c := range cols {
		acc[c] = r.get()
		if is.exact {
			acc[c] = zmm(acc[c])
		}
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
	g.levels(v, is, 0, -1, w, w2, mask, hi, tmp, func(wr string, actOff int) {
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
		g.termFMA(is, fmt.Sprintf("%d(SI)", c*q8Rec+32), dw, s0, ts[c], acc[c], false)
	}
	if v.hasMin {
		g.op("VCVTPH2PS %d(BX), %s", 2*8, dw)
		for c := range cols {
			g.op("VPBROADCASTD %d(SI), %s", c*q8Rec+36, ts[c])
			g.termFMA(is, fmt.Sprintf("%d(SI)", c*q8Rec+32), dw, s0, ts[c], acc[c], false)
		}
	}
	g.op("ADDQ R12, BX")
	g.op("ADDQ R10, SI")
	g.op("DECQ R8")
	g.op("JNZ %s_block", name)
	g.epilogue(acc, name+"_tile")
}

// termFMA emits acc ±= T · (scale · bcast(da at mem)) for the 8 rows' int32
// sums T: in float32, or on the exact level as float64(T) times
// float64(fl32(scale · da)), an exact product, added to a zmm of float64
// accumulators. T's register is overwritten.
func (g *gen) termFMA(is isa, daMem, scale, s, t, acc string, neg bool) {
	if !is.exact {
		g.op("VCVTDQ2PS %s, %s", t, t)
		g.scaleFMA(is, daMem, scale, s, t, acc, neg)
		return
	}
	g.op("VMULPS.BCST %s, %s, %s", daMem, scale, s)
	g.op("VCVTPS2PD %s, %s", s, zmm(s))
	g.op("VCVTDQ2PD %s, %s", t, zmm(t))
	if neg {
		g.op("VFNMADD231PD %s, %s, %s", zmm(s), zmm(t), acc)
	} else {
		g.op("VFMADD231PD %s, %s, %s", zmm(s), zmm(t), acc)
	}
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
		gb = 128 + 32*v.hbits
	}
	sumOff := q8KSum16
	if v.sub == 32 {
		sumOff = q8KSum32
	}
	r := regs{}
	w, w2, mask, sc, dw := r.get(), r.get(), r.get(), r.get(), r.get()
	var nego, a, a2, wabs, mn, s0, tmp string
	hi := make([]string, v.hbits)
	for j := range hi {
		hi[j] = r.get()
	}
	if is.vnni {
		nego, mn, s0 = r.get(), r.get(), r.get()
		if v.hbits > 0 {
			tmp = r.get()
		}
		r.next = 16
	} else {
		// AVX2 has half the registers: the mins share the scales' register,
		// the scale product the broadcast temporary, and the high bits the
		// dot products' temporary (free while levels are unpacked).
		a, a2 = r.get(), r.get()
		mn, s0, tmp = sc, a, a2
		if v.signed {
			wabs = r.get()
		}
	}
	acc, isum, msum, ts := make([]string, cols), make([]string, cols), make([]string, cols), make([]string, cols)
	for c := range cols {
		acc[c], isum[c], ts[c] = r.get(), r.get(), r.get()
		if is.exact {
			acc[c] = zmm(acc[c])
		}
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
		g.levels(v, is, group*gb, half, w, w2, mask, hi, tmp, func(wr string, actOff int) {
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
		g.termFMA(is, fmt.Sprintf("%d(SI)", c*q8KRec+q8KD), dw, s0, isum[c], acc[c], false)
	}
	if v.hasMin {
		g.op("VCVTPH2PS 16(BX), %s", dw)
		for c := range cols {
			g.termFMA(is, fmt.Sprintf("%d(SI)", c*q8KRec+q8KD), dw, s0, msum[c], acc[c], true)
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
	if cols == 1 && !is.exact {
		// The exact level adds in element order, as the portable float64
		// kernel does: float64 sums that cancel round by their order.
		chains = 4
	}
	acc := make([][]string, chains)
	for i := range acc {
		acc[i] = make([]string, cols)
		for c := range cols {
			acc[i][c] = r.get()
			if is.exact {
				acc[i][c] = zmm(acc[i][c])
			}
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
		if is.exact {
			g.op("VCVTPS2PD %s, %s", w, zmm(w))
		}
	}
	fma := func(mem, acc string) {
		if is.exact {
			// the product of two float32s, exact in float64
			g.op("VBROADCASTSS %s, %s", mem, a)
			g.op("VCVTPS2PD %s, %s", a, zmm(a))
			g.op("VFMADD231PD %s, %s, %s", zmm(a), zmm(w), acc)
			return
		}
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
		add := "VADDPS"
		if is.exact {
			add = "VADDPD"
		}
		g.op("%s %s, %s, %s", add, acc[1][0], acc[0][0], acc[0][0])
		g.op("%s %s, %s, %s", add, acc[3][0], acc[2][0], acc[2][0])
		g.op("%s %s, %s, %s", add, acc[2][0], acc[0][0], acc[0][0])
	}
	g.epilogue(acc[0], name+"_tile")
}
