package cpu

import (
	"fmt"
	"sync"
	"testing"
)

// streamSink keeps the sums alive.
var streamSink uint64

// BenchmarkStreamRead measures the machine's streaming-read bandwidth, the
// ceiling of a memory-bound decode step: 1 or 2 goroutines each read their
// half of a 1 GiB buffer once per iteration, 64 bytes at a time in eight
// independent chains. MB/s is the whole buffer's bytes per second.
func BenchmarkStreamRead(b *testing.B) {
	const size = 1 << 30
	buf := make([]uint64, size/8)
	for i := range buf {
		buf[i] = uint64(i)
	}
	for _, threads := range []int{1, 2} {
		b.Run(fmt.Sprintf("threads=%d", threads), func(b *testing.B) {
			b.SetBytes(size)
			var mu sync.Mutex
			for b.Loop() {
				var wg sync.WaitGroup
				per := len(buf) / threads
				for t := range threads {
					wg.Add(1)
					go func(part []uint64) {
						defer wg.Done()
						s := streamSum(part)
						mu.Lock()
						streamSink ^= s
						mu.Unlock()
					}(buf[t*per : (t+1)*per])
				}
				wg.Wait()
			}
		})
	}
}

func streamSum(x []uint64) uint64 {
	var s0, s1, s2, s3, s4, s5, s6, s7 uint64
	for i := 0; i+8 <= len(x); i += 8 {
		v := x[i : i+8 : i+8]
		s0 += v[0]
		s1 += v[1]
		s2 += v[2]
		s3 += v[3]
		s4 += v[4]
		s5 += v[5]
		s6 += v[6]
		s7 += v[7]
	}
	return s0 ^ s1 ^ s2 ^ s3 ^ s4 ^ s5 ^ s6 ^ s7
}
