package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/weftlm/weft/modelpath"
	"github.com/weftlm/weft/tokenizer"
)

func init() {
	register(command{
		name:    "tokenize",
		summary: "print the token ids of a text, or the text of token ids",
		run:     runTokenize,
	})
}

func runTokenize(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("tokenize", stderr)
	model := fs.String("m", "", "model `PATH`: a .gguf file, a directory of Hugging Face tokenizer files, a tokenizer.json,\na SentencePiece .model, or a model name (see weft list)")
	noSpecial := fs.Bool("no-special", false, "add no BOS/EOS and read special-token text as plain text")
	asJSON := fs.Bool("json", false, "print the ids as a JSON array")
	file := fs.String("file", "", "read the text from this file (- for standard input)")
	decode := fs.String("decode", "", "print the text of these comma-separated ids instead")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: weft tokenize -m PATH [--no-special] [--json] [--file F | TEXT]\n       weft tokenize -m PATH --decode 1,2,3")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if *model == "" {
		fs.Usage()
		return fmt.Errorf("%w: -m PATH is required", errUsage)
	}
	if *decode != "" && (*file != "" || len(pos) > 0) {
		return fmt.Errorf("%w: --decode takes no text", errUsage)
	}
	if *decode == "" && (*file == "") == (len(pos) == 0) {
		fs.Usage()
		return fmt.Errorf("%w: give either TEXT or --file", errUsage)
	}
	path, err := modelpath.Resolve(*model)
	if err != nil {
		return err
	}
	tk, err := tokenizer.Load(path)
	if err != nil {
		return err
	}
	if *decode != "" {
		ids, err := parseTokenIDs(*decode, tk.Len())
		if err != nil {
			return fmt.Errorf("%w: --decode: %v", errUsage, err)
		}
		_, err = fmt.Fprintln(stdout, tk.Decode(ids))
		return err
	}
	text := strings.Join(pos, " ")
	if *file != "" {
		if text, err = readText(*file); err != nil {
			return err
		}
	}
	ids := tk.Encode(text, !*noSpecial, !*noSpecial)
	if *asJSON {
		if ids == nil {
			ids = []int32{}
		}
		return json.NewEncoder(stdout).Encode(ids)
	}
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.Itoa(int(id)))
	}
	b.WriteByte('\n')
	_, err = io.WriteString(stdout, b.String())
	return err
}

func readText(path string) (string, error) {
	if path == "-" {
		b, err := io.ReadAll(os.Stdin)
		return string(b), err
	}
	b, err := os.ReadFile(path)
	return string(b), err
}

// parseTokenIDs reads ids separated by commas and/or spaces, each within a
// vocabulary of n tokens.
func parseTokenIDs(s string, n int) ([]int32, error) {
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })
	ids := make([]int32, 0, len(fields))
	for _, f := range fields {
		x, err := strconv.ParseInt(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%q is not a token id", f)
		}
		if x < 0 || x >= int64(n) {
			return nil, fmt.Errorf("token id %d is outside the vocabulary of %d tokens", x, n)
		}
		ids = append(ids, int32(x))
	}
	return ids, nil
}
