package chat

import (
	"encoding/json"
	"errors"
	"testing"
	"time"
)

// fuzzInput exercises messages, tool calls, tools and extras, so that
// random templates have data to walk.
var fuzzInput = Input{
	Messages: []Message{
		{Role: "system", Content: "sys"},
		{Role: "user", Content: "héllo\n"},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "abcDEF123", Function: FunctionCall{Name: "f", Arguments: json.RawMessage(`{"a":[1,2.5,null],"b":"x"}`)}}}},
		{Role: "tool", Content: "18", ToolCallID: "abcDEF123"},
		{Role: "user", Parts: []Part{{Type: "text", Text: "t"}, {Type: "image"}}},
	},
	AddGenerationPrompt: true,
	BOSToken:            "<s>",
	EOSToken:            "</s>",
	Tools:               []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}`)},
	Extra:               map[string]any{"flag": true},
	Now:                 time.Date(2025, 3, 14, 9, 5, 7, 0, time.UTC),
}

// FuzzTemplate parses and renders arbitrary template sources: whatever the
// source, the result is output or an *Error, quickly, never a panic, a hang
// or a runaway allocation. The seeds in testdata/fuzz/FuzzTemplate are
// small templates using each construct chat templates use.
func FuzzTemplate(f *testing.F) {
	f.Add("{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
	f.Fuzz(func(t *testing.T, src string) {
		start := time.Now()
		tmpl, err := Parse("fuzz", src)
		if err == nil {
			_, err = tmpl.Render(fuzzInput)
		}
		var e *Error
		if err != nil && !errors.As(err, &e) {
			t.Fatalf("error %v (%T) is not an *Error", err, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("took %v", d)
		}
	})
}
