package cpu_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/weftlm/weft/internal/testmodel"

	"github.com/weftlm/weft/backend/cpu"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/weights"
)

var testTokens = []int32{1, 15, 27, 3, 99, 42, 7, 64, 5, 11, 200, 31, 8, 17, 2, 90, 45, 6, 70, 13}

// runModel loads a model on the CPU backend at kernel level (""
// for the best) with threads workers and returns the teacher-forced logits
// of testTokens, fed as a prefill of the first half and decode steps for
// the rest.
func runModel(t *testing.T, path, level string, threads int) []float32 {
	t.Helper()
	t.Setenv("WEFT_CPU_KERNELS", level)
	p, err := weights.Open(path, weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	m, err := engine.Load(p, cpu.New(threads), engine.Options{Context: 64, MaxBatch: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	seq, err := m.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	toks := testTokens
	for i := range toks {
		toks[i] %= int32(m.Vocab())
	}
	half := len(toks) / 2
	out, err := seq.Forward(toks[:half], true)
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range toks[half:] {
		row, err := seq.Forward([]int32{tok}, false)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, row...)
	}
	return out
}

func relErr(a, b []float32) float64 { return testmodel.RelErr(a, b) }

// TestLevelsAgree runs models of every weight family at every kernel level
// this machine has. The SIMD levels do the same float operations in the
// same order on exact integer dot products, so they must agree bit for
// bit; the portable level rounds products separately where the assembly
// fuses them, so it must agree to 1e-5 on float weights and, on quantized
// ones, to what those roundings become if they move an activation across a
// rounding boundary of the 8-bit quantization (measured ≤ 3e-7 on these
// models; bound 1e-3), as must the exact level, whose SIMD kernels (on
// VNNI machines) and portable ones must agree bit for bit.
func TestLevelsAgree(t *testing.T) {
	root := filepath.Join("..", "..", "testdata", "models")
	cases := []struct {
		path  string
		float bool
	}{
		{filepath.Join(root, "llama3-tiny"), true},
		{filepath.Join(root, "llama3-tiny-bf16"), true},
		{filepath.Join(root, "quant", "llama3-tiny-Q4_0.gguf"), false},
		{filepath.Join(root, "quant", "llama3-tiny-Q8_0.gguf"), false},
		{filepath.Join(root, "quant", "gemma3-tiny-Q4_0.gguf"), false},
		{filepath.Join(root, "quant", "llama-256-Q4_K.gguf"), false},
		{filepath.Join(root, "quant", "qwen2-256-Q6_K.gguf"), false},
		{filepath.Join(root, "quant", "llama3-tiny-mlx4"), true},
	}
	levels := []string{"avx512vnni", "avx2", "go", "exact", "exact-go"}
	for _, c := range cases {
		t.Run(filepath.Base(c.path), func(t *testing.T) {
			if _, err := os.Stat(c.path); err != nil {
				t.Skipf("fixture missing: %v", err)
			}
			ref := runModel(t, c.path, "", 2)
			exact := map[string][]float32{}
			for _, level := range levels {
				t.Setenv("WEFT_CPU_KERNELS", level)
				if cpu.New(1).Kernels() == "" {
					continue // not on this machine
				}
				got := runModel(t, c.path, level, 2)
				if strings.HasPrefix(level, "exact") {
					exact[level] = got
				}
				e := relErr(got, ref)
				bound := 1e-3
				switch {
				case level != "go" && level != "exact" && level != "exact-go":
					bound = 0
				case c.float:
					bound = 1e-5
				}
				t.Logf("%s: relative difference %.3g", level, e)
				if e > bound {
					t.Errorf("%s: logits differ from the best level's by %.3g (bound %g)", level, e, bound)
				}
			}
			// The exact level's SIMD kernels keep its contract: the same
			// logits as the portable ones, bit for bit.
			if a, b := exact["exact"], exact["exact-go"]; a != nil && b != nil && !slices.Equal(a, b) {
				t.Errorf("exact and exact-go differ by %.3g", relErr(a, b))
			}
		})
	}
}

// TestUnknownLevel: a level the machine lacks fails at compile time,
// naming the variable.
func TestUnknownLevel(t *testing.T) {
	t.Setenv("WEFT_CPU_KERNELS", "sse9")
	b := cpu.New(1)
	if _, err := b.Compile(nil); err == nil {
		t.Fatal("compiled with an unknown kernel level")
	}
}

// TestRunAllocatesNothing: decode steps and prefill chunks replay the plan
// without allocating.
func TestRunAllocatesNothing(t *testing.T) {
	path := filepath.Join("..", "..", "testdata", "models", "quant", "llama-256-Q4_K.gguf")
	if _, err := os.Stat(path); err != nil {
		t.Skipf("fixture missing: %v", err)
	}
	p, err := weights.Open(path, weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	m, err := engine.Load(p, cpu.New(2), engine.Options{Context: 256, MaxBatch: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	seq, _ := m.NewSequence()
	logits := make([]float32, m.Vocab())
	one, chunk := []int32{3}, testTokens[:16]
	for name, toks := range map[string][]int32{"decode": one, "prefill": chunk} {
		allocs := testing.AllocsPerRun(5, func() {
			if seq.Pos()+len(toks) > m.Context() {
				seq.Rewind(0)
			}
			if err := seq.ForwardInto(toks, false, logits); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %g allocations per step", name, allocs)
		}
	}
}

// TestThreadsAgree: the logits do not depend on the worker count, bit for
// bit, at every kernel level. stories260K's FFN is 172 wide, not a whole
// number of 8-lane vectors, which once made a GLU over several rows round
// a row's tail differently depending on how rows were shared out.
func TestThreadsAgree(t *testing.T) {
	root := filepath.Join("..", "..", "testdata", "models")
	paths := []string{filepath.Join(root, "llama3-tiny"), filepath.Join(root, "quant", "llama3-tiny-Q4_0.gguf"),
		filepath.Join(root, "quant", "qwen2-256-Q6_K.gguf")}
	stories := filepath.Join("..", "..", "..", "shared", "testdata", "gguf-stories260K", "stories260K.gguf")
	if _, err := os.Stat(stories); err == nil {
		paths = append(paths, stories)
	} else {
		t.Logf("shared test data not available, stories260K left out: %v", err)
	}
	for _, path := range paths {
		for _, level := range []string{"avx512vnni", "avx2", "go"} {
			t.Setenv("WEFT_CPU_KERNELS", level)
			if cpu.New(1).Kernels() == "" {
				continue // not on this machine
			}
			ref := runModel(t, path, level, 1)
			for _, threads := range []int{2, 3, 4} {
				got := runModel(t, path, level, threads)
				for i := range ref {
					if got[i] != ref[i] {
						t.Fatalf("%s, %s, %d threads: logit %d is %v, one thread gives %v", filepath.Base(path), level, threads, i, got[i], ref[i])
					}
				}
			}
		}
	}
}
