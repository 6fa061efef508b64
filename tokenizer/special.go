package tokenizer

// specialSplitter finds the text of special tokens (control, user-defined
// and unknown tokens) in raw text before segmentation, as llama.cpp and
// Hugging Face's added-token extraction do. It takes the leftmost match,
// and of those the longest, through a byte trie.
type specialSplitter struct {
	first [256]bool        // bytes that start some special token
	edges map[uint64]int32 // node<<8 | byte -> child node; node 0 is the root
	ids   []int32          // token id ending at each node, -1 if none
	user  []bool           // that token is user-defined: matched even without parseSpecial
}

func newSpecialSplitter(v *Vocab, types []TokenType) *specialSplitter {
	s := &specialSplitter{edges: map[uint64]int32{}, ids: []int32{-1}, user: []bool{false}}
	for id, text := range v.Tokens {
		typ := types[id]
		if text == "" || (typ != TypeControl && typ != TypeUserDefined && typ != TypeUnknown) {
			continue
		}
		node := int32(0)
		for i := 0; i < len(text); i++ {
			k := uint64(node)<<8 | uint64(text[i])
			next, ok := s.edges[k]
			if !ok {
				next = int32(len(s.ids))
				s.edges[k] = next
				s.ids = append(s.ids, -1)
				s.user = append(s.user, false)
			}
			node = next
		}
		if s.ids[node] >= 0 && types[s.ids[node]] == TypeUserDefined {
			continue // two tokens of one text: prefer the control one
		}
		s.ids[node] = int32(id)
		s.user[node] = typ == TypeUserDefined
		s.first[text[0]] = true
	}
	return s
}

// next returns the first special token in text[from:]: its start, end and
// id, or start = -1. Without parseSpecial only user-defined tokens count.
func (s *specialSplitter) next(text string, from int, parseSpecial bool) (start, end int, id int32) {
	for i := from; i < len(text); i++ {
		if !s.first[text[i]] {
			continue
		}
		node, bestEnd, best := int32(0), -1, int32(-1)
		for j := i; j < len(text); j++ {
			next, ok := s.edges[uint64(node)<<8|uint64(text[j])]
			if !ok {
				break
			}
			node = next
			if s.ids[node] >= 0 && (parseSpecial || s.user[node]) {
				bestEnd, best = j+1, s.ids[node]
			}
		}
		if best >= 0 {
			return i, bestEnd, best
		}
	}
	return -1, -1, -1
}
