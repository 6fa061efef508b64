package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weftlm/weft/internal/testmodel"

	"github.com/creack/pty"
)

// templateModel is the story model with a real chat template.
func templateModel(t *testing.T) string { return testmodel.StoriesWithTemplate(t) }

// screen collects what the child writes to its terminal.
type screen struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]|\r`)

func (s *screen) text() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ansi.ReplaceAllString(s.buf.String(), "")
}

// waitFor polls the screen until it contains want n times.
func (s *screen) waitFor(t *testing.T, want string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if strings.Count(s.text(), want) >= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("screen never showed %q %d times:\n%s", want, n, s.text())
}

// TestChatInTerminal drives `weft chat` in a pseudo-terminal as a person
// would: type a message, read the streamed reply, clear, exit.
func TestChatInTerminal(t *testing.T) {
	model := templateModel(t)
	cmd := exec.Command(os.Args[0], "chat", "-m", model, "--temp", "0", "-n", "24")
	cmd.Env = append(os.Environ(), "WEFT_TEST_MAIN=1")
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 120})
	if err != nil {
		t.Skipf("no pseudo-terminal here: %v", err)
	}
	defer tty.Close()
	scr := &screen{}
	go func() { _, _ = copyAll(scr, tty) }()

	scr.waitFor(t, "/clear starts over", 1)
	scr.waitFor(t, "> ", 1)
	tty.Write([]byte("Tell me a story\r"))
	scr.waitFor(t, "> ", 2) // the reply ended and the prompt is back
	after := scr.text()[strings.Index(scr.text(), "Tell me a story"):]
	reply := strings.TrimSpace(strings.SplitN(strings.SplitN(after, "\n", 2)[1], "> ", 2)[0])
	if len(reply) < 10 {
		t.Fatalf("no reply on screen:\n%s", scr.text())
	}
	tty.Write([]byte("/clear\r"))
	scr.waitFor(t, "(conversation cleared)", 1)
	tty.Write([]byte("/exit\r"))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("chat exited with %v:\n%s", err, scr.text())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("chat did not exit:\n%s", scr.text())
	}
	t.Logf("screen:\n%s", scr.text())
}

func copyAll(dst *screen, src *os.File) (int64, error) {
	buf := make([]byte, 4096)
	var n int64
	for {
		k, err := src.Read(buf)
		if k > 0 {
			dst.Write(buf[:k])
			n += int64(k)
		}
		if err != nil {
			return n, err
		}
	}
}

// TestRunCommand: weft run prints only the generated text; the greedy
// output of stories260K from BOS is llama2.c's published text.
func TestRunCommand(t *testing.T) {
	want, err := os.ReadFile(filepath.Join(sharedTestdata(t), "llama2c-stories260K", "expected_greedy_t0.txt"))
	if err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := runWeft(t, "run", "-m", storiesPath(t), "--temp", "0", "-n", "256")
	if code != 0 || stdout != string(want) {
		t.Fatalf("exit %d, stderr %q\n got %q\nwant %q", code, stderr, stdout, want)
	}
	stdout, stderr, code = runWeft(t, "run", "-m", storiesPath(t), "-p", "Once upon a time", "-n", "20", "--seed", "5", "--verbose")
	if code != 0 || stdout == "" || !strings.Contains(stderr, "generated 20 tokens") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	stdout2, _, _ := runWeft(t, "run", "-m", storiesPath(t), "-p", "Once upon a time", "-n", "20", "--seed", "5", "--threads", "1")
	if stdout2 != stdout {
		t.Errorf("seeded runs differ: %q vs %q", stdout, stdout2)
	}
	schema := filepath.Join(t.TempDir(), "schema.json")
	if err := os.WriteFile(schema, []byte(`{"type":"object","properties":{"mood":{"enum":["happy","sad"]}},"required":["mood"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code = runWeft(t, "run", "-m", storiesPath(t), "--json-schema", schema, "--seed", "1", "-n", "60")
	var obj struct{ Mood string }
	if code != 0 || json.Unmarshal([]byte(stdout), &obj) != nil || (obj.Mood != "happy" && obj.Mood != "sad") {
		t.Errorf("--json-schema: exit %d, stdout %q (want {\"mood\": \"happy\" or \"sad\"}), stderr %q", code, stdout, stderr)
	}
	if err := os.WriteFile(schema, []byte(`{"type":"integer"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := runWeft(t, "run", "-m", storiesPath(t), "--json-schema", schema); code != 1 || !strings.Contains(stderr, "schema.json: schema: the top level") {
		t.Errorf("bad --json-schema: exit %d, stderr %q", code, stderr)
	}
	// An f16 key/value cache gives stories260K's greedy text unchanged.
	greedy, _, _ := runWeft(t, "run", "-m", storiesPath(t), "-p", "Once upon a time", "--temp", "0", "-n", "40", "--backend", "cpu")
	if got, stderr, code := runWeft(t, "run", "-m", storiesPath(t), "-p", "Once upon a time", "--temp", "0", "-n", "40", "--backend", "cpu", "--cache-type", "f16"); code != 0 || got != greedy {
		t.Errorf("--cache-type f16: exit %d, stderr %q\n got %q\nwant %q", code, stderr, got, greedy)
	}
	if _, stderr, code := runWeft(t, "run", "-m", storiesPath(t), "--cache-type", "q4"); code != 1 || !strings.Contains(stderr, `cache type "q4": want one of f32, f16`) {
		t.Errorf("bad --cache-type: exit %d, stderr %q", code, stderr)
	}
	if _, stderr, code := runWeft(t, "run", "-m", storiesPath(t), "--tensor-split", "a,b"); code != 2 || !strings.Contains(stderr, "--tensor-split") {
		t.Errorf("bad --tensor-split: exit %d, stderr %q", code, stderr)
	}
	if _, stderr, code := runWeft(t, "run", "-m", storiesPath(t), "--tensor-split", "1,1"); code != 1 || !strings.Contains(stderr, "tensor split needs GPUs: cuda: cannot load") {
		t.Errorf("--tensor-split without a GPU: exit %d, stderr %q", code, stderr)
	}
	if _, stderr, code := runWeft(t, "run", "-m", storiesPath(t), "--backend", "cpu", "--tensor-split", "1,1"); code != 1 || !strings.Contains(stderr, "tensor split needs the cuda or auto backend") {
		t.Errorf("--tensor-split on the CPU: exit %d, stderr %q", code, stderr)
	}
}
