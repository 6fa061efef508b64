package tokenizer

import (
	"fmt"
	"math"
	"strings"
	"sync"
)

// spm segments text the way SentencePiece's BPE model does, as llama.cpp's
// llm_tokenizer_spm reimplements it: the text is cut into UTF-8 characters,
// then the adjacent pair whose concatenation is the highest-scoring piece is
// merged, again and again, until no adjacent pair forms a piece. A character
// that is no piece falls back to its bytes' <0xNN> tokens, or to UNK.
//
// Only pieces SentencePiece itself merges take part: normal, user-defined and
// unused ones. Control, unknown and byte tokens are never formed from text,
// so a literal "<s>" or "<0x41>" in the input stays text. An unused piece
// that a merge produces is split back into the two parts that formed it.
//
// The tables are read-only after newSPM; scratch space comes from a pool, so
// encode is safe for concurrent use and allocates nothing once warm.
type spm struct {
	ids     map[string]int32 // mergeable piece → id
	ascii   [128]int32       // ids of one-byte pieces, -1 if absent
	pairs   spmPairs         // (left id, right id) → id of their concatenation
	scores  []float32        // per id; nil means all 0
	unused  []bool           // per id; nil means none
	byteIDs [256]int32       // <0xNN> token per byte, -1 if absent
	unk     int32
	maxLen  int // longest mergeable piece, in bytes
	// words is set when no merge can join a character to a "▁" after it
	// (no piece has one inside) and no unused piece can form: then every
	// such "▁" starts an independent word, and words are cached.
	words bool
	// unusedReach is set when merges can form an unused piece, which must
	// then be split again: only the general merge does that.
	unusedReach bool
	// isolated marks the ASCII characters in no longer piece, such as a
	// newline in most vocabularies: no merge crosses them either.
	isolated [128]bool

	scratch sync.Pool // *spmScratch
}

// spmSymbol is a run of text[start:start+n] in the linked list of symbols;
// n is 0 once the symbol was merged into its left neighbour. id is the
// run's piece, -1 for a character that is no piece.
type spmSymbol struct {
	start, n   int32
	prev, next int32 // indexes into the symbol list, -1 at the ends
	id         int32
}

// spmBigram is a candidate merge of symbols left and right into piece id,
// size bytes long. key orders the queue: the piece's score in the high
// half, the left symbol's index, inverted, in the low half, so that the
// largest key is the best-scoring, leftmost pair.
type spmBigram struct {
	key         uint64
	right, size int32
	id          int32
}

type spmScratch struct {
	text []byte
	syms []spmSymbol
	heap []spmBigram
	// splits records, for the text of each unused piece a merge formed, the
	// length of its left part (SentencePiece's rev_merge). Rarely used.
	splits map[string]int
	// cache maps a word's text to its tokens, held in arena.
	cache map[string]spmSpan
	arena []int32
}

type spmSpan struct{ off, n int32 }

// Word cache bounds: words longer than spmCacheWordLen bytes are not kept,
// and once spmCacheWords words are kept no more are added, so that a long
// text of ever new words costs no allocations (the first words of a text
// are its most common ones).
const (
	spmCacheWordLen = 64
	spmCacheWords   = 1 << 15
)

// spmSpace is U+2581, which stands for a space inside SentencePiece pieces.
const spmSpace = "\u2581"

func newSPM(v *Vocab) (*spm, error) {
	n := len(v.Tokens)
	if len(v.Scores) != 0 && len(v.Scores) != n {
		return nil, fmt.Errorf("tokenizer: %d scores for %d tokens", len(v.Scores), n)
	}
	if len(v.Types) != 0 && len(v.Types) != n {
		return nil, fmt.Errorf("tokenizer: %d token types for %d tokens", len(v.Types), n)
	}
	if v.UNK >= int32(n) {
		return nil, fmt.Errorf("tokenizer: unknown token id %d outside the vocabulary of %d tokens", v.UNK, n)
	}
	s := &spm{ids: make(map[string]int32, n), unk: v.UNK}
	if len(v.Scores) == n {
		s.scores = v.Scores
	}
	for i := range s.byteIDs {
		s.byteIDs[i] = -1
	}
	for i, tok := range v.Tokens {
		typ := TypeNormal
		if len(v.Types) == n {
			typ = v.Types[i]
		}
		if b, ok := spmByteToken(tok); ok {
			if s.byteIDs[b] < 0 {
				s.byteIDs[b] = int32(i)
			}
		}
		switch typ {
		case TypeControl, TypeUnknown, TypeByte:
			continue
		case TypeUnused:
			if s.unused == nil {
				s.unused = make([]bool, n)
			}
			s.unused[i] = true
		}
		if tok == "" {
			continue
		}
		if j, dup := s.ids[tok]; dup {
			return nil, fmt.Errorf("tokenizer: token %d %q repeats token %d", i, tok, j)
		}
		s.ids[tok] = int32(i)
		s.maxLen = max(s.maxLen, len(tok))
	}
	if s.unk < 0 {
		for b, id := range s.byteIDs {
			if id < 0 {
				return nil, fmt.Errorf("tokenizer: no token for byte 0x%02X (<0x%02X>) and no unknown token", b, b)
			}
		}
	}
	for i := range s.ascii {
		s.ascii[i] = -1
		if id, ok := s.ids[string(rune(i))]; ok {
			s.ascii[i] = id
		}
	}
	s.pairs = newSPMPairs(s.ids)
	s.unusedReach = s.unusedReachable()
	s.words = !s.spaceInside() && !s.unusedReach
	for c := range s.isolated {
		s.isolated[c] = true
	}
	for tok := range s.ids {
		if len(tok) > 1 {
			for i := 0; i < len(tok); i++ {
				if c := tok[i]; c < 0x80 {
					s.isolated[c] = false
				}
			}
		}
	}
	s.scratch.New = func() any { return new(spmScratch) }
	return s, nil
}

// spaceInside reports whether a piece has "▁" right after another character.
func (s *spm) spaceInside() bool {
	for tok := range s.ids {
		for i := 1; i < len(tok); i++ {
			j := strings.Index(tok[i:], spmSpace)
			if j < 0 {
				break
			}
			i += j
			if i < len(spmSpace) || tok[i-len(spmSpace):i] != spmSpace {
				return true
			}
		}
	}
	return false
}

// unusedReachable reports whether merging can form an unused piece: it is
// the join of two pieces, or holds a character that is no piece.
func (s *spm) unusedReachable() bool {
	if s.unused == nil {
		return false
	}
	for _, id := range s.pairs.vals {
		if s.unused[id] {
			return true
		}
	}
	for tok, id := range s.ids {
		if !s.unused[id] {
			continue
		}
		for off := 0; off < len(tok); {
			n := min(int(spmCharLen[tok[off]>>4]), len(tok)-off)
			if _, ok := s.ids[tok[off:off+n]]; !ok {
				return true
			}
			off += n
		}
	}
	return false
}

// spmByteToken recognises SentencePiece's byte pieces "<0xNN>" (upper-case
// hex, as llama.cpp looks them up).
func spmByteToken(tok string) (byte, bool) {
	if len(tok) != 6 || tok[:3] != "<0x" || tok[5] != '>' {
		return 0, false
	}
	hi, ok1 := spmHexDigit(tok[3])
	lo, ok2 := spmHexDigit(tok[4])
	return hi<<4 | lo, ok1 && ok2
}

func spmHexDigit(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// spmCharLen is the length of a UTF-8 sequence by its first byte's high
// nibble; a stray continuation byte counts as a character of its own.
var spmCharLen = [16]int32{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4}

// encode appends the tokens of one fragment of raw text (special tokens
// already split out) to dst. With prefixSpace a space is put before the text
// first, as SentencePiece's dummy prefix. Spaces become "▁".
func (s *spm) encode(dst []int32, text string, prefixSpace bool) []int32 {
	if text == "" && !prefixSpace {
		return dst
	}
	sc := s.scratch.Get().(*spmScratch)
	defer s.scratch.Put(sc)

	buf := sc.text[:0]
	if prefixSpace {
		buf = append(buf, spmSpace...)
	}
	for i := 0; i < len(text); i++ {
		if c := text[i]; c == ' ' {
			buf = append(buf, spmSpace...)
		} else {
			buf = append(buf, c)
		}
	}
	sc.text = buf
	if !s.words {
		return s.merge(dst, sc, buf)
	}

	// A word runs from a "▁" that follows another character to the next
	// one; an isolated character is a word of its own.
	start, prevSpace := 0, false
	for off := 0; off < len(buf); {
		c := buf[off]
		if c < 0x80 && s.isolated[c] {
			if off > start {
				dst = s.word(dst, sc, buf[start:off])
			}
			dst = s.merge(dst, sc, buf[off:off+1])
			off++
			start, prevSpace = off, false
			continue
		}
		n := min(int(spmCharLen[c>>4]), len(buf)-off)
		space := n == 3 && c == 0xE2 && buf[off+1] == 0x96 && buf[off+2] == 0x81
		if space && !prevSpace && off > start {
			dst = s.word(dst, sc, buf[start:off])
			start = off
		}
		prevSpace = space
		off += n
	}
	if start < len(buf) {
		dst = s.word(dst, sc, buf[start:])
	}
	return dst
}

// word appends the tokens of one word, from the cache when it is there.
func (s *spm) word(dst []int32, sc *spmScratch, w []byte) []int32 {
	if len(w) > spmCacheWordLen {
		return s.merge(dst, sc, w)
	}
	if sp, ok := sc.cache[string(w)]; ok {
		return append(dst, sc.arena[sp.off:sp.off+sp.n]...)
	}
	n0 := len(dst)
	dst = s.merge(dst, sc, w)
	if sc.cache == nil {
		sc.cache = make(map[string]spmSpan)
	}
	if len(sc.cache) < spmCacheWords {
		sc.cache[string(w)] = spmSpan{off: int32(len(sc.arena)), n: int32(len(dst) - n0)}
		sc.arena = append(sc.arena, dst[n0:]...)
	}
	return dst
}

// merge appends the tokens of text: it is cut into characters and pairs
// are joined best score first until none forms a piece. sc.syms holds the
// characters, linked as a list, for either way of merging.
func (s *spm) merge(dst []int32, sc *spmScratch, text []byte) []int32 {
	syms := sc.syms[:0]
	for off := int32(0); off < int32(len(text)); {
		c := text[off]
		n := min(spmCharLen[c>>4], int32(len(text))-off)
		id := int32(-1)
		if c < 0x80 {
			id = s.ascii[c]
		} else if x, ok := s.ids[string(text[off:off+n])]; ok {
			id = x
		}
		k := int32(len(syms))
		syms = append(syms, spmSymbol{start: off, n: n, prev: k - 1, next: k + 1, id: id})
		off += n
	}
	syms[len(syms)-1].next = -1
	sc.syms = syms
	if len(syms) <= spmSmall && !s.unusedReach {
		return s.mergeSmall(dst, sc, text, syms)
	}
	return s.mergeHeap(dst, sc, text, syms)
}

// mergeHeap keeps the candidate pairs in a priority queue, as llama.cpp
// does: O(n log n) for n characters, whatever the text.
func (s *spm) mergeHeap(dst []int32, sc *spmScratch, text []byte, syms []spmSymbol) []int32 {
	h := sc.heap[:0]
	for i := 1; i < len(syms); i++ {
		h = s.pushBigram(sc, h, text, int32(i-1), int32(i))
	}
	for i := len(h)/2 - 1; i >= 0; i-- {
		spmDown(h, i)
	}

	for len(h) > 0 {
		b := h[0]
		last := len(h) - 1
		h[0] = h[last]
		h = h[:last]
		spmDown(h, 0)

		left := ^int32(uint32(b.key))
		l, r := &syms[left], &syms[b.right]
		if l.n == 0 || r.n == 0 || l.n+r.n != b.size {
			continue // stale: one side was merged since
		}
		l.n += r.n
		l.id = b.id
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = left
		}
		if l.prev >= 0 {
			h = s.pushBigram(sc, h, text, l.prev, left)
			spmUp(h, len(h)-1)
		}
		if l.next >= 0 {
			h = s.pushBigram(sc, h, text, left, l.next)
			spmUp(h, len(h)-1)
		}
	}
	sc.heap = h

	for i := int32(0); i >= 0; i = syms[i].next {
		sym := syms[i]
		if sym.id >= 0 && (s.unused == nil || !s.unused[sym.id]) {
			dst = append(dst, sym.id)
		} else {
			dst = s.resegment(dst, sc, text[sym.start:sym.start+sym.n])
		}
	}
	if sc.splits != nil {
		clear(sc.splits)
	}
	return dst
}

// pushBigram appends the merge of symbols left and right as a candidate if
// their joined text is a piece; the caller restores the heap order.
func (s *spm) pushBigram(sc *spmScratch, h []spmBigram, text []byte, left, right int32) []spmBigram {
	l, r := &sc.syms[left], &sc.syms[right]
	id, ok := s.join(text, l, r)
	if !ok {
		return h
	}
	var score float32
	if s.scores != nil {
		score = s.scores[id]
	}
	size := l.n + r.n
	h = append(h, spmBigram{key: uint64(spmOrderedFloat(score))<<32 | uint64(^uint32(left)), right: right, size: size, id: id})
	if s.unused != nil && s.unused[id] {
		if sc.splits == nil {
			sc.splits = make(map[string]int)
		}
		sc.splits[string(text[l.start:l.start+size])] = int(l.n)
	}
	return h
}

// join returns the piece that symbols l and r, adjacent in text, form.
func (s *spm) join(text []byte, l, r *spmSymbol) (int32, bool) {
	size := l.n + r.n
	if int(size) > s.maxLen {
		return 0, false
	}
	if l.id >= 0 && r.id >= 0 {
		id := s.pairs.get(l.id, r.id)
		return id, id >= 0
	}
	// A character that is no piece may still start or end one.
	id, ok := s.ids[string(text[l.start:l.start+size])]
	return id, ok
}

// spmSmall is the most symbols mergeSmall takes: for a short word a scan
// for the best pair beats keeping a heap.
const spmSmall = 24

// mergeSmall merges like merge, by scanning the pairs for the best one
// instead of keeping a queue: the highest score wins and, among equals, the
// leftmost, as in the queue. syms is compacted as symbols join.
func (s *spm) mergeSmall(dst []int32, sc *spmScratch, text []byte, syms []spmSymbol) []int32 {
	var keys [spmSmall]int64 // score order of the pair (i, i+1); -1 if no piece
	var ids [spmSmall]int32
	pair := func(i int) {
		keys[i] = -1
		if id, ok := s.join(text, &syms[i], &syms[i+1]); ok {
			var score float32
			if s.scores != nil {
				score = s.scores[id]
			}
			keys[i], ids[i] = int64(spmOrderedFloat(score)), id
		}
	}
	n := len(syms)
	for i := 0; i+1 < n; i++ {
		pair(i)
	}
	for {
		best := -1
		bestKey := int64(-1)
		for i := 0; i+1 < n; i++ {
			if keys[i] > bestKey {
				best, bestKey = i, keys[i]
			}
		}
		if best < 0 {
			break
		}
		syms[best].n += syms[best+1].n
		syms[best].id = ids[best]
		copy(syms[best+1:n], syms[best+2:n])
		if best+2 < n { // drop pair best+1, move the later pairs down
			copy(keys[best+1:], keys[best+2:n-1])
			copy(ids[best+1:], ids[best+2:n-1])
		}
		n--
		if best+1 < n {
			pair(best)
		}
		if best > 0 {
			pair(best - 1)
		}
	}
	for _, sym := range syms[:n] {
		if sym.id >= 0 && (s.unused == nil || !s.unused[sym.id]) {
			dst = append(dst, sym.id)
		} else {
			dst = s.resegment(dst, sc, text[sym.start:sym.start+sym.n])
		}
	}
	return dst
}

// spmOrderedFloat maps a float32 to a uint32 of the same order.
func spmOrderedFloat(f float32) uint32 {
	b := math.Float32bits(f)
	if b>>31 != 0 {
		return ^b
	}
	return b | 1<<31
}

// resegment appends the tokens of a final symbol that is no usable piece:
// the parts an unused piece was merged from, or its bytes.
func (s *spm) resegment(dst []int32, sc *spmScratch, text []byte) []int32 {
	if id, ok := s.ids[string(text)]; ok && (s.unused == nil || !s.unused[id]) {
		return append(dst, id)
	}
	if split, ok := sc.splits[string(text)]; ok {
		dst = s.resegment(dst, sc, text[:split])
		return s.resegment(dst, sc, text[split:])
	}
	for _, c := range text {
		if s.byteIDs[c] < 0 {
			return append(dst, s.unk)
		}
	}
	for _, c := range text {
		dst = append(dst, s.byteIDs[c])
	}
	return dst
}

func spmUp(h []spmBigram, i int) {
	for i > 0 {
		p := (i - 1) / 2
		if h[i].key <= h[p].key {
			return
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func spmDown(h []spmBigram, i int) {
	n := len(h)
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if c+1 < n && h[c+1].key > h[c].key {
			c++
		}
		if h[c].key <= h[i].key {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

// spmPairs maps two piece ids to the id of the piece that is their
// concatenation: an open-addressing hash table over 64-bit keys, which
// answers the merge loop's question far faster than hashing the text.
type spmPairs struct {
	keys  []uint64 // (left+1)<<32 | (right+1); 0 marks an empty slot
	vals  []int32
	shift uint
}

// newSPMPairs finds, for every piece, each way of cutting it into two
// pieces. Text is cut into characters before merging, so only cuts between
// characters can join.
func newSPMPairs(ids map[string]int32) spmPairs {
	var keys []uint64
	var vals []int32
	for tok, id := range ids {
		for cut := int(spmCharLen[tok[0]>>4]); cut < len(tok); cut += int(spmCharLen[tok[cut]>>4]) {
			a, ok1 := ids[tok[:cut]]
			b, ok2 := ids[tok[cut:]]
			if ok1 && ok2 {
				keys = append(keys, spmPairKey(a, b))
				vals = append(vals, id)
			}
		}
	}
	size, shift := 16, uint(60)
	for size < 2*len(keys) {
		size, shift = size*2, shift-1
	}
	t := spmPairs{keys: make([]uint64, size), vals: make([]int32, size), shift: shift}
	for i, k := range keys {
		j := t.slot(k)
		for t.keys[j] != 0 {
			j = (j + 1) & (size - 1)
		}
		t.keys[j], t.vals[j] = k, vals[i]
	}
	return t
}

func spmPairKey(a, b int32) uint64 { return uint64(a+1)<<32 | uint64(b+1) }

func (t *spmPairs) slot(k uint64) int { return int((k * 0x9E3779B97F4A7C15) >> t.shift) }

// get returns the id of piece a followed by piece b, or -1.
func (t *spmPairs) get(a, b int32) int32 {
	k := spmPairKey(a, b)
	mask := len(t.keys) - 1
	for j := t.slot(k); ; j = (j + 1) & mask {
		switch t.keys[j] {
		case k:
			return t.vals[j]
		case 0:
			return -1
		}
	}
}
