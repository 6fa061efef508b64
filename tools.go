package weft

import (
	"bytes"
	"encoding/json"
	"strings"
)

// ToolCall is a function call read from a reply: the function's name and
// its arguments, a JSON object.
type ToolCall struct {
	Name      string
	Arguments json.RawMessage
}

// WithTools gives Chat tool definitions (JSON objects, OpenAI's form:
// {"type": "function", "function": {"name", "description",
// "parameters"}}) for the chat template to describe to the model; read
// the reply's calls with ParseToolCalls.
func WithTools(tools ...[]byte) GenerateOption {
	return func(g *GenerateOptions) { g.Tools = append(g.Tools, tools...) }
}

// ParseToolCalls reads the function calls in a reply, in the formats chat
// templates ask models for:
//
//   - <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block a
//     call (Hermes, Qwen 2.5 and 3, and the many templates that copy them);
//   - a bare JSON object {"name": ..., "parameters" or "arguments": {...}},
//     several joined by ';' (Llama 3.1-3.3), after an optional
//     <|python_tag|>;
//   - a JSON array of such objects (Mistral, after [TOOL_CALLS], a control
//     token that leaves no text).
//
// content is the text before the calls ("" when there is none). A reply
// that is none of these, or whose JSON does not parse, has no calls and
// comes back whole as content.
func ParseToolCalls(text string) (content string, calls []ToolCall) {
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
func oneCall(data []byte) (ToolCall, bool) {
	var c struct {
		Name       string          `json:"name"`
		Arguments  json.RawMessage `json:"arguments"`
		Parameters json.RawMessage `json:"parameters"`
	}
	if json.Unmarshal(data, &c) != nil || c.Name == "" {
		return ToolCall{}, false
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
			return ToolCall{}, false
		}
		args = []byte(s)
	}
	if len(args) == 0 || string(args) == "null" {
		args = []byte("{}")
	}
	var obj map[string]any
	if json.Unmarshal(args, &obj) != nil {
		return ToolCall{}, false
	}
	return ToolCall{Name: c.Name, Arguments: args}, true
}
