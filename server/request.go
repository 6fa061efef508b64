package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/weftlm/weft"
	"github.com/weftlm/weft/constrain"
	"github.com/weftlm/weft/sample"
)

// readJSON reads the whole body (already capped by http.MaxBytesReader)
// and decodes it into each of dst in turn: the fields shared by chat and
// completions, then the route's own. Unknown fields are ignored, as
// OpenAI's clients send many.
func readJSON(r *http.Request, dst ...any) error {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequest("", "the request body is empty; send a JSON object")
	}
	for _, d := range dst {
		if err := json.Unmarshal(body, d); err != nil {
			return err
		}
	}
	return nil
}

// sampling are the generation fields chat and completions share.
type sampling struct {
	Model               string             `json:"model"`
	MaxTokens           *int               `json:"max_tokens"`
	MaxCompletionTokens *int               `json:"max_completion_tokens"`
	Temperature         *float64           `json:"temperature"`
	TopP                *float64           `json:"top_p"`
	Seed                *int64             `json:"seed"`
	Stop                json.RawMessage    `json:"stop"`
	PresencePenalty     *float64           `json:"presence_penalty"`
	FrequencyPenalty    *float64           `json:"frequency_penalty"`
	LogitBias           map[string]float64 `json:"logit_bias"`
	N                   *int               `json:"n"`
	Stream              *bool              `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	ResponseFormat *struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
			Strict *bool           `json:"strict"`
		} `json:"json_schema"`
	} `json:"response_format"`
	// Extras beyond OpenAI's API, as llama.cpp's and vLLM's servers take
	// them.
	TopK          *int     `json:"top_k"`
	MinP          *float64 `json:"min_p"`
	RepeatPenalty *float64 `json:"repeat_penalty"`
}

// maxStops is OpenAI's limit on stop sequences.
const maxStops = 4

// defaultSeedZero stands in for a request's seed 0: the sampler reads 0 as
// "pick a random seed", while a client sending seed 0 wants a fixed one.
const defaultSeedZero = 0x9e3779b97f4a7c15

// options checks the fields and turns them into the model's generation
// options. defaultMax applies when the request sets no token limit (0: up
// to an end-of-generation token or a full context).
func (s *sampling) options(vocab, defaultMax int) (weft.GenerateOptions, error) {
	g := weft.GenerateOptions{MaxTokens: defaultMax, Overflow: weft.OverflowError}
	if s.N != nil && *s.N != 1 {
		return g, badRequest("n", "n = %d: this server makes one choice per prompt; send n = 1 or leave it out", *s.N)
	}
	for _, lim := range []struct {
		name string
		v    *int
	}{{"max_tokens", s.MaxTokens}, {"max_completion_tokens", s.MaxCompletionTokens}} {
		if lim.v == nil {
			continue
		}
		if *lim.v < 1 {
			return g, badRequest(lim.name, "%s = %d: want at least 1", lim.name, *lim.v)
		}
		g.MaxTokens = *lim.v // the later, max_completion_tokens, wins
	}
	if s.ResponseFormat != nil {
		switch s.ResponseFormat.Type {
		case "", "text":
		case "json_object":
			g.JSON = true // sampling is constrained to one JSON object
		case "json_schema":
			js := s.ResponseFormat.JSONSchema
			if js == nil || len(js.Schema) == 0 || string(js.Schema) == "null" {
				return g, badRequest("response_format", "response_format json_schema needs json_schema.schema, a JSON Schema object")
			}
			// Sampling follows the schema; one it cannot follow is refused
			// rather than loosely enforced.
			if _, err := constrain.CompileSchema(js.Schema); err != nil {
				return g, badRequest("response_format", "response_format json_schema: %v", err)
			}
			g.JSONSchema = js.Schema
		default:
			return g, badRequest("response_format", "response_format type %q is not supported: use \"json_schema\", \"json_object\" or \"text\"", s.ResponseFormat.Type)
		}
	}

	p := sample.Params{Temperature: 1} // OpenAI's default temperature
	var err error
	if p.Temperature, err = inRange("temperature", s.Temperature, 0, 2, 1); err != nil {
		return g, err
	}
	topP, err := inRange("top_p", s.TopP, 0, 1, 1)
	if err != nil {
		return g, err
	}
	if topP == 0 {
		p.TopK = 1 // the smallest set reaching probability 0 is the best token
	} else {
		p.TopP = topP
	}
	if s.TopK != nil {
		if *s.TopK < 0 {
			return g, badRequest("top_k", "top_k = %d: want 0 (off) or a positive count", *s.TopK)
		}
		if p.TopK == 0 {
			p.TopK = *s.TopK
		}
	}
	if p.MinP, err = inRange("min_p", s.MinP, 0, 1, 0); err != nil {
		return g, err
	}
	if p.RepeatPenalty, err = inRange("repeat_penalty", s.RepeatPenalty, math.SmallestNonzeroFloat32, 10, 1); err != nil {
		return g, err
	}
	if p.PresencePenalty, err = inRange("presence_penalty", s.PresencePenalty, -2, 2, 0); err != nil {
		return g, err
	}
	if p.FrequencyPenalty, err = inRange("frequency_penalty", s.FrequencyPenalty, -2, 2, 0); err != nil {
		return g, err
	}
	if len(s.LogitBias) > 0 {
		p.LogitBias = make(map[int32]float32, len(s.LogitBias))
		for k, b := range s.LogitBias {
			id, err := strconv.ParseInt(k, 10, 32)
			if err != nil || id < 0 || int(id) >= vocab {
				return g, badRequest("logit_bias", "logit_bias key %q: want a token id in [0, %d)", k, vocab)
			}
			if !(b >= -100 && b <= 100) {
				return g, badRequest("logit_bias", "logit_bias[%s] = %v: want a value in [-100, 100]", k, b)
			}
			p.LogitBias[int32(id)] = float32(b)
		}
	}
	if s.Seed != nil {
		p.Seed = uint64(*s.Seed)
		if p.Seed == 0 {
			p.Seed = defaultSeedZero
		}
	}
	g.Sampling = p
	if g.Stop, err = stopStrings(s.Stop); err != nil {
		return g, err
	}
	return g, nil
}

// inRange checks an optional number against [lo, hi]; def stands for an
// absent one.
func inRange(name string, v *float64, lo, hi, def float64) (float32, error) {
	if v == nil {
		return float32(def), nil
	}
	if !(*v >= lo && *v <= hi) {
		if lo == math.SmallestNonzeroFloat32 {
			return 0, badRequest(name, "%s = %v: want a positive value up to %v", name, *v, hi)
		}
		return 0, badRequest(name, "%s = %v: want a value in [%v, %v]", name, *v, lo, hi)
	}
	return float32(*v), nil
}

// stopStrings reads stop: null, a string, or an array of up to four.
func stopStrings(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, badRequest("stop", "stop: want a string or an array of strings")
	}
	if len(many) > maxStops {
		return nil, badRequest("stop", "stop has %d sequences; at most %d are allowed", len(many), maxStops)
	}
	return many, nil
}

// streaming reports whether the response is a stream and whether it ends
// with a usage chunk.
func (s *sampling) streaming() (stream, usage bool) {
	stream = s.Stream != nil && *s.Stream
	return stream, stream && s.StreamOptions != nil && s.StreamOptions.IncludeUsage
}

// chatRequest is what /v1/chat/completions reads beyond sampling.
type chatRequest struct {
	Messages    []json.RawMessage `json:"messages"`
	Logprobs    *bool             `json:"logprobs"`
	TopLogprobs *int              `json:"top_logprobs"`
	Tools       []json.RawMessage `json:"tools"`
	ToolChoice  json.RawMessage   `json:"tool_choice"`
}

// maxTopLogprobs is OpenAI's limit on alternatives per token (chat).
const maxTopLogprobs = 20

// messages decodes the conversation, text only.
func (c *chatRequest) messages() ([]weft.Message, error) {
	if len(c.Messages) == 0 {
		return nil, badRequest("messages", "messages is required: a non-empty array of {role, content}")
	}
	out := make([]weft.Message, len(c.Messages))
	for i, raw := range c.Messages {
		param := fmt.Sprintf("messages[%d]", i)
		var m weft.Message
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, badRequest(param, "%s: want {\"role\": string, \"content\": string or array of text parts}: %v", param, err)
		}
		switch m.Role {
		case "system", "user", "assistant", "tool":
		case "developer": // OpenAI's newer name for system, which templates know
			m.Role = "system"
		case "":
			return nil, badRequest(param+".role", "%s.role is required", param)
		default:
			return nil, badRequest(param+".role", "%s.role %q: want system, developer, user, assistant or tool", param, m.Role)
		}
		// Text parts become one string: most templates expect a string
		// and would print a list as its Python form.
		if m.Parts != nil {
			texts := make([]string, len(m.Parts))
			for j, p := range m.Parts {
				if p.Type != "text" {
					return nil, badRequest(fmt.Sprintf("%s.content[%d]", param, j), "%s.content[%d] has type %q; only text parts are supported", param, j, p.Type)
				}
				texts[j] = p.Text
			}
			m.Content, m.Parts = strings.Join(texts, "\n"), nil
		}
		out[i] = m
	}
	return out, nil
}

// logprobs returns how many alternatives per token to report, or -1 for
// none.
func (c *chatRequest) logprobs() (int, error) {
	want := c.Logprobs != nil && *c.Logprobs
	if c.TopLogprobs == nil {
		if want {
			return 0, nil
		}
		return -1, nil
	}
	n := *c.TopLogprobs
	switch {
	case n < 0 || n > maxTopLogprobs:
		return 0, badRequest("top_logprobs", "top_logprobs = %d: want a value in [0, %d]", n, maxTopLogprobs)
	case !want:
		return 0, badRequest("top_logprobs", "top_logprobs needs logprobs set to true")
	}
	return n, nil
}

// completionRequest is what /v1/completions reads beyond sampling.
type completionRequest struct {
	Prompt   json.RawMessage `json:"prompt"`
	Logprobs *int            `json:"logprobs"`
	Echo     *bool           `json:"echo"`
	Suffix   *string         `json:"suffix"`
	BestOf   *int            `json:"best_of"`
}

// maxCompletionLogprobs is OpenAI's limit for the completions API.
const maxCompletionLogprobs = 5

// maxPrompts bounds the prompts of one completions request (OpenAI's
// batch limit).
const maxPrompts = 2048

// prompt is one prompt of a completions request: text, or token ids.
type prompt struct {
	text  string
	ids   []int32
	isIDs bool
}

// prompts reads prompt: a string, an array of strings, an array of token
// ids, or an array of such arrays.
func (c *completionRequest) prompts(vocab int) ([]prompt, error) {
	switch {
	case c.Echo != nil && *c.Echo:
		return nil, badRequest("echo", "echo is not supported by this server")
	case c.Suffix != nil && *c.Suffix != "":
		return nil, badRequest("suffix", "suffix is not supported by this server")
	case c.BestOf != nil && *c.BestOf != 1:
		return nil, badRequest("best_of", "best_of = %d: this server makes one choice per prompt", *c.BestOf)
	}
	raw := bytes.TrimSpace(c.Prompt)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt", "prompt is required: a string, an array of strings, or token ids")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []prompt{{text: one}}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || len(items) == 0 {
		return nil, badRequest("prompt", "prompt: want a string, a non-empty array of strings, an array of token ids or an array of such arrays")
	}
	if len(items) > maxPrompts {
		return nil, badRequest("prompt", "prompt has %d entries; at most %d are allowed", len(items), maxPrompts)
	}
	var ids []int32
	if json.Unmarshal(raw, &ids) == nil {
		return []prompt{{ids: ids, isIDs: true}}, checkIDs("prompt", ids, vocab)
	}
	out := make([]prompt, len(items))
	for i, it := range items {
		param := fmt.Sprintf("prompt[%d]", i)
		if json.Unmarshal(it, &out[i].text) == nil {
			continue
		}
		if json.Unmarshal(it, &out[i].ids) != nil || len(out[i].ids) == 0 {
			return nil, badRequest(param, "%s: want a string or a non-empty array of token ids", param)
		}
		out[i].isIDs = true
		if err := checkIDs(param, out[i].ids, vocab); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func checkIDs(param string, ids []int32, vocab int) error {
	for i, id := range ids {
		if id < 0 || int(id) >= vocab {
			return badRequest(param, "%s[%d] = %d: want a token id in [0, %d)", param, i, id, vocab)
		}
	}
	return nil
}

// logprobs returns how many alternatives per token to report, or -1 for
// none.
func (c *completionRequest) logprobs() (int, error) {
	if c.Logprobs == nil {
		return -1, nil
	}
	if n := *c.Logprobs; n < 0 || n > maxCompletionLogprobs {
		return 0, badRequest("logprobs", "logprobs = %d: want a value in [0, %d]", n, maxCompletionLogprobs)
	}
	return *c.Logprobs, nil
}
