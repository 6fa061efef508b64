package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// Message is one turn of a conversation, shaped the way transformers hands
// messages to a chat template (the OpenAI chat format).
//
// In the template it is a dict with the keys role and content, then name,
// tool_calls, tool_call_id and the keys of Extra, each only when set. Content
// reaches the template as a string, except:
//   - when Parts is non-nil, content is that list of parts;
//   - when ToolCalls is non-empty and neither Content nor Parts is set,
//     content is none, as OpenAI-style clients send a message that only
//     calls tools (DeepSeek-R1's template tests for exactly that).
type Message struct {
	Role       string
	Content    string
	Parts      []Part
	Name       string
	ToolCalls  []ToolCall
	ToolCallID string
	// Extra holds further keys some templates read, such as
	// "reasoning_content"; values convert as Input.Extra's do.
	Extra map[string]any
}

// Part is one element of a list-of-parts content: {"type": "text", "text":
// ...} for text, {"type": "image"} and the like for other media (the text key
// appears only for type "text").
type Part struct {
	Type string `json:"type"`
	Text string `json:"text,omitempty"`
}

// ToolCall is one function call an assistant turn made.
type ToolCall struct {
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"` // "function" when empty
	Function FunctionCall `json:"function"`
}

// FunctionCall names the function and its arguments. Arguments is raw JSON:
// an object (what most Hugging Face templates expect, e.g. for `arguments |
// tojson`) or a string holding JSON (the OpenAI wire form, which DeepSeek's
// template concatenates as text). Key order is kept. Nil leaves the key out.
type FunctionCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// messageJSON is the OpenAI/Hugging Face wire form of a Message.
type messageJSON struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content,omitempty"`
	Name       string          `json:"name,omitempty"`
	ToolCalls  []ToolCall      `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
}

// UnmarshalJSON reads the OpenAI/Hugging Face form, where content is a
// string, a list of parts or null. Unknown keys are ignored.
func (m *Message) UnmarshalJSON(data []byte) error {
	var w messageJSON
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	*m = Message{Role: w.Role, Name: w.Name, ToolCalls: w.ToolCalls, ToolCallID: w.ToolCallID}
	content := bytes.TrimSpace(w.Content)
	switch {
	case len(content) == 0 || bytes.Equal(content, []byte("null")):
	case content[0] == '"':
		return json.Unmarshal(content, &m.Content)
	case content[0] == '[':
		m.Parts = []Part{}
		return json.Unmarshal(content, &m.Parts)
	default:
		return fmt.Errorf("message content: want a string, a list of parts or null, got %.20s", content)
	}
	return nil
}

// templateValue builds the dict a template sees for m.
func (m Message) templateValue() (*exec.Dict, error) {
	d := exec.NewDict()
	put(d, "role", m.Role)
	switch {
	case m.Parts != nil:
		parts := make([]any, len(m.Parts))
		for i, p := range m.Parts {
			pd := exec.NewDict()
			put(pd, "type", p.Type)
			if p.Type == "text" {
				put(pd, "text", p.Text)
			}
			parts[i] = pd
		}
		put(d, "content", parts)
	case m.Content == "" && len(m.ToolCalls) > 0:
		put(d, "content", nil)
	default:
		put(d, "content", m.Content)
	}
	if m.Name != "" {
		put(d, "name", m.Name)
	}
	if len(m.ToolCalls) > 0 {
		calls := make([]any, len(m.ToolCalls))
		for i, c := range m.ToolCalls {
			cd, err := c.templateValue()
			if err != nil {
				return nil, fmt.Errorf("tool call %d: %w", i, err)
			}
			calls[i] = cd
		}
		put(d, "tool_calls", calls)
	}
	if m.ToolCallID != "" {
		put(d, "tool_call_id", m.ToolCallID)
	}
	for _, k := range sortedKeys(m.Extra) {
		v, err := toTemplate(m.Extra[k])
		if err != nil {
			return nil, fmt.Errorf("extra key %q: %w", k, err)
		}
		put(d, k, v)
	}
	return d, nil
}

func (c ToolCall) templateValue() (*exec.Dict, error) {
	d := exec.NewDict()
	if c.ID != "" {
		put(d, "id", c.ID)
	}
	typ := c.Type
	if typ == "" {
		typ = "function"
	}
	put(d, "type", typ)
	f := exec.NewDict()
	put(f, "name", c.Function.Name)
	if c.Function.Arguments != nil {
		args, err := decodeJSON(c.Function.Arguments)
		if err != nil {
			return nil, fmt.Errorf("function %q arguments: %w", c.Function.Name, err)
		}
		put(f, "arguments", args)
	}
	put(d, "function", f)
	return d, nil
}

func put(d *exec.Dict, key string, v any) {
	d.Pairs = append(d.Pairs, &exec.Pair{Key: exec.AsValue(key), Value: exec.AsValue(v)})
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// decodeJSON turns raw JSON into template values: objects become ordered
// dicts (Python keeps insertion order, and tojson must reproduce it), integers
// int, other numbers float64, as Python's json.loads does.
func decodeJSON(raw json.RawMessage) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("trailing data after JSON value")
	}
	return v, nil
}

// maxJSONDepth bounds nesting so that hostile input cannot exhaust the stack.
const maxJSONDepth = 512

func decodeValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxJSONDepth {
		return nil, fmt.Errorf("JSON nested deeper than %d", maxJSONDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			list := []any{}
			for dec.More() {
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := dec.Token()
			return list, err
		}
		d := exec.NewDict()
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := decodeValue(dec, depth+1)
			if err != nil {
				return nil, err
			}
			setKey(d, k.(string), v)
		}
		_, err := dec.Token()
		return d, err
	case json.Number:
		if i, err := t.Int64(); err == nil && int64(int(i)) == i {
			return int(i), nil
		}
		f, err := t.Float64()
		if err != nil {
			return nil, fmt.Errorf("number %s: %w", t, err)
		}
		return f, nil
	default:
		return t, nil
	}
}

// setKey replaces the value of an existing key in place, as assigning to a
// Python dict does (a repeated JSON key keeps its first position).
func setKey(d *exec.Dict, key string, v any) {
	for _, p := range d.Pairs {
		if p.Key.String() == key {
			p.Value = exec.AsValue(v)
			return
		}
	}
	put(d, key, v)
}

// toTemplate converts a caller's Go value into a template value: JSON raw
// messages decode in order, maps become dicts with sorted keys (Go maps have
// no order to keep), slices become lists.
func toTemplate(v any) (any, error) {
	return toTemplateDepth(v, 0)
}

func toTemplateDepth(v any, depth int) (any, error) {
	if depth > maxJSONDepth {
		return nil, fmt.Errorf("value nested deeper than %d", maxJSONDepth)
	}
	switch t := v.(type) {
	case nil, string, bool, int, float64:
		return t, nil
	case json.RawMessage:
		return decodeJSON(t)
	case json.Number:
		return decodeJSON(json.RawMessage(t))
	case Message:
		return t.templateValue()
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return int(rv.Int()), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if rv.Uint() > uint64(^uint(0)>>1) {
			return nil, fmt.Errorf("integer %d out of range", rv.Uint())
		}
		return int(rv.Uint()), nil
	case reflect.Float32:
		return rv.Float(), nil
	case reflect.String:
		return rv.String(), nil
	case reflect.Bool:
		return rv.Bool(), nil
	case reflect.Slice, reflect.Array:
		if rv.Kind() == reflect.Slice && rv.IsNil() {
			return nil, nil
		}
		list := make([]any, rv.Len())
		for i := range list {
			e, err := toTemplateDepth(rv.Index(i).Interface(), depth+1)
			if err != nil {
				return nil, fmt.Errorf("index %d: %w", i, err)
			}
			list[i] = e
		}
		return list, nil
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			return nil, fmt.Errorf("map with %s keys: only string keys are supported", rv.Type().Key())
		}
		keys := make([]string, 0, rv.Len())
		for _, k := range rv.MapKeys() {
			keys = append(keys, k.String())
		}
		slices.Sort(keys)
		d := exec.NewDict()
		for _, k := range keys {
			e, err := toTemplateDepth(rv.MapIndex(reflect.ValueOf(k).Convert(rv.Type().Key())).Interface(), depth+1)
			if err != nil {
				return nil, fmt.Errorf("key %q: %w", k, err)
			}
			put(d, k, e)
		}
		return d, nil
	case reflect.Pointer:
		if rv.IsNil() {
			return nil, nil
		}
		return toTemplateDepth(rv.Elem().Interface(), depth+1)
	}
	return nil, fmt.Errorf("unsupported type %T", v)
}
