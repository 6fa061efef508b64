package weft

import (
	"context"
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
// generation prompt added, and returns the text and whether the template
// already wrote the BOS token.
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
		text, hasBOS, err := m.ChatPrompt(msgs)
		if err != nil {
			yield(Token{}, err)
			return
		}
		// A template that writes BOS as text gets it parsed into the BOS
		// id; otherwise BOS is added as the model asks. EOS never is.
		ids := m.tok.Encode(text, false, true)
		if v := m.tok.Vocab(); !hasBOS && v.AddBOS && v.BOS >= 0 {
			ids = append([]int32{v.BOS}, ids...)
		}
		m.run(ctx, ids, g, yield)
	}
}
