package server

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/weftlm/weft/internal/testmodel"
)

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
	for _, data := range sseData(body) {
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

// TestToolsReachTheTemplate: with a template that describes tools (Qwen
// 2.5's), a request's tools lengthen the prompt by their description, and
// tool_choice none leaves them out.
func TestToolsReachTheTemplate(t *testing.T) {
	m := load(t, testmodel.StoriesWithTemplateFile(t, "Qwen-Qwen2.5-7B-Instruct.jinja"), 1, 1024)
	_, ts := newTestServer(t, m, Options{})
	promptTokens := func(extra string) int {
		t.Helper()
		resp, body := do(t, "POST", ts.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"Weather?"}],"max_tokens":1`+extra+`}`)
		var r struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			}
		}
		if resp.StatusCode != 200 || json.Unmarshal(body, &r) != nil {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		return r.Usage.PromptTokens
	}
	tools := `,"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`
	plain, with, none := promptTokens(""), promptTokens(tools), promptTokens(tools+`,"tool_choice":"none"`)
	if with <= plain+20 || none != plain {
		t.Errorf("prompt tokens: %d without tools, %d with, %d with tool_choice none", plain, with, none)
	}
}

// TestToolsStreamLogprobs: a streamed reply held back while it might be a
// tool call still brings every token's log-probability once released.
func TestToolsStreamLogprobs(t *testing.T) {
	m := load(t, chatModelPath(t), 1, 512)
	_, ts := newTestServer(t, m, Options{})
	req := `{"messages":[{"role":"user","content":"Tell me a story"}],"tools":[{"type":"function","function":{"name":"f"}}],` +
		`"logprobs":true,"top_logprobs":2,"max_tokens":8,"temperature":0,"stream":true}`
	resp, body := do(t, "POST", ts.URL+"/v1/chat/completions", req)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var text strings.Builder
	entries := 0
	for _, data := range sseData(body) {
		var ch struct {
			Choices []struct {
				Delta    struct{ Content *string }
				Logprobs *struct {
					Content []struct{ Token string }
				}
			}
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatal(err)
		}
		for _, c := range ch.Choices {
			if c.Delta.Content != nil {
				text.WriteString(*c.Delta.Content)
			}
			if c.Logprobs != nil {
				entries += len(c.Logprobs.Content)
			}
		}
	}
	if entries != 8 || text.Len() == 0 {
		t.Errorf("%d log-probability entries for 8 tokens, text %q", entries, text.String())
	}
}

// sseData is the data of each event of an SSE body, but the final [DONE].
func sseData(body []byte) []string {
	var out []string
	for _, line := range strings.Split(string(body), "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && data != "[DONE]" {
			out = append(out, data)
		}
	}
	return out
}
