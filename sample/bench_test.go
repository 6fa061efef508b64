package sample

import (
	"fmt"
	"testing"
)

// The benchmarks draw from normal logits of standard deviation 3 (a
// nucleus of top-p 0.9 then holds a few percent of the vocabulary) and 1
// (a flat distribution: most of it), at Llama 2's and Llama 3's vocabulary
// sizes.
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
