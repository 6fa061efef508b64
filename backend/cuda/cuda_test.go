package cuda

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/weftlm/weft/backend"
)

// These tests need no GPU: the embedded source, the cache key, target
// choice, library search, the plan's checks, and the errors New and
// Devices give where the driver is missing.

func TestKernelSourceDefinesEveryKernel(t *testing.T) {
	if len(kernelSource) == 0 {
		t.Fatal("kernels.cu is not embedded")
	}
	for _, name := range kernelNames() {
		// ") name(" follows __launch_bounds__(...).
		defs := []string{"void " + name + "(", ") " + name + "(", "EMBED(" + name + ",", "MATVEC(" + name + ",", "MATVEC3(" + name + ",", "MATVEC3_LB(" + name + ",", "MATVEC_GLU(" + name + ",", "MATVEC1_GLU(" + name + ",", "MATVEC1_GLU_K(" + name + ",", "DEQ_F16(" + name + ",", "ATTN_TILED(" + name + ",", "MMQ(" + name + ",",
			"ROPE_STORE(" + name + ",", "STORE_KV(" + name + ",", "ATTENTION(" + name + ",", "ATTENTION_SPLIT(" + name + ",",
			"ATTENTION_SPLIT_W(" + name + ",", "MATVEC1D(" + name + ",", "EMBED_NORM_Q8(" + name + ",", "RMSNORM_Q8(" + name + ",",
			"RMSNORM_Q8K(" + name + ",", "GLU_Q8K(" + name + ",", "QUANTIZE_Q8K(" + name + ","}
		if !slices.ContainsFunc(defs, func(d string) bool { return strings.Contains(kernelSource, d) }) {
			t.Errorf("kernels.cu defines no kernel %s", name)
		}
	}
}

// TestKernelNamesCoverLookups: every kernel the Go code looks up by a
// literal name (funcs["name"]) is one kernelNames lists, so that the
// module it loads holds it (a kernel left off the list fails only on a
// GPU, as "a draw kernel is missing").
func TestKernelNamesCoverLookups(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Skip("no Go sources here: a test binary run away from its package")
	}
	listed := kernelNames()
	lookup := regexp.MustCompile(`funcs\["([a-z0-9_]+)"\]`)
	found := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range lookup.FindAllStringSubmatch(string(src), -1) {
			found++
			if !slices.Contains(listed, m[1]) {
				t.Errorf("%s looks up kernel %q, which kernelNames does not list", f, m[1])
			}
		}
	}
	if found < 7 { // the draws' seven kernels at least
		t.Errorf("found %d kernel lookups by name; the pattern no longer matches the code", found)
	}
}

func TestCacheKey(t *testing.T) {
	base := cacheKey("src", target{arch: 90, cubin: true}, 13000, 13000)
	if base != cacheKey("src", target{arch: 90, cubin: true}, 13000, 13000) {
		t.Fatal("cache key is not deterministic")
	}
	if !strings.HasPrefix(base, "sm_90-") || !strings.HasSuffix(base, ".cubin") {
		t.Errorf("key %q: want sm_90-<hash>.cubin", base)
	}
	for _, tc := range []struct {
		name string
		key  string
	}{
		{"source", cacheKey("src2", target{arch: 90, cubin: true}, 13000, 13000)},
		{"arch", cacheKey("src", target{arch: 89, cubin: true}, 13000, 13000)},
		{"ptx", cacheKey("src", target{arch: 90}, 13000, 13000)},
		{"driver", cacheKey("src", target{arch: 90, cubin: true}, 13010, 13000)},
		{"nvrtc", cacheKey("src", target{arch: 90, cubin: true}, 13000, 12090)},
	} {
		if tc.key == base {
			t.Errorf("changing the %s keeps the key %s", tc.name, base)
		}
	}
	if k := cacheKey("src", target{arch: 90}, 13000, 13000); !strings.HasSuffix(k, ".ptx") {
		t.Errorf("PTX key %q", k)
	}
}

func TestChooseTarget(t *testing.T) {
	supported := []int{75, 80, 86, 89, 90, 100, 120}
	for _, tc := range []struct {
		arch int
		want target
		err  bool
	}{
		{90, target{arch: 90, cubin: true}, false},
		{87, target{arch: 86}, false},
		{130, target{arch: 120}, false},
		{70, target{}, true},
	} {
		got, err := chooseTarget(tc.arch, supported)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("sm_%d: got %+v, %v; want %+v (error %v)", tc.arch, got, err, tc.want, tc.err)
		}
	}
	if o := (target{arch: 90, cubin: true}).option(); o != "--gpu-architecture=sm_90" {
		t.Errorf("option %q", o)
	}
}

func TestNVRTCNamesFollowTheDriver(t *testing.T) {
	t.Setenv("WEFT_NVRTC", "")
	for _, tc := range []struct {
		major      int
		want, not_ string
	}{
		{13, "libnvrtc.so.13", ""},
		{12, "libnvrtc.so.12", "libnvrtc.so.13"},
		{14, "libnvrtc.so.13", ""},
	} {
		names := strings.Join(nvrtcNames(tc.major), " ")
		if !strings.Contains(names, tc.want) || (tc.not_ != "" && strings.Contains(names, tc.not_)) {
			t.Errorf("driver %d: %s", tc.major, names)
		}
	}
	t.Setenv("WEFT_NVRTC", "/opt/x/libnvrtc.so")
	if n := nvrtcNames(13); n[0] != "/opt/x/libnvrtc.so" {
		t.Errorf("WEFT_NVRTC is not tried first: %v", n)
	}
}

func TestWriteCacheIsAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "k.cubin")
	writeCache(path, []byte("image"))
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "image" {
		t.Fatalf("read back %q, %v", b, err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}

// TestNoDriver checks that a machine without the driver gets an error, not
// a crash, from every entry point.
func TestNoDriver(t *testing.T) {
	if _, err := loadDriver(); err == nil {
		t.Skip("a CUDA driver is installed")
	}
	if b, err := New(0); err == nil || b != nil || !strings.HasPrefix(err.Error(), "cuda: ") {
		t.Errorf("New: %v, %v", b, err)
	}
	if _, err := Devices(); err == nil || !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Errorf("Devices: %v", err)
	}
	if _, err := NVRTC(); err == nil {
		t.Error("NVRTC without a driver gives no error")
	}
}

// validProgram is a small program using every op.
func validProgram(t *testing.T) *backend.Program {
	b := newProg(t, 1, 4, 2, 32, 64)
	x, xn, q, k, v, att, sel, logits := b.buf(64), b.buf(64), b.buf(64), b.buf(32), b.buf(32), b.buf(64), b.buf(64), b.buf(64)
	b.cache(32, 32)
	tab := b.rope(16, 10000)
	b.op(backend.Op{Kind: backend.OpEmbed, Out: x, W: b.mat("Q8_0", 64, 64, 1)})
	b.op(backend.Op{Kind: backend.OpRMSNorm, Out: xn, A: x, W: b.vec(64, 1, 0.1), Eps: 1e-5, Group: 64})
	b.op(backend.Op{Kind: backend.OpMatMul, Out: q, A: xn, W: b.mat("Q4_0", 64, 64, 1), Bias: b.vec(64, 0, 1)})
	b.op(backend.Op{Kind: backend.OpMatMul, Out: k, A: xn, W: b.mat("F16", 32, 64, 1), Bias: backend.NoWeight})
	b.op(backend.Op{Kind: backend.OpMatMul, Out: v, A: xn, W: b.mat("BF16", 32, 64, 1), Bias: backend.NoWeight})
	b.op(backend.Op{Kind: backend.OpRope, A: q, Table: tab, NHeads: 4, HeadDim: 16, RopeDim: 16})
	b.op(backend.Op{Kind: backend.OpStoreKV, A: k, B: v})
	b.op(backend.Op{Kind: backend.OpAttention, Out: att, A: q, NHeads: 4, NKV: 2, HeadDim: 16, Scale: 0.25})
	b.op(backend.Op{Kind: backend.OpAdd, Out: x, A: x, B: att})
	b.op(backend.Op{Kind: backend.OpGLU, Out: x, A: x, B: att, Act: backend.ActGELUTanh})
	b.op(backend.Op{Kind: backend.OpGather, Out: sel, A: x, OnSelected: true})
	b.op(backend.Op{Kind: backend.OpMatMul, Out: logits, A: sel, W: b.mat("F32", 64, 64, 1), Bias: backend.NoWeight, OnSelected: true})
	b.op(backend.Op{Kind: backend.OpSoftcap, Out: logits, A: logits, Cap: 30, OnSelected: true})
	b.p.Logits = logits
	return b.p
}

func TestPlan(t *testing.T) {
	for _, tc := range []struct {
		gemm bool
		mmq  bool
		want []string
	}{
		{false, false, []string{"embed_norm_q8_q8_0", "matvec_q4_0", "matvec_f16", "matvec_bf16", "rope", "store_kv",
			"attention_split_g1d2", "attention_tiled_64", "add", "glu", "gather", "matvec_f32", "softcap"}},
		{true, false, []string{"embed_q8_0", "embed_norm_q8_q8_0", "rmsnorm", "matvec_q4_0", "to_f16_q8", "deq_f16_q4_0", "gemm", "add_bias",
			"matvec_f16", "to_f16", "gemm", "matvec_bf16", "deq_f16_bf16", "gemm", "rope", "store_kv",
			"attention_split_g1d2", "attention_tiled_64", "add", "glu", "gather", "matvec_f32", "softcap"}},
		// mmq reads the int8 rows the fused norm writes for every batch.
		{true, true, []string{"embed_norm_q8_q8_0", "matvec_q4_0", "mmq_q4_0",
			"matvec_f16", "to_f16", "gemm", "matvec_bf16", "deq_f16_bf16", "gemm", "rope", "store_kv",
			"attention_split_g1d2", "attention_tiled_64", "add", "glu", "gather", "matvec_f32", "softcap"}},
		{false, true, []string{"embed_norm_q8_q8_0", "matvec_q4_0", "mmq_q4_0", "matvec_f16", "matvec_bf16", "rope", "store_kv",
			"attention_split_g1d2", "attention_tiled_64", "add", "glu", "gather", "matvec_f32", "softcap"}},
	} {
		pl, err := plan(validProgram(t), planOptions{gemm: tc.gemm, sms: 4, mmq: tc.mmq})
		if err != nil {
			t.Fatal(err)
		}
		var kernels []string // but the one-row twins (onerow.go)
		for _, c := range pl.calls {
			if c.gemm != nil {
				kernels = append(kernels, "gemm")
				if c.cond != large {
					t.Errorf("gemm %+v runs on small batches", c.gemm)
				}
				continue
			}
			if c.cond != one {
				kernels = append(kernels, c.kernel)
			}
		}
		if !slices.Equal(kernels, tc.want) {
			t.Errorf("gemm=%v mmq=%v: kernels %v\nwant %v", tc.gemm, tc.mmq, kernels, tc.want)
		}
		for _, c := range pl.calls {
			if strings.HasPrefix(c.kernel, "mmq") && (c.cond != large || c.block != mmqThreads || c.args[7] != weight(3)) {
				t.Errorf("mmq launch %+v", c)
			}
			if c.kernel == "rmsnorm_q8" && tc.mmq && c.cond != always {
				t.Errorf("with mmq the norm must quantize for every batch: %+v", c)
			}
		}
		if m := pl.mats[0]; m.rows != 64 || m.cols != 64 || m.ggufRow != 2*34 || m.rowBytes != 64 || m.dOff != 64*64 {
			t.Errorf("Q8_0 64x64 described as %+v", m)
		}
		if m := pl.mats[2]; m.rowBytes != 32 || m.dOff != 64*32 {
			t.Errorf("Q4_0 64x64 described as %+v", m)
		}
		// 64 short rows on 4 multiprocessors: 8 blocks of 8 rows.
		mv := pl.calls[slices.IndexFunc(pl.calls, func(c call) bool { return c.kernel == "matvec_q4_0" })]
		if mv.gridX != 8 || mv.gridY != gridOne || mv.block != 128 || mv.args[len(mv.args)-1] != i32(8) {
			t.Errorf("matvec launch %+v", mv)
		}
		if pl.scratch[scratchQ8] != 4*64 || pl.scratch[scratchQ8DS] != 4*2*8 {
			t.Errorf("scratch %v", pl.scratch)
		}
		// The Q4_0 weight's f16 copy, or with mmq only the BF16 one's.
		w16 := 64 * 64 * 2
		if tc.mmq {
			w16 = 32 * 64 * 2
		}
		if tc.gemm && pl.scratch[scratchW16] != int64(w16) {
			t.Errorf("f16 weight scratch %d bytes", pl.scratch[scratchW16])
		}
	}
}

// TestPlanFusesAndShares checks that products of one input quantize it
// once, by the norm that wrote it where there is one, that a product
// followed by a residual add does the add itself on the matrix-vector
// path, and that a write to the input forgets its quantized copy.
func TestPlanFusesAndShares(t *testing.T) {
	b := newProg(t, 1, 4, 1, 32, 64)
	x, xn, q, k, o, logits := b.buf(64), b.buf(64), b.buf(64), b.buf(32), b.buf(64), b.buf(64)
	b.op(backend.Op{Kind: backend.OpEmbed, Out: x, W: b.mat("F32", 64, 64, 1)})
	b.op(backend.Op{Kind: backend.OpRMSNorm, Out: xn, A: x, W: b.vec(64, 1, 0.1), Eps: 1e-5, Group: 64})
	b.op(backend.Op{Kind: backend.OpMatMul, Out: q, A: xn, W: b.mat("Q4_0", 64, 64, 1), Bias: backend.NoWeight})
	b.op(backend.Op{Kind: backend.OpMatMul, Out: k, A: xn, W: b.mat("Q8_0", 32, 64, 1), Bias: backend.NoWeight})
	b.op(backend.Op{Kind: backend.OpMatMul, Out: o, A: q, W: b.mat("Q4_0", 64, 64, 1), Bias: backend.NoWeight})
	b.op(backend.Op{Kind: backend.OpAdd, Out: x, A: x, B: o})
	b.op(backend.Op{Kind: backend.OpRMSNorm, Out: xn, A: x, W: b.vec(64, 1, 0.1), Eps: 1e-5, Group: 64})
	b.op(backend.Op{Kind: backend.OpMatMul, Out: logits, A: xn, W: b.mat("Q8_0", 64, 64, 1), Bias: backend.NoWeight})
	b.p.Logits = logits
	for _, gemm := range []bool{false, true} {
		pl, err := plan(b.p, planOptions{gemm: gemm, sms: 4})
		if err != nil {
			t.Fatal(err)
		}
		var quantizes, norms, adds []call
		for _, c := range pl.calls {
			switch c.kernel {
			case "quantize_q8", "rmsnorm_q8", "embed_norm_q8_f32":
				quantizes = append(quantizes, c)
			case "rmsnorm":
				norms = append(norms, c)
			case "add":
				adds = append(adds, c)
			case "matvec_q4_0":
				if c.op == 4 && c.args[1] != buf(x) {
					t.Errorf("gemm=%v: the output product adds to %+v, want buffer %d", gemm, c.args[1], x)
				}
			}
		}
		// xn for q and k by its norm, q for o, xn again by the norm that
		// rewrote it.
		if len(quantizes) != 3 || quantizes[0].op != 1 || quantizes[1].op != 4 || quantizes[2].op != 6 ||
			quantizes[0].kernel != "embed_norm_q8_f32" || quantizes[1].kernel != "quantize_q8" {
			t.Errorf("gemm=%v: quantizes at %+v", gemm, quantizes)
		}
		// With cuBLAS, large batches take the plain norm.
		if (len(norms) != 0) != gemm {
			t.Errorf("gemm=%v: plain norms %+v", gemm, norms)
		}
		switch {
		case !gemm && len(adds) != 0:
			t.Errorf("the fused add still runs: %+v", adds)
		case gemm && (len(adds) != 1 || adds[0].cond != large):
			t.Errorf("with cuBLAS the add must run on large batches only: %+v", adds)
		}
	}
}

// TestPlanMMQ checks the mmq plan: a product followed by a residual add
// adds on every path (the add never runs), the input of products is
// quantized for every batch, and the attention before a Q8_0 or Q4_0
// product quantizes its output in the decode kernel and, after the tiled
// kernel, in a quantize_q8 of large batches.
func TestPlanMMQ(t *testing.T) {
	b := newProg(t, 1, 40, 1, 64, 64)
	x, xn, q, k, v, att, o := b.buf(64), b.buf(64), b.buf(64), b.buf(32), b.buf(32), b.buf(64), b.buf(64)
	b.cache(32, 64)
	b.op(backend.Op{Kind: backend.OpEmbed, Out: x, W: b.mat("F32", 64, 64, 1)})
	b.op(backend.Op{Kind: backend.OpRMSNorm, Out: xn, A: x, W: b.vec(64, 1, 0.1), Eps: 1e-5, Group: 64})
	b.op(backend.Op{Kind: backend.OpMatMul, Out: q, A: xn, W: b.mat("Q4_0", 64, 64, 1), Bias: backend.NoWeight})
	b.op(backend.Op{Kind: backend.OpMatMul, Out: k, A: xn, W: b.mat("Q8_0", 32, 64, 1), Bias: b.vec(32, 0, 1)})
	b.op(backend.Op{Kind: backend.OpMatMul, Out: v, A: xn, W: b.mat("Q8_0", 32, 64, 1), Bias: backend.NoWeight})
	b.op(backend.Op{Kind: backend.OpStoreKV, A: k, B: v})
	b.op(backend.Op{Kind: backend.OpAttention, Out: att, A: q, NHeads: 2, NKV: 1, HeadDim: 32, Scale: 0.2})
	b.op(backend.Op{Kind: backend.OpMatMul, Out: o, A: att, W: b.mat("Q4_0", 64, 64, 1), Bias: backend.NoWeight})
	b.op(backend.Op{Kind: backend.OpAdd, Out: x, A: x, B: o})
	b.p.Logits = x
	pl, err := plan(b.p, planOptions{gemm: true, sms: 4, mmq: true})
	if err != nil {
		t.Fatal(err)
	}
	type launch struct {
		op     int
		kernel string
		cond   cond
	}
	var got []launch
	for _, c := range pl.calls {
		if c.gemm != nil {
			t.Fatalf("a cuBLAS product in %+v", c)
		}
		got = append(got, launch{c.op, c.kernel, c.cond})
	}
	want := []launch{{1, "embed_norm_q8_f32", always},
		{2, "matvec_q4_0", few}, {2, "matvec1_q4_0", one}, {2, "mmq_q4_0", large}, {3, "mmq_q8_0", large},
		{4, "mmq_q8_0", large}, {3, "matvec3_q8_0", few}, {3, "matvec13_q8_0", one}, {5, "store_kv", always},
		{6, "attention_split_g1d2", small}, {6, "attention_tiled_64", large}, {6, "quantize_q8", large},
		{7, "matvec_q4_0", few}, {7, "matvec1_q4_0", one}, {7, "mmq_q4_0", large}}
	if !slices.Equal(got, want) {
		t.Fatalf("launches %v\nwant %v", got, want)
	}
	for _, c := range pl.calls {
		switch {
		case strings.HasPrefix(c.kernel, "attention_split") && c.args[len(c.args)-7] != scratch(scratchQ8):
			t.Errorf("the decode attention does not quantize its output: %+v", c.args)
		case c.op == 7 && c.args[1] != buf(x):
			t.Errorf("%s of the output product adds to %+v, want buffer %d", c.kernel, c.args[1], x)
		case c.kernel == "mmq_q8_0" && c.op == 3 && (c.args[7] != weight(4) || c.args[10] != i32(64) || c.args[11] != i32(32)):
			t.Errorf("mmq launch of k %+v", c.args)
		case strings.HasPrefix(c.kernel, "mmq") && (c.gridY != gridOne || c.gridX != 1):
			// 64 or 32 weight rows, 40 rows: one tile.
			t.Errorf("mmq grid %+v", c)
		}
	}
	if pl.scratch[scratchW16] != 0 || pl.scratch[scratchX16] != 0 {
		t.Errorf("f16 scratch %v with mmq", pl.scratch)
	}
	// Small batches (the decode graphs) launch the same kernels with the
	// same arguments with mmq as with cuBLAS.
	cub, err := plan(b.p, planOptions{gemm: true, sms: 4})
	if err != nil {
		t.Fatal(err)
	}
	small := func(calls []call) []call {
		var out []call
		for _, c := range calls {
			if c.cond != large {
				out = append(out, c)
			}
		}
		return out
	}
	a, c := small(pl.calls), small(cub.calls)
	if len(a) != len(c) {
		t.Fatalf("%d small-batch launches with mmq, %d with cuBLAS", len(a), len(c))
	}
	for i := range a {
		x, y := a[i], c[i]
		if x.op != y.op || x.kernel != y.kernel || x.gridX != y.gridX || x.gridY != y.gridY || x.block != y.block ||
			x.shared != y.shared || x.which != y.which || !slices.Equal(x.args, y.args) {
			t.Errorf("small-batch launch %d: %+v with mmq, %+v with cuBLAS", i, x, y)
		}
	}
}

// TestPlanRopeStore checks that rope of q and k by one table and the
// store of k and v become one launch, and stay three otherwise.
func TestPlanRopeStore(t *testing.T) {
	for _, tc := range []struct {
		name   string
		kTable int
		want   []string
	}{
		{"fused", 0, []string{"rope_store", "attention_split_g1d2"}},
		{"two tables", 1, []string{"rope", "rope", "store_kv", "attention_split_g1d2"}},
	} {
		b := newProg(t, 1, 4, 1, 32, 64)
		q, k, v, att := b.buf(64), b.buf(32), b.buf(32), b.buf(64)
		b.cache(32, 32)
		b.rope(16, 10000)
		b.rope(16, 1000)
		b.op(backend.Op{Kind: backend.OpRope, A: q, Table: 0, NHeads: 4, HeadDim: 16, RopeDim: 16})
		b.op(backend.Op{Kind: backend.OpRope, A: k, Table: tc.kTable, NHeads: 2, HeadDim: 16, RopeDim: 16})
		b.op(backend.Op{Kind: backend.OpStoreKV, A: k, B: v})
		b.op(backend.Op{Kind: backend.OpAttention, Out: att, A: q, NHeads: 4, NKV: 2, HeadDim: 16, Scale: 0.25})
		b.p.Logits = att
		pl, err := plan(b.p, planOptions{sms: 4, first: "0"}) // the _first twins: TestTriggerFirst
		if err != nil {
			t.Fatal(err)
		}
		var kernels []string
		for _, c := range pl.calls {
			if c.cond != large {
				kernels = append(kernels, c.kernel)
			}
		}
		if !slices.Equal(kernels, tc.want) {
			t.Errorf("%s: kernels %v, want %v", tc.name, kernels, tc.want)
		}
	}
	// The fused launch still checks each op.
	b := newProg(t, 1, 4, 1, 32, 64)
	q, k, v := b.buf(64), b.buf(32), b.buf(32)
	b.cache(16, 32)
	b.rope(16, 10000)
	b.op(backend.Op{Kind: backend.OpRope, A: q, NHeads: 4, HeadDim: 16, RopeDim: 16})
	b.op(backend.Op{Kind: backend.OpRope, A: k, NHeads: 2, HeadDim: 16, RopeDim: 16})
	b.op(backend.Op{Kind: backend.OpStoreKV, A: k, B: v})
	b.p.Logits = q
	if _, err := plan(b.p, planOptions{}); err == nil || !strings.Contains(err.Error(), "op 2 (store_kv") {
		t.Errorf("a store into a cache of the wrong width: %v", err)
	}
}

func TestRowsPerBlock(t *testing.T) {
	for _, tc := range []struct{ n, chunks, want int }{
		{8192, 64, 8}, {8192, 128, 4}, {2048, 64, 4}, {1024, 64, 2}, {1024, 128, 2}, {600, 64, 2}, {512, 64, 1},
	} {
		if got := rowsPerBlock(tc.n, tc.chunks, 132); got != tc.want {
			t.Errorf("%d rows of %d chunks: %d rows a block, want %d", tc.n, tc.chunks, got, tc.want)
		}
	}
}

func TestPlanRejects(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(p *backend.Program)
		want   string
	}{
		{"no rows", func(p *backend.Program) { p.MaxRows = 0 }, "program with 0 rows"},
		{"logits width", func(p *backend.Program) { p.Vocab = 65 }, "logits buffer"},
		{"buffer range", func(p *backend.Program) { p.Ops[1].A = 99 }, "buffer 99 out of range"},
		{"weight range", func(p *backend.Program) { p.Ops[2].W = 99 }, "weight 99 out of range"},
		{"norm group", func(p *backend.Program) { p.Ops[1].Group = 48 }, "groups of 48"},
		{"matmul shape", func(p *backend.Program) { p.Ops[3].Out = 0 }, "maps 64 to 64"},
		{"bias size", func(p *backend.Program) { p.Ops[3].Bias = p.Ops[2].Bias }, "64 values for 32 outputs"},
		{"rope dim", func(p *backend.Program) { p.Ops[5].RopeDim = 8 }, "rope dim 8"},
		{"kv layer", func(p *backend.Program) { p.Ops[6].Layer = 3 }, "layer 3"},
		{"gqa", func(p *backend.Program) { p.Ops[7].NKV = 3 }, "(3 kv)"},
		{"ring", func(p *backend.Program) { p.Caches[0].Capacity = 8; p.Ops[7].Window = 6 }, "ring cache of 8"},
		{"activation", func(p *backend.Program) { p.Ops[9].Act = 7 }, "activation 7"},
		{"softcap", func(p *backend.Program) { p.Ops[12].Cap = 0 }, "soft-cap 0"},
		{"unsupported type", func(p *backend.Program) { p.Weights[2].Tensor.Type, p.Weights[2].Tensor.HasGGML = "U32", false }, "type U32 is not supported"},
		{"short data", func(p *backend.Program) { p.Weights[2].Data.Bytes = p.Weights[2].Data.Bytes[:10] }, "10 bytes"},
		{"unknown op", func(p *backend.Program) { p.Ops[0].Kind = 99 }, "unsupported op"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := validProgram(t)
			tc.mutate(p)
			_, err := plan(p, planOptions{gemm: true})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestSupports(t *testing.T) {
	var b Backend
	for typ, want := range map[string]bool{"F32": true, "F16": true, "BF16": true, "Q8_0": true, "Q4_0": true, "Q4_K": true,
		"Q6_K": true, "Q5_0": true, "IQ2_XXS": true, "TQ1_0": true, "MLX_Q4": true, "MLX_Q2": true, "MLX_Q3": false, "U32": false, "BOOL": false, "": false} {
		if b.Supports(typ) != want {
			t.Errorf("Supports(%s) = %v", typ, !want)
		}
	}
}

// TestNVRTCCompilesKernels compiles the kernels wherever NVRTC is
// installed, GPU or not, for a few architectures and as PTX; a failure
// carries NVRTC's full log.
func TestNVRTCCompilesKernels(t *testing.T) {
	n := &nvrtcAPI{}
	if _, _, err := loadLib(nvrtcNames(13), n); err != nil {
		if os.Getenv("WEFT_CUDA_REQUIRE") == "1" {
			t.Fatalf("WEFT_CUDA_REQUIRE=1 but NVRTC is missing: %v", err)
		}
		t.Skipf("NVRTC not installed: %.200s", err)
	}
	archs, err := n.archs()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NVRTC architectures %v", archs)
	targets := []target{{arch: 80}}
	for _, a := range slices.Compact([]int{90, archs[len(archs)-1]}) {
		if slices.Contains(archs, a) {
			targets = append(targets, target{arch: a, cubin: true})
		}
	}
	for _, tg := range targets {
		image, err := n.compile(kernelSource, tg)
		if err != nil {
			t.Fatalf("%s: %v", tg.option(), err)
		}
		if len(image) < 1000 {
			t.Errorf("%s: %d bytes of output", tg.option(), len(image))
		}
	}
}

// TestPlanSplitAttention checks which decode attention kernels each head
// shape gets (by depth where they differ: shallow, then deep, launches),
// how many splits a cache makes, and the groups of warps of the shallow
// kernels by the shared memory a block may have.
func TestPlanSplitAttention(t *testing.T) {
	const h100 = 232448 // an H100's shared memory a block may opt in to
	for _, tc := range []struct {
		name                   string
		heads, kv, hd, context int
		want                   []string // launches for small batches, then for large
		splits, kt             int32    // of the one-group kernels
		gsplits                int32    // of the grouped kernel
		keys                   int      // planOptions.splitKeys
		lane                   bool     // planOptions.attnLane
		deepAt                 int      // planOptions.deepAt
		shared, groups         int      // planOptions.maxShared, attnGroups
	}{
		{"gqa4-64", 8, 2, 64, 1000, []string{"attention_split_w2", "attention_tiled_64"}, 32, 32, 0, 0, false, 0, h100, 0},
		{"gqa4-64-groups4", 8, 2, 64, 1000, []string{"attention_split_w2g4", "attention_split_w2", "attention_tiled_64"}, 32, 32, 5, 0, false, 0, h100, 4},
		{"gqa4-64-groups4-48k", 8, 2, 64, 1000, []string{"attention_split_w2g2", "attention_split_w2", "attention_tiled_64"}, 32, 32, 10, 0, false, 0, 0, 4},
		{"gqa4-64-at-200", 8, 2, 64, 1000, []string{"attention_split_w2g4", "attention_split_w2", "attention_tiled_64"}, 32, 32, 2, 0, false, 200, h100, 4},
		{"gqa4-64-groups2", 8, 2, 64, 1000, []string{"attention_split_w2g2", "attention_split_w2", "attention_tiled_64"}, 32, 32, 10, 0, false, 0, h100, 2},
		{"gqa4-64-lane", 8, 2, 64, 1000, []string{"attention_split_g1d2", "attention_tiled_64"}, 32, 32, 0, 0, true, 0, h100, 0},
		{"gqa4-128", 32, 8, 128, 1000, []string{"attention_split_w2x2", "attention_split_g1d4", "attention_tiled_128"}, 32, 32, 0, 0, false, 0, 0, 0},
		{"gqa4-128-h100", 32, 8, 128, 1000, []string{"attention_split_w2x2g2", "attention_split_g1d4", "attention_tiled_128"}, 32, 32, 10, 0, false, 0, h100, 0},
		{"gqa4-128-groups1", 32, 8, 128, 1000, []string{"attention_split_w2x2", "attention_split_g1d4", "attention_tiled_128"}, 32, 32, 0, 0, false, 0, h100, 1},
		{"gqa4-128-groups4", 32, 8, 128, 1000, []string{"attention_split_w2x2g4", "attention_split_g1d4", "attention_tiled_128"}, 32, 32, 5, 0, false, 0, h100, 4},
		{"gqa4-128-at-200", 32, 8, 128, 1000, []string{"attention_split_w2x2", "attention_split_g1d4", "attention_tiled_128"}, 32, 32, 0, 0, false, 200, 0, 0},
		{"gqa4-128-deep", 32, 8, 128, 1000, []string{"attention_split_g1d4", "attention_tiled_128"}, 32, 32, 0, 0, false, -1, h100, 0},
		{"gqa4-128-lane", 32, 8, 128, 1000, []string{"attention_split_g1d4", "attention_tiled_128"}, 32, 32, 0, 0, true, 0, h100, 0},
		{"gqa5-64", 10, 2, 64, 1000, []string{"attention_split_g2d2", "attention_tiled_64"}, 32, 32, 0, 0, false, 0, h100, 0},
		{"gqa4-96", 8, 2, 96, 1000, []string{"attention_split_g1d4", "attention_tiled_128"}, 32, 32, 0, 0, false, 0, h100, 0},
		{"short", 8, 2, 64, 40, []string{"attention_split_w2g2", "attention_split_w2", "attention_tiled_64"}, 2, 32, 1, 0, false, 0, 0, 2},
		{"long", 8, 2, 64, 100000, []string{"attention_split_w2g2", "attention_split_w2", "attention_tiled_64"}, attSplitMax, 32, 10, 0, false, 0, 0, 2},
		{"hd256", 4, 2, 256, 256, []string{"attention_split", "attention"}, 8, 16, 0, 0, false, 0, 0, 0},
		{"odd-dims", 4, 2, 30, 256, []string{"attention", "attention"}, 0, 0, 0, 0, false, 0, 0, 0},
		{"gqa32", 32, 1, 64, 256, []string{"attention", "attention_tiled_64"}, 0, 0, 0, 0, false, 0, 0, 0},
		{"hd512", 2, 1, 512, 64, []string{"attention", "attention"}, 0, 0, 0, 0, false, 0, 0, 0},
		{"off", 8, 2, 64, 1000, []string{"attention", "attention_tiled_64"}, 0, 0, 0, -1, false, 0, 0, 0},
		{"keys-100", 8, 2, 64, 1000, []string{"attention_split_w2g2", "attention_split_w2", "attention_tiled_64"}, 10, 32, 7, 100, false, 0, 0, 2},
		{"keys-100-128", 32, 8, 128, 1000, []string{"attention_split_w2x2g2", "attention_split_g1d4", "attention_tiled_128"}, 10, 32, 7, 100, false, 0, h100, 0},
	} {
		b := newProg(t, 1, 16, 1, tc.context, tc.heads*tc.hd)
		q, k, v, att := b.buf(tc.heads*tc.hd), b.buf(tc.kv*tc.hd), b.buf(tc.kv*tc.hd), b.buf(tc.heads*tc.hd)
		b.cache(tc.kv*tc.hd, tc.context)
		b.op(backend.Op{Kind: backend.OpStoreKV, A: k, B: v})
		b.op(backend.Op{Kind: backend.OpAttention, Out: att, A: q, NHeads: tc.heads, NKV: tc.kv, HeadDim: tc.hd, Scale: 0.25})
		b.p.Logits = att
		pl, err := plan(b.p, planOptions{sms: 4, splitKeys: tc.keys, attnLane: tc.lane, deepAt: tc.deepAt, maxShared: tc.shared, attnGroups: tc.groups})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var sk, lk []string
		var depths []depth
		for _, c := range pl.calls {
			if c.op != 1 {
				continue
			}
			if c.cond != large {
				sk = append(sk, c.kernel)
				depths = append(depths, c.depth)
			}
			if c.cond != small {
				lk = append(lk, c.kernel)
			}
			if strings.HasPrefix(c.kernel, "attention_split") {
				n := len(c.args)
				warps, smem := attSplitWarps, 4*(int(tc.kt)*(2*tc.hd+4)+tc.heads/tc.kv*tc.hd+attSplitWarps*attSplitMax)
				splits, keys := tc.splits, cmp.Or(tc.keys, attSplitKeys)
				if strings.HasPrefix(c.kernel, "attention_split_w") { // w2 and w2x2: 2 warps a head
					// One group: two tiles' room where two of 32 keys fit
					// in 48 KiB (heads of 64 dims, not of 128). Groups of
					// warps (wNgG): one tile each, runs of a tile a group.
					tiles, ng := 1, 1
					if _, g, ok := strings.Cut(strings.TrimPrefix(c.kernel, "attention_split_w"), "g"); ok {
						ng, _ = strconv.Atoi(g)
						splits, keys = tc.gsplits, cmp.Or(tc.keys, attSplitKeys*ng)
					} else if tc.hd == 64 {
						tiles = 2
					}
					if c.args[n-1] != i32(tiles-1) {
						t.Errorf("%s: %s copies ahead: %+v, want %v", tc.name, c.kernel, c.args[n-1], tiles == 2)
					}
					n--
					warps = 2 * attSplitWHeads * ng
					smem = 4 * (ng*(tiles*int(tc.kt)*(2*tc.hd+4)+attSplitWHeads*tc.hd+2*attSplitWHeads*2*32) + attSplitWHeads*attSplitMax)
				}
				if c.block != uint32(32*warps) || c.shared != uint32(smem) {
					t.Errorf("%s: %s in blocks of %d threads with %d bytes of shared memory, want %d and %d", tc.name, c.kernel, c.block, c.shared, 32*warps, smem)
				}
				if c.args[n-3] != i32(int(splits)) || c.args[n-2] != i32(int(tc.kt)) || c.gridX != uint32(tc.kv)*uint32(splits) {
					t.Errorf("%s: %s: splits %+v, tile %+v, grid %d; want %d splits of %d-key tiles", tc.name, c.kernel, c.args[n-3], c.args[n-2], c.gridX, splits, tc.kt)
				}
				if c.args[n-1] != i32(keys) {
					t.Errorf("%s: %s: runs of %+v positions, want %d", tc.name, c.kernel, c.args[n-1], keys)
				}
				if want := int64(4 * smallRows * tc.heads * int(tc.splits) * (tc.hd + 2)); pl.scratch[scratchAttnPart] != want {
					t.Errorf("%s: partials %d bytes, want %d", tc.name, pl.scratch[scratchAttnPart], want)
				}
			}
		}
		if got := append(sk, lk...); !slices.Equal(got, tc.want) {
			t.Errorf("%s: kernels %v (small) %v (large), want %v", tc.name, sk, lk, tc.want)
		}
		// Two launches for small batches are a shallow and a deep one,
		// from the plan's deepAt on; one runs at every depth.
		wantDepths, wantAt := []depth{anyDepth}, 0
		if len(sk) == 2 {
			wantDepths, wantAt = []depth{shallow, deep}, cmp.Or(tc.deepAt, attDeepAt)
		}
		if !slices.Equal(depths, wantDepths) || pl.deepAt != wantAt {
			t.Errorf("%s: depths %v from %d, want %v from %d", tc.name, depths, pl.deepAt, wantDepths, wantAt)
		}
	}
}

// TestGeometryMatchesSource checks the plan's copies of the kernels'
// geometry against the #defines of the kernel source: a launch with the
// wrong block size runs without error and computes part of its output.
func TestGeometryMatchesSource(t *testing.T) {
	defines := map[string]int{}
	for _, line := range strings.Split(kernelSource, "\n") {
		var name string
		var v int
		if n, _ := fmt.Sscanf(line, "#define %s %d", &name, &v); n == 2 {
			defines[name] = v
		}
	}
	for name, want := range map[string]int{
		"MV_WARPS": mvWarps, "GLU_ROWS": gluRows, "GLU_WARPS": gluWarps, "GLU1_WARPS": gluTwinMaxWarps, "MVR": smallRows, "MAXD": maxHeadDim,
		"AT_ROWS": attTileRows, "AT_KT": attTileKeys, "AT_WARPS": attTileWarps, "AS_WARPS": attSplitWarps,
		"AS_MAXS": attSplitMax, "MQ_W": mmqWeightRows, "DRAW_THREADS": drawThreads, "AW_HEADS": attSplitWHeads, "NORM_HELD": normHeld,
	} {
		if got, ok := defines[name]; !ok || got != want {
			t.Errorf("kernel source defines %s = %d (found %v), the plan uses %d", name, got, ok, want)
		}
	}
	// attention_split's limits follow from its geometry, and each shape's
	// kernel (splitKernels) is compiled for the heads a warp and dims a
	// lane the plan gives it, over float and f16 caches.
	split := func(name string) (hpw, nd int, ok bool) {
		for _, line := range strings.Split(kernelSource, "\n") {
			if !strings.HasPrefix(line, "ATTENTION_SPLIT("+name+",") {
				continue
			}
			// name, cache element, async copies, heads a warp, dims a lane
			f := strings.Split(strings.TrimSuffix(strings.TrimPrefix(line, "ATTENTION_SPLIT("), ")"), ", ")
			if len(f) != 5 {
				return 0, 0, false
			}
			h, err1 := strconv.Atoi(f[3])
			d, err2 := strconv.Atoi(f[4])
			return h, d, err1 == nil && err2 == nil
		}
		return 0, 0, false
	}
	if h, d, ok := split("attention_split"); !ok || defines["AS_WARPS"]*h != attSplitMaxGroup || 32*d != attSplitMaxDim {
		t.Errorf("attention_split takes %d query heads a kv head and head sizes to %d (found %v), the plan allows %d and %d",
			defines["AS_WARPS"]*h, 32*d, ok, attSplitMaxGroup, attSplitMaxDim)
	}
	for shape, name := range splitKernels {
		for _, n := range []string{name, name + "_h"} {
			if h, d, ok := split(n); !ok || h != shape[0] || d != shape[1] {
				t.Errorf("%s is compiled for %d heads a warp and %d dims a lane (found %v), the plan takes %v", n, h, d, ok, shape)
			}
		}
	}
	// attention_split_wN is compiled for the warps a head (and heads of
	// 32·warps·dims-a-lane dims) the plan gives it: its block size is
	// attSplitWHeads warps a head.
	ks := map[int]splitWarpKernel{128: splitShallow128}
	for hd, k := range splitWarpKernels {
		ks[hd] = k
	}
	for hd, k := range ks {
		names := map[string]int{k.name: 1, k.name + "_h": 1} // with their groups of warps
		for _, ng := range attGroupSizes {
			names[groupKernel(k, ng)] = ng
		}
		for n, ng := range names {
			found := false
			for _, line := range strings.Split(kernelSource, "\n") {
				if rest, ok := strings.CutPrefix(line, "ATTENTION_SPLIT_W("+n+","); ok {
					f := strings.Split(strings.TrimSuffix(rest, ")"), ", ")
					dq, err1 := strconv.Atoi(f[len(f)-3])
					nd, err2 := strconv.Atoi(f[len(f)-2])
					g, err3 := strconv.Atoi(f[len(f)-1])
					found = err1 == nil && err2 == nil && err3 == nil && dq == k.dq && 32*dq*nd == hd && g == ng
				}
			}
			if !found {
				t.Errorf("%s is not compiled for %d warps a head of %d dims in %d groups", n, k.dq, hd, ng)
			}
		}
	}
	if !strings.Contains(kernelSource, "__launch_bounds__(32 * GLU_WARPS,") {
		t.Error("the GLU kernels are not bounded by GLU_WARPS warps")
	}
}

// TestPlanF16Cache checks that an f16 cache's store and attention run the
// kernels for half caches (name_h), and a float32 cache's do not.
func TestPlanF16Cache(t *testing.T) {
	for _, f16 := range []bool{false, true} {
		p := validProgram(t)
		for i := range p.Caches {
			p.Caches[i].F16 = f16
		}
		pl, err := plan(p, planOptions{gemm: true, sms: 4})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range pl.calls {
			base := strings.TrimSuffix(c.kernel, "_h")
			if !strings.HasPrefix(base, "attention") && base != "store_kv" && base != "rope_store" {
				continue
			}
			n++
			if strings.HasSuffix(c.kernel, "_h") != f16 {
				t.Errorf("f16 cache %v: kernel %s", f16, c.kernel)
			}
		}
		if n < 2 {
			t.Errorf("f16 cache %v: %d cache kernels planned", f16, n)
		}
	}
}

func TestSplitKernel(t *testing.T) {
	for _, tc := range []struct {
		g, hd int
		wide  bool
		want  string
	}{
		{4, 64, false, "attention_split_g1d2"},  // Llama 3.2 1B
		{4, 128, false, "attention_split_g1d4"}, // Llama 3 8B
		{1, 32, false, "attention_split_g1d2"},
		{3, 40, false, "attention_split_g1d2"},
		{7, 64, false, "attention_split_g2d2"}, // Qwen2.5 0.5B
		{8, 96, false, "attention_split_g2d4"},
		{5, 72, false, "attention_split_g2d4"},
		{16, 64, false, "attention_split"},
		{2, 256, false, "attention_split"},
		{9, 128, false, "attention_split"},
		{4, 64, true, "attention_split"},
	} {
		if got := splitKernel(tc.g, tc.hd, planOptions{attnWide: tc.wide}); got != tc.want {
			t.Errorf("splitKernel(%d, %d, wide %v) = %s, want %s", tc.g, tc.hd, tc.wide, got, tc.want)
		}
	}
}

// TestAttnGroupsSetting: WEFT_CUDA_ATTN_GROUPS reaches the plan options,
// and a count with no kernel compiled for it is an error naming the
// setting.
func TestAttnGroupsSetting(t *testing.T) {
	for _, tc := range []struct {
		v   string
		err bool
	}{{"", false}, {"1", false}, {"2", false}, {"4", false}, {"3", true}, {"8", true}, {"-2", true}} {
		t.Setenv("WEFT_CUDA_ATTN_GROUPS", tc.v)
		err := envPlanOptions().check()
		if (err != nil) != tc.err || err != nil && !strings.Contains(err.Error(), "WEFT_CUDA_ATTN_GROUPS") {
			t.Errorf("WEFT_CUDA_ATTN_GROUPS=%q: %v", tc.v, err)
		}
	}
}

// TestPlanGroupsFloatCaches: the kernels of groups of warps are compiled
// for float caches only, so f16 caches keep the one-group kernels.
func TestPlanGroupsFloatCaches(t *testing.T) {
	for _, f16 := range []bool{false, true} {
		b := newProg(t, 1, 16, 1, 1000, 32*128)
		q, k, v, att := b.buf(32*128), b.buf(8*128), b.buf(8*128), b.buf(32*128)
		b.cache(8*128, 1000)
		b.p.Caches[0].F16 = f16
		b.op(backend.Op{Kind: backend.OpStoreKV, A: k, B: v})
		b.op(backend.Op{Kind: backend.OpAttention, Out: att, A: q, NHeads: 32, NKV: 8, HeadDim: 128, Scale: 0.125})
		b.p.Logits = att
		pl, err := plan(b.p, planOptions{sms: 4, maxShared: 232448})
		if err != nil {
			t.Fatal(err)
		}
		want := "attention_split_w2x2g2"
		if f16 {
			want = "attention_split_w2x2_h"
		}
		if i := slices.IndexFunc(pl.calls, func(c call) bool { return c.kernel == want }); i < 0 || pl.calls[i].depth != shallow {
			t.Errorf("f16 %v: no shallow %s in the plan", f16, want)
		}
	}
}

// TestAttentionSingleTile: WEFT_CUDA_ATTN_SINGLE=1 (planOptions.attnSingle)
// gives attention_split_w2 one tile's shared memory and no copies ahead.
func TestAttentionSingleTile(t *testing.T) {
	t.Setenv("WEFT_CUDA_ATTN_SINGLE", "1")
	opt := envPlanOptions()
	if !opt.attnSingle {
		t.Fatal("WEFT_CUDA_ATTN_SINGLE=1 did not reach the plan options")
	}
	for _, single := range []bool{false, true} {
		b := newProg(t, 1, 16, 1, 1000, 8*64)
		q, k, v, att := b.buf(8*64), b.buf(2*64), b.buf(2*64), b.buf(8*64)
		b.cache(2*64, 1000)
		b.op(backend.Op{Kind: backend.OpStoreKV, A: k, B: v})
		b.op(backend.Op{Kind: backend.OpAttention, Out: att, A: q, NHeads: 8, NKV: 2, HeadDim: 64, Scale: 0.125})
		b.p.Logits = att
		pl, err := plan(b.p, planOptions{sms: 4, attnSingle: single})
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(pl.calls, func(c call) bool { return c.kernel == "attention_split_w2" })
		if i < 0 {
			t.Fatalf("single %v: no attention_split_w2 in the plan", single)
		}
		c := pl.calls[i]
		tiles := 2
		if single {
			tiles = 1
		}
		smem := 4 * (tiles*32*(2*64+4) + attSplitWHeads*64 + 2*attSplitWHeads*2*32 + attSplitWHeads*attSplitMax)
		if c.args[len(c.args)-1] != i32(tiles-1) || c.shared != uint32(smem) {
			t.Errorf("single %v: copies ahead %+v with %d bytes of shared memory, want %v and %d", single, c.args[len(c.args)-1], c.shared, tiles == 2, smem)
		}
	}
}

// TestTriggerFirst: the norms and rope_store take their _first twins
// where every rope_store rotates heads of at most firstMaxHeadDim dims,
// unless WEFT_CUDA_FIRST forces them on or off; other kernels keep their
// names, and every twin is a kernel that kernelNames lists.
func TestTriggerFirst(t *testing.T) {
	rope := func(kernel string, hd int) call {
		args := make([]arg, 15)
		args[11] = i32(hd)
		return call{kernel: kernel, args: args}
	}
	step := func(hd, hd2 int) *planned {
		return &planned{calls: []call{{kernel: "rmsnorm_q8"}, {kernel: "matvec13_q4_0"}, rope("rope_store", hd),
			{kernel: "attention_split_w2"}, {kernel: "rmsnorm_q8"}, rope("rope_store_h", hd2), {kernel: "embed_norm_q8_q4_0"}}}
	}
	on := []string{"rmsnorm_q8_first", "matvec13_q4_0", "rope_store_first", "attention_split_w2", "rmsnorm_q8_first",
		"rope_store_first_h", "embed_norm_q8_q4_0"}
	off := []string{"rmsnorm_q8", "matvec13_q4_0", "rope_store", "attention_split_w2", "rmsnorm_q8", "rope_store_h", "embed_norm_q8_q4_0"}
	for _, tc := range []struct {
		hd, hd2 int
		mode    string
		want    []string
	}{
		{64, 64, "", on}, {16, 64, "", on}, {128, 128, "", off}, {64, 128, "", off},
		{128, 128, "1", on}, {64, 64, "0", off},
	} {
		pl := step(tc.hd, tc.hd2)
		triggerFirst(pl, tc.mode)
		var got []string
		for _, c := range pl.calls {
			got = append(got, c.kernel)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("heads of %d and %d dims, WEFT_CUDA_FIRST=%q: %v, want %v", tc.hd, tc.hd2, tc.mode, got, tc.want)
		}
	}
	// A K-quant layer: quantize_q8k (after the attention) and glu_q8k
	// take their twins whatever the heads, the norms and rope_store only
	// when asked.
	kstep := func(hd int) *planned {
		return &planned{calls: []call{{kernel: "rmsnorm_q8k"}, {kernel: "matvec13_q4_k"}, rope("rope_store", hd),
			{kernel: "attention_split_w2"}, {kernel: "quantize_q8k"}, {kernel: "matvec1_q4_k"}, {kernel: "rmsnorm_q8k"},
			{kernel: "matvec13_q4_k"}, {kernel: "glu_q8k"}, {kernel: "matvec1_q6_k"}}}
	}
	kname := func(first bool, name string) string {
		if first {
			return name + "_first"
		}
		return name
	}
	for _, tc := range []struct {
		hd                          int
		mode                        string
		attn, rope, quant, ffn, glu bool
	}{
		{64, "", false, false, true, false, true}, {128, "", false, false, true, false, true},
		{128, "1", true, true, true, true, true}, {64, "0", false, false, false, false, false},
		{128, "glu", false, false, false, false, true}, {128, "ffn", false, false, false, true, false},
		{64, "attn,quant", true, false, true, false, false},
	} {
		pl := kstep(tc.hd)
		triggerFirst(pl, tc.mode)
		var got []string
		for _, c := range pl.calls {
			got = append(got, c.kernel)
		}
		want := []string{kname(tc.attn, "rmsnorm_q8k"), "matvec13_q4_k", kname(tc.rope, "rope_store"), "attention_split_w2",
			kname(tc.quant, "quantize_q8k"), "matvec1_q4_k", kname(tc.ffn, "rmsnorm_q8k"), "matvec13_q4_k", kname(tc.glu, "glu_q8k"),
			"matvec1_q6_k"}
		if !slices.Equal(got, want) {
			t.Errorf("K-quants, heads of %d dims, WEFT_CUDA_FIRST=%q: %v, want %v", tc.hd, tc.mode, got, want)
		}
	}
	// No rope_store (a plan without attention): the norms keep their
	// kernels, quantize_q8k (a K-quant plan's) takes its twin.
	pl := &planned{calls: []call{{kernel: "rmsnorm_q8"}, {kernel: "quantize_q8k"}}}
	if triggerFirst(pl, ""); pl.calls[0].kernel != "rmsnorm_q8" || pl.calls[1].kernel != "quantize_q8k_first" {
		t.Errorf("a plan without rope_store took %s, %s", pl.calls[0].kernel, pl.calls[1].kernel)
	}
	for from, twin := range firstTwins {
		if !slices.Contains(kernelNames(), twin) || !slices.Contains(kernelNames(), from) {
			t.Errorf("%s → %s: not both in kernelNames", from, twin)
		}
	}
	for _, tc := range []struct {
		v   string
		err bool
	}{{"", false}, {"0", false}, {"1", false}, {"attn,rope", false}, {"ffn", false}, {"quant,glu", false}, {"2", true}, {"yes", true},
		{"attn,", true}, {"attn,x", true}} {
		t.Setenv("WEFT_CUDA_FIRST", tc.v)
		err := envPlanOptions().check()
		if (err != nil) != tc.err || err != nil && !strings.Contains(err.Error(), "WEFT_CUDA_FIRST") {
			t.Errorf("WEFT_CUDA_FIRST=%q: %v", tc.v, err)
		}
	}
}

// TestFirstKinds: WEFT_CUDA_FIRST's lists give the _first twins to the
// norms before q/k/v (attn), the norms before the GLU (ffn) and
// rope_store (rope), over a planned layer. The layer's own norm before
// q/k/v is fused with the embedding, so attn shows on the next layer's.
func TestFirstKinds(t *testing.T) {
	for _, tc := range []struct {
		mode string
		want []string
	}{
		{"0", []string{"rope_store", "rmsnorm_q8", "rmsnorm_q8"}},
		{"1", []string{"rope_store_first", "rmsnorm_q8_first", "rmsnorm_q8_first"}},
		{"attn", []string{"rope_store", "rmsnorm_q8", "rmsnorm_q8_first"}},
		{"ffn", []string{"rope_store", "rmsnorm_q8_first", "rmsnorm_q8"}},
		{"rope", []string{"rope_store_first", "rmsnorm_q8", "rmsnorm_q8"}},
		{"attn,rope", []string{"rope_store_first", "rmsnorm_q8", "rmsnorm_q8_first"}},
		// 16-dim heads take every twin by triggerFirst's rule.
		{"", []string{"rope_store_first", "rmsnorm_q8_first", "rmsnorm_q8_first"}},
	} {
		pl, err := plan(ropeLayerProgram(t), planOptions{sms: 4, first: tc.mode})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range pl.calls {
			if strings.HasPrefix(c.kernel, "rmsnorm_q8") || strings.HasPrefix(c.kernel, "rope_store") {
				got = append(got, c.kernel)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("WEFT_CUDA_FIRST=%q: %v, want %v", tc.mode, got, tc.want)
		}
	}
}

// TestSameWeights: WEFT_CUDA_PROBE_SAMEW points each listed launch's
// weight arguments at the first weight of that kernel, argument and
// shape, and leaves the rest alone.
func TestSameWeights(t *testing.T) {
	weights := func(calls []call) (ids []int) {
		for _, c := range calls {
			for _, a := range c.args {
				if a.kind == argWeight && a.id >= 0 {
					ids = append(ids, a.id)
				}
			}
		}
		return ids
	}
	for _, which := range []string{"", "all", "matvec1_", "rmsnorm", "rope_store"} {
		two, err := plan(twoLayerProgram(t), planOptions{sms: 4})
		if err != nil {
			t.Fatal(err)
		}
		before := weights(two.calls)
		sameWeights(two.calls, two.mats, which)
		after := weights(two.calls)
		changed := 0
		for i := range before {
			if before[i] != after[i] {
				changed++
				if m, n := two.mats[before[i]], two.mats[after[i]]; m.rows != n.rows || m.cols != n.cols || after[i] > before[i] {
					t.Errorf("%q: weight %d (%dx%d) became %d (%dx%d)", which, before[i], m.rows, m.cols, after[i], n.rows, n.cols)
				}
			}
		}
		if want := which != "" && which != "rope_store"; (changed > 0) != want {
			t.Errorf("%q: %d weight arguments changed", which, changed)
		}
	}
}
