package weft

import "errors"

// What a server needs beyond Generate and Chat: the prompt's token ids
// before generating, to count them for usage and to refuse an oversized
// prompt before a reply starts. Feeding these ids to GenerateTokens gives
// exactly what Generate or Chat would.

// PromptTokens returns the ids Generate feeds for prompt: the text
// encoded with BOS added as the model asks and special-token text left as
// text.
func (m *Model) PromptTokens(prompt string) ([]int32, error) {
	if m.tok == nil {
		return nil, ErrNoTokenizer
	}
	return m.tok.Encode(prompt, true, false), nil
}

// ChatTokens returns the ids Chat feeds for msgs: the rendered template
// (with tools, tool definitions as JSON objects, when given) with
// special-token text parsed, and BOS added only when the template did not
// write it.
func (m *Model) ChatTokens(msgs []Message, tools ...[]byte) ([]int32, error) {
	if len(msgs) == 0 {
		return nil, errNoMessages
	}
	text, hasBOS, err := m.ChatPrompt(msgs, tools...)
	if err != nil {
		return nil, err
	}
	ids := m.tok.Encode(text, false, true)
	if v := m.tok.Vocab(); !hasBOS && v.AddBOS && v.BOS >= 0 {
		ids = append([]int32{v.BOS}, ids...)
	}
	return ids, nil
}

var errNoMessages = errors.New("weft: chat needs at least one message")
