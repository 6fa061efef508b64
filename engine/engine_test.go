package engine

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/weftlm/weft/backend/cpu"
	"github.com/weftlm/weft/internal/testmodel"
	"github.com/weftlm/weft/weights"
)

func sharedFile(t testing.TB, rel string) string {
	t.Helper()
	p := filepath.Join("..", "..", "shared", "testdata", rel)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("shared test data %s not available: %v", rel, err)
	}
	return p
}

func argmax(v []float32) int32 { return testmodel.Argmax(v) }

func relErr(a, b []float32) float64 { return testmodel.RelErr(a, b) }

// TestStoriesGreedy decodes 256 tokens greedily from BOS with the real
// stories260K model and compares with the ids llama2.c's run.c produces.
func TestStoriesGreedy(t *testing.T) {
	var want struct {
		IDs []int32 `json:"ids_including_bos"`
	}
	b, err := os.ReadFile(sharedFile(t, "llama2c-stories260K/DERIVED_greedy_ids_t0.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	p, err := weights.Open(sharedFile(t, "gguf-stories260K/stories260K.gguf"), weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, threads := range []int{1, 2} {
		m, err := Load(p, cpu.New(threads), Options{Context: 512})
		if err != nil {
			t.Fatal(err)
		}
		seq, _ := m.NewSequence()
		got := []int32{want.IDs[0]}
		logits, err := seq.Forward(got, false)
		if err != nil {
			t.Fatal(err)
		}
		for len(got) < len(want.IDs) {
			next := argmax(logits)
			got = append(got, next)
			if len(got) == len(want.IDs) {
				break
			}
			if logits, err = seq.Forward([]int32{next}, false); err != nil {
				t.Fatal(err)
			}
		}
		for i := range want.IDs {
			if got[i] != want.IDs[i] {
				t.Fatalf("threads %d: token %d is %d, want %d\n got %v\nwant %v", threads, i, got[i], want.IDs[i], got[:i+1], want.IDs[:i+1])
			}
		}
		seq.Close()
		m.Close()
	}
}
