package engine

import (
	"strings"
	"testing"

	"path/filepath"

	"github.com/weftlm/weft/quant"
	"github.com/weftlm/weft/weights"

	"github.com/weftlm/weft/backend/cpu"
)

// TestF16Cache runs each fixture with its key/value cache in IEEE half
// floats against the float32 cache: the same greedy tokens, and logits
// within what rounding every cached key and value to 11 significant bits
// moves them (relative error 1e-2; seen: 3.3e-3 at most). The first
// layer's keys read back are the float32 cache's rounded to f16.
func TestF16Cache(t *testing.T) {
	for _, name := range []string{"llama3-tiny", "qwen2-tiny", "gemma3-tiny"} {
		t.Run(name, func(t *testing.T) {
			f32 := loadFixture(t, name, Options{Context: 48, MaxBatch: 8})
			f16 := loadFixture(t, name, Options{Context: 48, MaxBatch: 8, CacheType: "f16"})
			a, _ := f32.NewSequence()
			b, _ := f16.NewSequence()
			prompt := []int32{5, 9, 200, 17, 33, 1, 2, 3, 4, 5, 6, 40, 41}
			la, err := a.Forward(prompt, false)
			if err != nil {
				t.Fatal(err)
			}
			lb, err := b.Forward(prompt, false)
			if err != nil {
				t.Fatal(err)
			}
			k32, err := a.Keys(0)
			if err != nil {
				t.Fatal(err)
			}
			k16, err := b.Keys(0)
			if err != nil {
				t.Fatal(err)
			}
			for i, k := range k32 {
				if want := quant.F16ToF32(quant.F32ToF16(k)); k16[i] != want {
					t.Fatalf("key %d: %g read back, want %g (%g rounded)", i, k16[i], want, k)
				}
			}
			worst := 0.0
			for step := range 20 {
				worst = max(worst, relErr(lb, la))
				if worst > 1e-2 {
					t.Fatalf("step %d: relative error %.3g between the f16 and f32 caches", step, worst)
				}
				ta, tb := argmax(la), argmax(lb)
				if ta != tb {
					t.Fatalf("step %d: greedy token %d with the f32 cache, %d with f16", step, ta, tb)
				}
				if la, err = a.Forward([]int32{ta}, false); err != nil {
					t.Fatal(err)
				}
				if lb, err = b.Forward([]int32{tb}, false); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("worst relative error %.3g", worst)
		})
	}
}

func TestCacheTypeRejected(t *testing.T) {
	p, err := weights.Open(filepath.Join("..", "testdata", "models", "llama3-tiny"), weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := Load(p, cpu.New(1), Options{CacheType: "q4_0"}); err == nil || !strings.Contains(err.Error(), `cache type "q4_0"`) {
		t.Errorf("cache type q4_0: %v", err)
	}
}
