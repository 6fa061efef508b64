package weft

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Metrics are the model's counters: totals since it was loaded and the
// figures of the last generation.
type Metrics struct {
	Requests        int64 `json:"requests"`
	PromptTokens    int64 `json:"prompt_tokens"`    // total prompt tokens prefilled
	GeneratedTokens int64 `json:"generated_tokens"` // total tokens generated

	// CachedPromptTokens counts prompt tokens a request found already in
	// its slot's cache (a conversation's earlier turns) and did not feed.
	CachedPromptTokens int64 `json:"cached_prompt_tokens"`

	LastPromptTokens    int           `json:"last_prompt_tokens"`
	LastGeneratedTokens int           `json:"last_generated_tokens"`
	PrefillTokensPerSec float64       `json:"prefill_tokens_per_second"` // of the last prefill
	DecodeTokensPerSec  float64       `json:"decode_tokens_per_second"`  // of the last generation
	TimeToFirstToken    time.Duration `json:"time_to_first_token"`       // of the last generation

	// PeakMemoryBytes is the process's peak resident memory where the OS
	// reports it (Linux VmHWM: weights paged in from the map included),
	// else the Go runtime's memory obtained from the OS.
	PeakMemoryBytes int64 `json:"peak_memory_bytes"`
}

// Metrics returns a snapshot of the counters.
func (m *Model) Metrics() Metrics {
	m.mu.Lock()
	out := m.metrics
	m.mu.Unlock()
	out.PeakMemoryBytes = peakMemory()
	return out
}

func (m *Model) recordPrefill(tokens int, d time.Duration) { m.recordPrompt(tokens, 0, d) }

// recordPrompt books a prompt of tokens of which kept were already
// cached: the rate counts the tokens fed.
func (m *Model) recordPrompt(tokens, kept int, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.metrics.PromptTokens += int64(tokens)
	m.metrics.CachedPromptTokens += int64(kept)
	m.metrics.LastPromptTokens = tokens
	if d > 0 {
		m.metrics.PrefillTokensPerSec = float64(tokens-kept) / d.Seconds()
	}
}

// recordGeneration books a finished generation: generated tokens, the
// time to the first token, and the decode rate after it.
func (m *Model) recordGeneration(generated int, start, first time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.metrics.Requests++
	m.metrics.GeneratedTokens += int64(generated)
	m.metrics.LastGeneratedTokens = generated
	if !first.IsZero() {
		m.metrics.TimeToFirstToken = first.Sub(start)
	}
	if generated > 1 && !first.IsZero() {
		m.metrics.DecodeTokensPerSec = float64(generated-1) / elapsed(first)
	}
}

// peakMemory reads VmHWM from /proc/self/status, falling back to the Go
// runtime's figure.
func peakMemory() int64 {
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				f := strings.Fields(rest)
				if len(f) == 2 && f[1] == "kB" {
					if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil {
						return kb * 1024
					}
				}
			}
		}
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.Sys)
}
