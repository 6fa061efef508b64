package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Tool calling. The tools of a request go to the chat template, which
// describes them to the model in its own format; what the model writes
// back is read for calls in the formats templates ask for:
//
//   - <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block a
//     call (Hermes, Qwen 2.5 and 3, and the many templates that copy them);
//   - a bare JSON object {"name": ..., "parameters" or "arguments": {...}},
//     several joined by ';' (Llama 3.1-3.3), after an optional
//     <|python_tag|>;
//   - a JSON array of such objects (Mistral, after [TOOL_CALLS], a control
//     token that leaves no text).
//
// A reply that is none of these, or whose JSON does not parse, is plain
// content.

// toolCall is one call as a response carries it: arguments as a JSON text.
type toolCall struct {
	Index    *int   `json:"index,omitempty"` // stream deltas only
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// toolSpec is the part of a request's tool this server checks.
type toolSpec struct {
	Type     string `json:"type"`
	Function *struct {
		Name string `json:"name"`
	} `json:"function"`
}

// tools checks the request's tools and tool_choice and returns the tools
// to render (nil for none) and whether replies are read for calls.
func (c *chatRequest) tools() ([][]byte, bool, error) {
	if len(c.Tools) == 0 {
		return nil, false, nil
	}
	choice := "auto"
	if len(c.ToolChoice) > 0 && string(c.ToolChoice) != "null" {
		if err := json.Unmarshal(c.ToolChoice, &choice); err != nil {
			return nil, false, badRequest("tool_choice", "tool_choice: this server takes \"auto\" or \"none\", not a named function")
		}
	}
	switch choice {
	case "auto":
	case "none":
		return nil, false, nil
	default:
		return nil, false, badRequest("tool_choice", "tool_choice %q is not supported: the model decides (\"auto\") or calls nothing (\"none\")", choice)
	}
	out := make([][]byte, len(c.Tools))
	for i, raw := range c.Tools {
		var t toolSpec
		if err := json.Unmarshal(raw, &t); err != nil || t.Type != "function" || t.Function == nil || t.Function.Name == "" {
			return nil, false, badRequest(fmt.Sprintf("tools[%d]", i), "tools[%d]: want {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}", i)
		}
		out[i] = raw
	}
	return out, true, nil
}

// parsedCall is a call read from a reply.
type parsedCall struct {
	name string
	args json.RawMessage // a JSON object
}

// parseToolCalls reads the calls in a reply; content is the text before
// them (empty when there is none). It returns no calls for a reply that
// holds none or holds malformed ones.
func parseToolCalls(text string) (content string, calls []parsedCall) {
	const open, end = "<tool_call>", "</tool_call>"
	if i := strings.Index(text, open); i >= 0 {
		content = strings.TrimSpace(text[:i])
		rest := text[i:]
		for {
			rest = strings.TrimSpace(rest)
			if rest == "" {
				break
			}
			body, ok := strings.CutPrefix(rest, open)
			if !ok {
				return text, nil // text between or after the calls
			}
			j := strings.Index(body, end)
			if j < 0 {
				j = len(body) // the last block may stop at end of generation
			}
			c, ok := oneCall([]byte(strings.TrimSpace(body[:j])))
			if !ok {
				return text, nil
			}
			calls = append(calls, c)
			rest = body[min(j+len(end), len(body)):]
		}
		return content, calls
	}
	trimmed := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(text), "<|python_tag|>"))
	if trimmed == "" || (trimmed[0] != '{' && trimmed[0] != '[') {
		return text, nil
	}
	dec := json.NewDecoder(strings.NewReader(trimmed))
	for {
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return text, nil
		}
		if v[0] == '[' {
			var list []json.RawMessage
			if json.Unmarshal(v, &list) != nil || len(list) == 0 {
				return text, nil
			}
			for _, item := range list {
				c, ok := oneCall(item)
				if !ok {
					return text, nil
				}
				calls = append(calls, c)
			}
		} else {
			c, ok := oneCall(v)
			if !ok {
				return text, nil
			}
			calls = append(calls, c)
		}
		// Llama joins several calls with ';'.
		rest := strings.TrimSpace(trimmed[dec.InputOffset():])
		if rest == "" {
			return "", calls
		}
		if rest[0] != ';' {
			return text, nil
		}
		trimmed = strings.TrimSpace(rest[1:])
		if trimmed == "" {
			return "", calls
		}
		dec = json.NewDecoder(strings.NewReader(trimmed))
	}
}

// oneCall reads {"name": string, "arguments" or "parameters": object}.
func oneCall(data []byte) (parsedCall, bool) {
	var c struct {
		Name       string          `json:"name"`
		Arguments  json.RawMessage `json:"arguments"`
		Parameters json.RawMessage `json:"parameters"`
	}
	if json.Unmarshal(data, &c) != nil || c.Name == "" {
		return parsedCall{}, false
	}
	args := c.Arguments
	if args == nil {
		args = c.Parameters
	}
	args = bytes.TrimSpace(args)
	if len(args) > 0 && args[0] == '"' {
		// Arguments already as a JSON text, as OpenAI's wire form has them.
		var s string
		if json.Unmarshal(args, &s) != nil {
			return parsedCall{}, false
		}
		args = []byte(s)
	}
	if len(args) == 0 || string(args) == "null" {
		args = []byte("{}")
	}
	var obj map[string]any
	if json.Unmarshal(args, &obj) != nil {
		return parsedCall{}, false
	}
	return parsedCall{name: c.Name, args: args}, true
}

// mayBeToolCall reports whether a reply that begins with text could still
// turn out to be a tool call, so a stream holds it back.
func mayBeToolCall(text string) bool {
	t := strings.TrimSpace(text)
	switch {
	case t == "":
		return true
	case t[0] == '{' || t[0] == '[':
		return true
	}
	for _, marker := range []string{"<tool_call>", "<|python_tag|>"} {
		if strings.HasPrefix(t, marker) || strings.HasPrefix(marker, t) {
			return true
		}
	}
	return false
}

// responseCalls gives the calls their ids and their wire form; index
// marks them as stream deltas.
func (s *Server) responseCalls(calls []parsedCall, index bool) []toolCall {
	out := make([]toolCall, len(calls))
	for i, c := range calls {
		out[i].ID, out[i].Type = s.newID("call_"), "function"
		out[i].Function.Name, out[i].Function.Arguments = c.name, compactJSON(c.args)
		if index {
			out[i].Index = &i
		}
	}
	return out
}

// compactJSON is data without insignificant whitespace.
func compactJSON(data []byte) string {
	var b bytes.Buffer
	if json.Compact(&b, data) != nil {
		return string(data)
	}
	return b.String()
}
