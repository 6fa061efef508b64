package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"golang.org/x/term"

	"github.com/weftlm/weft"
)

func init() {
	register(command{name: "chat", summary: "chat with a model through its chat template (/clear, /exit)", run: runChat})
}

const chatHelp = "Type a message and press Enter. /clear starts over, /exit (or Ctrl-D) quits, Ctrl-C stops a reply."

// chatIO is where the conversation happens: a raw-mode terminal with line
// editing and history, or plain lines when stdin is not a terminal.
type chatIO interface {
	ReadLine() (string, error)
	io.Writer
	// generating switches the terminal to cooked mode while a reply
	// streams, so Ctrl-C arrives as a signal, and back afterwards.
	generating(on bool)
}

type rawTerminal struct {
	*term.Terminal
	fd    int
	state *term.State
}

func (t *rawTerminal) generating(on bool) {
	if on {
		term.Restore(t.fd, t.state)
	} else if s, err := term.MakeRaw(t.fd); err == nil {
		t.state = s
	}
}

type plainLines struct {
	in  *bufio.Scanner
	out io.Writer
}

func (p *plainLines) ReadLine() (string, error) {
	fmt.Fprint(p.out, "> ")
	if !p.in.Scan() {
		if err := p.in.Err(); err != nil {
			return "", err
		}
		return "", io.EOF
	}
	return p.in.Text(), nil
}
func (p *plainLines) Write(b []byte) (int, error) { return p.out.Write(b) }
func (p *plainLines) generating(bool)             {}

func runChat(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("chat", stderr)
	g := addGenFlags(fs, 0)
	system := fs.String("system", "", "system prompt")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	m, err := g.load(ctx, stderr)
	if err != nil {
		return err
	}
	defer m.Close()
	if !m.Info().ChatTemplate {
		return fmt.Errorf("%s has no chat template; use weft run with a prompt you format yourself", *g.model)
	}

	var io_ chatIO
	if f, ok := stdout.(*os.File); ok && term.IsTerminal(int(os.Stdin.Fd())) && term.IsTerminal(int(f.Fd())) {
		fd := int(os.Stdin.Fd())
		state, err := term.MakeRaw(fd)
		if err != nil {
			return err
		}
		rt := &rawTerminal{Terminal: term.NewTerminal(struct {
			io.Reader
			io.Writer
		}{os.Stdin, f}, "> "), fd: fd, state: state}
		defer func() { term.Restore(fd, rt.state) }()
		io_ = rt
	} else {
		io_ = &plainLines{in: bufio.NewScanner(os.Stdin), out: stdout}
	}
	fmt.Fprintln(io_, chatHelp)

	// Ctrl-C stops the reply being generated, not the program.
	signal.Reset(os.Interrupt)
	intr := make(chan os.Signal, 1)
	signal.Notify(intr, os.Interrupt)
	defer signal.Stop(intr)

	reset := func() []weft.Message {
		if *system != "" {
			return []weft.Message{{Role: "system", Content: *system}}
		}
		return nil
	}
	msgs := reset()
	for {
		line, err := io_.ReadLine()
		if err == io.EOF {
			fmt.Fprintln(io_)
			return nil
		}
		if err != nil {
			return err
		}
		switch strings.TrimSpace(line) {
		case "":
			continue
		case "/exit", "/bye", "/quit":
			return nil
		case "/clear":
			msgs = reset()
			fmt.Fprintln(io_, "(conversation cleared)")
			continue
		case "/help", "/?":
			fmt.Fprintln(io_, chatHelp)
			continue
		}
		msgs = append(msgs, weft.Message{Role: "user", Content: line})
		reply, err := chatTurn(ctx, m, msgs, g, io_, intr)
		if err != nil {
			fmt.Fprintf(io_, "\n[error: %v]\n", err)
			msgs = msgs[:len(msgs)-1]
			continue
		}
		msgs = append(msgs, weft.Message{Role: "assistant", Content: reply})
	}
}

// chatTurn streams one reply; an interrupt stops it and keeps what was
// said so far.
func chatTurn(ctx context.Context, m *weft.Model, msgs []weft.Message, g *genFlags, out chatIO, intr chan os.Signal) (string, error) {
	genCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	out.generating(true)
	defer out.generating(false)
	go func() {
		select {
		case <-intr:
			cancel()
		case <-genCtx.Done():
		}
	}()
	var reply strings.Builder
	for tok, err := range m.Chat(genCtx, msgs, g.options()...) {
		if err != nil {
			if genCtx.Err() != nil && ctx.Err() == nil {
				fmt.Fprintln(out, " [stopped]")
				return reply.String(), nil
			}
			return "", err
		}
		reply.WriteString(tok.Text)
		fmt.Fprint(out, tok.Text)
	}
	fmt.Fprintln(out)
	if *g.verbose {
		printMetrics(out, m)
	}
	return reply.String(), nil
}
