package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/weftlm/weft"
)

// Tool calling. The tools of a request go to the chat template, which
// describes them to the model in its own format; the reply is read for
// calls by weft.ParseToolCalls, which knows the formats templates ask for.

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
func (s *Server) responseCalls(calls []weft.ToolCall, index bool) []toolCall {
	out := make([]toolCall, len(calls))
	for i, c := range calls {
		out[i].ID, out[i].Type = s.newID("call_"), "function"
		out[i].Function.Name, out[i].Function.Arguments = c.Name, compactJSON(c.Arguments)
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
