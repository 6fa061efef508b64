package server

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"iter"
	"math"
	"strings"
	"testing"

	"github.com/weftlm/weft"
)

// reference runs a generation on the model directly and returns its items.
func reference(t *testing.T, seq iter.Seq2[weft.Token, error]) []weft.Token {
	t.Helper()
	var out []weft.Token
	for tok, err := range seq {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tok)
	}
	return out
}

func joined(toks []weft.Token) string {
	var b strings.Builder
	for _, tok := range toks {
		b.WriteString(tok.Text)
	}
	return b.String()
}

func quoteJSON(s string) string {
	b, err := marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestCompletion: a whole completion carries the model's own text and
// the usage counts; the default limit is OpenAI's 16 tokens.
func TestCompletion(t *testing.T) {
	m := load(t, storiesPath(t), 1, 128)
	_, ts := newTestServer(t, m, Options{})
	ctx := context.Background()

	want := joined(reference(t, m.Generate(ctx, "Once upon a time", weft.WithTemperature(0), weft.WithMaxTokens(16))))
	resp, body := do(t, "POST", ts.URL+"/v1/completions", `{"model": "anything", "prompt": "Once upon a time", "temperature": 0}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	wantBody := fmt.Sprintf(`{"id":"cmpl-test","object":"text_completion","created":1700000000,"model":"stories260K","choices":[{"text":%s,"index":0,"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":16,"total_tokens":21}}`+"\n", quoteJSON(want))
	if string(body) != wantBody {
		t.Errorf("body\n got %s\nwant %s", body, wantBody)
	}

	// An array of prompts, text and token ids, gives a choice each; a stop
	// string cuts the text and ends with "stop".
	ids, _ := m.PromptTokens("Once upon a time")
	idsJSON, _ := json.Marshal(ids)
	stop := strings.Fields(want)[2]
	resp, body = do(t, "POST", ts.URL+"/v1/completions", fmt.Sprintf(`{"prompt": ["Once upon a time", %s], "max_tokens": 16, "temperature": 0, "stop": %s}`, idsJSON, quoteJSON(stop)))
	var c struct {
		Choices []struct {
			Text         string `json:"text"`
			Index        int    `json:"index"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal(body, &c); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%d %s: %v", resp.StatusCode, body, err)
	}
	cut := want[:strings.Index(want, stop)]
	if len(c.Choices) != 2 {
		t.Fatalf("choices %+v", c.Choices)
	}
	for i, ch := range c.Choices {
		if ch.Index != i || ch.Text != cut || ch.FinishReason != "stop" {
			t.Errorf("choice %d: %+v, want text %q ending with stop", i, ch, cut)
		}
	}
	// The token that completed the stop string counts as generated.
	n := len(reference(t, m.Generate(ctx, "Once upon a time", weft.WithTemperature(0), weft.WithMaxTokens(16), weft.WithStop(stop))))
	if c.Usage != usageOf(10, 2*n) {
		t.Errorf("usage %+v, want %d prompt and %d generated tokens", c.Usage, 10, 2*n)
	}
}

// TestCompletionStream: the event stream is byte for byte what OpenAI
// sends: a chunk per piece of text, the finish reason in the last chunk,
// a usage chunk with no choices when asked, then [DONE].
func TestCompletionStream(t *testing.T) {
	m := load(t, storiesPath(t), 1, 128)
	_, ts := newTestServer(t, m, Options{})
	toks := reference(t, m.Generate(context.Background(), "Once upon a time", weft.WithTemperature(0), weft.WithMaxTokens(7)))

	for _, includeUsage := range []bool{false, true} {
		body := `{"prompt": "Once upon a time", "max_tokens": 7, "temperature": 0, "stream": true}`
		tail := ""
		if includeUsage {
			body = strings.Replace(body, `"stream": true`, `"stream": true, "stream_options": {"include_usage": true}`, 1)
			tail = `,"usage":null`
		}
		var want strings.Builder
		for _, tok := range toks {
			if tok.Done {
				fmt.Fprintf(&want, `data: {"id":"cmpl-test","object":"text_completion","created":1700000000,"model":"stories260K","choices":[{"text":%s,"index":0,"logprobs":null,"finish_reason":"length"}]%s}`+"\n\n", quoteJSON(tok.Text), tail)
			} else if tok.Text != "" {
				fmt.Fprintf(&want, `data: {"id":"cmpl-test","object":"text_completion","created":1700000000,"model":"stories260K","choices":[{"text":%s,"index":0,"logprobs":null,"finish_reason":null}]%s}`+"\n\n", quoteJSON(tok.Text), tail)
			}
		}
		if includeUsage {
			want.WriteString(`data: {"id":"cmpl-test","object":"text_completion","created":1700000000,"model":"stories260K","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}` + "\n\n")
		}
		want.WriteString("data: [DONE]\n\n")
		resp, got := do(t, "POST", ts.URL+"/v1/completions", body)
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
			t.Fatalf("status %d, Content-Type %q", resp.StatusCode, ct)
		}
		if string(got) != want.String() {
			t.Errorf("usage %v: stream\n got %q\nwant %q", includeUsage, got, want.String())
		}
	}
}

// TestChatStream: a chat stream opens with the assistant's role, carries
// the model's reply through its real template, and ends as OpenAI's does.
func TestChatStream(t *testing.T) {
	m := load(t, chatModelPath(t), 1, 256)
	_, ts := newTestServer(t, m, Options{})
	msgs := []weft.Message{{Role: "user", Content: "Tell me a story"}}
	toks := reference(t, m.Chat(context.Background(), msgs, weft.WithTemperature(0), weft.WithMaxTokens(6)))
	ids, err := m.ChatTokens(msgs)
	if err != nil {
		t.Fatal(err)
	}
	head := `data: {"id":"chatcmpl-test","object":"chat.completion.chunk","created":1700000000,"model":"stories-chat","choices":[{"index":0,`
	var want strings.Builder
	want.WriteString(head + `"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n")
	for _, tok := range toks {
		if tok.Text != "" {
			fmt.Fprintf(&want, head+`"delta":{"content":%s},"logprobs":null,"finish_reason":null}],"usage":null}`+"\n\n", quoteJSON(tok.Text))
		}
		if tok.Done {
			want.WriteString(head + `"delta":{},"logprobs":null,"finish_reason":"length"}],"usage":null}` + "\n\n")
		}
	}
	// The reference ran the same conversation: all of the prompt but its
	// last token comes from the slot's cache.
	fmt.Fprintf(&want, `data: {"id":"chatcmpl-test","object":"chat.completion.chunk","created":1700000000,"model":"stories-chat","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":6,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`+"\n\n", len(ids), len(ids)+6, len(ids)-1)
	want.WriteString("data: [DONE]\n\n")

	resp, got := do(t, "POST", ts.URL+"/v1/chat/completions", `{"model": "gpt-4o", "messages": [{"role": "user", "content": "Tell me a story"}], "max_completion_tokens": 6, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}`)
	if resp.StatusCode != 200 || string(got) != want.String() {
		t.Errorf("status %d, stream\n got %q\nwant %q", resp.StatusCode, got, want.String())
	}

	// The same request whole, with the content as text parts.
	resp, got = do(t, "POST", ts.URL+"/v1/chat/completions", `{"messages": [{"role": "user", "content": [{"type": "text", "text": "Tell me a story"}]}], "max_tokens": 6, "temperature": 0}`)
	wantBody := fmt.Sprintf(`{"id":"chatcmpl-test","object":"chat.completion","created":1700000000,"model":"stories-chat","choices":[{"index":0,"message":{"role":"assistant","content":%s,"refusal":null},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":%d,"completion_tokens":6,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`+"\n", quoteJSON(joined(toks)), len(ids), len(ids)+6, len(ids)-1)
	if resp.StatusCode != 200 || string(got) != wantBody {
		t.Errorf("status %d, body\n got %s\nwant %s", resp.StatusCode, got, wantBody)
	}
}

// TestLogprobs: chat and completion logprobs name each generated token,
// its log-probability and the most probable alternatives, as the model
// reports them.
func TestLogprobs(t *testing.T) {
	m := load(t, chatModelPath(t), 1, 256)
	_, ts := newTestServer(t, m, Options{})
	tk := m.Tokenizer()
	toks := reference(t, m.Generate(context.Background(), "Once upon a time", weft.WithTemperature(0), weft.WithMaxTokens(4), weft.WithLogprobs(3)))

	_, body := do(t, "POST", ts.URL+"/v1/completions", `{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "logprobs": 3}`)
	var c struct {
		Choices []struct {
			Text     string             `json:"text"`
			Logprobs completionLogprobs `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	lp := c.Choices[0].Logprobs
	if len(lp.Tokens) != 4 || len(lp.TokenLogprobs) != 4 || len(lp.TopLogprobs) != 4 || len(lp.TextOffset) != 4 {
		t.Fatalf("logprobs %+v", lp)
	}
	offset := 0
	for i := range 4 {
		tok := toks[i]
		if lp.Tokens[i] != tk.Piece(tok.ID) || lp.TokenLogprobs[i] != tok.Logprob || lp.TextOffset[i] != offset {
			t.Errorf("token %d: %q %v at %d, want %q %v at %d", i, lp.Tokens[i], lp.TokenLogprobs[i], lp.TextOffset[i], tk.Piece(tok.ID), tok.Logprob, offset)
		}
		offset += len(tok.Text)
		if best, ok := lp.TopLogprobs[i][tk.Piece(tok.ID)]; len(lp.TopLogprobs[i]) != 3 || !ok || math.Abs(float64(best-tok.Logprob)) > 1e-6 || tok.Logprob >= 0 {
			t.Errorf("token %d: top %v, want 3 with the greedy choice at %v", i, lp.TopLogprobs[i], tok.Logprob)
		}
	}

	_, body = do(t, "POST", ts.URL+"/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0, "logprobs": true, "top_logprobs": 2, "stream": true}`)
	var streamed []tokenLogprob
	for _, ev := range strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n") {
		data := strings.TrimPrefix(ev, "data: ")
		if data == "[DONE]" {
			continue
		}
		var choices struct {
			Choices []chatChunkChoice `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &choices); err != nil {
			t.Fatalf("%q: %v", data, err)
		}
		for _, c := range choices.Choices {
			if c.Logprobs != nil {
				streamed = append(streamed, c.Logprobs.Content...)
			}
		}
	}
	if len(streamed) != 3 {
		t.Fatalf("%d streamed logprobs: %s", len(streamed), body)
	}
	for i, e := range streamed {
		if len(e.TopLogprobs) != 2 || e.TopLogprobs[0].Token != e.Token || math.Abs(float64(e.TopLogprobs[0].Logprob-e.Logprob)) > 1e-6 || string(bytesOf(e.Bytes)) != e.Token {
			t.Errorf("token %d: %+v: the greedy token should head its alternatives, with its bytes", i, e)
		}
	}
}

func bytesOf(v []int) []byte {
	b := make([]byte, len(v))
	for i, x := range v {
		b[i] = byte(x)
	}
	return b
}

// TestSamplingFields: seeds repeat, logit_bias bans a token, top_p 0 is
// greedy; extras top_k, min_p and repeat_penalty are taken.
func TestSamplingFields(t *testing.T) {
	m := load(t, storiesPath(t), 1, 128)
	_, ts := newTestServer(t, m, Options{})
	text := func(body string) string {
		t.Helper()
		resp, b := do(t, "POST", ts.URL+"/v1/completions", body)
		var out struct {
			Choices []completionChoice `json:"choices"`
		}
		if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != 200 || len(out.Choices) != 1 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return out.Choices[0].Text
	}
	seeded := `{"prompt": "Once", "max_tokens": 20, "temperature": 1.2, "seed": %d, "top_k": 50, "min_p": 0.01, "repeat_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.5}`
	a, b, c := text(fmt.Sprintf(seeded, 0)), text(fmt.Sprintf(seeded, 0)), text(fmt.Sprintf(seeded, 7))
	if a != b || a == c {
		t.Errorf("seed 0 twice: %q, %q; seed 7: %q", a, b, c)
	}
	greedy := text(`{"prompt": "Once", "max_tokens": 20, "temperature": 0}`)
	if got := text(`{"prompt": "Once", "max_tokens": 20, "temperature": 1, "top_p": 0, "seed": 3}`); got != greedy {
		t.Errorf("top_p 0: %q, greedy %q", got, greedy)
	}
	ids, _ := m.PromptTokens("Once" + greedy)
	first := ids[len(mustIDs(t, m, "Once"))]
	banned := text(fmt.Sprintf(`{"prompt": "Once", "max_tokens": 20, "temperature": 0, "logit_bias": {"%d": -100}}`, first))
	if banned == greedy || strings.HasPrefix(banned, m.Tokenizer().Piece(first)) {
		t.Errorf("banning %q changed nothing: %q", m.Tokenizer().Piece(first), banned)
	}
}

func mustIDs(t *testing.T, m *weft.Model, s string) []int32 {
	ids, err := m.PromptTokens(s)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestEmbeddings: float and base64 encodings carry the model's own
// normalised mean-pooled embeddings; dimensions shortens and renormalises.
func TestEmbeddings(t *testing.T) {
	m := load(t, storiesPath(t), 1, 128)
	_, ts := newTestServer(t, m, Options{})
	texts := []string{"Once upon a time", "The cat sat on the mat"}
	want, err := m.Embed(context.Background(), texts, weft.WithNormalize(true))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Object string `json:"object"`
		Data   []struct {
			Object    string          `json:"object"`
			Index     int             `json:"index"`
			Embedding json.RawMessage `json:"embedding"`
		} `json:"data"`
		Model string `json:"model"`
		Usage usage  `json:"usage"`
	}
	_, body := do(t, "POST", ts.URL+"/v1/embeddings", `{"input": ["Once upon a time", "The cat sat on the mat"], "model": "x"}`)
	if err := json.Unmarshal(body, &f); err != nil || f.Object != "list" || len(f.Data) != 2 || f.Model != "stories260K" {
		t.Fatalf("%s: %v", body, err)
	}
	if f.Usage.PromptTokens != len(mustIDs(t, m, texts[0]))+len(mustIDs(t, m, texts[1])) || f.Usage.TotalTokens != f.Usage.PromptTokens {
		t.Errorf("usage %+v", f.Usage)
	}
	for i, d := range f.Data {
		var v []float32
		if err := json.Unmarshal(d.Embedding, &v); err != nil || d.Index != i || d.Object != "embedding" {
			t.Fatalf("%+v: %v", d, err)
		}
		if !equalVec(v, want[i]) {
			t.Errorf("embedding %d differs from Embed's", i)
		}
	}

	_, body = do(t, "POST", ts.URL+"/v1/embeddings", `{"input": "Once upon a time", "encoding_format": "base64"}`)
	if err := json.Unmarshal(body, &f); err != nil || len(f.Data) != 1 {
		t.Fatalf("%s: %v", body, err)
	}
	var s string
	json.Unmarshal(f.Data[0].Embedding, &s)
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(raw) != 4*64 {
		t.Fatalf("base64 %q: %v", s, err)
	}
	v := make([]float32, 64)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	if !equalVec(v, want[0]) {
		t.Error("base64 embedding differs from Embed's")
	}

	_, body = do(t, "POST", ts.URL+"/v1/embeddings", `{"input": "Once upon a time", "dimensions": 8}`)
	json.Unmarshal(body, &f)
	var short []float32
	json.Unmarshal(f.Data[0].Embedding, &short)
	if len(short) != 8 || math.Abs(norm(short)-1) > 1e-5 {
		t.Errorf("dimensions 8: %v (norm %v)", short, norm(short))
	}
}

func equalVec(a, b []float32) bool {
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

func norm(v []float32) float64 {
	var ss float64
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	return math.Sqrt(ss)
}
