package server

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weftlm/weft"
)

// TestOpenAINodeClient runs OpenAI's official Node client
// (test/openai/client.mjs, the openai package pinned in its lockfile)
// against the server on loopback: models, a completion whole and
// streamed, embeddings, chat through a real template whole and streamed,
// and error cases. The expected texts are the model's own greedy output
// for the same requests.
func TestOpenAINodeClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed; the OpenAI client test needs Node.js 20 or later")
	}
	dir := filepath.Join("..", "test", "openai")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err != nil {
		t.Skipf("the openai npm package is not installed; run `npm ci` in test/openai (%v)", err)
	}
	m := load(t, chatModelPath(t), 4, 256)
	_, ts := newTestServer(t, m, Options{APIKey: "test-key"})

	ctx := context.Background()
	expect := map[string]any{"model": "stories-chat", "dim": m.Info().Config.Dim}
	text := func(seq func(func(weft.Token, error) bool)) string { return joined(reference(t, seq)) }
	expect["completion"] = text(m.Generate(ctx, "Once upon a time", weft.WithTemperature(0), weft.WithMaxTokens(24)))
	expect["completionPromptTokens"] = len(mustIDs(t, m, "Once upon a time"))
	msgs := []weft.Message{{Role: "user", Content: "Tell me a story"}}
	expect["chat"] = text(m.Chat(ctx, msgs, weft.WithTemperature(0), weft.WithMaxTokens(24)))
	ids, err := m.ChatTokens(msgs)
	if err != nil {
		t.Fatal(err)
	}
	expect["chatPromptTokens"] = len(ids)
	js, _ := json.Marshal(expect)

	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, node, filepath.Join(dir, "client.mjs"), ts.URL)
	cmd.Env = append(os.Environ(), "WEFT_API_KEY=test-key", "WEFT_EXPECT="+string(js))
	out, err := cmd.CombinedOutput()
	t.Logf("node client.mjs %s:\n%s", ts.URL, out)
	if err != nil {
		t.Fatalf("the OpenAI client failed: %v", err)
	}
	if !strings.Contains(string(out), "all 10 checks passed") {
		t.Error("the client did not report all its checks")
	}
}
