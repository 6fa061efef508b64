package cuda

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/engine"
)

// TestRunView: RunView hands out what Run copies, logits or hidden states,
// from the staging memory, and refuses a batch whose rows do not fit it;
// Run of such a batch copies them straight out.
func TestRunView(t *testing.T) {
	_, e := loadRecorded(t, filepath.Join("..", "..", "testdata", "models", "llama3-tiny"), engine.Options{Context: 64, MaxBatch: 16})
	p := e.p
	toks := []int32{5, 9, 200, 17, 3, 4, 8, 1, 2, 70}
	b := &backend.Batch{Tokens: toks, Pos: make([]int32, len(toks)), Slots: make([]int32, len(toks))}
	for i := range toks {
		b.Pos[i] = int32(i)
	}
	for _, tc := range []struct {
		name     string
		selected []int32
		hidden   bool
	}{
		{"one row", []int32{9}, false},
		{"eight rows", []int32{0, 1, 2, 3, 4, 5, 6, 9}, false},
		{"hidden", []int32{3, 9}, true},
	} {
		b.Selected, b.HiddenOnly = tc.selected, tc.hidden
		width := p.Vocab
		if tc.hidden {
			width = p.Dim
		}
		want := make([]float32, len(tc.selected)*width)
		if err := e.Run(b, want); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, err := e.RunView(b)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: the view differs from Run's copy", tc.name)
		}
	}
	// Nine rows exceed the staging's smallRows: Run copies them straight
	// out, as it does its staged rows.
	b.Selected, b.HiddenOnly = []int32{0, 1, 2, 3, 4, 5, 6, 7, 9}, false
	if _, err := e.RunView(b); err == nil {
		t.Error("a view of nine rows was given")
	}
	all := make([]float32, 9*p.Vocab)
	if err := e.Run(b, all); err != nil {
		t.Fatal(err)
	}
	b.Selected = []int32{9}
	last, err := e.RunView(b)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(all[8*p.Vocab:], last) {
		t.Error("Run of nine rows and the view of the last differ")
	}
}
