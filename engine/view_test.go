package engine

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/weftlm/weft/backend/cpu"
	"github.com/weftlm/weft/internal/testmodel"
	"github.com/weftlm/weft/weights"
)

// TestForwardView: ForwardView returns the logits ForwardInto writes, for
// prompts of one chunk and of several, whether the backend hands its rows
// out in place (a backend.Viewer) or the model's scratch holds them.
func TestForwardView(t *testing.T) {
	p, err := weights.Open(filepath.Join("..", "testdata", "models", "llama3-tiny"), weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	viewing := &testmodel.Viewing{Backend: cpu.New(2)}
	opts := Options{Context: 64, MaxBatch: 4, Slots: 2}
	for _, tc := range []struct {
		name  string
		load  func() (*Model, error)
		views int
	}{
		{"scratch", func() (*Model, error) { return Load(p, cpu.New(2), opts) }, 0},
		{"viewer", func() (*Model, error) { return Load(p, viewing, opts) }, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := tc.load()
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			into, err := m.NewSequence()
			if err != nil {
				t.Fatal(err)
			}
			defer into.Close()
			view, err := m.NewSequence()
			if err != nil {
				t.Fatal(err)
			}
			defer view.Close()
			viewing.Views = 0
			want := make([]float32, m.Vocab())
			// A prompt of three chunks, then two single tokens.
			for _, toks := range [][]int32{{5, 9, 200, 17, 3, 4, 8, 1, 2, 70}, {11}, {12}} {
				if err := into.ForwardInto(toks, false, want); err != nil {
					t.Fatal(err)
				}
				got, err := view.ForwardView(toks)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("after %v: ForwardView's logits differ from ForwardInto's", toks)
				}
			}
			if view.Pos() != into.Pos() {
				t.Errorf("position %d after the views, want %d", view.Pos(), into.Pos())
			}
			if viewing.Views != tc.views {
				t.Errorf("%d runs viewed in place, want %d", viewing.Views, tc.views)
			}
			if _, err := view.ForwardView(nil); err == nil {
				t.Error("no tokens were accepted")
			}
			var ce *ContextError
			if _, err := view.ForwardView(make([]int32, 64)); !errors.As(err, &ce) {
				t.Errorf("a prompt past the context: %v, want a ContextError", err)
			}
		})
	}
}
