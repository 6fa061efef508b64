package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/weftlm/weft"
)

// completionDefaultMax is OpenAI's default max_tokens for /v1/completions;
// chat has none (up to an end-of-generation token or a full context).
const completionDefaultMax = 16

// job is one generation a handler has checked and is ready to run.
type job struct {
	ids  []int32
	opts weft.GenerateOptions
}

// outcome is what a generation produced.
type outcome struct {
	text      string
	finish    string
	generated int
	cached    int          // prompt tokens taken from the slot's cache
	logprobs  []weft.Token // the generated tokens, when logprobs were asked for
}

// generated tells whether tok stands for a generated token.
func generated(tok weft.Token) bool { return tok.Sampled }

// run generates for j, calling each for every item; an error from each
// stops the generation. It holds a slot from the gate while it runs.
func (s *Server) run(ctx context.Context, j job, start time.Time, rec *record, each func(weft.Token) error) (outcome, error) {
	var out outcome
	for tok, err := range s.m.GenerateTokens(ctx, j.ids, weft.WithOptions(j.opts)) {
		if err != nil {
			return out, err
		}
		if s.pace != nil {
			s.pace(ctx)
		}
		if rec.firstToken == 0 {
			rec.firstToken = time.Since(start)
		}
		if generated(tok) {
			out.generated++
			rec.completionTokens++
		}
		if j.opts.Logprobs && generated(tok) {
			out.logprobs = append(out.logprobs, tok)
		}
		out.text += tok.Text
		if tok.Done {
			out.finish, out.cached = tok.FinishReason, tok.CachedPromptTokens
			rec.cachedTokens += tok.CachedPromptTokens
		}
		if err := each(tok); err != nil {
			return out, err
		}
	}
	return out, nil
}

// checkLength refuses a prompt that leaves the context no room to
// generate, before the response begins.
func (s *Server) checkLength(param string, ids []int32) error {
	if len(ids) == 0 {
		return badRequest(param, "%s is empty and the model adds no BOS token; give at least one token", param)
	}
	if len(ids) >= s.info.Context {
		return promptTooLong(param, len(ids), s.info.Context)
	}
	return nil
}

func (s *Server) vocab() int { return s.info.Config.VocabSize }

// chat serves POST /v1/chat/completions.
func (s *Server) chat(w http.ResponseWriter, r *http.Request, rec *record) error {
	start := time.Now()
	var sp sampling
	var req chatRequest
	if err := readJSON(r, &sp, &req); err != nil {
		return err
	}
	opts, err := sp.options(s.vocab(), 0)
	if err != nil {
		return err
	}
	top, err := req.logprobs()
	if err != nil {
		return err
	}
	setLogprobs(&opts, top)
	msgs, err := req.messages()
	if err != nil {
		return err
	}
	tools, readCalls, err := req.tools()
	if err != nil {
		return err
	}
	ids, err := s.m.ChatTokens(msgs, tools...)
	if err != nil {
		if ae := toAPIError(err); ae.Status != http.StatusInternalServerError {
			return ae
		}
		return badRequest("messages", "the chat template failed on these messages: %v", err)
	}
	if err := s.checkLength("messages", ids); err != nil {
		return err
	}
	rec.promptTokens = len(ids)
	release, err := s.gate.enter(r.Context())
	if err != nil {
		return err
	}
	defer release()

	j := job{ids: ids, opts: opts}
	id, created := s.newID("chatcmpl-"), s.now().Unix()
	stream, usage := sp.streaming()
	if !stream {
		out, err := s.run(r.Context(), j, start, rec, func(weft.Token) error { return nil })
		if err != nil {
			return err
		}
		msg := chatMessage{Role: "assistant", Content: &out.text}
		if readCalls && out.finish == "stop" {
			if content, calls := weft.ParseToolCalls(out.text); calls != nil {
				msg.Content, msg.ToolCalls, out.finish = nil, s.responseCalls(calls, false), "tool_calls"
				if content != "" {
					msg.Content = &content
				}
			}
		}
		resp := chatCompletion{ID: id, Object: "chat.completion", Created: created, Model: s.opts.ModelID,
			Choices: []chatChoice{{Message: msg, Logprobs: s.chatLogprobs(out.logprobs, top), FinishReason: out.finish}},
			Usage:   usageOf(len(ids), out.generated).withCached(out.cached)}
		return writeJSON(w, http.StatusOK, resp)
	}

	ev := newEvents(w)
	chunk := func(d chatDelta, lp *chatLogprobs, finish *string) error {
		c := chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.opts.ModelID,
			Choices: []chatChunkChoice{{Delta: d, Logprobs: lp, FinishReason: finish}}}
		if usage {
			c.Usage = nullJSON
		}
		return ev.send(c)
	}
	empty := ""
	if err := chunk(chatDelta{Role: "assistant", Content: &empty}, nil, nil); err != nil {
		return err
	}
	// With tools, a reply that may be a call is held back until it is
	// known: sent as calls at the end, or as text (with its tokens'
	// log-probabilities) once it cannot be one.
	held, holding := "", readCalls
	var heldToks []weft.Token
	out, err := s.run(r.Context(), j, start, rec, func(tok weft.Token) error {
		var lp *chatLogprobs
		if top >= 0 && generated(tok) {
			lp = s.chatLogprobs([]weft.Token{tok}, top)
		}
		text := tok.Text
		if holding {
			held += text
			if top >= 0 && generated(tok) {
				heldToks = append(heldToks, tok)
			}
			if !tok.Done && mayBeToolCall(held) {
				return nil
			}
			holding, text = false, held
			if len(heldToks) > 0 {
				lp = s.chatLogprobs(heldToks, top)
			}
			if tok.Done && tok.FinishReason == "stop" {
				if content, calls := weft.ParseToolCalls(held); calls != nil {
					if content != "" {
						if err := chunk(chatDelta{Content: &content}, nil, nil); err != nil {
							return err
						}
					}
					if err := chunk(chatDelta{ToolCalls: s.responseCalls(calls, true)}, nil, nil); err != nil {
						return err
					}
					finish := "tool_calls"
					return chunk(chatDelta{}, nil, &finish)
				}
			}
		}
		if text != "" || lp != nil {
			if err := chunk(chatDelta{Content: &text}, lp, nil); err != nil {
				return err
			}
		}
		if tok.Done {
			return chunk(chatDelta{}, nil, &tok.FinishReason)
		}
		return nil
	})
	if err != nil {
		return ev.fail(err)
	}
	if usage {
		u := usageOf(len(ids), out.generated).withCached(out.cached)
		if err := ev.send(chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.opts.ModelID,
			Choices: []chatChunkChoice{}, Usage: u}); err != nil {
			return err
		}
	}
	return ev.done()
}

// completions serves POST /v1/completions. An array of prompts runs one
// after another, each a choice with its index.
func (s *Server) completions(w http.ResponseWriter, r *http.Request, rec *record) error {
	start := time.Now()
	var sp sampling
	var req completionRequest
	if err := readJSON(r, &sp, &req); err != nil {
		return err
	}
	opts, err := sp.options(s.vocab(), completionDefaultMax)
	if err != nil {
		return err
	}
	top, err := req.logprobs()
	if err != nil {
		return err
	}
	setLogprobs(&opts, top)
	prompts, err := req.prompts(s.vocab())
	if err != nil {
		return err
	}
	jobs := make([]job, len(prompts))
	for i, p := range prompts {
		ids := p.ids
		if !p.isIDs {
			if ids, err = s.m.PromptTokens(p.text); err != nil {
				return err
			}
		}
		param := "prompt"
		if len(prompts) > 1 {
			param = fmt.Sprintf("prompt[%d]", i)
		}
		if err := s.checkLength(param, ids); err != nil {
			return err
		}
		jobs[i] = job{ids: ids, opts: opts}
		rec.promptTokens += len(ids)
	}
	release, err := s.gate.enter(r.Context())
	if err != nil {
		return err
	}
	defer release()

	id, created := s.newID("cmpl-"), s.now().Unix()
	stream, usage := sp.streaming()
	if !stream {
		resp := completion{ID: id, Object: "text_completion", Created: created, Model: s.opts.ModelID,
			Choices: make([]completionChoice, len(jobs))}
		total := 0
		for i, j := range jobs {
			out, err := s.run(r.Context(), j, start, rec, func(weft.Token) error { return nil })
			if err != nil {
				return err
			}
			total += out.generated
			resp.Choices[i] = completionChoice{Text: out.text, Index: i, Logprobs: s.completionLogprobs(out.logprobs, top, 0), FinishReason: &out.finish}
		}
		resp.Usage = usageOf(rec.promptTokens, total)
		return writeJSON(w, http.StatusOK, resp)
	}

	ev := newEvents(w)
	chunk := func(c completionChoice) error {
		cc := completion{ID: id, Object: "text_completion", Created: created, Model: s.opts.ModelID, Choices: []completionChoice{c}}
		if usage {
			cc.Usage = nullJSON
		}
		return ev.send(cc)
	}
	total := 0
	for i, j := range jobs {
		offset := 0
		out, err := s.run(r.Context(), j, start, rec, func(tok weft.Token) error {
			c := completionChoice{Text: tok.Text, Index: i}
			if top >= 0 && generated(tok) {
				c.Logprobs = s.completionLogprobs([]weft.Token{tok}, top, offset)
			}
			offset += len(tok.Text)
			if tok.Done {
				c.FinishReason = &tok.FinishReason
			} else if tok.Text == "" && c.Logprobs == nil {
				return nil
			}
			return chunk(c)
		})
		if err != nil {
			return ev.fail(err)
		}
		total += out.generated
	}
	if usage {
		if err := ev.send(completion{ID: id, Object: "text_completion", Created: created, Model: s.opts.ModelID,
			Choices: []completionChoice{}, Usage: usageOf(rec.promptTokens, total)}); err != nil {
			return err
		}
	}
	return ev.done()
}

// setLogprobs asks the model for log-probabilities when top >= 0.
func setLogprobs(g *weft.GenerateOptions, top int) {
	if top >= 0 {
		g.Logprobs, g.TopN = true, top
	}
}

// nullJSON is a usage field present but null: OpenAI sends "usage": null
// in every chunk of a stream that ends with a usage chunk.
var nullJSON = json.RawMessage("null")
