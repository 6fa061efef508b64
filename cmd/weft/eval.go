package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/weftlm/weft/backend/cpu"
	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/modelpath"
	"github.com/weftlm/weft/tokenizer"
	"github.com/weftlm/weft/weights"
)

func init() {
	register(command{name: "logits", summary: "write the logits of a token sequence (and greedy continuations) as raw float32", run: runLogits})
	register(command{name: "perplexity", summary: "teacher-forced negative log-likelihood of a text or token sequence", run: runPerplexity})
}

// loadedModel is a model opened for the evaluation commands.
type loadedModel struct {
	w *weights.Provider
	m *engine.Model
}

func (l *loadedModel) Close() {
	l.m.Close()
	l.w.Close()
}

func openModel(path string, threads, ctx, batch int) (*loadedModel, error) {
	if path == "" {
		return nil, fmt.Errorf("%w: -m MODEL is required", errUsage)
	}
	resolved, err := modelpath.Resolve(path)
	if err != nil {
		return nil, err
	}
	w, err := weights.Open(resolved, weights.Options{})
	if err != nil {
		return nil, err
	}
	m, err := engine.Load(w, cpu.New(threads), engine.Options{Context: ctx, MaxBatch: batch})
	if err != nil {
		w.Close()
		return nil, err
	}
	return &loadedModel{w: w, m: m}, nil
}

// parseIDs reads "1,2,3" (spaces allowed).
func parseIDs(s string) ([]int32, error) {
	var out []int32
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' }) {
		v, err := strconv.ParseInt(f, 10, 32)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("%w: bad token id %q", errUsage, f)
		}
		out = append(out, int32(v))
	}
	return out, nil
}

func checkVocab(ids []int32, vocab int) error {
	for i, id := range ids {
		if int(id) >= vocab {
			return fmt.Errorf("token %d (position %d) is outside the vocabulary of %d", id, i, vocab)
		}
	}
	return nil
}

func argmaxRow(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

func runLogits(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("logits", stderr)
	model := fs.String("m", "", "model file or directory")
	tokens := fs.String("tokens", "", "comma-separated token ids, fed as given (no BOS added)")
	generate := fs.Int("generate", 0, "then decode this many greedy tokens through the KV cache")
	out := fs.String("out", "", "file to write the logits to: float32 little-endian [rows, vocab]")
	threads := fs.Int("threads", 0, "CPU threads (0: all)")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	ids, err := parseIDs(*tokens)
	if err != nil {
		return err
	}
	if len(ids) == 0 || *out == "" || *generate < 0 {
		return fmt.Errorf("%w: need --tokens, --out and a non-negative --generate", errUsage)
	}
	lm, err := openModel(*model, *threads, len(ids)+*generate, 0)
	if err != nil {
		return err
	}
	defer lm.Close()
	v := lm.m.Vocab()
	if err := checkVocab(ids, v); err != nil {
		return err
	}
	seq, err := lm.m.NewSequence()
	if err != nil {
		return err
	}
	defer seq.Close()
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	writeRows := func(rows []float32) error {
		var b [4]byte
		for _, x := range rows {
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(x))
			if _, err := bw.Write(b[:]); err != nil {
				return err
			}
		}
		return nil
	}
	rows, err := seq.Forward(ids, true)
	if err == nil {
		err = writeRows(rows)
	}
	generated := []int32{}
	last := rows[len(rows)-v:]
	for i := 0; err == nil && i < *generate; i++ {
		if ctx.Err() != nil {
			err = ctx.Err()
			break
		}
		next := argmaxRow(last)
		generated = append(generated, next)
		if last, err = seq.Forward([]int32{next}, false); err == nil {
			err = writeRows(last)
		}
	}
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(map[string]any{
		"tokens": ids, "generated": generated, "rows": len(ids) + len(generated), "vocab": v,
	})
}

func runPerplexity(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("perplexity", stderr)
	model := fs.String("m", "", "model file or directory")
	file := fs.String("f", "", "text file, tokenized with BOS as the model does")
	tokens := fs.String("tokens", "", "comma-separated token ids instead of -f")
	threads := fs.Int("threads", 0, "CPU threads (0: all)")
	ctxLen := fs.Int("ctx", 0, "context window; longer inputs are scored in consecutive windows (0: the whole input)")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if (*file == "") == (*tokens == "") {
		return fmt.Errorf("%w: give exactly one of -f and --tokens", errUsage)
	}
	var ids []int32
	if *tokens != "" {
		var err error
		if ids, err = parseIDs(*tokens); err != nil {
			return err
		}
	} else {
		text, err := os.ReadFile(*file)
		if err != nil {
			return err
		}
		resolved, err := modelpath.Resolve(*model)
		if err != nil {
			return err
		}
		tok, err := tokenizer.Load(resolved)
		if err != nil {
			return err
		}
		ids = tok.Encode(string(text), true, false)
	}
	if len(ids) < 2 {
		return fmt.Errorf("need at least 2 tokens to score, have %d", len(ids))
	}
	window := *ctxLen
	if window <= 0 {
		window = len(ids)
	}
	lm, err := openModel(*model, *threads, window, 0)
	if err != nil {
		return err
	}
	defer lm.Close()
	v := lm.m.Vocab()
	if err := checkVocab(ids, v); err != nil {
		return err
	}
	nll, n, err := scoreTokens(ctx, lm.m, ids, window)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "nll=%.6f ppl=%.6f tokens=%d\n", nll, math.Exp(nll/float64(n)), len(ids))
	return nil
}

// scoreTokens sums −log p(ids[i] | ids[:i]) over every predicted token, in
// windows of at most window tokens (each window starts a fresh sequence).
func scoreTokens(ctx context.Context, m *engine.Model, ids []int32, window int) (nll float64, n int, err error) {
	v := m.Vocab()
	for start := 0; start+1 < len(ids); start += window {
		if ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		chunk := ids[start:min(start+window, len(ids))]
		seq, err := m.NewSequence()
		if err != nil {
			return 0, 0, err
		}
		rows, err := seq.Forward(chunk, true)
		seq.Close()
		if err != nil {
			return 0, 0, err
		}
		for i := 0; i+1 < len(chunk); i++ {
			nll -= logSoftmaxAt(rows[i*v:(i+1)*v], chunk[i+1])
			n++
		}
	}
	return nll, n, nil
}

// logSoftmaxAt returns log softmax(row)[k], computed stably in float64.
func logSoftmaxAt(row []float32, k int32) float64 {
	mx := float64(row[0])
	for _, x := range row {
		mx = max(mx, float64(x))
	}
	var sum float64
	for _, x := range row {
		sum += math.Exp(float64(x) - mx)
	}
	return float64(row[k]) - mx - math.Log(sum)
}
