package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServeUsage: bad flags are usage errors (exit 2) that say what is
// wrong.
func TestServeUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "-m MODEL is required"},
		{[]string{"-m", "x.gguf", "extra"}, `unexpected argument "extra"`},
		{[]string{"-m", "x.gguf", "--parallel", "0"}, "--parallel must be at least 1"},
		{[]string{"-m", "x.gguf", "--max-queue", "-1"}, "--max-queue must not be negative"},
		{[]string{"-m", "x.gguf", "--max-body", "0"}, "--max-body must be positive"},
		{[]string{"-m", "x.gguf", "--log", "xml"}, "--log must be text or json"},
		{[]string{"--port", "80"}, "flag provided but not defined: -port"},
		{[]string{"-m", "x.gguf", "--tensor-split", "1,-2"}, `--tensor-split "1,-2": entry 2`},
	} {
		_, errOut, code := runWeft(t, append([]string{"serve"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("serve %v: exit %d, stderr %q; want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
	if _, errOut, code := runWeft(t, "serve", "-m", filepath.Join(t.TempDir(), "none.gguf")); code != 1 || !strings.Contains(errOut, "none.gguf") {
		t.Errorf("missing model: exit %d, %q", code, errOut)
	}
}

// TestServeCommand runs `weft serve` as a child process on a free
// loopback port: it answers, logs one structured line per request, and
// on SIGTERM drains and exits 0.
func TestServeCommand(t *testing.T) {
	model := filepath.Join(sharedTestdata(t), "gguf-stories260K", "stories260K.gguf")
	cmd := exec.Command(os.Args[0], "serve", "-m", model, "--addr", "127.0.0.1:0", "--parallel", "2", "--ctx", "128",
		"--api-key", "k", "--log", "json", "--name", "stories")
	cmd.Env = append(os.Environ(), "WEFT_TEST_MAIN=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var log []string
	next := func(want string) map[string]any {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case line, ok := <-lines:
				if !ok {
					t.Fatalf("serve exited before logging %q:\n%s", want, strings.Join(log, "\n"))
				}
				log = append(log, line)
				var rec map[string]any
				if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == want {
					return rec
				}
			case <-timeout:
				t.Fatalf("no %q log line:\n%s", want, strings.Join(log, "\n"))
			}
		}
	}
	url, _ := next("listening")["url"].(string)
	if !regexp.MustCompile(`^http://127\.0\.0\.1:\d+$`).MatchString(url) {
		t.Fatalf("listening on %q", url)
	}

	req, _ := http.NewRequest("POST", url+"/v1/completions", strings.NewReader(`{"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}`))
	req.Header.Set("Authorization", "Bearer k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"model":"stories"`) || !strings.Contains(string(body), `"completion_tokens":5`) {
		t.Errorf("completion: %d %s", resp.StatusCode, body)
	}
	rec := next("request")
	for k, want := range map[string]any{"method": "POST", "path": "/v1/completions", "status": 200.0, "prompt_tokens": 5.0, "completion_tokens": 5.0} {
		if rec[k] != want {
			t.Errorf("request log %s = %v, want %v (%v)", k, rec[k], want, rec)
		}
	}
	if _, ok := rec["duration"]; !ok {
		t.Errorf("request log lacks duration: %v", rec)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	next("shutting down")
	next("stopped")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve exited with %v:\n%s", err, strings.Join(log, "\n"))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not exit after SIGTERM")
	}
}
