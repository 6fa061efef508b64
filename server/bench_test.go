package server

import (
	"fmt"
	"sync"
	"testing"
)

// BenchmarkThroughput measures total generated tokens per second through
// the HTTP server on loopback, with as many concurrent streaming clients
// as the model has slots (1, 8, 64), each making two requests of 64
// tokens per iteration. Batched decoding shows as the rate growing with
// the parallelism.
//
//	go test ./server -run '^$' -bench Throughput -benchtime 3x
func BenchmarkThroughput(b *testing.B) {
	for _, parallel := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("parallel=%d", parallel), func(b *testing.B) {
			m := load(b, storiesPath(b), parallel, 256)
			_, ts := newTestServer(b, m, Options{MaxQueue: parallel})
			client := loopbackClient()
			body := `{"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0.8, "seed": 1, "stream": true, ` + banEOS + `}`
			before := m.Metrics().GeneratedTokens
			for b.Loop() {
				var wg sync.WaitGroup
				for range parallel {
					wg.Go(func() {
						for range 2 {
							if _, err := streamTokens(client, ts.URL, body); err != nil {
								b.Error(err)
							}
						}
					})
				}
				wg.Wait()
			}
			tokens := m.Metrics().GeneratedTokens - before
			b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
