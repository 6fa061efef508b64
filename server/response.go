package server

import (
	"math"
	"net/http"

	"github.com/weftlm/weft"
	"github.com/weftlm/weft/sample"
)

// The response bodies, with fields in the order OpenAI's servers write
// them.

type usage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details,omitempty"`
}

// promptDetails says how much of the prompt came from a slot's cache.
type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func usageOf(prompt, completion int) usage {
	return usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
}

// withCached adds the cached prompt tokens, when there are any.
func (u usage) withCached(cached int) usage {
	if cached > 0 {
		u.PromptTokensDetails = &promptDetails{CachedTokens: cached}
	}
	return u
}

type chatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   usage        `json:"usage"`
}

type chatChoice struct {
	Index        int           `json:"index"`
	Message      chatMessage   `json:"message"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason string        `json:"finish_reason"`
}

type chatMessage struct {
	Role      string     `json:"role"`
	Content   *string    `json:"content"` // null beside tool calls with no text
	Refusal   *string    `json:"refusal"`
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
}

// chatChunk is one event of a chat stream. Usage is absent, null in
// every chunk of a stream that ends with usage, or the usage itself in
// that last chunk.
type chatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []chatChunkChoice `json:"choices"`
	Usage   any               `json:"usage,omitempty"`
}

type chatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        chatDelta     `json:"delta"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

type chatDelta struct {
	Role      string     `json:"role,omitempty"`
	Content   *string    `json:"content,omitempty"`
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
}

type chatLogprobs struct {
	Content []tokenLogprob `json:"content"`
}

type tokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     float32      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []topLogprob `json:"top_logprobs"`
}

type topLogprob struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// completion is a /v1/completions response, and each event of its stream
// (Usage as in chatChunk).
type completion struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   any                `json:"usage,omitempty"`
}

type completionChoice struct {
	Text         string              `json:"text"`
	Index        int                 `json:"index"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float32            `json:"token_logprobs"`
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// piece is a token's text as the logprobs name it.
func (s *Server) piece(id int32) string {
	if t := s.m.Tokenizer(); t != nil {
		return t.Piece(id)
	}
	return ""
}

// finite keeps JSON valid: OpenAI writes -9999 for a probability that
// underflows.
func finite(lp float32) float32 {
	if math.IsNaN(float64(lp)) || math.IsInf(float64(lp), 0) {
		return -9999
	}
	return lp
}

func byteValues(s string) []int {
	out := make([]int, len(s))
	for i := range len(s) {
		out[i] = int(s[i])
	}
	return out
}

// chatLogprobs is the logprobs of a chat choice or chunk; nil when none
// were asked for (top < 0).
func (s *Server) chatLogprobs(toks []weft.Token, top int) *chatLogprobs {
	if top < 0 {
		return nil
	}
	out := &chatLogprobs{Content: make([]tokenLogprob, 0, len(toks))}
	for _, tok := range toks {
		p := s.piece(tok.ID)
		e := tokenLogprob{Token: p, Logprob: finite(tok.Logprob), Bytes: byteValues(p), TopLogprobs: []topLogprob{}}
		for _, alt := range firstN(tok.TopLogprobs, top) {
			ap := s.piece(alt.ID)
			e.TopLogprobs = append(e.TopLogprobs, topLogprob{Token: ap, Logprob: finite(alt.LogProb), Bytes: byteValues(ap)})
		}
		out.Content = append(out.Content, e)
	}
	return out
}

// completionLogprobs is the logprobs of a completion choice or chunk;
// offset is where the first token's text starts in the choice's text.
func (s *Server) completionLogprobs(toks []weft.Token, top, offset int) *completionLogprobs {
	if top < 0 {
		return nil
	}
	out := &completionLogprobs{Tokens: []string{}, TokenLogprobs: []float32{}, TextOffset: []int{}}
	if top > 0 {
		out.TopLogprobs = []map[string]float32{}
	}
	for _, tok := range toks {
		out.Tokens = append(out.Tokens, s.piece(tok.ID))
		out.TokenLogprobs = append(out.TokenLogprobs, finite(tok.Logprob))
		out.TextOffset = append(out.TextOffset, offset)
		offset += len(tok.Text)
		if top > 0 {
			alts := map[string]float32{}
			for _, alt := range firstN(tok.TopLogprobs, top) {
				alts[s.piece(alt.ID)] = finite(alt.LogProb)
			}
			out.TopLogprobs = append(out.TopLogprobs, alts)
		}
	}
	return out
}

func firstN(alts []sample.TokenLogProb, n int) []sample.TokenLogProb {
	return alts[:min(n, len(alts))]
}

// events writes a server-sent event stream the way OpenAI's servers do:
// "data: {json}\n\n" per chunk and "data: [DONE]\n\n" at the end, each
// flushed at once.
type events struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
}

func newEvents(w http.ResponseWriter) *events {
	return &events{w: w, rc: http.NewResponseController(w)}
}

func (e *events) write(data []byte) error {
	if !e.started {
		e.started = true
		h := e.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no") // proxies must not hold events back
		e.w.WriteHeader(http.StatusOK)
	}
	buf := make([]byte, 0, len(data)+8)
	buf = append(append(append(buf, "data: "...), data...), "\n\n"...)
	if _, err := e.w.Write(buf); err != nil {
		return err
	}
	return e.rc.Flush()
}

func (e *events) send(v any) error {
	b, err := marshal(v)
	if err != nil {
		return err
	}
	return e.write(b)
}

func (e *events) done() error { return e.write([]byte("[DONE]")) }

// fail ends a stream on an error. Before the first event the handler's
// caller still writes a JSON error with its status; after it, an error
// event is the last thing sent (OpenAI's clients raise it), unless the
// client has gone.
func (e *events) fail(err error) error {
	if !e.started {
		return err
	}
	ae := toAPIError(err)
	if ae.Code != "cancelled" {
		e.send(ae.body())
	}
	return err
}
