package cuda

import (
	"slices"
	"strings"
	"testing"
)

// TestOneRowTwin checks the one-row twins' rows per block and grids on an
// H100-sized device: half a warp a row where that still makes two blocks
// a multiprocessor, as many rows per block as before where it does not;
// quantized weights keep rowsPerBlock's rows, up to oneRowQuantGrid
// blocks a multiprocessor, whatever the launch's size; K-quants and float
// launches of long rows over oneRowMaxBytes have no twins.
func TestOneRowTwin(t *testing.T) {
	opt := planOptions{sms: 132}
	rowBytes := map[string]func(k int) int{"f32": func(k int) int { return 4 * k }, "f16": func(k int) int { return 2 * k },
		"bf16": func(k int) int { return 2 * k }, "q8_0": func(k int) int { return k }, "q4_0": func(k int) int { return k / 2 },
		"q4_k": func(k int) int { return k / 2 }, "q6_k": func(k int) int { return k * 3 / 4 }}
	mv := func(typ string, k, n, rpb int) call {
		return call{kernel: "matvec_" + typ, cond: small, args: []arg{null, null, null, null, null, i64(rowBytes[typ](k)), i64(0), null,
			null, i32(0), i32(k), i32(n), i32(rpb)}}
	}
	// out, gout, uout, qo, dso, x, ds, wg, wu, rowBytes, dOffG, dOffU, meta, which, K, N, act
	glu := func(typ string, k, n int) call {
		return call{kernel: "matvec_glu_" + typ, cond: small, args: []arg{null, null, null, null, null, null, null, null, null,
			i64(rowBytes[typ](k)), i64(0), i64(0), null, i32(0), i32(k), i32(n), i32(0)}}
	}
	// x, ds, rowBytes, meta, which, K, rpb, then out, w, dOff, bias, N of
	// each of three weights.
	mv3 := func(typ string, k, n0, n1, n2 int) call {
		return call{kernel: "matvec3_" + typ, cond: always, args: []arg{null, null, i64(rowBytes[typ](k)), null, i32(0), i32(k), i32(4),
			null, null, i64(0), null, i32(n0), null, null, i64(0), null, i32(n1), null, null, i64(0), null, i32(n2)}}
	}
	for _, tc := range []struct {
		c         call
		kernel    string
		rpb, grid int
	}{
		{mv("bf16", 2048, 4096, 4), "matvec1_bf16", 8, 512},
		{mv("f16", 14336, 512, 4), "matvec1_f16", 1, 512}, // 14 MiB
		{mv("bf16", 2048, 128256, 4), "matvec1_bf16", 8, 528},
		{mv("f32", 2048, 512, 1), "matvec1_f32", 1, 512},
		{mv("q4_0", 4096, 4096, 4), "matvec1_q4_0", 4, 1024},
		{mv("q4_0", 2048, 2048, 4), "matvec1_q4_0", 4, 512},
		{mv("q8_0", 2048, 128256, 8), "matvec1_q8_0", 4, 1056},
		{mv("q4_0", 14336, 4096, 4), "matvec1_q4_0", 4, 1024}, // the 8B down product, 28 MiB
		{mv3("bf16", 2048, 4096, 1024, 1024), "matvec13_bf16", 8, 528},
		{mv3("q4_0", 4096, 2048, 512, 512), "matvec13_q4_0", 4, 768}, // 6 MiB
		{mv3("q4_0", 2048, 2048, 512, 512), "matvec13_q4_0", 4, 768}, // the 1B q, k and v: rowsPerBlock's 8 for short rows, but 4 fit
		{mv3("q8_0", 2048, 256, 64, 64), "matvec13_q8_0", 1, 384},    // few rows keep rowsPerBlock's
		// The 8B q, k and v (24 MiB): 1,536 groups of 4 rows overflow the
		// grid's 1,056 blocks, 768 groups of 8 fit one round.
		{mv3("q8_0", 4096, 4096, 1024, 1024), "matvec13_q8_0", 8, 768},
		{mv3("q4_0", 4096, 4096, 1024, 1024), "matvec13_q4_0", 8, 768},
		{mv3("q4_0", 8192, 8192, 1024, 1024), "matvec13_q4_0", 8, 1056}, // 1,280 groups of 8 still overflow: 8 at most
		{mv3("q4_k", 4096, 4096, 1024, 1024), "matvec13_q4_k", 4, 1056}, // the K-quants keep rowsPerBlock
		{glu("f16", 2048, 8192), "matvec1_glu_f16", -1, 0},
		{glu("q8_0", 4096, 1536), "matvec1_glu_q8_0", -1, 0},   // 12 MiB of gate and up rows
		{glu("q8_0", 8192, 512), "matvec1_glu_q8_0", -1, 0},    // 8 MiB: N rows, not K
		{glu("q8_0", 4096, 14336), "matvec1w_glu_q8_0", -1, 0}, // the 8B GLU, 112 MiB: the wide kernel
		{mv("q4_k", 2048, 2048, 4), "matvec1_q4_k", 4, 512},
		{mv("q6_k", 2048, 128256, 8), "matvec1_q6_k", 8, 1056}, // a tied Q6_K output matrix
		{mv("q4_k", 14336, 4096, 4), "matvec1_q4_k", 4, 1024},
	} {
		got, ok := oneRowTwin(tc.c, opt)
		if !ok || got.kernel != tc.kernel || got.cond != one {
			t.Errorf("%s: twin %v %q (%v)", tc.c.kernel, ok, got.kernel, got.cond)
			continue
		}
		rpbAt := map[string]int{"matvec1_": 12, "matvec13": 6}[got.kernel[:8]]
		if tc.rpb > 0 && (got.args[rpbAt] != i32(tc.rpb) || got.gridX != uint32(tc.grid)) {
			t.Errorf("%s: rows per block %+v, grid %d; want %d, %d", got.kernel, got.args[rpbAt], got.gridX, tc.rpb, tc.grid)
		}
		if tc.c.args != nil && &got.args[0] == &tc.c.args[0] {
			t.Errorf("%s: the twin shares its arguments", got.kernel)
		}
	}
	for _, c := range []call{
		mv("bf16", 4096, 4096, 4),           // 32 MiB of rows longer than oneRowAnyCols
		glu("f16", 4096, 2560),              // 40 MiB: gate and up both count
		glu("bf16", 4096, 14336),            // the 8B GLU, 224 MiB (wide if it had a twin)
		mv3("bf16", 4096, 4096, 1024, 1024), // the 8B q, k and v, 48 MiB
		{kernel: "matvec_q4_k", cond: large}, {kernel: "matvec_glu_q4_k", cond: large},
		{kernel: "matvec_bf16", cond: large}, {kernel: "rmsnorm_q8", cond: small},
		{kernel: "mmq_q4_0", cond: large},
	} {
		if _, ok := oneRowTwin(c, opt); ok {
			t.Errorf("%s (%v) has a one-row twin", c.kernel, c.cond)
		}
	}
}

// TestOneRowMax checks that WEFT_CUDA_ONEROW_MAX's limit replaces
// oneRowMaxBytes.
func TestOneRowMax(t *testing.T) {
	c := call{kernel: "matvec_bf16", cond: small, args: []arg{null, null, null, null, null, i64(8192), i64(0), null,
		null, i32(0), i32(4096), i32(4096), i32(4)}} // 32 MiB
	for _, tc := range []struct {
		limit int
		twin  bool
	}{{0, false}, {32 << 20, true}, {64 << 20, true}, {16 << 20, false}} {
		if _, ok := oneRowTwin(c, planOptions{sms: 132, oneRowMax: tc.limit}); ok != tc.twin {
			t.Errorf("limit %d: twin %v, want %v", tc.limit, ok, tc.twin)
		}
	}
}

// TestBreakChains checks that only a GLU launch that also runs batches of
// one row (no one-row twin) launches without programmatic dependent
// launch.
func TestBreakChains(t *testing.T) {
	for _, noOneRow := range []bool{false, true} {
		pl, err := plan(layerProgram(t, "Q4_0", nil), planOptions{sms: 4, noOneRow: noOneRow})
		if err != nil {
			t.Fatal(err)
		}
		var serial []string
		for _, c := range pl.calls {
			if c.serial {
				serial = append(serial, c.kernel)
			}
		}
		want := []string(nil) // the GLU has a twin: nothing breaks the chain
		if noOneRow {
			want = []string{"matvec_glu_q4_0"}
		}
		if !slices.Equal(serial, want) {
			t.Errorf("noOneRow %v: serial launches %v, want %v", noOneRow, serial, want)
		}
	}
	pl, err := plan(layerProgram(t, "Q4_0", nil), planOptions{sms: 4, noOneRow: true, noBreak: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range pl.calls {
		if c.serial {
			t.Errorf("noBreak: %s is serial", c.kernel)
		}
	}
}

// TestEnvSettings checks that the comparison settings reach the plan:
// WEFT_CUDA_GLU=0, WEFT_CUDA_BREAK=0 and WEFT_CUDA_TWIN_GRID through envPlanOptions,
// WEFT_CUDA_SERIAL and WEFT_CUDA_OMIT through the calls' prefixes.
func TestEnvSettings(t *testing.T) {
	t.Setenv("WEFT_CUDA_GLU", "0")
	t.Setenv("WEFT_CUDA_BREAK", "0")
	t.Setenv("WEFT_CUDA_ONEROW", "0")
	t.Setenv("WEFT_CUDA_TWIN_GRID", "8")
	opt := envPlanOptions()
	if !opt.noGLU || !opt.noBreak || !opt.noOneRow || opt.twinGrid != 8 {
		t.Fatalf("options %+v", opt)
	}
	opt.sms = 4
	pl, err := plan(layerProgram(t, "Q4_0", nil), opt)
	if err != nil {
		t.Fatal(err)
	}
	if got := kernelsOf(pl, false); slices.Contains(got, "matvec_glu_q4_0") || !slices.Contains(got, "glu_q8") {
		t.Errorf("WEFT_CUDA_GLU=0 runs %v", got)
	}
	serialCalls(pl.calls, "glu_q8,,rmsnorm")
	n := len(pl.calls)
	for _, c := range pl.calls {
		if want := c.kernel == "glu_q8" || strings.HasPrefix(c.kernel, "rmsnorm"); c.serial != want {
			t.Errorf("%s: serial %v", c.kernel, c.serial)
		}
	}
	norms := 0
	for _, c := range pl.calls {
		if strings.HasPrefix(c.kernel, "rmsnorm") {
			norms++
		}
	}
	pl.calls = omitCalls(pl.calls, "rmsnorm,")
	if norms == 0 || len(pl.calls) != n-norms || slices.ContainsFunc(pl.calls, func(c call) bool { return strings.HasPrefix(c.kernel, "rmsnorm") }) {
		t.Errorf("omitting rmsnorm left %d of %d calls (%d norms)", len(pl.calls), n, norms)
	}
	if pl.calls = omitCalls(pl.calls, ""); len(pl.calls) != n-norms {
		t.Errorf("an empty WEFT_CUDA_OMIT dropped calls")
	}
}

// TestGLUTwin checks the one-row GLU launches: matvec_glu's geometry
// where its blocks are all resident, else the wide kernel with the most
// warps (up to 8) with which every block is resident at 32 warps a
// multiprocessor, or the forced count rounded down to a power of two.
func TestGLUTwin(t *testing.T) {
	for _, tc := range []struct {
		groups, sms, force, want int
		wide                     bool
	}{
		{448, 132, 0, 8, true},  // the 8B shape's GLU
		{256, 132, 0, 0, false}, // the 1B shape's
		{264, 132, 0, 0, false}, // two blocks of 8 warps on each
		{265, 132, 0, 8, true},  //
		{896, 132, 0, 4, true},  // 28,672 rows
		{5000, 132, 0, 1, true}, // more groups than one wave holds at any size
		{10, 4, 0, 8, true},     //
		{448, 132, 4, 4, true},  // WEFT_CUDA_GLU1_WARPS=4
		{256, 132, 2, 2, true},  //
		{448, 132, 12, 8, true}, //
		{448, 132, 64, 8, true}, // never more than GLU1_WARPS
	} {
		w, wide := gluTwin(tc.groups, planOptions{sms: tc.sms, glu1Warps: tc.force})
		if w != tc.want || wide != tc.wide {
			t.Errorf("%d groups on %d multiprocessors (forced %d): %d warps, wide %v; want %d, %v", tc.groups, tc.sms, tc.force, w, wide, tc.want, tc.wide)
		}
	}
	// The twins of the 8B and 1B shapes' Q8_0 GLU (out, gout, uout, qo,
	// dso, x, ds, wg, wu, rowBytes, dOffG, dOffU, meta, which, K, N, act).
	for _, tc := range []struct {
		n      int
		kernel string
		block  uint32
	}{{14336, "matvec1w_glu_q8_0", 256}, {8192, "matvec1_glu_q8_0", 128}} {
		c := call{kernel: "matvec_glu_q8_0", cond: small, block: 128, args: []arg{null, null, null, null, null, null, null, null, null,
			i64(4096), i64(0), i64(0), null, i32(0), i32(4096), i32(tc.n), i32(0)}}
		if tw, ok := oneRowTwin(c, planOptions{sms: 132}); !ok || tw.kernel != tc.kernel || tw.block != tc.block || c.block != 128 {
			t.Errorf("N %d: twin %v %s of %d threads (the launch's %d), want %s of %d", tc.n, ok, tw.kernel, tw.block, c.block, tc.kernel, tc.block)
		}
	}
}

// TestTwinRPB checks that WEFT_CUDA_TWIN_RPB's rows a block replace
// rowsPerBlock's for the quantized twins only, and only where the kernel
// takes them, and that WEFT_CUDA_TWIN13_RPB's replace them for the
// grouped twins alone.
func TestTwinRPB(t *testing.T) {
	mv3 := call{kernel: "matvec3_q8_0", cond: always, args: []arg{null, null, i64(4096), null, i32(0), i32(4096), i32(4),
		null, null, i64(0), null, i32(4096), null, null, i64(0), null, i32(1024), null, null, i64(0), null, i32(1024)}}
	// 6,144 rows: rowsPerBlock's 4 overflow the grid, so 8 unless forced
	// (oneRoundRPB).
	for _, tc := range []struct{ all, grouped, want int }{{0, 0, 8}, {0, 2, 2}, {0, 4, 4}, {8, 0, 8}, {8, 2, 2}, {0, 5, 4}, {4, 0, 4}} {
		got, ok := oneRowTwin(mv3, planOptions{sms: 132, twinRPB: tc.all, twin13RPB: tc.grouped})
		if !ok || got.args[6] != i32(tc.want) {
			t.Errorf("matvec3_q8_0, WEFT_CUDA_TWIN_RPB=%d, WEFT_CUDA_TWIN13_RPB=%d: twin %v, rows a block %+v, want %d", tc.all, tc.grouped, ok, got.args[6], tc.want)
		}
	}
	if got, _ := oneRowTwin(call{kernel: "matvec_q8_0", cond: small, args: []arg{null, null, null, null, null, i64(4096), i64(0), null,
		null, i32(0), i32(4096), i32(4096), i32(4)}}, planOptions{sms: 132, twin13RPB: 2}); got.args[12] != i32(4) {
		t.Errorf("WEFT_CUDA_TWIN13_RPB=2 set matvec1's rows a block: %+v", got.args[12])
	}
	mv := func(typ string, rowBytes int) call {
		return call{kernel: "matvec_" + typ, cond: small, args: []arg{null, null, null, null, null, i64(rowBytes), i64(0), null,
			null, i32(0), i32(4096), i32(4096), i32(4)}}
	}
	for _, tc := range []struct {
		c         call
		rpb, want int
	}{
		{mv("q8_0", 4096), 0, 4}, {mv("q8_0", 4096), 2, 2}, {mv("q4_0", 2048), 8, 8}, {mv("q4_0", 2048), 1, 1},
		{mv("q8_0", 4096), 3, 4}, {mv("bf16", 8192), 2, 8},
	} {
		got, ok := oneRowTwin(tc.c, planOptions{sms: 132, twinRPB: tc.rpb, oneRowMax: 64 << 20})
		if !ok || got.args[12] != i32(tc.want) {
			t.Errorf("%s, WEFT_CUDA_TWIN_RPB=%d: twin %v, rows a block %+v, want %d", tc.c.kernel, tc.rpb, ok, got.args[12], tc.want)
		}
	}
	// Long rows (256 chunks or more: K = 8192 for Q4_K and Q4_0, 4096 for
	// Q8_0) of quantized types take 2 rows a block where those blocks fit
	// the grid (2,048 rows: 1,024 blocks of the 1,056; 4,096 rows do not);
	// WEFT_CUDA_LONG_RPB forces 1, 2 or 4 (-1: rowsPerBlock), and
	// WEFT_CUDA_TWIN_RPB takes precedence.
	long := func(typ string, k, n int) call {
		return call{kernel: "matvec_" + typ, cond: small, args: []arg{null, null, null, null, null, i64(k), i64(0), null,
			null, i32(0), i32(k), i32(n), i32(4)}}
	}
	for _, tc := range []struct {
		c              call
		rpb, all, want int
	}{
		{long("q4_k", 8192, 2048), 0, 0, 2}, {long("q4_0", 8192, 2048), 0, 0, 2}, {long("q8_0", 4096, 2048), 0, 0, 2},
		{long("q8_0", 14336, 4096), 0, 0, 4}, {long("q4_0", 14336, 4096), 2, 0, 2}, {long("q4_k", 8192, 2048), -1, 0, 4},
		{long("q4_k", 8192, 2048), 1, 0, 1}, {long("q4_k", 4096, 2048), 0, 0, 4}, {long("q8_0", 2048, 2048), 2, 0, 4},
		{long("bf16", 8192, 2048), 2, 0, 4}, {long("q4_k", 8192, 2048), 3, 0, 4}, {long("q4_0", 8192, 2048), 0, 4, 4},
		{long("q4_0", 8192, 2048), 2, 1, 1},
	} {
		got, ok := oneRowTwin(tc.c, planOptions{sms: 132, longRPB: tc.rpb, twinRPB: tc.all, oneRowMax: 64 << 20})
		if !ok || got.args[12] != i32(tc.want) {
			t.Errorf("%s, %d rows of %d, WEFT_CUDA_LONG_RPB=%d, WEFT_CUDA_TWIN_RPB=%d: twin %v, rows a block %+v, want %d",
				tc.c.kernel, tc.c.args[11].v, tc.c.args[10].v, tc.rpb, tc.all, ok, got.args[12], tc.want)
		}
	}
}
