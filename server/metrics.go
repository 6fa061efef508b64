package server

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// metrics are the server's counters, written out in Prometheus's text
// exposition format (version 0.0.4) by GET /metrics.
type metrics struct {
	mu        sync.Mutex
	requests  map[routeStatus]int64
	prompt    int64 // prompt tokens of finished requests
	generated int64 // tokens generated for finished requests
	latency   map[string]*histogram
	ttft      map[string]*histogram
}

type routeStatus struct {
	route  string
	status int
}

// latencyBuckets are upper bounds in seconds, for both histograms: from a
// cached small reply to a long generation.
var latencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

type histogram struct {
	counts []int64 // per bucket, not cumulative; the last is +Inf
	sum    float64
	n      int64
}

func (h *histogram) observe(v float64) {
	i, _ := slices.BinarySearch(latencyBuckets, v)
	h.counts[i]++
	h.sum += v
	h.n++
}

func newMetrics() *metrics {
	return &metrics{requests: map[routeStatus]int64{}, latency: map[string]*histogram{}, ttft: map[string]*histogram{}}
}

func observeIn(hs map[string]*histogram, route string, d time.Duration) {
	h := hs[route]
	if h == nil {
		h = &histogram{counts: make([]int64, len(latencyBuckets)+1)}
		hs[route] = h
	}
	h.observe(d.Seconds())
}

// observe books a finished request. route is a known route or "other",
// so the label sets stay few whatever paths clients ask for.
func (m *metrics) observe(route string, status int, d time.Duration, rec *record) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requests[routeStatus{route, status}]++
	m.prompt += int64(rec.promptTokens)
	m.generated += int64(rec.completionTokens)
	observeIn(m.latency, route, d)
	if rec.firstToken > 0 {
		observeIn(m.ttft, route, rec.firstToken)
	}
}

// write prints every metric; active, waiting and slots are read from the
// gate at the time of the scrape.
func (m *metrics) write(w io.Writer, active, waiting, slots int, cached int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	head := func(name, typ, help string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	head("weft_requests_total", "counter", "HTTP requests served, by route and status code.")
	keys := slices.SortedFunc(maps.Keys(m.requests), func(a, b routeStatus) int {
		if c := strings.Compare(a.route, b.route); c != 0 {
			return c
		}
		return a.status - b.status
	})
	for _, k := range keys {
		fmt.Fprintf(&b, "weft_requests_total{route=%s,status=\"%d\"} %d\n", quote(k.route), k.status, m.requests[k])
	}
	head("weft_prompt_tokens_total", "counter", "Prompt tokens of finished requests.")
	fmt.Fprintf(&b, "weft_prompt_tokens_total %d\n", m.prompt)
	head("weft_prompt_tokens_cached_total", "counter", "Prompt tokens found in a slot's cache from an earlier request and not fed again.")
	fmt.Fprintf(&b, "weft_prompt_tokens_cached_total %d\n", cached)
	head("weft_generated_tokens_total", "counter", "Tokens generated for finished requests.")
	fmt.Fprintf(&b, "weft_generated_tokens_total %d\n", m.generated)
	writeHistograms(&b, "weft_request_duration_seconds", "Time from a request's arrival to the end of its response, by route.", m.latency)
	writeHistograms(&b, "weft_time_to_first_token_seconds", "Time from a generation request's arrival to its first token, by route.", m.ttft)
	head("weft_queue_depth", "gauge", "Requests waiting for a slot.")
	fmt.Fprintf(&b, "weft_queue_depth %d\n", waiting)
	head("weft_active_slots", "gauge", "Requests running on the model.")
	fmt.Fprintf(&b, "weft_active_slots %d\n", active)
	head("weft_slots", "gauge", "Requests the model runs at once (--parallel).")
	fmt.Fprintf(&b, "weft_slots %d\n", slots)
	_, err := io.WriteString(w, b.String())
	return err
}

func writeHistograms(b *strings.Builder, name, help string, hs map[string]*histogram) {
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
	for _, route := range slices.Sorted(maps.Keys(hs)) {
		h := hs[route]
		var cum int64
		for i, c := range h.counts {
			cum += c
			le := "+Inf"
			if i < len(latencyBuckets) {
				le = strconv.FormatFloat(latencyBuckets[i], 'g', -1, 64)
			}
			fmt.Fprintf(b, "%s_bucket{route=%s,le=\"%s\"} %d\n", name, quote(route), le, cum)
		}
		fmt.Fprintf(b, "%s_sum{route=%s} %s\n", name, quote(route), strconv.FormatFloat(h.sum, 'g', -1, 64))
		fmt.Fprintf(b, "%s_count{route=%s} %d\n", name, quote(route), h.n)
	}
}

// quote writes a label value with the format's three escapes.
func quote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s) + `"`
}
