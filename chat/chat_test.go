package chat

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func render(t *testing.T, src string, in Input) (string, error) {
	t.Helper()
	tmpl, err := Parse("test", src)
	if err != nil {
		return "", err
	}
	return tmpl.Render(in)
}

func mustRender(t *testing.T, src string, in Input) string {
	t.Helper()
	out, err := render(t, src, in)
	if err != nil {
		t.Fatalf("%q: %v", src, err)
	}
	return out
}

func TestMessageJSON(t *testing.T) {
	tests := []struct {
		json string
		want Message
	}{
		{`{"role":"user","content":"hi"}`, Message{Role: "user", Content: "hi"}},
		{`{"role":"assistant","content":null,"tool_calls":[{"id":"x","type":"function","function":{"name":"f","arguments":{"a":1}}}]}`,
			Message{Role: "assistant", ToolCalls: []ToolCall{{ID: "x", Type: "function", Function: FunctionCall{Name: "f", Arguments: json.RawMessage(`{"a":1}`)}}}}},
		{`{"role":"user","content":[{"type":"text","text":"a"},{"type":"image"}]}`, Message{Role: "user", Parts: []Part{{Type: "text", Text: "a"}, {Type: "image"}}}},
		{`{"role":"tool","content":"18","tool_call_id":"abc","name":"w"}`, Message{Role: "tool", Content: "18", ToolCallID: "abc", Name: "w"}},
	}
	for _, tt := range tests {
		var m Message
		if err := json.Unmarshal([]byte(tt.json), &m); err != nil {
			t.Fatalf("%s: %v", tt.json, err)
		}
		got, _ := json.Marshal(m)
		want, _ := json.Marshal(tt.want)
		if string(got) != string(want) {
			t.Errorf("%s: got %s, want %s", tt.json, got, want)
		}
	}
	var m Message
	if err := json.Unmarshal([]byte(`{"role":"user","content":42}`), &m); err == nil {
		t.Error("numeric content accepted")
	}
}

// TestTemplateValues checks the dicts a template sees: key order, when
// content is none, how tools and extras arrive.
func TestTemplateValues(t *testing.T) {
	tests := []struct {
		name string
		src  string
		in   Input
		want string
	}{
		{"message keys", `{{ messages | tojson }}`, Input{Messages: []Message{
			{Role: "assistant", ToolCalls: []ToolCall{{Function: FunctionCall{Name: "f", Arguments: json.RawMessage(`{"b":1,"a":[true,null]}`)}}}},
			{Role: "tool", Content: "ok", ToolCallID: "c1", Name: "f", Extra: map[string]any{"z": 1, "reasoning_content": "r"}},
			{Role: "user", Parts: []Part{{Type: "text", Text: "t"}, {Type: "image", Text: "ignored"}}},
		}}, `[{"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"b": 1, "a": [true, null]}}}]}, ` +
			`{"role": "tool", "content": "ok", "name": "f", "tool_call_id": "c1", "reasoning_content": "r", "z": 1}, ` +
			`{"role": "user", "content": [{"type": "text", "text": "t"}, {"type": "image"}]}]`},
		{"no tools is none", `{{ tools is none }} {{ tools | tojson }}`, Input{}, "True null"},
		{"empty tools list", `{{ tools is none }} {{ tools | tojson }}`, Input{Tools: []json.RawMessage{}}, "False []"},
		{"tool order", `{{ tools[0] | tojson }}`, Input{Tools: []json.RawMessage{json.RawMessage(`{"z":1,"a":{"y":2.50,"x":1e2}}`)}}, `{"z": 1, "a": {"y": 2.5, "x": 100.0}}`},
		{"bos undefined when empty", `[{{ bos_token }}]{% if bos_token is defined %}D{% endif %}[{{ eos_token }}]`, Input{EOSToken: "</s>"}, "[][</s>]"},
		{"extra values", `{{ flag }} {{ n }} {{ m | tojson }} {{ raw | tojson }}`, Input{Extra: map[string]any{
			"flag": true, "n": int64(7), "m": map[string]int{"b": 2, "a": 1}, "raw": json.RawMessage(`{"b":2,"a":1}`)}},
			`True 7 {"a": 1, "b": 2} {"b": 2, "a": 1}`},
		{"generation prompt", `{% if add_generation_prompt %}G{% endif %}`, Input{AddGenerationPrompt: true}, "G"},
		{"strftime", `{{ strftime_now("%d %b %Y %H:%M") }}`, Input{Now: time.Date(2024, 7, 26, 13, 4, 0, 0, time.UTC)}, "26 Jul 2024 13:04"},
		{"generation tag", `{% generation %}a{{ 1 }}{% endgeneration %}`, Input{}, "a1"},
	}
	for _, tt := range tests {
		if got := mustRender(t, tt.src, tt.in); got != tt.want {
			t.Errorf("%s:\n got %s\nwant %s", tt.name, got, tt.want)
		}
	}
}

// TestPython checks the places where gonja's own behaviour differs from
// Python's and this package supplies Python's.
func TestPython(t *testing.T) {
	tests := []struct{ src, want string }{
		{`{{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2.5 * 2 }} {{ 1 + 2 * 3 }}`, "-4 2 -2 1024 3.5 2.0 5.0 7"},
		{`{{ "ab" * 3 }} {{ 2 * "x" }} {{ ([1, 2] * 2) | length }} {{ "a" ~ 1 ~ true ~ 1.5 }} {{ ([1] + [2]) | length }}`, "ababab xx 4 a1True1.5 2"},
		{`[{{ "  a b  ".strip() }}][{{ "  a".lstrip() }}][{{ "a  ".rstrip() }}][{{ "xxaxx".strip("x") }}]`, "[a b][a][a][a]"},
		{`{{ "a  b\tc".split() | join("|") }} {{ "a,b,c".split(",", 1) | join("|") }} {{ "a".split(",") | join("|") }}`, "a|b|c a|b,c a"},
		{`{{ "aaaa".replace("a", "b", 2) }} {{ "x-y" | replace("-", "+") }} {{ "hello wORLD go-lang".title() }}`, "bbaa x+y Hello World Go-Lang"},
		{`{{ {"b": 1, "a": 2}.keys() | join(",") }} {% for k, v in {"b": 1, "a": 2}.items() %}{{ k }}{{ v }}{% endfor %} {{ {"b": 1}.get("c", "d") }}`, "b,a b1a2 d"},
		{`{{ [1, 2, 3] | reverse | join(",") }} {{ "abc" | reverse }} {{ " x " | trim }}|`, "3,2,1 cba x|"},
		{`{{ {"k": "é\n", "n": [1.0, 1e16, 1e-05, false]} | tojson }}`, `{"k": "é\n", "n": [1.0, 1e+16, 1e-05, false]}`},
		{`{{ {"a": [1]} | tojson(indent=2) }}`, "{\n  \"a\": [\n    1\n  ]\n}"},
		{`{{ "é" | tojson(true) }} {{ {"b": 1, "a": 2} | tojson(sort_keys=true, separators=[",", ":"]) }}`, `"\u00e9" {"a":2,"b":1}`},
		{`{% set ns = namespace(n=0) %}{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}`, "2"},
		{`{% macro m(a, b="d") %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}`, "[1d][23]"},
		{`{% set x %}in{{ 1 }}{% endset %}{{ x }} {% set y = "a" if false else "b" %}{{ y }}`, "in1 b"},
		{`{% for c in "hé!" %}{{ c }},{% endfor %} {{ "héllo"[1] }}{{ "héllo"[-1] }}[{{ "ab"[5] }}] {{ [1, 2][-2] }} {{ {1: "one"}[1] }} {{ {"a": 1}["a"] }}`, "h,é,!, éo[] 1 one 1"},
		{"a {% if true %}b{% endif %} c\n  {% if true %}d{% endif %}\n{{ 1 }} {% if true %}e{% endif %}", "a b c\nd1 e"},
	}
	for _, tt := range tests {
		if got := mustRender(t, tt.src, Input{}); got != tt.want {
			t.Errorf("%s:\n got %q\nwant %q", tt.src, got, tt.want)
		}
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name, src  string
		in         Input
		line, col  int
		contains   string
		exception  string
		parseError bool
	}{
		{name: "unclosed if", src: "a\n{% if x %}b", line: 0, contains: "", parseError: true},
		{name: "bad expression", src: "line1\n{{ 1 + }}", line: 2, parseError: true},
		{name: "unknown tag", src: "{% include 'x' %}", line: 1, col: 4, contains: "include", parseError: true},
		{name: "library panic", src: "{%if 0 is %}0", contains: "template engine failed", parseError: true},
		// gonja's lexer panics on this one, and after the error of the next
		// emits error tokens without end (fuzzing found both).
		{name: "lexer panic", src: "{{ 5.퐐 }}", contains: "template lexer failed", parseError: true},
		{name: "endless lexer", src: "{%!/!5.퐐 퐤 쐤", line: 1, col: 4, contains: `Unexpected "!"`, parseError: true},
		{name: "recursive loop", src: "{% for x in [1] recursive %}{% endfor %}", contains: "recursive", parseError: true},
		{name: "raise", src: "ok\n{% if true %}\n{{ raise_exception('bad roles') }}\n{% endif %}", line: 3, exception: "bad roles"},
		{name: "type error", src: "x\n{{ 'a' + 1 }}", line: 2, contains: "unsupported operand type(s) for +: 'str' and 'int'"},
		{name: "division by zero", src: "{{ 1 // 0 }}", line: 1, contains: "by zero"},
		{name: "percent formatting", src: "{{ '%s' % 1 }}", contains: "not supported"},
		{name: "set on dict", src: "{% set d = {} %}{% set d.x = 1 %}", contains: "non-namespace"},
		{name: "reserved extra", src: "x", in: Input{Extra: map[string]any{"messages": 1}}, contains: "set by Render"},
		{name: "bad tool json", src: "x", in: Input{Tools: []json.RawMessage{json.RawMessage(`{`)}}, contains: "tool 0"},
	}
	for _, tt := range tests {
		tmpl, err := Parse("tmpl-"+tt.name, tt.src)
		if tt.parseError != (err != nil) {
			t.Fatalf("%s: parse error %v, want one: %v", tt.name, err, tt.parseError)
		}
		if err == nil {
			_, err = tmpl.Render(tt.in)
		}
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("%s: error %v (%T) is not an *Error", tt.name, err, err)
		}
		if e.Template != "tmpl-"+tt.name || !strings.Contains(err.Error(), `"tmpl-`+tt.name+`"`) {
			t.Errorf("%s: %v does not name the template", tt.name, err)
		}
		if tt.line != 0 && e.Line != tt.line || tt.col != 0 && e.Column != tt.col {
			t.Errorf("%s: %v at %d:%d, want %d:%d", tt.name, err, e.Line, e.Column, tt.line, tt.col)
		}
		if !strings.Contains(err.Error(), tt.contains) {
			t.Errorf("%s: %v does not mention %q", tt.name, err, tt.contains)
		}
		var ex *Exception
		if got := errors.As(err, &ex); got != (tt.exception != "") || got && ex.Message != tt.exception {
			t.Errorf("%s: exception %v, want %q", tt.name, ex, tt.exception)
		}
	}
}

// TestBudget feeds templates that would hang, overflow the stack or
// exhaust memory without the guards; each must fail fast with ErrBudget.
func TestBudget(t *testing.T) {
	srcs := []string{
		`{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}`,
		`{% for i in range(10**12) %}{% endfor %}`,
		`{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}`,
		`{% macro f() %}{{ f() }}{{ f() }}{% endmacro %}{{ f() }}`,
		`{{ "a" * 10000000000 }}`,
		`{{ ([1] * 100000000) | length }}`,
		`{% set ns = namespace(s="ab") %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}`,
		`{% set ns = namespace(s="ab") %}{% for i in range(64) %}{% set ns.s = ns.s.replace("a", "aaaa") %}{% endfor %}`,
		`{% set ns = namespace(s="ab") %}{% for i in range(64) %}{% set ns.s = ns.s | replace("a", "aaaa") %}{% endfor %}`,
		`{% set s = "x" * 1000000 %}{{ range(200) | map("string") | join(s) | length }}`,
		`{{ "x" | center(100000000) }}`,
		`{{ "x".ljust(100000000) }}`,
		`{{ [1] | tojson(indent=100000000) }}`,
		`{% set s = "y" * 60000000 %}{% for i in range(100) %}{{ s }}{% endfor %}`,
	}
	for _, src := range srcs {
		start := time.Now()
		_, err := render(t, src, Input{})
		if !errors.Is(err, ErrBudget) {
			t.Errorf("%s: %v, want ErrBudget", src, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s: took %v", src, d)
		}
	}
	deep := strings.Repeat("(", 1000) + "1" + strings.Repeat(")", 1000)
	if _, err := Parse("deep", "{{ "+deep+" }}"); err == nil || !strings.Contains(err.Error(), "nested") {
		t.Errorf("deep nesting: %v", err)
	}
	if _, err := Parse("big", strings.Repeat("x", maxSourceBytes+1)); err == nil {
		t.Error("oversized source accepted")
	}
}

func TestBOS(t *testing.T) {
	tests := []struct {
		rendered, bos string
		has           bool
		stripped      string
	}{
		{"<s>[INST] hi", "<s>", true, "[INST] hi"},
		{"[INST] hi", "<s>", false, "[INST] hi"},
		{"<|begin_of_text|><|start_header_id|>", "<|begin_of_text|>", true, "<|start_header_id|>"},
		{"<s>", "", false, "<s>"},
		{" <s>x", "<s>", false, " <s>x"},
	}
	for _, tt := range tests {
		if got := HasLeadingBOS(tt.rendered, tt.bos); got != tt.has {
			t.Errorf("HasLeadingBOS(%q, %q) = %v", tt.rendered, tt.bos, got)
		}
		if got := StripLeadingBOS(tt.rendered, tt.bos); got != tt.stripped {
			t.Errorf("StripLeadingBOS(%q, %q) = %q", tt.rendered, tt.bos, got)
		}
	}
}

func TestConcurrentRender(t *testing.T) {
	tmpl, err := Parse("c", `{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m.content }}{% endfor %}{{ ns.n }}`)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			content := strings.Repeat("x", i)
			in := Input{Messages: []Message{{Role: "user", Content: content}, {Role: "user", Content: content}}}
			for range 50 {
				got, err := tmpl.Render(in)
				if want := content + content + "2"; err != nil || got != want {
					t.Errorf("got %q, %v; want %q", got, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestFloatRepr(t *testing.T) {
	tests := map[float64]string{
		1: "1.0", 0.1: "0.1", 1e16: "1e+16", 1e15: "1000000000000000.0", 1e-4: "0.0001", 1e-5: "1e-05",
		123456789.125: "123456789.125", 1.5e300: "1.5e+300", 5e-324: "5e-324", -2.5: "-2.5", 0: "0.0",
		123456789012345678.0: "1.2345678901234568e+17",
	}
	for f, want := range tests {
		if got := pyFloatRepr(f); got != want {
			t.Errorf("pyFloatRepr(%v) = %q, want %q", f, got, want)
		}
	}
}

func TestStrftime(t *testing.T) {
	now := time.Date(2025, 3, 4, 21, 5, 7, 123456000, time.UTC)
	tests := map[string]string{
		"%Y-%m-%d %H:%M:%S": "2025-03-04 21:05:07", "%d %b %Y": "04 Mar 2025", "%A %B %-d": "Tuesday March 4",
		"%a %y %I%p %j %%": "Tue 25 09PM 063 %", "%e|%f|%u|%w|%F|%T": " 4|123456|2|2|2025-03-04|21:05:07",
		"%c": "Tue Mar  4 21:05:07 2025", "[%z%Z]": "[]", "%Q": "%Q",
	}
	for f, want := range tests {
		if got := strftime(now, f); got != want {
			t.Errorf("strftime(%q) = %q, want %q", f, got, want)
		}
	}
}
