package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/weftlm/weft/modelpath"
)

func init() {
	register(command{
		name:    "list",
		summary: "list the models in the Hugging Face cache and the ollama store (names for -m)",
		run:     runList,
	})
}

func runList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("list", stderr)
	asJSON := fs.Bool("json", false, "print a JSON array of {name, source, path, format, size}")
	verbose := fs.Bool("v", false, "also show the store roots and the incomplete models left out, with the reason")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: weft list [--json] [-v]\n\nEach NAME can be passed to -m. The Hugging Face cache is $HF_HUB_CACHE,\n$HF_HOME/hub or ~/.cache/huggingface/hub; the ollama store is\n$OLLAMA_MODELS or ~/.ollama/models.")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		fs.Usage()
		return fmt.Errorf("%w: list takes no arguments", errUsage)
	}
	stores := modelpath.DefaultStores()
	l, err := stores.Scan()
	if err != nil {
		return err
	}
	if *verbose {
		fmt.Fprintf(stderr, "Hugging Face cache: %s\nollama store:       %s\n", orNone(stores.HuggingFace), orNone(stores.Ollama))
		for _, s := range l.Skipped {
			fmt.Fprintf(stderr, "skipped %s %s: %s\n", s.Source, s.Name, s.Reason)
		}
	} else if len(l.Skipped) > 0 {
		fmt.Fprintf(stderr, "weft list: left out %d incomplete model(s); -v says why\n", len(l.Skipped))
	}
	if *asJSON {
		entries := l.Entries
		if entries == nil {
			entries = []modelpath.Entry{}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(entries)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSOURCE\tFORMAT\tSIZE\tPATH")
	for _, e := range l.Entries {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.Name, e.Source, e.Format, humanBytes(uint64(e.Size)), e.Path)
	}
	return tw.Flush()
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
