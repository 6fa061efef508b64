package server

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weftlm/weft/internal/testmodel"

	"github.com/weftlm/weft"
)

// testdata is the shared data folder, beside the repository.
func testdata(t testing.TB) string {
	t.Helper()
	root := filepath.Join("..", "..", "shared", "testdata")
	if _, err := os.Stat(filepath.Join(root, "gguf-stories260K", "stories260K.gguf")); err != nil {
		t.Skipf("shared test data not available (want ../shared/testdata beside the repository): %v", err)
	}
	return root
}

func storiesPath(t testing.TB) string {
	return filepath.Join(testdata(t), "gguf-stories260K", "stories260K.gguf")
}

// chatModelPath is the story model carrying a real chat template.
func chatModelPath(t testing.TB) string { return testmodel.StoriesWithTemplate(t) }

// load opens a model for a test with parallel slots and a context of ctx
// tokens.
func load(t testing.TB, path string, parallel, ctx int) *weft.Model {
	t.Helper()
	m, err := weft.Load(context.Background(), path, weft.WithParallel(parallel), weft.WithBatch(max(64, parallel)), weft.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// testTime and the ids below are fixed so that responses compare byte for
// byte.
var testTime = time.Unix(1700000000, 0)

func newTestServer(t testing.TB, m *weft.Model, o Options) (*Server, *httptest.Server) {
	t.Helper()
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := New(m, o)
	s.now = func() time.Time { return testTime }
	s.newID = func(prefix string) string { return prefix + "test" }
	s.created = testTime.Unix()
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts
}

// do sends a request and returns the response with its whole body.
func do(t testing.TB, method, url, body string, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// TestErrors: every class of bad request gets OpenAI's error shape, the
// right status, the field at fault, and a message that says what to do.
func TestErrors(t *testing.T) {
	chatModel := load(t, chatModelPath(t), 1, 64)
	plain := load(t, storiesPath(t), 1, 64)
	_, chatTS := newTestServer(t, chatModel, Options{MaxBody: 2048})
	_, plainTS := newTestServer(t, plain, Options{})
	_, keyTS := newTestServer(t, plain, Options{APIKey: "sekrit"})
	long := `{"prompt": "` + strings.Repeat("once ", 200) + `"}`
	msgs := `"messages": [{"role": "user", "content": "Hi"}]`

	for _, tc := range []struct {
		name, url, method, path, body string
		header                        []string
		status                        int
		param, code, msg              string
	}{
		{"malformed JSON", chatTS.URL, "POST", "/v1/completions", `{"prompt": "Hi",}`, nil, 400, "", "", "not valid JSON"},
		{"empty body", chatTS.URL, "POST", "/v1/completions", ``, nil, 400, "", "", "body is empty"},
		{"not an object", chatTS.URL, "POST", "/v1/completions", `[1, 2]`, nil, 400, "", "", "must be a JSON object"},
		{"wrong type", chatTS.URL, "POST", "/v1/completions", `{"prompt": "Hi", "max_tokens": "ten"}`, nil, 400, "max_tokens", "", "max_tokens: want an integer, got string"},
		{"fraction for an integer", chatTS.URL, "POST", "/v1/completions", `{"prompt": "Hi", "max_tokens": 1.5}`, nil, 400, "max_tokens", "", "want an integer"},
		{"nested wrong type", chatTS.URL, "POST", "/v1/chat/completions", `{` + msgs + `, "stream_options": {"include_usage": 1}}`, nil, 400, "stream_options.include_usage", "", "want a boolean"},
		{"wrong prompt type", chatTS.URL, "POST", "/v1/completions", `{"prompt": {"text": "Hi"}}`, nil, 400, "prompt", "", "want a string"},
		{"missing prompt", chatTS.URL, "POST", "/v1/completions", `{"max_tokens": 3}`, nil, 400, "prompt", "", "prompt is required"},
		{"token id out of range", chatTS.URL, "POST", "/v1/completions", `{"prompt": [1, 99999]}`, nil, 400, "prompt", "", "prompt[1] = 99999"},
		{"n > 1", chatTS.URL, "POST", "/v1/completions", `{"prompt": "Hi", "n": 2}`, nil, 400, "n", "", "n = 2"},
		{"max_tokens 0", chatTS.URL, "POST", "/v1/completions", `{"prompt": "Hi", "max_tokens": 0}`, nil, 400, "max_tokens", "", "at least 1"},
		{"temperature out of range", chatTS.URL, "POST", "/v1/completions", `{"prompt": "Hi", "temperature": 3}`, nil, 400, "temperature", "", "[0, 2]"},
		{"top_p out of range", chatTS.URL, "POST", "/v1/completions", `{"prompt": "Hi", "top_p": 1.5}`, nil, 400, "top_p", "", "top_p = 1.5"},
		{"penalty out of range", chatTS.URL, "POST", "/v1/completions", `{"prompt": "Hi", "presence_penalty": -3}`, nil, 400, "presence_penalty", "", "[-2, 2]"},
		{"repeat_penalty 0", chatTS.URL, "POST", "/v1/completions", `{"prompt": "Hi", "repeat_penalty": 0}`, nil, 400, "repeat_penalty", "", "positive"},
		{"logit_bias key", chatTS.URL, "POST", "/v1/completions", `{"prompt": "Hi", "logit_bias": {"abc": 1}}`, nil, 400, "logit_bias", "", `key "abc"`},
		{"logit_bias value", chatTS.URL, "POST", "/v1/completions", `{"prompt": "Hi", "logit_bias": {"5": 101}}`, nil, 400, "logit_bias", "", "[-100, 100]"},
		{"too many stops", chatTS.URL, "POST", "/v1/completions", `{"prompt": "Hi", "stop": ["a", "b", "c", "d", "e"]}`, nil, 400, "stop", "", "at most 4"},
		{"stop type", chatTS.URL, "POST", "/v1/completions", `{"prompt": "Hi", "stop": 3}`, nil, 400, "stop", "", "want a string or an array"},
		{"logprobs too many", chatTS.URL, "POST", "/v1/completions", `{"prompt": "Hi", "logprobs": 6}`, nil, 400, "logprobs", "", "[0, 5]"},
		{"echo", chatTS.URL, "POST", "/v1/completions", `{"prompt": "Hi", "echo": true}`, nil, 400, "echo", "", "not supported"},
		{"prompt too long", chatTS.URL, "POST", "/v1/completions", long, nil, 400, "prompt", "context_length_exceeded", "the prompt is 402 tokens but the model's context holds 64"},
		{"chat prompt too long", chatTS.URL, "POST", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "` + strings.Repeat("hi ", 100) + `"}]}`, nil, 400, "messages", "context_length_exceeded", "context holds 64"},
		{"body over the limit", chatTS.URL, "POST", "/v1/completions", `{"prompt": "` + strings.Repeat("x", 4096) + `"}`, nil, 413, "", "request_too_large", "limit of 2048 bytes"},
		{"json_schema without schema", chatTS.URL, "POST", "/v1/chat/completions", `{` + msgs + `, "response_format": {"type": "json_schema"}}`, nil, 400, "response_format", "", `needs json_schema.schema`},
		{"json_schema unsupported", chatTS.URL, "POST", "/v1/chat/completions", `{` + msgs + `, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"anyOf": []}}}}}}`, nil, 400, "response_format", "", `/properties/a: "anyOf" is not supported`},
		{"response_format unknown", chatTS.URL, "POST", "/v1/chat/completions", `{` + msgs + `, "response_format": {"type": "xml"}}`, nil, 400, "response_format", "", `use "json_schema"`},
		{"top_logprobs without logprobs", chatTS.URL, "POST", "/v1/chat/completions", `{` + msgs + `, "top_logprobs": 2}`, nil, 400, "top_logprobs", "", "needs logprobs"},
		{"no messages", chatTS.URL, "POST", "/v1/chat/completions", `{"messages": []}`, nil, 400, "messages", "", "messages is required"},
		{"message not an object", chatTS.URL, "POST", "/v1/chat/completions", `{"messages": ["Hi"]}`, nil, 400, "messages[0]", "", "messages[0]: want"},
		{"bad content", chatTS.URL, "POST", "/v1/chat/completions", `{"messages": [{"role": "user", "content": 5}]}`, nil, 400, "messages[0]", "", "content"},
		{"no role", chatTS.URL, "POST", "/v1/chat/completions", `{"messages": [{"content": "Hi"}]}`, nil, 400, "messages[0].role", "", "role is required"},
		{"bad role", chatTS.URL, "POST", "/v1/chat/completions", `{"messages": [{"role": "robot", "content": "Hi"}]}`, nil, 400, "messages[0].role", "", `"robot"`},
		{"image part", chatTS.URL, "POST", "/v1/chat/completions", `{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}`, nil, 400, "messages[0].content[0]", "", "only text parts"},
		{"tool without a function", chatTS.URL, "POST", "/v1/chat/completions", `{` + msgs + `, "tools": [{"type": "function"}]}`, nil, 400, "tools[0]", "", `want {"type": "function"`},
		{"tool_choice required", chatTS.URL, "POST", "/v1/chat/completions", `{` + msgs + `, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}`, nil, 400, "tool_choice", "", `"required" is not supported`},
		{"tool_choice named", chatTS.URL, "POST", "/v1/chat/completions", `{` + msgs + `, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "f"}}}`, nil, 400, "tool_choice", "", "not a named function"},
		{"template refuses", chatTS.URL, "POST", "/v1/chat/completions", `{"messages": [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi"}]}`, nil, 400, "messages", "", "chat template failed"},
		{"no chat template", plainTS.URL, "POST", "/v1/chat/completions", `{` + msgs + `}`, nil, 400, "messages", "", "no chat template"},
		{"embedding format", chatTS.URL, "POST", "/v1/embeddings", `{"input": "Hi", "encoding_format": "int8"}`, nil, 400, "encoding_format", "", `"int8"`},
		{"embedding dimensions", chatTS.URL, "POST", "/v1/embeddings", `{"input": "Hi", "dimensions": 65}`, nil, 400, "dimensions", "", "have 64"},
		{"embedding input", chatTS.URL, "POST", "/v1/embeddings", `{"input": [1, 2]}`, nil, 400, "input", "", "token-id input is not supported"},
		{"embedding too long", chatTS.URL, "POST", "/v1/embeddings", `{"input": ["Hi", "` + strings.Repeat("once ", 80) + `"]}`, nil, 400, "input[1]", "context_length_exceeded", "context holds 64"},
		{"unknown route", chatTS.URL, "GET", "/v1/engines", ``, nil, 404, "", "not_found", "no route GET /v1/engines"},
		{"unknown model", chatTS.URL, "GET", "/v1/models/gpt-4", ``, nil, 404, "model", "model_not_found", `"gpt-4" does not exist`},
		{"wrong method", chatTS.URL, "GET", "/v1/chat/completions", ``, nil, 405, "", "method_not_allowed", "use POST"},
		{"wrong method on models", chatTS.URL, "DELETE", "/v1/models", ``, nil, 405, "", "method_not_allowed", "use GET"},
		{"missing key", keyTS.URL, "GET", "/v1/models", ``, nil, 401, "", "invalid_api_key", "Authorization: Bearer"},
		{"wrong key", keyTS.URL, "POST", "/v1/completions", `{"prompt": "Hi"}`, []string{"Authorization", "Bearer nope"}, 401, "", "invalid_api_key", "API key"},
		{"key not bearer", keyTS.URL, "GET", "/v1/models", ``, []string{"Authorization", "sekrit"}, 401, "", "invalid_api_key", "API key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, tc.method, tc.url+tc.path, tc.body, tc.header...)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if tc.status == 405 && resp.Header.Get("Allow") == "" {
				t.Error("405 without an Allow header")
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			var e errorBody
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("body %s: %v", body, err)
			}
			if e.Error.Type == "" || !strings.Contains(e.Error.Message, tc.msg) {
				t.Errorf("error %+v, want a message containing %q", e.Error, tc.msg)
			}
			if got := deref(e.Error.Param); got != tc.param {
				t.Errorf("param %q, want %q", got, tc.param)
			}
			if got := deref(e.Error.Code); got != tc.code {
				t.Errorf("code %q, want %q", got, tc.code)
			}
		})
	}
	// The right key passes, and the open routes need none.
	if resp, body := do(t, "GET", keyTS.URL+"/v1/models", "", "Authorization", "Bearer sekrit"); resp.StatusCode != 200 {
		t.Errorf("right key: %d %s", resp.StatusCode, body)
	}
	for _, p := range []string{"/health", "/metrics"} {
		if resp, body := do(t, "GET", keyTS.URL+p, ""); resp.StatusCode != 200 {
			t.Errorf("%s without a key: %d %s", p, resp.StatusCode, body)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// TestModelsHealthMetrics: the model list, one model, the health check,
// and the metrics after a few requests, in Prometheus's text format.
func TestModelsHealthMetrics(t *testing.T) {
	m := load(t, storiesPath(t), 2, 64)
	_, ts := newTestServer(t, m, Options{})

	_, body := do(t, "GET", ts.URL+"/v1/models", "")
	if want := `{"object":"list","data":[{"id":"stories260K","object":"model","created":1700000000,"owned_by":"weft"}]}` + "\n"; string(body) != want {
		t.Errorf("models:\n got %s\nwant %s", body, want)
	}
	_, body = do(t, "GET", ts.URL+"/v1/models/stories260K", "")
	if want := `{"id":"stories260K","object":"model","created":1700000000,"owned_by":"weft"}` + "\n"; string(body) != want {
		t.Errorf("model:\n got %s\nwant %s", body, want)
	}
	resp, body := do(t, "GET", ts.URL+"/health", "")
	if want := `{"active":0,"model":"stories260K","queued":0,"slots":2,"status":"ok"}` + "\n"; resp.StatusCode != 200 || string(body) != want {
		t.Errorf("health: %d\n got %s\nwant %s", resp.StatusCode, body, want)
	}
	if resp, _ := do(t, "HEAD", ts.URL+"/health", ""); resp.StatusCode != 200 {
		t.Errorf("HEAD /health: %d", resp.StatusCode)
	}

	do(t, "POST", ts.URL+"/v1/completions", `{"prompt": "Once", "max_tokens": 5, "temperature": 0}`)
	do(t, "POST", ts.URL+"/v1/completions", `{"prompt": "Once", "max_tokens": 5, "temperature": 0, "stream": true}`)
	do(t, "POST", ts.URL+"/v1/completions", `{"prompt": "Once", "n": 3}`)
	do(t, "GET", ts.URL+"/nowhere", "")
	resp, body = do(t, "GET", ts.URL+"/metrics", "")
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("metrics Content-Type %q", ct)
	}
	text := string(body)
	for _, want := range []string{
		"# TYPE weft_requests_total counter\n",
		`weft_requests_total{route="/v1/completions",status="200"} 2` + "\n",
		`weft_requests_total{route="/v1/completions",status="400"} 1` + "\n",
		`weft_requests_total{route="other",status="404"} 1` + "\n",
		`weft_requests_total{route="/v1/models",status="200"} 1` + "\n",
		"weft_prompt_tokens_total 4\n", // BOS and "Once", twice
		"weft_generated_tokens_total 10\n",
		"# TYPE weft_request_duration_seconds histogram\n",
		`weft_request_duration_seconds_bucket{route="/v1/completions",le="+Inf"} 3` + "\n",
		`weft_request_duration_seconds_count{route="/v1/completions"} 3` + "\n",
		"# TYPE weft_time_to_first_token_seconds histogram\n",
		`weft_time_to_first_token_seconds_count{route="/v1/completions"} 2` + "\n",
		"weft_queue_depth 0\n", "weft_active_slots 0\n", "weft_slots 2\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q:\n%s", want, text)
		}
	}
	checkExposition(t, text)
}

// checkExposition checks the text format's grammar: comment lines, then
// samples "name{labels} value" with cumulative histogram buckets.
func checkExposition(t *testing.T, text string) {
	t.Helper()
	if !strings.HasSuffix(text, "\n") {
		t.Error("exposition does not end in a newline")
	}
	var last float64 = -1
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if strings.HasPrefix(line, "# HELP ") || strings.HasPrefix(line, "# TYPE ") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 || !strings.HasPrefix(line, "weft_") {
			t.Errorf("bad sample line %q", line)
			continue
		}
		var v float64
		if err := json.Unmarshal([]byte(line[i+1:]), &v); err != nil {
			t.Errorf("bad value in %q", line)
		}
		if strings.Contains(line, "_bucket{") {
			if strings.Contains(line, `le="0.005"`) {
				last = -1
			}
			if v < last {
				t.Errorf("buckets not cumulative at %q", line)
			}
			last = v
		}
	}
}
