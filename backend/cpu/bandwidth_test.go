package cpu

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
)

// streamSink keeps the sums alive.
var streamSink uint64

// BenchmarkStreamRead measures the machine's streaming-read bandwidth, the
// ceiling of a memory-bound decode step: 1 or 2 goroutines each read their
// half of a 1 GiB buffer once per iteration with 32-byte loads (8-byte
// ones without AVX2). MB/s is the whole buffer's bytes per second.
func BenchmarkStreamRead(b *testing.B) {
	const size = 1 << 30
	buf := make([]byte, size)
	for i := 0; i < size; i += 4096 {
		buf[i] = byte(i >> 12)
	}
	for _, threads := range []int{1, 2} {
		b.Run(fmt.Sprintf("threads=%d", threads), func(b *testing.B) {
			b.SetBytes(size)
			var mu sync.Mutex
			for b.Loop() {
				var wg sync.WaitGroup
				per := size / threads
				for t := range threads {
					wg.Add(1)
					go func(part []byte) {
						defer wg.Done()
						s := streamRead(part)
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

// TestStreamRead checks the read loops against a plain XOR of the words,
// so the benchmark is known to read every byte.
func TestStreamRead(t *testing.T) {
	x := make([]byte, 4096)
	for i := range x {
		x[i] = byte(i*7 + i>>8)
	}
	var want uint64
	for i := 0; i < len(x); i += 8 {
		want ^= binary.LittleEndian.Uint64(x[i:])
	}
	if got := streamRead(x); got != want {
		t.Errorf("streamRead = %#x, want %#x", got, want)
	}
	if got := streamReadGo(x); got != want {
		t.Errorf("streamReadGo = %#x, want %#x", got, want)
	}
}
