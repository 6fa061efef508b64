package weft

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weftlm/weft/constrain"
	"github.com/weftlm/weft/internal/testmodel"
	"github.com/weftlm/weft/weights"
)

func sharedFile(t testing.TB, rel string) string {
	t.Helper()
	p := filepath.Join("..", "shared", "testdata", rel)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("shared test data %s not available: %v", rel, err)
	}
	return p
}

func loadStories(t *testing.T, opts ...Option) *Model {
	t.Helper()
	m, err := Load(context.Background(), sharedFile(t, "gguf-stories260K/stories260K.gguf"), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func collect(t *testing.T, seq func(func(Token, error) bool)) (string, []int32, Token) {
	t.Helper()
	var sb strings.Builder
	var ids []int32
	var last Token
	for tok, err := range seq {
		if err != nil {
			t.Fatal(err)
		}
		sb.WriteString(tok.Text)
		if !tok.Done {
			ids = append(ids, tok.ID)
		}
		last = tok
	}
	return sb.String(), ids, last
}

// TestGreedyStories: greedy decoding from BOS reproduces llama2.c's
// published output byte for byte.
func TestGreedyStories(t *testing.T) {
	want, err := os.ReadFile(sharedFile(t, "llama2c-stories260K/expected_greedy_t0.txt"))
	if err != nil {
		t.Fatal(err)
	}
	m := loadStories(t)
	text, ids, last := collect(t, m.Generate(context.Background(), "", WithTemperature(0), WithMaxTokens(256)))
	if text != string(want) {
		t.Fatalf("got %q\nwant %q", text, want)
	}
	if len(ids) != 256 || !last.Done || last.FinishReason != "length" {
		t.Errorf("%d tokens, final %+v", len(ids), last)
	}
	mt := m.Metrics()
	if mt.LastGeneratedTokens != 256 || mt.LastPromptTokens != 1 || mt.DecodeTokensPerSec <= 0 || mt.TimeToFirstToken <= 0 || mt.PeakMemoryBytes <= 0 {
		t.Errorf("metrics %+v", mt)
	}
}

// TestSeededSampling: the same seed gives the same tokens, whatever the
// thread count; another seed gives others.
func TestSeededSampling(t *testing.T) {
	gen := func(threads int, seed uint64) []int32 {
		m := loadStories(t, WithThreads(threads))
		_, ids, _ := collect(t, m.Generate(context.Background(), "Once upon a time", WithTemperature(1), WithTopP(0.9), WithSeed(seed), WithMaxTokens(40)))
		return ids
	}
	a, b, c := gen(1, 42), gen(2, 42), gen(2, 7)
	if !equalIDs(a, b) {
		t.Errorf("seed 42 differs between 1 and 2 threads:\n%v\n%v", a, b)
	}
	if equalIDs(a, c) {
		t.Errorf("seeds 42 and 7 gave the same tokens")
	}
}

func equalIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestStopStrings: a stop string spanning tokens ends generation and is
// never emitted, nor is anything after it.
func TestStopStrings(t *testing.T) {
	m := loadStories(t)
	full, _, _ := collect(t, m.Generate(context.Background(), "", WithTemperature(0), WithMaxTokens(60)))
	i := strings.Index(full, "little girl")
	if i < 0 {
		t.Fatalf("expected text lacks the probe: %q", full)
	}
	text, _, last := collect(t, m.Generate(context.Background(), "", WithTemperature(0), WithMaxTokens(60), WithStop("zzz", "e gi")))
	want := full[:strings.Index(full, "e gi")]
	if text != want || last.FinishReason != "stop" {
		t.Errorf("got %q (%s), want %q", text, last.FinishReason, want)
	}
}

func TestOverflow(t *testing.T) {
	m := loadStories(t, WithContext(32))
	long := strings.Repeat("Lily and Tom went to the park. ", 10)
	var tooLong *PromptTooLongError
	for _, err := range m.Generate(context.Background(), long) {
		if !errors.As(err, &tooLong) || tooLong.Context != 32 {
			t.Fatalf("got %v", err)
		}
		break
	}
	_, ids, last := collect(t, m.Generate(context.Background(), long, WithOverflow(OverflowTruncate), WithTemperature(0)))
	if len(last.Notices) != 1 || !strings.Contains(last.Notices[0], "prompt truncated from") || len(ids) == 0 {
		t.Errorf("truncate: %d tokens, notices %v", len(ids), last.Notices)
	}
	_, ids, last = collect(t, m.Generate(context.Background(), "Once", WithOverflow(OverflowShift), WithTemperature(0), WithMaxTokens(70)))
	if len(ids) != 70 || len(last.Notices) == 0 || !strings.Contains(last.Notices[0], "context shifted") {
		t.Errorf("shift: %d tokens, notices %v", len(ids), last.Notices)
	}
}

func TestCancel(t *testing.T) {
	m := loadStories(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	var gotErr error
	for tok, err := range m.Generate(ctx, "", WithTemperature(0), WithMaxTokens(200)) {
		if err != nil {
			gotErr = err
			break
		}
		n++
		if n == 5 && !tok.Done {
			cancel()
		}
	}
	if !errors.Is(gotErr, context.Canceled) || n != 5 {
		t.Errorf("after cancel: %d tokens, error %v", n, gotErr)
	}
	// Breaking out early returns the slot: the next request runs.
	for range m.Generate(context.Background(), "") {
		break
	}
	_, ids, _ := collect(t, m.Generate(context.Background(), "", WithMaxTokens(3)))
	if len(ids) != 3 {
		t.Errorf("after an early break: %d tokens", len(ids))
	}
}

// TestBatchGenerateMatchesAlone: a prompt gives the same greedy text in a
// batch as alone.
func TestBatchGenerateMatchesAlone(t *testing.T) {
	m := loadStories(t, WithParallel(4), WithBatch(16))
	prompts := []string{"Once upon a time", "The cat", "Lily and Tom", "One day, a little", "Tim had a big"}
	alone := make([]string, len(prompts))
	for i, p := range prompts {
		alone[i], _, _ = collect(t, m.Generate(context.Background(), p, WithTemperature(0), WithMaxTokens(30)))
	}
	got, err := m.BatchGenerate(context.Background(), prompts, WithTemperature(0), WithMaxTokens(30))
	if err != nil {
		t.Fatal(err)
	}
	for i := range prompts {
		if got[i].Text != alone[i] || got[i].FinishReason != "length" || len(got[i].Tokens) != 30 {
			t.Errorf("prompt %d: batch %q (%s), alone %q", i, got[i].Text, got[i].FinishReason, alone[i])
		}
	}
}

func TestClassifyEmbedInspect(t *testing.T) {
	m := loadStories(t, WithParallel(2))
	ctx := context.Background()
	cls, err := m.Classify(ctx, []string{"Once upon a", "The dog", "She was very"})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cls {
		if len(c.Logits) != 512 || c.Text == "" {
			t.Errorf("classification %d: %d logits, text %q", i, len(c.Logits), c.Text)
		}
	}
	// The batch's first answer equals a one-token greedy generation.
	_, ids, _ := collect(t, m.Generate(ctx, "Once upon a", WithTemperature(0), WithMaxTokens(1)))
	if ids[0] != cls[0].Token {
		t.Errorf("classify token %d, generate %d", cls[0].Token, ids[0])
	}
	embs, err := m.Embed(ctx, []string{"a happy dog", "a happy dog", "the sea"}, WithNormalize(true))
	if err != nil {
		t.Fatal(err)
	}
	if len(embs) != 3 || len(embs[0]) != 64 || !equalFloats(embs[0], embs[1]) || equalFloats(embs[0], embs[2]) {
		t.Errorf("embeddings wrong shape or not deterministic")
	}
	var norm float64
	for _, x := range embs[2] {
		norm += float64(x) * float64(x)
	}
	if norm < 0.999 || norm > 1.001 {
		t.Errorf("normalised embedding has squared norm %g", norm)
	}
	ai, err := m.InspectAttention(ctx, "Once upon a time")
	if err != nil {
		t.Fatal(err)
	}
	if ai.Layers != 5 || ai.KVHeads != 4 || ai.HeadDim != 8 || len(ai.Keys(4, 3, len(ai.Tokens)-1)) != 8 {
		t.Errorf("inspection %d layers %d heads %d dims", ai.Layers, ai.KVHeads, ai.HeadDim)
	}
	// At position 0 RoPE is the identity, so the key is k_proj(norm(emb(BOS))).
	if k := ai.Keys(0, 0, 0); k[0] == 0 && k[1] == 0 {
		t.Errorf("position 0 keys are zero")
	}
}

func equalFloats(a, b []float32) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return len(a) == len(b)
}

func TestLoadErrorsAndClose(t *testing.T) {
	ctx := context.Background()
	if _, err := Load(ctx, filepath.Join(t.TempDir(), "nope.gguf")); err == nil {
		t.Error("loaded a missing file")
	}
	p := sharedFile(t, "gguf-stories260K/stories260K.gguf")
	if _, err := Load(ctx, p, WithMemoryLimit(1<<20)); err == nil || !strings.Contains(err.Error(), "over the limit") {
		t.Errorf("memory limit: %v", err)
	}
	if _, err := Load(ctx, p, WithBackend("tpu")); err == nil || !strings.Contains(err.Error(), `unknown backend "tpu"`) {
		t.Errorf("backend: %v", err)
	}
	var stages []string
	m, err := Load(ctx, p, WithProgress(func(pr Progress) {
		if len(stages) == 0 || stages[len(stages)-1] != pr.Stage {
			stages = append(stages, pr.Stage)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(stages, ",") != "open,weights,compile,warmup" {
		t.Errorf("progress stages %v", stages)
	}
	if in := m.Info(); in.Parameters == 0 || in.Architecture != "llama" || !in.HasTokenizer || in.Context != 2048 {
		t.Errorf("info %+v", in)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	for _, err := range m.Generate(ctx, "x") {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("generate after close: %v", err)
		}
	}
	if _, err := m.Classify(ctx, []string{"x"}); !errors.Is(err, ErrClosed) {
		t.Errorf("classify after close: %v", err)
	}
}

// TestConcurrentGenerate: requests running at once are decoded together
// (continuous batching) and each gets what it gets alone.
func TestConcurrentGenerate(t *testing.T) {
	m := loadStories(t, WithParallel(4))
	ctx := context.Background()
	prompts := []string{"Once upon a time", "The little dog", "Lily saw a bird", "Tom was sad", "The sun", "A big red ball"}
	alone := make([]string, len(prompts))
	for i, p := range prompts {
		alone[i], _, _ = collect(t, m.Generate(ctx, p, WithTemperature(0), WithMaxTokens(25)))
	}
	got := make([]string, len(prompts))
	errs := make([]error, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var sb strings.Builder
			for tok, err := range m.Generate(ctx, p, WithTemperature(0), WithMaxTokens(25)) {
				if err != nil {
					errs[i] = err
					return
				}
				sb.WriteString(tok.Text)
			}
			got[i] = sb.String()
		}()
	}
	wg.Wait()
	for i := range prompts {
		if errs[i] != nil || got[i] != alone[i] {
			t.Errorf("prompt %d: concurrent %q (%v), alone %q", i, got[i], errs[i], alone[i])
		}
	}
}

// TestBackendChoice: "auto" falls back to the CPU where no GPU can be used;
// "cuda" says why it cannot.
func TestBackendChoice(t *testing.T) {
	p := sharedFile(t, "gguf-stories260K/stories260K.gguf")
	m, err := Load(context.Background(), p, WithBackend("auto"))
	if err != nil {
		t.Fatal(err)
	}
	gpu := m.Info().Backend != "cpu"
	m.Close()
	if gpu {
		t.Skip("a GPU is present: nothing to fall back from")
	}
	_, err = Load(context.Background(), p, WithBackend("cuda"))
	if err == nil || !strings.Contains(err.Error(), "cuda") {
		t.Errorf("cuda without a GPU: %v", err)
	}
}

// templateStories is the story model with a real chat template.
func templateStories(t *testing.T) string { return testmodel.StoriesWithTemplate(t) }

func TestChatAndTokens(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, templateStories(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	msgs := []Message{{Role: "user", Content: "Tell me a story."}}
	text, hasBOS, err := m.ChatPrompt(msgs)
	if err != nil {
		t.Fatal(err)
	}
	want := "<bos><start_of_turn>user\nTell me a story.<end_of_turn>\n<start_of_turn>model\n"
	if text != strings.Replace(want, "<bos>", "<s>", 1) || !hasBOS {
		t.Fatalf("rendered %q (BOS written: %v)", text, hasBOS)
	}
	// The template wrote BOS: the prompt holds exactly one.
	ids := m.Tokenizer().Encode(text, false, true)
	if ids[0] != m.Tokenizer().BOS() || ids[1] == m.Tokenizer().BOS() {
		t.Fatalf("prompt ids start %v", ids[:3])
	}
	reply, gen, last := collect(t, m.Chat(ctx, msgs, WithTemperature(0), WithMaxTokens(20)))
	if len(gen) == 0 || reply == "" || !last.Done {
		t.Fatalf("chat reply %q, %d tokens", reply, len(gen))
	}
	// Chat is Generate from the rendered, special-parsed prompt.
	again, _, _ := collect(t, m.GenerateTokens(ctx, ids, WithTemperature(0), WithMaxTokens(20)))
	if again != reply {
		t.Errorf("GenerateTokens %q, Chat %q", again, reply)
	}
	// A model without a template says so.
	plain := loadStories(t)
	for _, err := range plain.Chat(ctx, msgs) {
		if !errors.Is(err, ErrNoChatTemplate) {
			t.Errorf("chat without a template: %v", err)
		}
	}
}

// TestContextFullKeepsLastToken: when the context fills, the token sampled
// from the last position is still emitted (it needs no room), and the
// text is exactly the decoded ids.
func TestContextFullKeepsLastToken(t *testing.T) {
	m := loadStories(t, WithContext(16))
	prompt, err := m.PromptTokens("Once upon a time")
	if err != nil {
		t.Fatal(err)
	}
	text, ids, last := collect(t, m.Generate(context.Background(), "Once upon a time", WithTemperature(0)))
	if last.FinishReason != "length" || !last.Sampled || len(ids)+1 != 16-len(prompt)+1 {
		// ids holds the non-final items; the final one carries the last token.
		t.Fatalf("%d tokens before the last, prompt %d, final %+v", len(ids), len(prompt), last)
	}
	all := append(ids, last.ID)
	if want := m.Tokenizer().Decode(all); text != want {
		t.Errorf("text %q, decoded ids %q", text, want)
	}
}

// TestJSONMode: a model that knows nothing of JSON still produces one
// valid JSON object when constrained, and stops when it closes.
func TestJSONMode(t *testing.T) {
	m := loadStories(t)
	for _, seed := range []uint64{1, 2, 3} {
		text, _, last := collect(t, m.Generate(context.Background(), "Once upon a time", WithJSON(), WithSeed(seed), WithTemperature(1), WithMaxTokens(300)))
		if last.FinishReason == "length" {
			continue // the object may not close within the limit
		}
		var obj map[string]any
		if err := json.Unmarshal([]byte(text), &obj); err != nil {
			t.Errorf("seed %d: %q is not a JSON object: %v", seed, text, err)
		}
	}
	text, _, _ := collect(t, m.Generate(context.Background(), "", WithJSON(), WithTemperature(0), WithMaxTokens(40)))
	if !strings.HasPrefix(strings.TrimSpace(text), "{") {
		t.Errorf("greedy JSON output %q does not open an object", text)
	}
}

// TestCloseWhileGenerating: Close ends running generations with ErrClosed
// and returns; nothing hangs.
func TestCloseWhileGenerating(t *testing.T) {
	m, err := Load(context.Background(), sharedFile(t, "gguf-stories260K/stories260K.gguf"), WithParallel(2))
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{}, 4)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			var last error
			first := true
			for _, err := range m.Generate(context.Background(), "Once", WithMaxTokens(100000), WithOverflow(OverflowShift)) {
				if first {
					started <- struct{}{}
					first = false
				}
				if err != nil {
					last = err
				}
			}
			errs <- last
		}()
	}
	<-started
	<-started
	done := make(chan error, 1)
	go func() { done <- m.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close hung")
	}
	for range 4 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("a generation ended with %v, want ErrClosed", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a generation never ended")
		}
	}
}

// TestJSONSchemaMode: with a schema, every output is a prefix the schema
// allows, and a finished one is a document that follows it.
func TestJSONSchemaMode(t *testing.T) {
	m := loadStories(t)
	schema := []byte(`{"type":"object","properties":{"mood":{"enum":["happy","sad"]},"n":{"type":"integer"}},"required":["mood","n"]}`)
	s, err := constrain.CompileSchema(schema)
	if err != nil {
		t.Fatal(err)
	}
	finished := 0
	for _, seed := range []uint64{1, 2, 3, 4, 5, 6} {
		text, _, last := collect(t, m.Generate(context.Background(), "Once upon a time", WithJSONSchema(schema), WithSeed(seed), WithTemperature(1), WithMaxTokens(120)))
		j := constrain.NewSchemaJSON(s)
		if !j.FeedString(text) {
			t.Fatalf("seed %d: %q leaves the schema", seed, text)
		}
		if last.FinishReason == "length" {
			continue
		}
		finished++
		var obj struct {
			Mood string `json:"mood"`
			N    *int   `json:"n"`
		}
		if err := json.Unmarshal([]byte(text), &obj); err != nil || (obj.Mood != "happy" && obj.Mood != "sad") || obj.N == nil {
			t.Errorf("seed %d: %q does not follow the schema (%v)", seed, text, err)
		}
	}
	t.Logf("%d of 6 documents finished", finished)
	if finished == 0 {
		t.Error("no generation finished its document within 120 tokens")
	}
	var gotErr error
	for _, err := range m.Generate(context.Background(), "x", WithJSONSchema([]byte(`{"type":"string"}`))) {
		gotErr = err
	}
	if gotErr == nil || !strings.Contains(gotErr.Error(), "top level") {
		t.Errorf("a schema whose top level is a string: %v", gotErr)
	}
}

// TestPromptCache: a request whose prompt starts with what an earlier
// request left in a slot's cache feeds only the rest, and generates what
// a fresh model does.
func TestPromptCache(t *testing.T) {
	m := loadStories(t, WithParallel(2))
	opts := []GenerateOption{WithTemperature(0), WithMaxTokens(20)}
	first, _, _ := collect(t, m.Generate(context.Background(), "Once upon a time", opts...))
	second := "Once upon a time" + first + " Then"
	before := m.Metrics().CachedPromptTokens
	got, _, _ := collect(t, m.Generate(context.Background(), second, opts...))
	cached := m.Metrics().CachedPromptTokens - before
	if cached < int64(len(m.Tokenizer().Encode("Once upon a time", true, false))) {
		t.Errorf("%d prompt tokens came from the cache, want at least the first prompt's", cached)
	}
	want, _, _ := collect(t, loadStories(t).Generate(context.Background(), second, opts...))
	if got != want {
		t.Errorf("with the cached prefix: %q\nfresh model:           %q", got, want)
	}
}

// TestEstimateMemoryCacheType: an f16 cache halves the KV part of the
// estimate.
func TestEstimateMemoryCacheType(t *testing.T) {
	w, err := weights.Open(sharedFile(t, "gguf-stories260K/stories260K.gguf"), weights.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c := w.Config
	kv32 := int64(c.NLayers) * 2 * 256 * int64(c.KVDim()) * 2 * 4
	f32, f16 := estimateMemory(w, 256, 2, 8, false), estimateMemory(w, 256, 2, 8, true)
	if f32-f16 != kv32/2 {
		t.Errorf("f32 cache %d bytes, f16 %d: the difference %d, want %d", f32, f16, f32-f16, kv32/2)
	}
}
