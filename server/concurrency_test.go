package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// banEOS makes a generation run to its token limit: stories260K's </s> is
// token 2.
const banEOS = `"logit_bias": {"2": -100}`

// openStream starts a streaming request and reads its first event.
func openStream(t *testing.T, ctx context.Context, url, body string) (*http.Response, *bufio.Reader, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	br := bufio.NewReader(resp.Body)
	ev, err := readEvent(br)
	if err != nil {
		t.Fatal(err)
	}
	return resp, br, ev
}

// readEvent reads one "data: ...\n\n" event and returns its data.
func readEvent(br *bufio.Reader) (string, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	if blank, err := br.ReadString('\n'); err != nil || blank != "\n" {
		return "", fmt.Errorf("event %q not followed by a blank line (%q, %v)", line, blank, err)
	}
	data, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "data: ")
	if !ok {
		return "", fmt.Errorf("event line %q lacks \"data: \"", line)
	}
	return data, nil
}

// waitFor polls cond for up to 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// holdTokens makes every generation wait before each token until release
// is called (or its request ends).
func holdTokens(s *Server) (release func()) {
	gate := make(chan struct{})
	s.pace = func(ctx context.Context) {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	var once sync.Once
	return func() { once.Do(func() { close(gate) }) }
}

// TestDisconnectFreesSlot: a client that goes away mid-stream gives its
// slot back at the next step, long before its token limit.
func TestDisconnectFreesSlot(t *testing.T) {
	m := load(t, storiesPath(t), 1, 2048)
	s, ts := newTestServer(t, m, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	resp, _, _ := openStream(t, ctx, ts.URL+"/v1/completions", `{"prompt": "Once", "max_tokens": 2000, "stream": true, `+banEOS+`}`)
	cancel()
	resp.Body.Close()
	waitFor(t, "the slot to be free", func() bool { active, _ := s.gate.depth(); return active == 0 })
	if got := m.Metrics().GeneratedTokens; got >= 2000 {
		t.Errorf("the abandoned generation ran on: %d tokens", got)
	}
	r, body := do(t, "POST", ts.URL+"/v1/completions", `{"prompt": "Once", "max_tokens": 3}`)
	if r.StatusCode != 200 {
		t.Errorf("next request: %d %s", r.StatusCode, body)
	}
}

// TestQueueFull: with every slot busy and the queue full, a request gets
// 429 at once; the queued one runs when the slot frees.
func TestQueueFull(t *testing.T) {
	m := load(t, chatModelPath(t), 1, 128)
	s, ts := newTestServer(t, m, Options{MaxQueue: 1})
	release := holdTokens(s)
	defer release()

	resp, br, _ := openStream(t, context.Background(), ts.URL+"/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "stream": true}`)
	queued := make(chan int, 1)
	go func() {
		r, _ := do(t, "POST", ts.URL+"/v1/completions", `{"prompt": "Once", "max_tokens": 3}`)
		queued <- r.StatusCode
	}()
	waitFor(t, "a queued request", func() bool { _, waiting := s.gate.depth(); return waiting == 1 })

	r, body := do(t, "POST", ts.URL+"/v1/completions", `{"prompt": "Once", "max_tokens": 3}`)
	var e errorBody
	json.Unmarshal(body, &e)
	if r.StatusCode != 429 || deref(e.Error.Code) != "queue_full" {
		t.Errorf("over capacity: %d %s, want 429 queue_full", r.StatusCode, body)
	}
	_, metricsText := do(t, "GET", ts.URL+"/metrics", "")
	for _, want := range []string{"weft_queue_depth 1\n", "weft_active_slots 1\n", `weft_requests_total{route="/v1/completions",status="429"} 1`} {
		if !strings.Contains(string(metricsText), want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	release()
	rest, err := io.ReadAll(br)
	resp.Body.Close()
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Errorf("the running stream did not finish: %q, %v", rest, err)
	}
	if code := <-queued; code != 200 {
		t.Errorf("queued request: %d", code)
	}
}

// TestShutdownDrains: on shutdown the server stops accepting, refuses the
// queued request with 503, lets the running stream finish, and returns.
func TestShutdownDrains(t *testing.T) {
	m := load(t, chatModelPath(t), 1, 128)
	s, _ := newTestServer(t, m, Options{MaxQueue: 4})
	release := holdTokens(s)
	defer release()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()

	resp, br, _ := openStream(t, context.Background(), base+"/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0, "stream": true, `+banEOS+`}`)
	defer resp.Body.Close()
	queued := make(chan []byte, 1)
	go func() {
		r, body := do(t, "POST", base+"/v1/completions", `{"prompt": "Once", "max_tokens": 3}`)
		queued <- append([]byte(fmt.Sprint(r.StatusCode, " ")), body...)
	}()
	waitFor(t, "a queued request", func() bool { _, waiting := s.gate.depth(); return waiting == 1 })

	stop()
	if got := string(<-queued); !strings.HasPrefix(got, "503 ") || !strings.Contains(got, `"code":"shutting_down"`) {
		t.Errorf("queued request at shutdown: %s", got)
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/health", nil))
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), "shutting down") {
		t.Errorf("health while draining: %d %s", rec.Code, rec.Body)
	}
	waitFor(t, "the listener to close", func() bool {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case err := <-served:
		t.Fatalf("Serve returned before the stream finished: %v", err)
	default:
	}

	release()
	rest, err := io.ReadAll(br)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || !strings.Contains(string(rest), `"finish_reason":"length"`) {
		t.Errorf("the running stream did not finish: %q, %v", rest, err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not return after the drain")
	}
}

// TestShutdownDeadline: a stream still running when the drain time is up
// is cut off, and Serve reports the deadline.
func TestShutdownDeadline(t *testing.T) {
	m := load(t, chatModelPath(t), 1, 128)
	s, _ := newTestServer(t, m, Options{DrainTimeout: 200 * time.Millisecond})
	release := holdTokens(s)
	defer release()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	resp, br, _ := openStream(t, context.Background(), "http://"+ln.Addr().String()+"/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "stream": true}`)
	defer resp.Body.Close()
	stop()
	select {
	case err := <-served:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Serve: %v, want the drain deadline", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not return after the drain deadline")
	}
	if rest, _ := io.ReadAll(br); strings.Contains(string(rest), "[DONE]") {
		t.Errorf("the cut-off stream finished: %q", rest)
	}
	if active, _ := s.gate.depth(); active != 0 {
		t.Errorf("%d slots still held", active)
	}
}

// completionText sends a whole completion and returns its text.
func completionText(client *http.Client, url, body string) (string, error) {
	resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct {
		Choices []completionChoice `json:"choices"`
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil || len(out.Choices) != 1 {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return out.Choices[0].Text, nil
}

func loopbackClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
}

// TestBatchedMatchesAlone: a greedy request gives the same text alone and
// decoded alongside 63 others, and each of those gives what it gives
// alone: nothing of one request reaches another.
func TestBatchedMatchesAlone(t *testing.T) {
	m := load(t, storiesPath(t), 64, 256)
	_, ts := newTestServer(t, m, Options{MaxQueue: 64})
	client := loopbackClient()
	bodies := []string{`{"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}`}
	for i, p := range []string{"The cat", "Lily", "One day", "Tom was", "A big dog", "The sun", "She"} {
		if i%2 == 0 {
			bodies = append(bodies, fmt.Sprintf(`{"prompt": %q, "max_tokens": 24, "temperature": 0}`, p))
		} else {
			bodies = append(bodies, fmt.Sprintf(`{"prompt": %q, "max_tokens": 24, "temperature": 0.9, "seed": %d}`, p, i))
		}
	}
	alone := make([]string, len(bodies))
	for i, b := range bodies {
		text, err := completionText(client, ts.URL, b)
		if err != nil {
			t.Fatal(err)
		}
		alone[i] = text
	}
	got := make([]string, 64)
	errs := make([]error, 64)
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() { got[i], errs[i] = completionText(client, ts.URL, bodies[i%len(bodies)]) })
	}
	wg.Wait()
	for i := range 64 {
		if errs[i] != nil {
			t.Errorf("request %d: %v", i, errs[i])
		} else if want := alone[i%len(bodies)]; got[i] != want {
			t.Errorf("request %d (%s): batched %q, alone %q", i, bodies[i%len(bodies)], got[i], want)
		}
	}
}

// streamTokens runs one streaming completion and counts its text chunks;
// it fails on anything but a well-formed stream ending in [DONE].
func streamTokens(client *http.Client, url, body string) (int, error) {
	resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	br := bufio.NewReader(resp.Body)
	n := 0
	for {
		data, err := readEvent(br)
		if err != nil {
			return n, err
		}
		if data == "[DONE]" {
			return n, nil
		}
		var c completion
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return n, fmt.Errorf("chunk %q: %v", data, err)
		}
		n++
	}
}

// TestLoad256: 256 concurrent streaming requests on loopback, 64 at a
// time and the rest queued, all finish with their full token count.
func TestLoad256(t *testing.T) {
	if testing.Short() {
		t.Skip("load test skipped in -short mode")
	}
	m := load(t, storiesPath(t), 64, 128)
	_, ts := newTestServer(t, m, Options{MaxQueue: 256})
	client := loopbackClient()
	const requests, tokens = 256, 8
	body := fmt.Sprintf(`{"prompt": "Once upon a time", "max_tokens": %d, "temperature": 0.8, "seed": 1, "stream": true, %s}`, tokens, banEOS)
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []error
	total := 0
	for range requests {
		wg.Go(func() {
			n, err := streamTokens(client, ts.URL, body)
			mu.Lock()
			defer mu.Unlock()
			total += n
			if err != nil {
				failures = append(failures, err)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if len(failures) > 0 {
		t.Fatalf("%d of %d requests failed; first: %v", len(failures), requests, failures[0])
	}
	// Each request sends a chunk per token, the last one with its finish
	// reason: at least tokens chunks, and one more when the finish
	// carries no text.
	if total < requests*tokens {
		t.Errorf("%d chunks from %d requests of %d tokens", total, requests, tokens)
	}
	if got := m.Metrics().GeneratedTokens; got != requests*tokens {
		t.Errorf("model generated %d tokens, want %d", got, requests*tokens)
	}
	t.Logf("%d streams of %d tokens in %v: %.0f tokens/s", requests, tokens, elapsed.Round(time.Millisecond), float64(requests*tokens)/elapsed.Seconds())
}
