package server

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseToolCalls(t *testing.T) {
	type call struct{ name, args string }
	for _, tc := range []struct {
		name, text, content string
		calls               []call
	}{
		{"hermes", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "", []call{{"get_weather", `{"city":"Paris"}`}}},
		{"hermes, two, with text before", "Let me look.\n<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n<tool_call>{\"name\":\"b\",\"arguments\":{\"x\":[1,2]}}</tool_call>", "Let me look.", []call{{"a", `{}`}, {"b", `{"x":[1,2]}`}}},
		{"hermes, unterminated last", "<tool_call>{\"name\":\"a\",\"arguments\":{\"k\":1}}", "", []call{{"a", `{"k":1}`}}},
		{"hermes, text after", "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call> and more", "", nil},
		{"hermes, bad json", "<tool_call>{\"name\":\"a\",</tool_call>", "", nil},
		{"llama", ` {"name": "get_weather", "parameters": {"city": "Paris"}}`, "", []call{{"get_weather", `{"city":"Paris"}`}}},
		{"llama, python tag", `<|python_tag|>{"name": "f", "parameters": {}}`, "", []call{{"f", `{}`}}},
		{"llama, two joined by ;", `{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}`, "", []call{{"a", `{"x":1}`}, {"b", `{}`}}},
		{"mistral array", `[{"name": "a", "arguments": {"q": "x"}}, {"name": "b", "arguments": {}}]`, "", []call{{"a", `{"q":"x"}`}, {"b", `{}`}}},
		{"arguments as a JSON text", `{"name": "a", "arguments": "{\"q\": 1}"}`, "", []call{{"a", `{"q":1}`}}},
		{"no arguments", `{"name": "now"}`, "", []call{{"now", `{}`}}},
		{"plain JSON answer", `{"answer": 42}`, "", nil},
		{"arguments not an object", `{"name": "a", "arguments": [1]}`, "", nil},
		{"text", "The weather is fine.", "", nil},
		{"json then text", `{"name": "a", "parameters": {}} but also`, "", nil},
		{"empty", "", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			content, calls := parseToolCalls(tc.text)
			if len(calls) != len(tc.calls) {
				t.Fatalf("%d calls %+v, want %d", len(calls), calls, len(tc.calls))
			}
			if calls == nil {
				if content != tc.text {
					t.Errorf("content %q, want the text back", content)
				}
				return
			}
			if content != tc.content {
				t.Errorf("content %q, want %q", content, tc.content)
			}
			for i, c := range calls {
				if c.name != tc.calls[i].name || compactJSON(c.args) != tc.calls[i].args {
					t.Errorf("call %d: %s %s, want %s %s", i, c.name, compactJSON(c.args), tc.calls[i].name, tc.calls[i].args)
				}
			}
		})
	}
}

func TestMayBeToolCall(t *testing.T) {
	for text, want := range map[string]bool{
		"": true, "  ": true, "<tool": true, "<tool_call>{": true, " {": true, "[": true, "<|python": true,
		"The": false, "<b>": false, " Sure, {": false,
	} {
		if got := mayBeToolCall(text); got != want {
			t.Errorf("mayBeToolCall(%q) = %v, want %v", text, got, want)
		}
	}
}

// toolRequest asks for a call of get_weather, with the reply forced into
// Llama's call format by a JSON Schema (the tiny model would not write
// one by itself), so the reply is read back as a call.
func toolRequest(stream bool) string {
	schema := `{"type":"object","properties":{"name":{"const":"get_weather"},"parameters":{"type":"object","properties":{"city":{"enum":["Paris","Rome"]}},"required":["city"]}},"required":["name","parameters"]}`
	tools := `[{"type":"function","function":{"name":"get_weather","description":"Current weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`
	s := `{"messages":[{"role":"user","content":"Weather in Paris?"}],"tools":` + tools +
		`,"response_format":{"type":"json_schema","json_schema":{"name":"call","schema":` + schema + `}},"max_tokens":200,"seed":4`
	if stream {
		s += `,"stream":true`
	}
	return s + "}"
}

func TestToolCalls(t *testing.T) {
	m := load(t, chatModelPath(t), 1, 512)
	_, ts := newTestServer(t, m, Options{})
	resp, body := do(t, "POST", ts.URL+"/v1/chat/completions", toolRequest(false))
	var r struct {
		Choices []struct {
			Message struct {
				Content   *string
				ToolCalls []struct {
					ID       string
					Type     string
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			}
			FinishReason string `json:"finish_reason"`
		}
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &r) != nil || len(r.Choices) != 1 {
		t.Fatalf("status %d, body %s", resp.StatusCode, body)
	}
	c := r.Choices[0]
	if c.FinishReason == "length" {
		t.Skipf("the forced call did not finish within 200 tokens: %s", body)
	}
	if c.FinishReason != "tool_calls" || c.Message.Content != nil || len(c.Message.ToolCalls) != 1 {
		t.Fatalf("body %s: want one tool call and finish_reason tool_calls", body)
	}
	call := c.Message.ToolCalls[0]
	var args struct{ City string }
	if call.Type != "function" || call.Function.Name != "get_weather" || !strings.HasPrefix(call.ID, "call_") ||
		json.Unmarshal([]byte(call.Function.Arguments), &args) != nil || (args.City != "Paris" && args.City != "Rome") {
		t.Errorf("call %+v", call)
	}

	// Streamed: the held-back reply comes out as one tool-call delta.
	resp, body = do(t, "POST", ts.URL+"/v1/chat/completions", toolRequest(true))
	if resp.StatusCode != 200 {
		t.Fatalf("stream status %d: %s", resp.StatusCode, body)
	}
	var sawCall, sawFinish bool
	for _, line := range strings.Split(string(body), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Content   *string
					ToolCalls []struct {
						Index    *int
						Function struct{ Name, Arguments string }
					} `json:"tool_calls"`
				}
				FinishReason *string `json:"finish_reason"`
			}
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("chunk %s: %v", data, err)
		}
		for _, cc := range ch.Choices {
			if cc.Delta.Content != nil && *cc.Delta.Content != "" {
				t.Errorf("content %q streamed for a tool call", *cc.Delta.Content)
			}
			if len(cc.Delta.ToolCalls) == 1 && cc.Delta.ToolCalls[0].Index != nil && cc.Delta.ToolCalls[0].Function.Name == "get_weather" &&
				compactJSON([]byte(cc.Delta.ToolCalls[0].Function.Arguments)) == call.Function.Arguments {
				sawCall = true
			}
			if cc.FinishReason != nil && *cc.FinishReason == "tool_calls" {
				sawFinish = true
			}
		}
	}
	if !sawCall || !sawFinish {
		t.Errorf("stream without the call or its finish reason:\n%s", body)
	}

	// tool_choice none: no call is read, the reply stays text.
	resp, body = do(t, "POST", ts.URL+"/v1/chat/completions", strings.Replace(toolRequest(false), `"max_tokens"`, `"tool_choice":"none","max_tokens"`, 1))
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"finish_reason":"stop"`) || strings.Contains(string(body), "tool_calls") {
		t.Errorf("tool_choice none: status %d, body %s", resp.StatusCode, body)
	}
}
