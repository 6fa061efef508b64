package chat

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// goldenCase is one entry of testdata/expected.json, written by
// testdata/gen_expected.py with transformers' apply_chat_template.
type goldenCase struct {
	Template string            `json:"template"`
	Source   map[string]string `json:"source"`
	SHA256   string            `json:"sha256"`
	Case     string            `json:"case"`
	Inputs   struct {
		Messages      []Message                  `json:"messages"`
		AddGeneration bool                       `json:"add_generation_prompt"`
		Tools         []json.RawMessage          `json:"tools"`
		SpecialTokens map[string]string          `json:"special_tokens"`
		Extra         map[string]json.RawMessage `json:"extra"`
	} `json:"inputs"`
	Expected  *string `json:"expected"`
	Error     *string `json:"error"`
	ErrorKind string  `json:"error_kind"`
}

type goldenFile struct {
	Meta struct {
		Renderer     string `json:"renderer"`
		Transformers string `json:"transformers"`
		Now          string `json:"now"`
	} `json:"meta"`
	Cases []goldenCase `json:"cases"`
}

var sharedDir = filepath.Join("..", "..", "shared", "testdata")

func loadGolden(t *testing.T) goldenFile {
	t.Helper()
	path := filepath.Join("testdata", "expected.json")
	if p := os.Getenv("CHAT_EXPECTED"); p != "" {
		path = p // a file made with --jinja2-only while writing new cases
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var g goldenFile
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if os.Getenv("CHAT_EXPECTED") == "" && !strings.HasPrefix(g.Meta.Renderer, "transformers") {
		t.Fatalf("%s was rendered by %q, not transformers", path, g.Meta.Renderer)
	}
	return g
}

// goldenSource reads a case's template from shared/testdata or this
// package's testdata/templates, checking it is the text the reference saw.
func goldenSource(t *testing.T, c goldenCase) string {
	t.Helper()
	var text string
	switch {
	case c.Source["own"] != "":
		b, err := os.ReadFile(filepath.Join("testdata", c.Source["own"]))
		if err != nil {
			t.Fatal(err)
		}
		text = string(b)
	default:
		path := filepath.Join(sharedDir, c.Source["shared"])
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			t.Skipf("shared test data absent (%s)", path)
		}
		if err != nil {
			t.Fatal(err)
		}
		text = string(b)
		if key := c.Source["key"]; key != "" {
			var cfg map[string]any
			if err := json.Unmarshal(b, &cfg); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			text, _ = cfg[key].(string)
		}
	}
	sum := sha256.Sum256([]byte(text))
	if got := hex.EncodeToString(sum[:]); got != c.SHA256 {
		t.Fatalf("template source changed since the reference run: sha256 %s, want %s", got, c.SHA256)
	}
	return text
}

func goldenInput(t *testing.T, c goldenCase, now time.Time) Input {
	t.Helper()
	in := Input{Messages: c.Inputs.Messages, AddGenerationPrompt: c.Inputs.AddGeneration, Tools: c.Inputs.Tools, Extra: map[string]any{}, Now: now}
	for k, v := range c.Inputs.SpecialTokens {
		switch k {
		case "bos_token":
			in.BOSToken = v
		case "eos_token":
			in.EOSToken = v
		default:
			in.Extra[k] = v
		}
	}
	for k, v := range c.Inputs.Extra {
		in.Extra[k] = v
	}
	return in
}

// TestGolden renders every reference case and compares byte for byte.
func TestGolden(t *testing.T) {
	g := loadGolden(t)
	now, err := time.Parse("2006-01-02T15:04:05", g.Meta.Now)
	if err != nil {
		t.Fatalf("meta.now: %v", err)
	}
	parsed := map[string]*Template{}
	passed, total := map[string]int{}, map[string]int{}
	for _, c := range g.Cases {
		total[c.Template]++
		ok := t.Run(c.Template+"/"+c.Case, func(t *testing.T) {
			tmpl := parsed[c.Template]
			if tmpl == nil {
				var err error
				if tmpl, err = Parse(c.Template, goldenSource(t, c)); err != nil {
					t.Fatal(err)
				}
				parsed[c.Template] = tmpl
			}
			got, err := tmpl.Render(goldenInput(t, c, now))
			switch {
			case c.Expected != nil && err != nil:
				t.Fatalf("render failed: %v", err)
			case c.Expected != nil && got != *c.Expected:
				t.Fatalf("rendered\n%q\nwant\n%q", got, *c.Expected)
			case c.Expected == nil && err == nil:
				t.Fatalf("rendered %q, want the error %q", got, *c.Error)
			case c.Expected == nil && c.ErrorKind == "raise_exception":
				var ex *Exception
				if !errors.As(err, &ex) || ex.Message != *c.Error {
					t.Fatalf("error %v, want raise_exception(%q)", err, *c.Error)
				}
				var te *Error
				if !errors.As(err, &te) || te.Template != c.Template || te.Line == 0 {
					t.Errorf("error %v does not name the template and line", err)
				}
			}
		})
		if ok {
			passed[c.Template]++
		}
	}
	for _, name := range sortedKeys(total) {
		t.Logf("%-42s %2d/%2d", name, passed[name], total[name])
	}
}
