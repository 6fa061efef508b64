package weft

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/weftlm/weft/internal/testmodel"
)

func compact(data []byte) string {
	var b bytes.Buffer
	if err := json.Compact(&b, data); err != nil {
		return string(data)
	}
	return b.String()
}

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
			content, calls := ParseToolCalls(tc.text)
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
				if c.Name != tc.calls[i].name || compact(c.Arguments) != tc.calls[i].args {
					t.Errorf("call %d: %s %s, want %s %s", i, c.Name, compact(c.Arguments), tc.calls[i].name, tc.calls[i].args)
				}
			}
		})
	}
}

// TestChatWithTools: WithTools reaches the template (Qwen 2.5's describes
// tools in the system turn), and Chat feeds what ChatTokens renders.
func TestChatWithTools(t *testing.T) {
	m, err := Load(context.Background(), testmodel.StoriesWithTemplateFile(t, "Qwen-Qwen2.5-7B-Instruct.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tool := []byte(`{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}`)
	msgs := []Message{{Role: "user", Content: "Weather in Paris?"}}
	text, _, err := m.ChatPrompt(msgs, tool)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, `"name": "get_weather"`) || !strings.Contains(text, "<tools>") {
		t.Fatalf("the prompt does not describe the tool:\n%s", text)
	}
	ids, err := m.ChatTokens(msgs, tool)
	if err != nil {
		t.Fatal(err)
	}
	_, want, _ := collect(t, m.GenerateTokens(context.Background(), ids, WithTemperature(0), WithMaxTokens(12)))
	_, got, _ := collect(t, m.Chat(context.Background(), msgs, WithTools(tool), WithTemperature(0), WithMaxTokens(12)))
	if len(got) != len(want) {
		t.Fatalf("Chat with tools gave %v, the rendered prompt %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("Chat with tools gave %v, the rendered prompt %v", got, want)
		}
	}
}
