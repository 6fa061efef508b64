package sample

import (
	"fmt"
	"slices"
	"testing"
)

// The benchmarks draw from normal logits of standard deviation 3, where
// the nucleus of top-p 0.9 at temperature 0.8 holds about 1% of the
// vocabulary (385 of 32,000 tokens, 1,472 of 128,256), and 1, a flat
// distribution where it holds half (16,408 and 65,830), at Llama 2's and
// Llama 3's vocabulary sizes.
func BenchmarkSample(b *testing.B) {
	chains := []struct {
		name string
		p    Params
	}{
		{"greedy", Params{}},
		{"topk40", Params{Temperature: 0.8, TopK: 40}},
		{"topp0.9", Params{Temperature: 0.8, TopP: 0.9}},
		{"temperature", Params{Temperature: 0.8}},
		{"llamacpp-defaults", Params{Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05, RepeatPenalty: 1.1}},
	}
	hist := make([]int32, 64)
	for i := range hist {
		hist[i] = int32(i * 31)
	}
	for _, vocab := range []int{32000, 128256} {
		for _, sd := range []float64{3, 1} {
			l := randLogits(vocab, sd, 1)
			for _, c := range chains {
				if sd == 1 && c.name != "topp0.9" {
					continue
				}
				b.Run(fmt.Sprintf("%s/vocab=%d/sd=%v", c.name, vocab, sd), func(b *testing.B) {
					s, err := New(c.p, vocab)
					if err != nil {
						b.Fatal(err)
					}
					b.ReportAllocs()
					for b.Loop() {
						if _, err := s.Sample(l, hist); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

func BenchmarkHelpers(b *testing.B) {
	for _, vocab := range []int{32000, 128256} {
		l := randLogits(vocab, 3, 1)
		b.Run(fmt.Sprintf("SampleGumbel/vocab=%d", vocab), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := SampleGumbel(l, 0.8, 1, 2); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("TopLogProbs20/vocab=%d", vocab), func(b *testing.B) {
			dst := make([]TokenLogProb, 0, 20)
			b.ReportAllocs()
			for b.Loop() {
				dst = TopLogProbs(l, 20, dst)
			}
		})
	}
}

// BenchmarkFullSort is the baseline top-p avoids: the softmax, then a sort
// of every candidate by probability.
func BenchmarkFullSort(b *testing.B) {
	cmp := func(a, b cand) int {
		switch {
		case worse(b, a):
			return -1
		case worse(a, b):
			return 1
		}
		return 0
	}
	for _, vocab := range []int{32000, 128256} {
		l := randLogits(vocab, 3, 1)
		c := make([]cand, 0, vocab)
		b.Run(fmt.Sprintf("vocab=%d", vocab), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c, _ = softmaxLogits(l, l[argmax(l)], 1/0.8, c[:0], nil)
				slices.SortFunc(c, cmp)
			}
		})
	}
}
