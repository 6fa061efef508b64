package server

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/weftlm/weft"
	"github.com/weftlm/weft/sample"
)

// TestMessagesDecode: text parts become one string, "developer" reads as
// "system", and other fields pass through.
func TestMessagesDecode(t *testing.T) {
	var c chatRequest
	body := `{"messages": [
		{"role": "developer", "content": "Be brief"},
		{"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
		{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
		{"role": "tool", "content": "42", "tool_call_id": "c1"}]}`
	if err := json.Unmarshal([]byte(body), &c); err != nil {
		t.Fatal(err)
	}
	got, err := c.messages()
	if err != nil {
		t.Fatal(err)
	}
	want := []weft.Message{
		{Role: "system", Content: "Be brief"},
		{Role: "user", Content: "one\ntwo"},
		{Role: "assistant", ToolCalls: got[2].ToolCalls},
		{Role: "tool", Content: "42", ToolCallID: "c1"},
	}
	if !reflect.DeepEqual(got, want) || len(got[2].ToolCalls) != 1 || got[2].ToolCalls[0].Function.Name != "f" {
		t.Errorf("messages\n got %+v\nwant %+v", got, want)
	}
}

// TestSamplingOptions: the request fields map onto the model's options.
func TestSamplingOptions(t *testing.T) {
	for _, tc := range []struct {
		body       string
		defaultMax int
		want       weft.GenerateOptions
	}{
		{`{}`, 16, weft.GenerateOptions{MaxTokens: 16, Sampling: sample.Params{Temperature: 1, TopP: 1, RepeatPenalty: 1}}},
		{`{"max_tokens": 9, "temperature": 0, "seed": 5, "stop": "x"}`, 0,
			weft.GenerateOptions{MaxTokens: 9, Stop: []string{"x"}, Sampling: sample.Params{TopP: 1, RepeatPenalty: 1, Seed: 5}}},
		{`{"max_tokens": 9, "max_completion_tokens": 4, "top_p": 0, "top_k": 7, "seed": 0}`, 0,
			weft.GenerateOptions{MaxTokens: 4, Sampling: sample.Params{Temperature: 1, TopK: 1, RepeatPenalty: 1, Seed: defaultSeedZero}}},
		{`{"top_p": 0.5, "top_k": 7, "min_p": 0.1, "repeat_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": -0.5, "logit_bias": {"3": -100}, "stop": ["a", "b"]}`, 0,
			weft.GenerateOptions{Stop: []string{"a", "b"}, Sampling: sample.Params{Temperature: 1, TopP: 0.5, TopK: 7, MinP: 0.1,
				RepeatPenalty: 1.3, PresencePenalty: 0.5, FrequencyPenalty: -0.5, LogitBias: map[int32]float32{3: -100}}}},
	} {
		var sp sampling
		if err := json.Unmarshal([]byte(tc.body), &sp); err != nil {
			t.Fatal(err)
		}
		got, err := sp.options(512, tc.defaultMax)
		if err != nil {
			t.Errorf("%s: %v", tc.body, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.body, got, tc.want)
		}
	}
}

// TestPromptsDecode: every form of prompt.
func TestPromptsDecode(t *testing.T) {
	for _, tc := range []struct {
		body string
		want []prompt
	}{
		{`{"prompt": "Hi"}`, []prompt{{text: "Hi"}}},
		{`{"prompt": ["a", "b"]}`, []prompt{{text: "a"}, {text: "b"}}},
		{`{"prompt": [1, 5, 9]}`, []prompt{{ids: []int32{1, 5, 9}, isIDs: true}}},
		{`{"prompt": [[1, 5], "c"]}`, []prompt{{ids: []int32{1, 5}, isIDs: true}, {text: "c"}}},
	} {
		var c completionRequest
		if err := json.Unmarshal([]byte(tc.body), &c); err != nil {
			t.Fatal(err)
		}
		got, err := c.prompts(512)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v, %v; want %+v", tc.body, got, err, tc.want)
		}
	}
}
