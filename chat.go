package weft

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"

	"github.com/weftlm/weft/chat"
)

// Message is one chat turn: Role ("system", "user", "assistant", "tool")
// and Content, or list-of-parts content, tool calls and the like.
type Message = chat.Message

// ErrNoChatTemplate is returned by Chat for a model that ships no template.
var ErrNoChatTemplate = errors.New("weft: the model has no chat template; use Generate with a prompt you format yourself")

// ChatPrompt renders messages with the model's chat template, with the
// generation prompt added and tools (JSON objects, OpenAI's form) as the
// template's tools, and returns the text and whether the template already
// wrote the BOS token.
func (m *Model) ChatPrompt(msgs []Message, tools ...[]byte) (string, bool, error) {
	if m.tok == nil {
		return "", false, ErrNoTokenizer
	}
	src := m.tok.ChatTemplate()
	if src == "" {
		return "", false, ErrNoChatTemplate
	}
	m.mu.Lock()
	tmpl := m.template
	m.mu.Unlock()
	if tmpl == nil {
		t, err := chat.Parse(m.info.Path+" chat template", src)
		if err != nil {
			return "", false, err
		}
		m.mu.Lock()
		m.template, tmpl = t, t
		m.mu.Unlock()
	}
	in := chat.Input{Messages: msgs, AddGenerationPrompt: true}
	for _, t := range tools {
		in.Tools = append(in.Tools, json.RawMessage(t))
	}
	if bos := m.tok.BOS(); bos >= 0 {
		in.BOSToken = m.tok.Piece(bos)
	}
	if eos := m.tok.EOS(); eos >= 0 {
		in.EOSToken = m.tok.Piece(eos)
	}
	text, err := tmpl.Render(in)
	if err != nil {
		return "", false, err
	}
	return text, in.BOSToken != "" && chat.HasLeadingBOS(text, in.BOSToken), nil
}

// Chat renders the conversation with the model's chat template and streams
// the assistant's reply. Special-token text in the rendered prompt is
// parsed as special tokens, and BOS is added only when the template did
// not write it (no double BOS).
func (m *Model) Chat(ctx context.Context, msgs []Message, opts ...GenerateOption) iter.Seq2[Token, error] {
	g := m.genOptions(opts)
	return func(yield func(Token, error) bool) {
		if len(msgs) == 0 {
			yield(Token{}, fmt.Errorf("weft: chat needs at least one message"))
			return
		}
		ids, err := m.ChatTokens(msgs, g.Tools...)
		if err != nil {
			yield(Token{}, err)
			return
		}
		m.run(ctx, ids, g, yield)
	}
}
