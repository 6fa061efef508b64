package constrain

import (
	"math"
	"slices"
	"strings"
	"sync"
)

// Masker masks the tokens that would break a JSON prefix: it knows each
// token's bytes and which tokens end generation. It is safe for concurrent
// use.
//
// The token texts are kept as a trie, so Apply feeds each distinct prefix
// once and drops a whole subtree at the first byte the state refuses: in
// the middle of a document most first bytes are refused, and the walk
// touches a small part of the vocabulary's bytes.
type Masker struct {
	vocab int
	eog   []int32
	nodes []trieNode
	edges []trieEdge
	toks  []int32 // token ids, grouped by the node their text ends at
	bits  sync.Pool

	// Inside a string most tokens are plain text, taken whole without a
	// change of state: plainBits marks those tokens (every byte
	// plainStringByte), special the nodes whose subtree holds a token with
	// some other byte — the only ones a walk from inside a string visits.
	plainBits []uint64
	special   []bool
	// plainUpTo[c] marks the tokens of plain text of at most c
	// characters, for strings with a maximum length.
	plainUpTo [maxCounted + 1][]uint64
	// long marks the nodes whose subtree holds a token with some other
	// byte or of plain text longer than maxCounted characters.
	long []bool
}

// maxCounted is the longest remaining length plainUpTo serves; a string
// with more room left walks the trie.
const maxCounted = 16

type trieNode struct {
	edges, edgesEnd int32 // children: edges[edges:edgesEnd]
	toks, toksEnd   int32 // tokens whose text ends here: toks[toks:toksEnd]
}

type trieEdge struct {
	b     byte
	child int32
}

// NewMasker takes every token's text (empty for tokens that stand for no
// text, such as control tokens) and which tokens end generation.
func NewMasker(pieces []string, eog []bool) *Masker {
	m := &Masker{vocab: len(pieces)}
	var ids []int32
	for id, p := range pieces {
		switch {
		case id < len(eog) && eog[id]:
			m.eog = append(m.eog, int32(id))
		case p != "":
			ids = append(ids, int32(id))
		}
	}
	slices.SortFunc(ids, func(a, b int32) int { return strings.Compare(pieces[a], pieces[b]) })
	m.nodes = append(m.nodes, trieNode{})
	m.build(0, pieces, ids, 0)
	words := (len(pieces) + 63) / 64
	m.bits.New = func() any { b := make([]uint64, words); return &b }
	m.plainBits = make([]uint64, words)
	for c := range m.plainUpTo {
		m.plainUpTo[c] = make([]uint64, words)
	}
	for _, id := range ids {
		p := pieces[id]
		if strings.ContainsFunc(p, func(r rune) bool { return r < 0x20 || r == '"' || r == '\\' }) {
			continue
		}
		m.plainBits[id/64] |= 1 << (id % 64)
		chars := 0
		for i := 0; i < len(p); i++ {
			if p[i]&0xc0 != 0x80 {
				chars++
			}
		}
		for c := chars; c <= maxCounted; c++ {
			m.plainUpTo[c][id/64] |= 1 << (id % 64)
		}
	}
	// Children come after their parent, so one pass from the end sees
	// every child before its parent.
	m.special = make([]bool, len(m.nodes))
	for n := len(m.nodes) - 1; n >= 0; n-- {
		node := m.nodes[n]
		for _, e := range m.edges[node.edges:node.edgesEnd] {
			if !plainStringByte(e.b) || m.special[e.child] {
				m.special[n] = true
				break
			}
		}
	}
	m.long = make([]bool, len(m.nodes))
	m.markLong(0, 0)
	return m
}

// markLong sets long for node n, whose path has chars characters, and its
// subtree, and reports it.
func (m *Masker) markLong(n int32, chars int) bool {
	node := m.nodes[n]
	long := chars > maxCounted && node.toksEnd > node.toks
	for _, e := range m.edges[node.edges:node.edgesEnd] {
		c := chars
		if e.b&0xc0 != 0x80 {
			c++
		}
		if m.markLong(e.child, c) || !plainStringByte(e.b) {
			long = true
		}
	}
	m.long[n] = long
	return long
}

// build fills node n from ids (sorted by text, sharing their first depth
// bytes): the tokens that end here, then one child per next byte.
func (m *Masker) build(n int32, pieces []string, ids []int32, depth int) {
	i := 0
	for i < len(ids) && len(pieces[ids[i]]) == depth {
		i++
	}
	m.nodes[n].toks = int32(len(m.toks))
	m.toks = append(m.toks, ids[:i]...)
	m.nodes[n].toksEnd = int32(len(m.toks))
	type group struct {
		b      byte
		lo, hi int
	}
	var groups []group
	for i < len(ids) {
		b := pieces[ids[i]][depth]
		j := i
		for j < len(ids) && pieces[ids[j]][depth] == b {
			j++
		}
		groups = append(groups, group{b, i, j})
		i = j
	}
	m.nodes[n].edges = int32(len(m.edges))
	for _, g := range groups {
		m.nodes = append(m.nodes, trieNode{})
		m.edges = append(m.edges, trieEdge{b: g.b, child: int32(len(m.nodes) - 1)})
	}
	m.nodes[n].edgesEnd = int32(len(m.edges))
	for k, g := range groups {
		m.build(m.edges[m.nodes[n].edges+int32(k)].child, pieces, ids[g.lo:g.hi], depth+1)
	}
}

// Apply sets to -Inf the logits of tokens that cannot follow state: a
// token is allowed when all its bytes keep the prefix valid; an
// end-of-generation token only once the document is complete. It returns
// how many tokens stay allowed.
func (m *Masker) Apply(state *JSON, logits []float32) int {
	bp := m.bits.Get().(*[]uint64)
	bits := *bp
	switch {
	case state.plainString():
		copy(bits, m.plainBits)
		m.walkSpecial(0, state, bits)
	case state.countedString() && state.lenMax < 0:
		// Only a minimum: plain text is fine at any length.
		copy(bits, m.plainBits)
		m.walkCounted(0, state, 0, bits, false)
	case state.countedString() && state.lenMax-state.strLen <= maxCounted:
		copy(bits, m.plainUpTo[max(state.lenMax-state.strLen, 0)])
		m.walkCounted(0, state, 0, bits, false)
	case state.countedString():
		// Room for more than maxCounted characters: the shorter plain
		// tokens fit, the longer ones are found by the walk.
		copy(bits, m.plainUpTo[maxCounted])
		m.walkCounted(0, state, 0, bits, true)
	default:
		clear(bits)
		m.walk(0, *state, bits)
	}
	if state.Complete() {
		for _, id := range m.eog {
			bits[id/64] |= 1 << (id % 64)
		}
	}
	negInf := float32(math.Inf(-1))
	allowed := 0
	for id := range logits {
		if id < m.vocab && bits[id/64]&(1<<(id%64)) != 0 {
			allowed++
		} else {
			logits[id] = negInf
		}
	}
	m.bits.Put(bp)
	return allowed
}

// walk marks the tokens under node n that state (having read the node's
// prefix) accepts. The state goes by value: each branch feeds its own
// copy, which stays on the stack.
func (m *Masker) walk(n int32, state JSON, bits []uint64) {
	if state.plainString() {
		m.walkString(n, &state, bits)
		return
	}
	node := m.nodes[n]
	for _, id := range m.toks[node.toks:node.toksEnd] {
		bits[id/64] |= 1 << (id % 64)
	}
	for _, e := range m.edges[node.edges:node.edgesEnd] {
		s := state
		if s.Feed(e.b) {
			m.walk(e.child, s, bits)
		}
	}
}

// walkSpecial is walkString from the root, with the tokens of plain text
// already marked (plainBits): it only follows plain bytes towards tokens
// that hold some other byte.
func (m *Masker) walkSpecial(n int32, state *JSON, bits []uint64) {
	node := m.nodes[n]
	for _, e := range m.edges[node.edges:node.edgesEnd] {
		if plainStringByte(e.b) {
			if m.special[e.child] {
				m.walkSpecial(e.child, state, bits)
			}
			continue
		}
		s := *state
		if s.Feed(e.b) {
			m.walk(e.child, s, bits)
		}
	}
}

// walkCounted is walkSpecial inside a string with length bounds: chars
// counts the characters of the path from the root, which a plain byte
// leaves to the count rather than to a copy of the state; a path longer
// than the maximum is dropped. The tokens of plain text up to maxCounted
// characters are marked already; with long, so far as they fit, are the
// longer ones, which the walk marks (and follows the paths to).
func (m *Masker) walkCounted(n int32, state *JSON, chars int32, bits []uint64, long bool) {
	node := m.nodes[n]
	if long && chars > maxCounted {
		for _, id := range m.toks[node.toks:node.toksEnd] {
			bits[id/64] |= 1 << (id % 64)
		}
	}
	for _, e := range m.edges[node.edges:node.edgesEnd] {
		if plainStringByte(e.b) {
			c := chars
			if e.b&0xc0 != 0x80 {
				c++
			}
			if state.lenMax >= 0 && state.strLen+c > state.lenMax {
				continue
			}
			if long && m.long[e.child] || m.special[e.child] {
				m.walkCounted(e.child, state, c, bits, long)
			}
			continue
		}
		s := *state
		s.strLen += chars
		if s.Feed(e.b) {
			m.walk(e.child, s, bits)
		}
	}
}

// walkString is walk inside a string's characters, where a plain byte
// leaves the state as it is: those edges need no copy of it, which keeps
// a walk through the many tokens of text cheap.
func (m *Masker) walkString(n int32, state *JSON, bits []uint64) {
	node := m.nodes[n]
	for _, id := range m.toks[node.toks:node.toksEnd] {
		bits[id/64] |= 1 << (id % 64)
	}
	for _, e := range m.edges[node.edges:node.edgesEnd] {
		if plainStringByte(e.b) {
			m.walkString(e.child, state, bits)
			continue
		}
		s := *state
		if s.Feed(e.b) {
			m.walk(e.child, s, bits)
		}
	}
}
