package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func storiesPath(t *testing.T) string {
	return filepath.Join(sharedTestdata(t), "gguf-stories260K", "stories260K.gguf")
}

// TestLogitsCommand checks the file layout and the JSON summary, and that
// the greedy continuation is the argmax of the previous row.
func TestLogitsCommand(t *testing.T) {
	out := filepath.Join(t.TempDir(), "l.f32")
	stdout, stderr, code := runWeft(t, "logits", "-m", storiesPath(t), "--tokens", "1,403,407,261", "--generate", "5", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rep struct {
		Tokens, Generated []int32
		Rows, Vocab       int
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Rows != 9 || rep.Vocab != 512 || len(rep.Generated) != 5 || len(rep.Tokens) != 4 {
		t.Fatalf("report %+v", rep)
	}
	raw, _ := os.ReadFile(out)
	if len(raw) != 4*9*512 {
		t.Fatalf("file has %d bytes, want %d", len(raw), 4*9*512)
	}
	row := func(r int) []float32 {
		v := make([]float32, 512)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*(r*512+i):]))
		}
		return v
	}
	for i, g := range rep.Generated {
		if a := argmaxRow(row(3 + i)); a != g {
			t.Errorf("generated[%d] = %d but row %d's argmax is %d", i, g, 3+i, a)
		}
	}
	for _, bad := range [][]string{
		{"logits", "-m", storiesPath(t), "--tokens", "1,9999", "--out", out},
		{"logits", "-m", storiesPath(t), "--tokens", "1,x", "--out", out},
		{"logits", "-m", storiesPath(t), "--tokens", "1"},
	} {
		if _, stderr, code := runWeft(t, bad...); code == 0 || stderr == "" {
			t.Errorf("%v: exit %d, stderr %q", bad, code, stderr)
		}
	}
}

// TestPerplexityCommand: the --tokens form must equal the NLL computed
// from `weft logits` rows, and -f must tokenize with BOS.
func TestPerplexityCommand(t *testing.T) {
	ids := "1,403,407,261,378,432,261"
	stdout, stderr, code := runWeft(t, "perplexity", "-m", storiesPath(t), "--tokens", ids)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var nll, ppl float64
	var n int
	if _, err := fmtSscanf(stdout, &nll, &ppl, &n); err != nil || n != 7 {
		t.Fatalf("output %q: %v", stdout, err)
	}
	out := filepath.Join(t.TempDir(), "l.f32")
	if _, stderr, code := runWeft(t, "logits", "-m", storiesPath(t), "--tokens", ids, "--out", out); code != 0 {
		t.Fatal(stderr)
	}
	raw, _ := os.ReadFile(out)
	toks := []int32{1, 403, 407, 261, 378, 432, 261}
	var want float64
	for r := 0; r+1 < len(toks); r++ {
		row := make([]float32, 512)
		for i := range row {
			row[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*(r*512+i):]))
		}
		want -= logSoftmaxAt(row, toks[r+1])
	}
	if math.Abs(nll-want) > 1e-4*math.Abs(want) || math.Abs(ppl-math.Exp(want/6)) > 1e-3*ppl {
		t.Errorf("nll %g ppl %g, want %g and %g", nll, ppl, want, math.Exp(want/6))
	}

	text := filepath.Join(t.TempDir(), "story.txt")
	os.WriteFile(text, []byte("Once upon a time, there was a little girl named Lily."), 0o644)
	stdout, stderr, code = runWeft(t, "perplexity", "-m", storiesPath(t), "-f", text)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if _, err := fmtSscanf(stdout, &nll, &ppl, &n); err != nil || n < 10 || ppl < 1 || ppl > 50 {
		t.Errorf("perplexity of a story line: %q", stdout)
	}
}

func fmtSscanf(s string, nll, ppl *float64, n *int) (int, error) {
	return fmt.Sscanf(strings.TrimSpace(s), "nll=%g ppl=%g tokens=%d", nll, ppl, n)
}
