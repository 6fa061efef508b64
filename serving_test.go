package weft

import (
	"context"
	"errors"
	"testing"

	"github.com/weftlm/weft/internal/testmodel"
)

// chatStories is the story model with a real chat template.
func chatStories(t *testing.T) string { return testmodel.StoriesWithTemplate(t) }

// TestPromptAndChatTokens: the ids PromptTokens and ChatTokens return,
// fed to GenerateTokens, give what Generate and Chat give.
func TestPromptAndChatTokens(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, chatStories(t), WithContext(256))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	opts := []GenerateOption{WithTemperature(0), WithMaxTokens(20)}

	for _, prompt := range []string{"", "Once upon a time", "<s> a tag"} {
		ids, err := m.PromptTokens(prompt)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) == 0 || ids[0] != m.Tokenizer().BOS() {
			t.Errorf("%q: ids %v do not start with BOS", prompt, ids)
		}
		want, _, _ := collect(t, m.Generate(ctx, prompt, opts...))
		got, _, _ := collect(t, m.GenerateTokens(ctx, ids, opts...))
		if got != want || want == "" {
			t.Errorf("%q: from ids %q, Generate %q", prompt, got, want)
		}
	}

	msgs := []Message{{Role: "user", Content: "Tell me a story"}}
	ids, err := m.ChatTokens(msgs)
	if err != nil {
		t.Fatal(err)
	}
	bos := 0
	for _, id := range ids {
		if id == m.Tokenizer().BOS() {
			bos++
		}
	}
	if ids[0] != m.Tokenizer().BOS() || bos != 1 {
		t.Errorf("chat ids %v: want one leading BOS", ids)
	}
	want, _, _ := collect(t, m.Chat(ctx, msgs, opts...))
	got, _, _ := collect(t, m.GenerateTokens(ctx, ids, opts...))
	if got != want || want == "" {
		t.Errorf("chat: from ids %q, Chat %q", got, want)
	}
	if _, err := m.ChatTokens(nil); err == nil {
		t.Error("ChatTokens(nil): no error")
	}

	plain := loadStories(t, WithContext(64))
	if _, err := plain.ChatTokens(msgs); !errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("no template: err %v, want ErrNoChatTemplate", err)
	}
}
