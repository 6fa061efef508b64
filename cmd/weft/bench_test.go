package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestBenchCommand runs a tiny pp/tg benchmark on stories260K and checks
// the JSON fields, the table form and the usage errors.
func TestBenchCommand(t *testing.T) {
	model := storiesPath(t)
	stdout, stderr, code := runWeft(t, "bench", "-m", model, "-p", "16", "-n", "4", "-r", "2", "--threads", "1", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res []benchResult
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v in %s", err, stdout)
	}
	st, err := os.Stat(model)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || res[0].Test != "pp16" || res[1].Test != "tg4" {
		t.Fatalf("tests %+v, want pp16 and tg4", res)
	}
	for _, r := range res {
		if !(r.TokPerSec > 0) || r.Stddev < 0 || r.Threads != 1 || len(r.Samples) != 2 || r.Backend != "cpu" {
			t.Errorf("%+v", r)
		}
		// the tensors are most of the file but not all of it
		if r.ModelBytes == 0 || r.ModelBytes > uint64(st.Size()) {
			t.Errorf("%s: model_bytes %d for a file of %d", r.Test, r.ModelBytes, st.Size())
		}
	}

	stdout, stderr, code = runWeft(t, "bench", "-m", model, "-p", "0", "-n", "2", "-r", "1")
	if code != 0 || !strings.Contains(stdout, "tg2") || strings.Contains(stdout, "pp") || !strings.Contains(stdout, "| cpu ") {
		t.Fatalf("table: exit %d, %q %q", code, stdout, stderr)
	}

	// At a depth: the context holds 40 tokens before each test.
	stdout, stderr, code = runWeft(t, "bench", "-m", model, "-d", "40", "-p", "8", "-n", "3", "-r", "1", "--json")
	if code != 0 {
		t.Fatalf("depth: exit %d: %s", code, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || len(res) != 2 || res[0].Test != "pp8 @ d40" || res[1].Test != "tg3 @ d40" {
		t.Fatalf("depth: %v, tests %+v", err, res)
	}

	// Several sequences decoding together, counted together, with an f16
	// cache.
	stdout, stderr, code = runWeft(t, "bench", "-m", model, "-d", "10", "-p", "0", "-n", "5", "-r", "1", "--parallel", "3", "--cache-type", "f16", "--json")
	if code != 0 {
		t.Fatalf("parallel: exit %d: %s", code, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || len(res) != 1 || res[0].Test != "tg5 x3 @ d10" || !(res[0].TokPerSec > 0) {
		t.Fatalf("parallel: %v, tests %+v", err, res)
	}

	// Draws fed back, a step queued ahead where the backend can.
	stdout, stderr, code = runWeft(t, "bench", "-m", model, "-d", "10", "-p", "0", "-n", "6", "-r", "2", "--parallel", "2", "--draw", "--json")
	if code != 0 {
		t.Fatalf("drawn: exit %d: %s", code, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || len(res) != 1 || res[0].Test != "tg6 drawn x2 @ d10" || !(res[0].TokPerSec > 0) {
		t.Fatalf("drawn: %v, tests %+v", err, res)
	}

	// The same with llama.cpp's sampling chain.
	stdout, stderr, code = runWeft(t, "bench", "-m", model, "-p", "0", "-n", "6", "-r", "1", "--draw", "--temp", "0.8", "--top-k", "40",
		"--top-p", "0.95", "--min-p", "0.05", "--json")
	if code != 0 {
		t.Fatalf("drawn, top-k: exit %d: %s", code, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || len(res) != 1 || res[0].Test != "tg6 drawn T0.8 k40 p0.95 m0.05" || !(res[0].TokPerSec > 0) {
		t.Fatalf("drawn, top-k: %v, tests %+v", err, res)
	}

	// And with the OpenAI API's usual one: top-p without a top-k.
	stdout, stderr, code = runWeft(t, "bench", "-m", model, "-p", "0", "-n", "6", "-r", "1", "--draw", "--temp", "0.8",
		"--top-p", "0.9", "--min-p", "0.05", "--json")
	if code != 0 {
		t.Fatalf("drawn, top-p: exit %d: %s", code, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || len(res) != 1 || res[0].Test != "tg6 drawn T0.8 p0.9 m0.05" || !(res[0].TokPerSec > 0) {
		t.Fatalf("drawn, top-p: %v, tests %+v", err, res)
	}

	// With log-probabilities, as an API request asks for them.
	stdout, stderr, code = runWeft(t, "bench", "-m", model, "-p", "0", "-n", "6", "-r", "1", "--draw", "--logprobs", "5", "--json")
	if code != 0 {
		t.Fatalf("drawn, logprobs: exit %d: %s", code, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || len(res) != 1 || res[0].Test != "tg6 drawn lp5" || !(res[0].TokPerSec > 0) {
		t.Fatalf("drawn, logprobs: %v, tests %+v", err, res)
	}

	for _, bad := range [][]string{
		{"bench", "-m", model, "--temp", "0.8"},                            // a chain without --draw
		{"bench", "-m", model, "--logprobs", "2"},                          // log-probabilities without --draw
		{"bench", "-m", model, "--draw", "--logprobs", "21"},               // past the API's top_logprobs
		{"bench", "-m", model, "--draw", "--temp", "0.8", "--top-k", "65"}, // past the device's top-k
		{"bench", "-m", model, "--draw", "--temp", "-1"},
		{"bench", "-m", model, "--draw", "--temp", "1", "--top-k", "5", "--min-p", "2"},
		{"bench"},
		{"bench", "-m", model, "--parallel", "0"},
		{"bench", "-m", model, "--cache-type", "f8"},
		{"bench", "-m", model, "-d", "-1"},
		{"bench", "-m", model, "-d", "100000"}, // past the model's context
		{"bench", "-m", model, "-p", "0", "-n", "0"},
		{"bench", "-m", model, "-r", "0"},
		{"bench", "-m", model, "--threads", "0"},
		{"bench", "-m", model, "-p", "100000"},
		{"bench", "-m", "/nonexistent.gguf"},
		{"bench", "-m", model, "--backend", "tpu"},
		{"bench", "-m", model, "--tensor-split", "1,x"},
		{"bench", "-m", model, "--tensor-split", "1,1"}, // needs a GPU backend
	} {
		if _, stderr, code := runWeft(t, bad...); code == 0 || stderr == "" {
			t.Errorf("%v: exit %d, stderr %q", bad, code, stderr)
		}
	}
}

func TestMeanStddev(t *testing.T) {
	for _, c := range []struct {
		xs       []float64
		mean, sd float64
	}{
		{[]float64{5}, 5, 0},
		{[]float64{1, 3}, 2, 1.4142135623730951},
		{[]float64{2, 4, 4, 4, 5, 5, 7, 9}, 5, 2.138089935299395},
	} {
		m, s := meanStddev(c.xs)
		if m != c.mean || s-c.sd > 1e-12 || c.sd-s > 1e-12 {
			t.Errorf("%v: %g ± %g, want %g ± %g", c.xs, m, s, c.mean, c.sd)
		}
	}
}

// TestInfoPlacement: weft info -m prints where the model would run (the
// CPU alone on this GPU-less machine) and fails on a model it cannot open.
func TestInfoPlacement(t *testing.T) {
	stdout, stderr, code := runWeft(t, "info", "-m", storiesPath(t), "--ctx", "128")
	if code != 0 || !strings.Contains(stdout, "cpu: ") || !strings.Contains(stdout, "placement of ") || !strings.Contains(stdout, "(context 128)") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if _, stderr, code := runWeft(t, "info", "-m", "/nonexistent.gguf"); code != 1 || !strings.Contains(stderr, "nonexistent.gguf") {
		t.Errorf("missing model: exit %d, stderr %q", code, stderr)
	}
	if _, stderr, code := runWeft(t, "info", "extra"); code != 2 || !strings.Contains(stderr, "takes no arguments") {
		t.Errorf("argument: exit %d, stderr %q", code, stderr)
	}
}
