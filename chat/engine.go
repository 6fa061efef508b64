package chat

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	cs "github.com/nikolalohinski/gonja/v2/builtins/control_structures"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/parser"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// Limits on the template source itself: nesting drives the parser's
// recursion, so it is capped well below what the Go stack can take.
const (
	maxSourceBytes = 1 << 20
	maxNesting     = 256
)

// jinjaConfig is the environment transformers compiles chat templates in:
// trim_blocks and lstrip_blocks on, the trailing newline dropped, no
// autoescaping, undefined values rendering empty. Lexing runs with
// LeftStripBlocks off: lstripBlocks below applies Jinja's rule instead.
func jinjaConfig() *config.Config {
	c := config.New()
	c.TrimBlocks = true
	c.LeftStripBlocks = false
	c.KeepTrailingNewline = false
	return c
}

// structures are the tags a chat template may use: Jinja's statements less
// those that load other templates (there are none to load), plus
// loopcontrols and transformers' {% generation %}. set, macro and
// generation are this package's own so that their parts can be guarded.
var structures = func() *exec.ControlStructureSet {
	m := map[string]parser.ControlStructureParser{
		"set":        setParser,
		"macro":      macroParser,
		"generation": generationParser,
	}
	for _, name := range []string{"if", "for", "call", "raw", "break", "continue"} {
		p, ok := cs.All.Get(name)
		if !ok {
			panic("gonja lacks the " + name + " statement")
		}
		m[name] = p
	}
	return exec.NewControlStructureSet(m)
}()

// lexTemplate tokenizes src and applies lstrip_blocks the way Jinja does:
// the spaces and tabs before a {% or {# tag are dropped only when nothing
// but them stands between the tag and the start of its line. (gonja also
// strips them after a }} or %} on the same line, which Jinja keeps.)
func lexTemplate(src string, cfg *config.Config) ([]*tokens.Token, error) {
	lx := tokens.NewLexer(src, cfg)
	var crash any
	go func() {
		// Run closes the channel when it finishes; a panic skips that, so
		// close it here, or the loop below would wait forever.
		defer func() {
			if r := recover(); r != nil {
				crash = r
				close(lx.Tokens)
			}
		}()
		lx.Run()
	}()
	// gonja's lexer does not always stop at an error: after some (such as
	// "{%!/!5.") it emits error and empty tokens without end. A template
	// yields at most a few tokens a byte, so the first error token, or
	// more tokens than that, ends the scan. The lexer can only be stopped
	// by taking its tokens: a bounded drain lets one that does end finish,
	// and one that does not waits on its channel for good.
	limit := 4*len(src) + 64
	var toks []*tokens.Token
	for t := range lx.Tokens {
		toks = append(toks, t)
		if t.Type != tokens.Error && len(toks) <= limit {
			continue
		}
		go func() {
			for range limit {
				if _, ok := <-lx.Tokens; !ok {
					return
				}
			}
		}()
		if t.Type == tokens.Error {
			line, col := errorPosition(lx.Input, t)
			return nil, &Error{Line: line, Column: col, Msg: t.Val}
		}
		return nil, &Error{Line: t.Line, Column: t.Col, Msg: fmt.Sprintf("the template lexer went past %d tokens for %d bytes", limit, len(src))}
	}
	if crash != nil {
		return nil, &Error{Msg: fmt.Sprintf("template lexer failed: %v", crash)}
	}
	input := lx.Input
	depth, blocks := 0, 0
	for i, t := range toks {
		switch t.Type {
		case tokens.LeftParenthesis, tokens.LeftBracket, tokens.LeftBrace:
			depth++
			if depth > maxNesting {
				return nil, &Error{Line: t.Line, Column: t.Col, Msg: fmt.Sprintf("brackets nested deeper than %d", maxNesting)}
			}
		case tokens.RightParenthesis, tokens.RightBracket, tokens.RightBrace:
			depth--
		case tokens.BlockBegin:
			blocks += blockDelta(toks, i)
			if blocks > maxNesting {
				return nil, &Error{Line: t.Line, Column: t.Col, Msg: fmt.Sprintf("blocks nested deeper than %d", maxNesting)}
			}
		case tokens.Data:
			if i+1 < len(toks) && lstripsBefore(toks[i+1]) {
				t.Val = lstripData(input, t)
			}
		}
	}
	return toks, nil
}

// errorPosition is where an error token points: gonja gives most error
// tokens only their offset in the input, which this turns into a line
// and a column (both from 1).
func errorPosition(input string, t *tokens.Token) (line, col int) {
	if t.Line > 0 || t.Pos < 0 || t.Pos > len(input) {
		return t.Line, t.Col
	}
	before := input[:t.Pos]
	return strings.Count(before, "\n") + 1, t.Pos - strings.LastIndexByte(before, '\n')
}

// blockDelta is +1 for a tag opening a block, -1 for one closing it.
func blockDelta(toks []*tokens.Token, i int) int {
	for _, t := range toks[i+1:] {
		if t.Type == tokens.Whitespace {
			continue
		}
		if t.Type != tokens.Name {
			return 0
		}
		switch {
		case strings.HasPrefix(t.Val, "end"):
			return -1
		case t.Val == "if" || t.Val == "for" || t.Val == "macro" || t.Val == "call" || t.Val == "generation" || t.Val == "raw":
			return 1
		}
		return 0
	}
	return 0
}

// lstripsBefore reports a {% or {# tag without a + or - marker.
func lstripsBefore(t *tokens.Token) bool {
	if t.Type != tokens.BlockBegin && t.Type != tokens.CommentBegin {
		return false
	}
	return !strings.HasSuffix(t.Val, "+") && !strings.HasSuffix(t.Val, "-")
}

func lstripData(input string, t *tokens.Token) string {
	text := t.Val
	lineStart := strings.LastIndexByte(text, '\n') + 1
	// Jinja's "line starting" state: the data begins the template or follows
	// a tag whose match consumed a newline (trim_blocks).
	starting := t.Pos == 0 || t.Pos <= len(input) && input[t.Pos-1] == '\n'
	if lineStart == len(text) || lineStart == 0 && !starting {
		return text
	}
	if strings.TrimLeftFunc(text[lineStart:], pyIsSpace) != "" {
		return text
	}
	return text[:lineStart]
}

// stubLoader serves an empty template: gonja's renderer wants an
// *exec.Template, but this package parses the real one itself.
type stubLoader struct{}

func (stubLoader) Read(string) (io.Reader, error)         { return strings.NewReader(""), nil }
func (stubLoader) Resolve(p string) (string, error)       { return p, nil }
func (stubLoader) Inherit(string) (loaders.Loader, error) { return stubLoader{}, nil }

// parseSource lexes, parses and guards src.
func parseSource(name, src string) (*nodes.Template, error) {
	if len(src) > maxSourceBytes {
		return nil, &Error{Msg: fmt.Sprintf("source is %d bytes, more than %d", len(src), maxSourceBytes)}
	}
	cfg := jinjaConfig()
	toks, err := lexTemplate(src, cfg)
	if err != nil {
		return nil, err
	}
	p := parser.NewParser(name, tokens.NewStream(toks), cfg, stubLoader{}, structures)
	root, err := p.Parse()
	if err != nil {
		return nil, err
	}
	if err := guardTree(root); err != nil {
		return nil, err
	}
	return root, nil
}

// setStructure is {% set %}: a name or a namespace attribute, assigned an
// expression (optionally `x if c else y`) or, in block form, the rendered
// body. gonja's own keeps its parts unexported, out of the guard's reach.
type setStructure struct {
	Location    *tokens.Token
	Target      nodes.Expression
	Expression  nodes.Expression
	Condition   nodes.Expression
	Alternative nodes.Expression
	Body        *nodes.Wrapper
}

func (s *setStructure) Position() *tokens.Token { return s.Location }
func (s *setStructure) String() string {
	return fmt.Sprintf("set(Line=%d Col=%d)", s.Location.Line, s.Location.Col)
}

func setParser(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
	s := &setStructure{Location: p.Current()}
	target, err := args.ParseVariableOrLiteral()
	if err != nil {
		return nil, err
	}
	switch target.(type) {
	case *nodes.Name, *nodes.GetAttribute:
		s.Target = target
	default:
		return nil, args.Error("set can only assign to a name or a namespace attribute", args.Current())
	}
	if args.Match(tokens.Assign) == nil {
		if !args.End() {
			return nil, args.Error("expected '=' or the end of the tag", args.Current())
		}
		body, end, err := p.WrapUntil("endset")
		if err != nil {
			return nil, err
		}
		if !end.End() {
			return nil, end.Error("endset takes no arguments", end.Current())
		}
		s.Body = body
		return s, nil
	}
	if s.Expression, err = args.ParseExpression(); err != nil {
		return nil, err
	}
	if s.Condition, s.Alternative, err = args.ParseCondition(); err != nil {
		return nil, err
	}
	if !args.End() {
		return nil, args.Error("unexpected tokens at the end of set", args.Current())
	}
	return s, nil
}

func (s *setStructure) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	var value *exec.Value
	switch {
	case s.Body != nil:
		var buf bytes.Buffer
		sub := r.Inherit()
		sub.Output = &buf
		if err := sub.ExecuteWrapper(s.Body); err != nil {
			return err
		}
		value = exec.AsSafeValue(buf.String())
	case s.Condition != nil:
		cond := r.Eval(s.Condition)
		if cond.IsError() {
			return cond
		}
		if cond.IsTrue() {
			value = r.Eval(s.Expression)
		} else {
			value = r.Eval(s.Alternative)
		}
	default:
		value = r.Eval(s.Expression)
	}
	if value.IsError() {
		return value
	}
	switch t := s.Target.(type) {
	case *nodes.Name:
		r.Environment.Context.Set(t.Name.Val, value.Interface())
		return nil
	case *nodes.GetAttribute:
		ns := r.Eval(t.Node)
		if ns.IsError() {
			return ns
		}
		m, ok := ns.Interface().(map[string]any)
		if !ok {
			return fmt.Errorf("line %d: cannot assign attribute on non-namespace object", s.Location.Line)
		}
		m[t.Attribute] = value
		return nil
	}
	return fmt.Errorf("line %d: invalid set target", s.Location.Line)
}

// macroStructure is {% macro %} with every call counted as a step and
// nesting bounded, so recursion ends in an error rather than a stack
// overflow.
type macroStructure struct {
	*nodes.Macro
}

func macroParser(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
	inner, _ := cs.All.Get("macro")
	parsed, err := inner(p, args)
	if err != nil {
		return nil, err
	}
	m, ok := parsed.(*cs.MacroControlStructure)
	if !ok {
		return nil, fmt.Errorf("macro parsed as %T", parsed)
	}
	return &macroStructure{m.Macro}, nil
}

func (m *macroStructure) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	fn, err := exec.MacroNodeToFunc(m.Macro, r)
	if err != nil {
		return err
	}
	var guarded exec.Macro = func(va *exec.VarArgs) *exec.Value {
		s := stateOf(r.Environment.Context)
		if err := s.step(); err != nil {
			return exec.AsValue(err)
		}
		if s.depth >= maxMacroDepth {
			return exec.AsValue(fmt.Errorf("%w: macro calls nested deeper than %d", errBudget, maxMacroDepth))
		}
		s.depth++
		defer func() { s.depth-- }()
		return fn(va)
	}
	r.Environment.Context.Set(m.Name, guarded)
	return nil
}

// generationStructure is transformers' {% generation %} block, which marks
// assistant text for training masks and renders its body unchanged.
type generationStructure struct {
	Location *tokens.Token
	Body     *nodes.Wrapper
}

func (g *generationStructure) Position() *tokens.Token { return g.Location }
func (g *generationStructure) String() string {
	return fmt.Sprintf("generation(Line=%d Col=%d)", g.Location.Line, g.Location.Col)
}

func generationParser(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
	g := &generationStructure{Location: p.Current()}
	if !args.End() {
		return nil, args.Error("generation takes no arguments", args.Current())
	}
	body, end, err := p.WrapUntil("endgeneration")
	if err != nil {
		return nil, err
	}
	if !end.End() {
		return nil, end.Error("endgeneration takes no arguments", end.Current())
	}
	g.Body = body
	return g, nil
}

func (g *generationStructure) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	return r.ExecuteWrapper(g.Body)
}
