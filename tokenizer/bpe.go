package tokenizer

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"unicode/utf8"
)

// bpe segments a piece by merge rank, as GPT-2 and Hugging Face's BPE model
// do: the piece starts as one symbol per byte (byte-level vocabularies) or
// per character (SentencePiece-style vocabularies with byte fallback), and
// the adjacent pair with the lowest-ranked merge, leftmost first, is merged
// until no pair has a merge.
//
// The tables are read-only after newBPE; scratch space and a cache of
// recent words come from a pool, so encode is safe for concurrent use.
type bpe struct {
	ids          map[string]int32 // token text -> id
	merges       map[uint64]bpeMerge
	byteLevel    bool
	ignoreMerges bool             // a piece that is a normal token becomes that token unmerged
	whole        map[string]int32 // with ignoreMerges: normal tokens by text
	byteIDs      [256]int32       // byte-level: the token spelling each byte; else <0xNN>; -1 if none
	unk          int32
	fuseUnk      bool // consecutive unknown characters become one UNK

	scratch sync.Pool // *bpeScratch
}

// bpeMerge is the result of merging a pair: its rank (lower merges first)
// and the id of the merged token.
type bpeMerge struct{ rank, id int32 }

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// bpeSymbol is one symbol of a word being merged, in a linked list over a
// slice; id is -1 once the symbol was merged into its left neighbour.
type bpeSymbol struct {
	id         int32
	prev, next int32
}

type bpeScratch struct {
	syms  []bpeSymbol
	heap  []uint64 // candidate merges: rank<<32 | left symbol index
	buf   []byte
	cache map[string][]int32 // word -> ids, for words seen recently
}

// bpeCacheSize bounds the word cache of one scratch; it is cleared when full.
const bpeCacheSize = 1 << 15

// bpeSmall is the longest word merged by rescanning all pairs; longer words
// use a heap, so that a megabyte without spaces stays O(n log n).
const bpeSmall = 48

func newBPE(v *Vocab, byteLevel, ignoreMerges bool) (*bpe, error) {
	b := &bpe{
		ids:          make(map[string]int32, len(v.Tokens)),
		merges:       make(map[uint64]bpeMerge, len(v.Merges)),
		byteLevel:    byteLevel,
		ignoreMerges: ignoreMerges,
		unk:          v.UNK,
		fuseUnk:      !byteLevel,
	}
	if len(v.Merges) > math.MaxInt32 {
		return nil, fmt.Errorf("%d merges is too many", len(v.Merges))
	}
	if ignoreMerges {
		b.whole = make(map[string]int32, len(v.Tokens))
	}
	for i, t := range v.Tokens {
		normal := tokenTypeOf(v, int32(i)) == TypeNormal
		if _, dup := b.ids[t]; !dup || normal {
			b.ids[t] = int32(i)
		}
		if normal && b.whole != nil {
			b.whole[t] = int32(i)
		}
	}
	for i := range b.byteIDs {
		b.byteIDs[i] = -1
		var name string
		if byteLevel {
			name = string(byteRune[i])
		} else {
			name = fmt.Sprintf("<0x%02X>", i)
		}
		if id, ok := b.ids[name]; ok {
			b.byteIDs[i] = id
		}
	}
	for rank, m := range v.Merges {
		sp := strings.IndexByte(m[min(1, len(m)):], ' ') + 1
		if sp < 1 {
			return nil, fmt.Errorf("merge %d %q is not two pieces separated by a space", rank, m)
		}
		left, right := m[:sp], m[sp+1:]
		l, okl := b.ids[left]
		r, okr := b.ids[right]
		id, ok := b.ids[left+right]
		if !okl || !okr || !ok {
			continue // a merge into or of a token the vocabulary lacks can never apply
		}
		k := pairKey(l, r)
		if _, dup := b.merges[k]; !dup {
			b.merges[k] = bpeMerge{rank: int32(rank), id: id}
		}
	}
	b.scratch.New = func() any { return &bpeScratch{cache: make(map[string][]int32)} }
	return b, nil
}

// encode appends the ids of one pre-tokenized piece to dst.
func (b *bpe) encode(dst []int32, word string) []int32 {
	if word == "" {
		return dst
	}
	sc := b.scratch.Get().(*bpeScratch)
	defer b.scratch.Put(sc)
	cacheable := len(word) <= 64
	if cacheable {
		if ids, ok := sc.cache[word]; ok {
			return append(dst, ids...)
		}
	}
	n := len(dst)
	dst = b.encodeUncached(dst, word, sc)
	if cacheable {
		if len(sc.cache) >= bpeCacheSize {
			clear(sc.cache)
		}
		sc.cache[strings.Clone(word)] = append([]int32(nil), dst[n:]...)
	}
	return dst
}

func (b *bpe) encodeUncached(dst []int32, word string, sc *bpeScratch) []int32 {
	if b.ignoreMerges {
		id, ok := b.whole[word]
		if b.byteLevel {
			sc.buf = byteLevelEncode(sc.buf[:0], word)
			id, ok = b.whole[string(sc.buf)] // converting in the index does not allocate
		}
		if ok {
			return append(dst, id)
		}
	}
	syms := b.symbols(sc.syms[:0], word)
	sc.syms = syms
	if len(syms) == 0 {
		return dst
	}
	if len(syms) > bpeSmall {
		sc.heap = b.mergeHeap(syms, sc.heap[:0])
	} else {
		b.mergeSmall(syms)
	}
	for i := int32(0); i >= 0 && int(i) < len(syms); i = syms[i].next {
		if syms[i].id >= 0 {
			dst = append(dst, syms[i].id)
		}
	}
	return dst
}

// symbols splits word into its initial symbols. A byte-level word has one
// per byte. Otherwise each character is its token if there is one, else its
// bytes' <0xNN> tokens, else UNK (consecutive UNKs fused when fuseUnk).
func (b *bpe) symbols(syms []bpeSymbol, word string) []bpeSymbol {
	add := func(id int32) {
		i := int32(len(syms))
		syms = append(syms, bpeSymbol{id: id, prev: i - 1, next: i + 1})
	}
	if b.byteLevel {
		for i := 0; i < len(word); i++ {
			if id := b.byteIDs[word[i]]; id >= 0 {
				add(id)
			} else if b.unk >= 0 {
				add(b.unk)
			}
		}
	} else {
		for i := 0; i < len(word); {
			_, n := utf8.DecodeRuneInString(word[i:])
			if id, ok := b.ids[word[i:i+n]]; ok {
				add(id)
			} else if b.hasBytes(word[i : i+n]) {
				for k := i; k < i+n; k++ {
					add(b.byteIDs[word[k]])
				}
			} else if b.unk >= 0 && !(b.fuseUnk && len(syms) > 0 && syms[len(syms)-1].id == b.unk) {
				add(b.unk)
			}
			i += n
		}
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	return syms
}

func (b *bpe) hasBytes(s string) bool {
	for i := 0; i < len(s); i++ {
		if b.byteIDs[s[i]] < 0 {
			return false
		}
	}
	return true
}

// pairMerge returns the merge of symbol i with its right neighbour.
func (b *bpe) pairMerge(syms []bpeSymbol, i int32) (bpeMerge, bool) {
	j := syms[i].next
	if j < 0 {
		return bpeMerge{}, false
	}
	m, ok := b.merges[pairKey(syms[i].id, syms[j].id)]
	return m, ok
}

// mergeSmall merges a short word, keeping each pair's merge in an array
// and rescanning it for the best: O(n²) comparisons but O(n) map lookups.
func (b *bpe) mergeSmall(syms []bpeSymbol) {
	var best [bpeSmall]bpeMerge
	const none = math.MaxInt32
	for i := range syms {
		best[i].rank = none
		if m, ok := b.pairMerge(syms, int32(i)); ok {
			best[i] = m
		}
	}
	for {
		at, rank := int32(-1), int32(none)
		for i := int32(0); i >= 0; i = syms[i].next {
			if best[i].rank < rank {
				at, rank = i, best[i].rank
			}
		}
		if at < 0 {
			return
		}
		right := syms[at].next
		syms[at].id = best[at].id
		syms[at].next = syms[right].next
		if syms[right].next >= 0 {
			syms[syms[right].next].prev = at
		}
		syms[right].id = -1
		best[at].rank = none
		if m, ok := b.pairMerge(syms, at); ok {
			best[at] = m
		}
		if p := syms[at].prev; p >= 0 {
			best[p].rank = none
			if m, ok := b.pairMerge(syms, p); ok {
				best[p] = m
			}
		}
	}
}

// mergeHeap merges a long word with a min-heap of candidate merges keyed
// by rank, then position. A popped candidate whose symbols have changed
// since it was pushed is stale and skipped.
func (b *bpe) mergeHeap(syms []bpeSymbol, h []uint64) []uint64 {
	push := func(i int32) {
		if m, ok := b.pairMerge(syms, i); ok {
			h = heapPush(h, uint64(m.rank)<<32|uint64(i))
		}
	}
	for i := range syms {
		push(int32(i))
	}
	for len(h) > 0 {
		var top uint64
		top, h = heapPop(h)
		at, rank := int32(uint32(top)), int32(top>>32)
		if syms[at].id < 0 {
			continue
		}
		m, ok := b.pairMerge(syms, at)
		if !ok || m.rank != rank {
			continue
		}
		right := syms[at].next
		syms[at].id = m.id
		syms[at].next = syms[right].next
		if syms[right].next >= 0 {
			syms[syms[right].next].prev = at
		}
		syms[right].id = -1
		push(at)
		if p := syms[at].prev; p >= 0 {
			push(p)
		}
	}
	return h
}

func heapPush(h []uint64, x uint64) []uint64 {
	h = append(h, x)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if h[p] <= h[i] {
			break
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
	return h
}

func heapPop(h []uint64) (uint64, []uint64) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l, small := 2*i+1, i
		if l < len(h) && h[l] < h[small] {
			small = l
		}
		if r := l + 1; r < len(h) && h[r] < h[small] {
			small = r
		}
		if small == i {
			break
		}
		h[i], h[small] = h[small], h[i]
		i = small
	}
	return top, h
}
