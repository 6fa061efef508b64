// Package chat renders Hugging Face chat templates — the Jinja programs in a
// model's tokenizer_config.json or GGUF metadata that turn a conversation
// into the prompt text the model was trained on — the way transformers'
// apply_chat_template(..., tokenize=False) does.
//
// The Jinja engine is github.com/nikolalohinski/gonja/v2, set up as
// transformers sets up jinja2 (trim_blocks, lstrip_blocks, loopcontrols,
// raise_exception, strftime_now, a tojson that is json.dumps), with this
// package's replacements where gonja departs from Python: Jinja's exact
// lstrip_blocks rule, insertion-ordered dicts, Python's string methods and
// arithmetic. Rendering runs under a budget (steps, nesting, bytes) so a
// hostile template ends in an error, never a hang or a crash.
//
// Known departures from transformers: gonja does not tell a none value from
// an undefined one (so `x is defined` is false for a key holding none, and
// none prints empty), printf-style `%` string formatting and str.format are
// unsupported, and {% include %}, {% import %}, {% extends %}, {% with %}
// and {% filter %} are not available.
package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/parser"
)

// Input is what a template is rendered with.
type Input struct {
	Messages            []Message
	AddGenerationPrompt bool
	// BOSToken and EOSToken become bos_token and eos_token; an empty one is
	// left undefined, as transformers leaves out special tokens a tokenizer
	// does not have.
	BOSToken string
	EOSToken string
	// Tools are the tool definitions (JSON-schema dicts, key order kept).
	// Nil passes tools as none; an empty, non-nil slice passes [].
	Tools []json.RawMessage
	// Extra holds further template variables: other special tokens
	// (pad_token, unk_token, ...) and keyword arguments such as
	// date_string or tools_in_user_message. Go maps convert to dicts with
	// sorted keys; json.RawMessage values decode with their key order.
	Extra map[string]any
	// Now is the time strftime_now formats; zero means time.Now().
	Now time.Time
}

// Template is a parsed chat template. It is safe for concurrent renders.
type Template struct {
	name string
	root *nodes.Template
	stub *exec.Template
}

// Error is a template that failed to parse or render. Line and Column are
// 1-based; 0 means the engine did not report it.
type Error struct {
	Template string
	Line     int
	Column   int
	Msg      string
	Err      error // the cause: an *Exception for raise_exception
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("chat template")
	if e.Template != "" {
		fmt.Fprintf(&b, " %q", e.Template)
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, " line %d", e.Line)
		if e.Column > 0 {
			fmt.Fprintf(&b, " column %d", e.Column)
		}
	}
	b.WriteString(": ")
	b.WriteString(e.Msg)
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Parse compiles a template; name identifies it in errors (a model or file
// name).
func Parse(name, source string) (t *Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &Error{Template: name, Msg: fmt.Sprintf("template engine failed: %v", r)}
		}
	}()
	root, err := parseSource(name, source)
	if err != nil {
		return nil, asError(name, err)
	}
	stub, err := exec.NewTemplate(name, jinjaConfig(), stubLoader{}, environment)
	if err != nil {
		return nil, asError(name, err)
	}
	return &Template{name: name, root: root, stub: stub}, nil
}

// reserved are the variables Render itself sets.
var reserved = []string{"messages", "tools", "add_generation_prompt", "documents"}

// Render renders the conversation. A conversation the template rejects
// through raise_exception gives an *Error wrapping an *Exception.
func (t *Template) Render(in Input) (out string, err error) {
	data, inputBytes, err := t.context(in)
	if err != nil {
		return "", &Error{Template: t.name, Msg: err.Error(), Err: err}
	}
	state := &renderState{rangeLeft: maxRange, allocsLeft: baseAllocs + 32*inputBytes, now: in.Now}
	if state.now.IsZero() {
		state.now = time.Now()
	}
	data[stateKey] = state
	defer func() {
		if r := recover(); r != nil {
			out, err = "", &Error{Template: t.name, Msg: fmt.Sprintf("template engine failed: %v", r)}
		}
	}()
	var b strings.Builder
	r := &exec.Renderer{
		Config:      jinjaConfig(),
		Environment: &exec.Environment{Context: environment.Context.Inherit().Update(exec.NewContext(data)), Filters: environment.Filters, Tests: environment.Tests, ControlStructures: environment.ControlStructures, Methods: environment.Methods},
		Loader:      stubLoader{},
		Template:    t.stub,
		RootNode:    t.root,
		Output:      &b,
	}
	if err := r.Execute(); err != nil {
		e := asError(t.name, err)
		if state.raised != nil {
			e.Msg, e.Err = state.raised.Message, state.raised
		}
		return "", e
	}
	return b.String(), nil
}

// context builds the template variables, as render_jinja_template passes
// them: messages, tools, documents, add_generation_prompt, then the special
// tokens and keyword arguments.
func (t *Template) context(in Input) (map[string]any, int, error) {
	size := 0
	msgs := make([]any, len(in.Messages))
	for i, m := range in.Messages {
		d, err := m.templateValue()
		if err != nil {
			return nil, 0, fmt.Errorf("message %d: %w", i, err)
		}
		msgs[i] = d
		size += len(m.Content) + 64
		for _, p := range m.Parts {
			size += len(p.Text)
		}
	}
	data := map[string]any{"messages": msgs, "add_generation_prompt": in.AddGenerationPrompt, "tools": nil, "documents": nil}
	if in.Tools != nil {
		tools := make([]any, len(in.Tools))
		for i, raw := range in.Tools {
			v, err := decodeJSON(raw)
			if err != nil {
				return nil, 0, fmt.Errorf("tool %d: %w", i, err)
			}
			tools[i] = v
			size += len(raw)
		}
		data["tools"] = tools
	}
	if in.BOSToken != "" {
		data["bos_token"] = in.BOSToken
	}
	if in.EOSToken != "" {
		data["eos_token"] = in.EOSToken
	}
	for _, k := range sortedKeys(in.Extra) {
		for _, r := range reserved {
			if k == r {
				return nil, 0, fmt.Errorf("extra variable %q is set by Render itself", k)
			}
		}
		v, err := toTemplate(in.Extra[k])
		if err != nil {
			return nil, 0, fmt.Errorf("extra variable %q: %w", k, err)
		}
		data[k] = v
	}
	return data, size, nil
}

// lineRE finds the line numbers gonja writes into its render errors; the
// last one is the innermost, where the failure happened.
var lineRE = regexp.MustCompile(`at line (\d+)`)

func asError(name string, err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		e.Template = name
		return e
	}
	var syn *parser.SyntaxError
	if errors.As(err, &syn) {
		return &Error{Template: name, Line: syn.Line, Column: syn.Column, Msg: syn.Message, Err: err}
	}
	e = &Error{Template: name, Msg: err.Error(), Err: err}
	if strings.Contains(e.Msg, ErrBudget.Error()) {
		// The limit's error passes through gonja's *exec.Value, which
		// does not unwrap; restore it for errors.Is.
		e.Err = ErrBudget
	}
	if m := lineRE.FindAllStringSubmatch(e.Msg, -1); m != nil {
		e.Line, _ = strconv.Atoi(m[len(m)-1][1])
	}
	return e
}

// StripLeadingBOS returns rendered without its leading bos, if it has one.
//
// Templates differ on who writes the BOS token: Llama 3's, Gemma's and
// Mistral's write bos_token themselves, others leave it to the tokenizer.
// The rule for callers: tokenize the rendered text with special tokens
// parsed, and let the tokenizer add its BOS only when HasLeadingBOS is
// false — or, equivalently, strip the template's BOS with this function
// and always let the tokenizer add it. Either way the prompt starts with
// exactly one BOS.
func StripLeadingBOS(rendered, bos string) string {
	if HasLeadingBOS(rendered, bos) {
		return rendered[len(bos):]
	}
	return rendered
}

// HasLeadingBOS reports whether the rendered prompt already starts with the
// BOS token, so the tokenizer must not add another. An empty bos never
// matches.
func HasLeadingBOS(rendered, bos string) bool {
	return bos != "" && strings.HasPrefix(rendered, bos)
}
