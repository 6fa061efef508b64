package engine

import "testing"

// TestNewSequenceFor: a sequence taking a slot whose cache holds the start
// of its prompt keeps it and feeds the rest, with the logits a fresh
// sequence gets; the slot with the longest match wins; what was rewound
// or overwritten is not kept; ring caches keep nothing.
func TestNewSequenceFor(t *testing.T) {
	m := loadFixture(t, "llama3-tiny", Options{Context: 64, Slots: 2, MaxBatch: 8})
	a := []int32{5, 9, 200, 17, 33, 1, 2, 3, 4, 5, 6, 7}
	b := []int32{100, 101, 102, 103, 104}
	ab := append(append([]int32(nil), a...), b...)

	fresh, _ := m.NewSequence()
	want, err := fresh.Forward(ab, false)
	if err != nil {
		t.Fatal(err)
	}
	fresh.Close()

	s1, _ := m.NewSequence()
	if _, err := s1.Forward(a, false); err != nil {
		t.Fatal(err)
	}
	slotA := s1.Slot()
	s1.Close()
	s2, kept, err := m.NewSequenceFor(ab)
	if err != nil {
		t.Fatal(err)
	}
	if kept != len(a) || s2.Slot() != slotA || s2.Pos() != len(a) {
		t.Fatalf("kept %d in slot %d at %d, want %d in slot %d", kept, s2.Slot(), s2.Pos(), len(a), slotA)
	}
	got, err := s2.Forward(ab[kept:], false)
	if err != nil {
		t.Fatal(err)
	}
	if e := relErr(got, want); e > 1e-5 {
		t.Errorf("logits after a kept prefix differ from a fresh sequence's: relative error %.3g", e)
	}
	s2.Close()

	// The whole prompt held: its last token is still fed, for its logits.
	s3, kept, _ := m.NewSequenceFor(ab)
	if kept != len(ab)-1 {
		t.Errorf("whole prompt held: kept %d, want %d", kept, len(ab)-1)
	}
	// Rewound and fed something else: only the common start stays.
	if err := s3.Rewind(4); err != nil {
		t.Fatal(err)
	}
	if _, err := s3.Forward([]int32{77, 78}, false); err != nil {
		t.Fatal(err)
	}
	s3.Close()
	if s4, kept, _ := m.NewSequenceFor(ab); kept != 4 {
		t.Errorf("after a rewind to 4 and other tokens: kept %d, want 4", kept)
		s4.Close()
	} else {
		s4.Close()
	}
	if s5, kept, _ := m.NewSequenceFor([]int32{300, 301}); kept != 0 || s5.Pos() != 0 {
		t.Errorf("no match: kept %d at %d", kept, s5.Pos())
	}

	ring := loadFixture(t, "gemma3-tiny", Options{Context: 96, Slots: 1, MaxBatch: 8})
	r1, _ := ring.NewSequence()
	if _, err := r1.Forward(a, false); err != nil {
		t.Fatal(err)
	}
	r1.Close()
	if r2, kept, _ := ring.NewSequenceFor(ab); kept != 0 {
		t.Errorf("a model with sliding-window ring caches kept %d tokens", kept)
		r2.Close()
	}
}

// TestNewSequenceForKeepsHistories: a prompt that shares only its first
// token with a slot's long history takes an empty slot instead, so the
// history stays for the conversation it belongs to.
func TestNewSequenceForKeepsHistories(t *testing.T) {
	m := loadFixture(t, "llama3-tiny", Options{Context: 64, Slots: 2, MaxBatch: 8})
	a := []int32{5, 9, 200, 17, 33, 1, 2, 3, 4, 5, 6, 7}
	s1, _ := m.NewSequence()
	if _, err := s1.Forward(a, false); err != nil {
		t.Fatal(err)
	}
	held := s1.Slot()
	s1.Close()
	other, kept, _ := m.NewSequenceFor([]int32{5, 300, 301})
	if other.Slot() == held || kept != 0 {
		t.Errorf("a prompt sharing one token took slot %d (kept %d); the history is in slot %d", other.Slot(), kept, held)
	}
	if _, err := other.Forward([]int32{5, 300, 301}, false); err != nil {
		t.Fatal(err)
	}
	// Both slots hold something now: the conversation still finds its own.
	again, kept, _ := m.NewSequenceFor(append(append([]int32(nil), a...), 8))
	if again.Slot() != held || kept != len(a) {
		t.Errorf("the continuation took slot %d keeping %d, want slot %d keeping %d", again.Slot(), kept, held, len(a))
	}
	again.Close()
	other.Close()
}
