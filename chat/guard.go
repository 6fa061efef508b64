package chat

import (
	"errors"
	"fmt"
	"time"

	cs "github.com/nikolalohinski/gonja/v2/builtins/control_structures"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// A template is code from a model file, so rendering runs under a budget:
// every loop iteration and macro call is a step, every string or list an
// operator, filter or output builds is charged to an allocation budget, and
// macro calls nest only so deep. Without these a short template could loop
// for hours, recurse until the Go stack overflows (fatal, not a panic), or
// double a string until the process is killed.
const (
	maxSteps      = 1 << 16  // loop iterations plus macro calls per render
	maxMacroDepth = 64       // nested macro calls
	maxRange      = 1 << 16  // elements all range() calls may produce
	maxSizeArg    = 1 << 16  // largest width/count argument a filter or method accepts
	maxValueBytes = 64 << 20 // largest single string or list a render may build
	baseAllocs    = 256 << 20
)

// Names of the hidden helpers the rewritten tree calls. Angle brackets keep
// a template from naming, and so from replacing, any of them.
const (
	stateKey = "<state>"
	tickName = "<loop step>"
	outName  = "<output>"
	itemName = "<item>"
	iterName = "<iterable>"
	opPrefix = "<operator "
)

// ErrBudget is wrapped by the *Error of a render stopped by one of the
// limits above.
var ErrBudget = errors.New("template exceeded its render budget")

// errBudget is ErrBudget's name inside the package.
var errBudget = ErrBudget

// renderState is the per-render bookkeeping the guards share.
type renderState struct {
	steps      int
	depth      int
	rangeLeft  int
	allocsLeft int
	raised     *Exception
	now        time.Time
}

func (s *renderState) step() error {
	s.steps++
	if s.steps > maxSteps {
		return fmt.Errorf("%w: more than %d loop iterations and macro calls", errBudget, maxSteps)
	}
	return nil
}

// charge accounts n bytes of freshly built text or list.
func (s *renderState) charge(n int) error {
	if n > maxValueBytes {
		return fmt.Errorf("%w: a value of %d bytes exceeds %d", errBudget, n, maxValueBytes)
	}
	s.allocsLeft -= n
	if s.allocsLeft < 0 {
		return fmt.Errorf("%w: rendering built too much text", errBudget)
	}
	return nil
}

func stateOf(ctx *exec.Context) *renderState {
	v, _ := ctx.Get(stateKey)
	s, _ := v.(*renderState)
	if s == nil {
		// Only reachable if the tree runs outside Render; fail closed.
		return &renderState{steps: maxSteps, depth: maxMacroDepth}
	}
	return s
}

// sizeOf estimates the bytes a value holds at its top level.
func sizeOf(v *exec.Value) int {
	switch {
	case v.IsString():
		return len(v.String())
	case v.IsList():
		return v.Len() * 16
	}
	return 0
}

// guardTree rewrites a parsed template in place so that it runs under the
// budget: arithmetic goes through Python-semantics helpers that check sizes,
// each output is charged, each loop body starts with a step. It rejects
// constructs it cannot bound (recursive loops).
func guardTree(root *nodes.Template) error {
	var err error
	root.Nodes, err = guardNodes(root.Nodes)
	return err
}

func guardNodes(list []nodes.Node) ([]nodes.Node, error) {
	for i, n := range list {
		g, err := guardNode(n)
		if err != nil {
			return nil, err
		}
		list[i] = g
	}
	return list, nil
}

func guardWrapper(w *nodes.Wrapper) error {
	if w == nil {
		return nil
	}
	var err error
	w.Nodes, err = guardNodes(w.Nodes)
	return err
}

func guardNode(n nodes.Node) (nodes.Node, error) {
	switch t := n.(type) {
	case *nodes.Data, *nodes.Comment:
		return n, nil
	case *nodes.Output:
		for _, e := range []*nodes.Expression{&t.Expression, &t.Condition, &t.Alternative} {
			if err := guardExprInPlace(e); err != nil {
				return nil, err
			}
		}
		if t.Expression != nil {
			t.Expression = hiddenCall(outName, t.Start, t.Expression)
		}
		if t.Alternative != nil {
			t.Alternative = hiddenCall(outName, t.Start, t.Alternative)
		}
		return t, nil
	case *nodes.ControlStructureBlock:
		return t, guardStructure(t)
	case *nodes.Wrapper:
		return t, guardWrapper(t)
	}
	return nil, fmt.Errorf("unsupported template node %T", n)
}

// guardStructure walks the control structures this package registers; any
// other kind cannot occur because only these are registered.
func guardStructure(b *nodes.ControlStructureBlock) error {
	switch c := b.ControlStructure.(type) {
	case *cs.IfControlStructure:
		for i := range c.Conditions {
			if err := guardExprInPlace(&c.Conditions[i]); err != nil {
				return err
			}
		}
		for _, w := range c.Wrappers {
			if err := guardWrapper(w); err != nil {
				return err
			}
		}
	case *cs.ForControlStructure:
		if c.Recursive {
			return fmt.Errorf("line %d: recursive loops are not supported", c.Position().Line)
		}
		if err := guardExprInPlace(&c.ObjectEvaluator); err != nil {
			return err
		}
		c.ObjectEvaluator = hiddenCall(iterName, c.Position(), c.ObjectEvaluator)
		if err := guardExprInPlace(&c.IfCondition); err != nil {
			return err
		}
		if err := guardWrapper(c.BodyWrapper); err != nil {
			return err
		}
		if err := guardWrapper(c.EmptyWrapper); err != nil {
			return err
		}
		if c.BodyWrapper != nil {
			tick := &nodes.Output{Start: c.Position(), End: c.Position(), Expression: hiddenCall(tickName, c.Position())}
			c.BodyWrapper.Nodes = append([]nodes.Node{tick}, c.BodyWrapper.Nodes...)
		}
	case *setStructure:
		for _, e := range []*nodes.Expression{&c.Target, &c.Expression, &c.Condition, &c.Alternative} {
			if err := guardExprInPlace(e); err != nil {
				return err
			}
		}
		return guardWrapper(c.Body)
	case *macroStructure:
		for _, p := range c.Kwargs {
			if err := guardExprInPlace(&p.Value); err != nil {
				return err
			}
		}
		return guardWrapper(c.Wrapper)
	case *cs.CallControlStructure:
		var e nodes.Expression = c.Call
		if err := guardExprInPlace(&e); err != nil {
			return err
		}
		return guardWrapper(c.Body)
	case *generationStructure:
		return guardWrapper(c.Body)
	case *cs.RawControlStructure, *cs.BreakControlStructure, *cs.ContinueControlStructure:
	default:
		return fmt.Errorf("unsupported control structure %T", c)
	}
	return nil
}

func guardExprInPlace(e *nodes.Expression) error {
	if *e == nil {
		return nil
	}
	g, err := guardExpr(*e)
	if err != nil {
		return err
	}
	*e = g
	return nil
}

func guardNodeExpr(n *nodes.Node) error {
	if *n == nil {
		return nil
	}
	e, ok := (*n).(nodes.Expression)
	if !ok {
		return fmt.Errorf("unsupported expression node %T", *n)
	}
	g, err := guardExpr(e)
	if err != nil {
		return err
	}
	*n = g
	return nil
}

func guardExprs(list []nodes.Expression) error {
	for i := range list {
		if err := guardExprInPlace(&list[i]); err != nil {
			return err
		}
	}
	return nil
}

func guardKwargs(m map[string]nodes.Expression) error {
	for k, e := range m {
		g, err := guardExpr(e)
		if err != nil {
			return err
		}
		m[k] = g
	}
	return nil
}

// guardExpr returns e with its arithmetic routed through the guarded
// helpers, recursing into every sub-expression.
func guardExpr(e nodes.Expression) (nodes.Expression, error) {
	switch t := e.(type) {
	case *nodes.String, *nodes.Integer, *nodes.Float, *nodes.Bool, *nodes.None, *nodes.Name, *nodes.Error:
		return e, nil
	case *nodes.BinaryExpression:
		if err := guardExprInPlace(&t.Left); err != nil {
			return nil, err
		}
		if err := guardExprInPlace(&t.Right); err != nil {
			return nil, err
		}
		if op, ok := binaryOps[t.Operator.Token.Val]; ok {
			return hiddenCall(opPrefix+op.name+">", t.Operator.Token, t.Left, t.Right), nil
		}
		return t, nil
	case *nodes.UnaryExpression:
		return t, guardExprInPlace(&t.Term)
	case *nodes.Negation:
		return t, guardExprInPlace(&t.Term)
	case *nodes.FilteredExpression:
		if err := guardExprInPlace(&t.Expression); err != nil {
			return nil, err
		}
		for _, f := range t.Filters {
			if err := guardExprs(f.Args); err != nil {
				return nil, err
			}
			if err := guardKwargs(f.Kwargs); err != nil {
				return nil, err
			}
		}
		return t, nil
	case *nodes.TestExpression:
		if err := guardExprInPlace(&t.Expression); err != nil {
			return nil, err
		}
		if err := guardExprs(t.Test.Args); err != nil {
			return nil, err
		}
		return t, guardKwargs(t.Test.Kwargs)
	case *nodes.Call:
		if err := guardNodeExpr(&t.Func); err != nil {
			return nil, err
		}
		if err := guardNodeExpr(&t.Parent); err != nil {
			return nil, err
		}
		if err := guardExprs(t.Args); err != nil {
			return nil, err
		}
		return t, guardKwargs(t.Kwargs)
	case *nodes.GetItem:
		if err := guardNodeExpr(&t.Node); err != nil {
			return nil, err
		}
		if err := guardNodeExpr(&t.Arg); err != nil {
			return nil, err
		}
		target, ok1 := t.Node.(nodes.Expression)
		key, ok2 := t.Arg.(nodes.Expression)
		if !ok1 || !ok2 {
			return t, nil
		}
		return hiddenCall(itemName, t.Location, target, key), nil
	case *nodes.GetSlice:
		for _, n := range []*nodes.Node{&t.Node, &t.Start, &t.End, &t.Step} {
			if err := guardNodeExpr(n); err != nil {
				return nil, err
			}
		}
		return t, nil
	case *nodes.GetAttribute:
		return t, guardNodeExpr(&t.Node)
	case *nodes.List:
		return t, guardExprs(t.Val)
	case *nodes.Tuple:
		return t, guardExprs(t.Val)
	case *nodes.Dict:
		for _, p := range t.Pairs {
			if err := guardExprInPlace(&p.Key); err != nil {
				return nil, err
			}
			if err := guardExprInPlace(&p.Value); err != nil {
				return nil, err
			}
		}
		return t, nil
	case *nodes.Pair:
		if err := guardExprInPlace(&t.Key); err != nil {
			return nil, err
		}
		return t, guardExprInPlace(&t.Value)
	}
	return nil, fmt.Errorf("unsupported expression %T", e)
}

// hiddenCall builds a call of one of the hidden helpers at the position of
// tok.
func hiddenCall(name string, tok *tokens.Token, args ...nodes.Expression) *nodes.Call {
	at := &tokens.Token{Type: tokens.Name, Val: name}
	if tok != nil {
		at.Pos, at.Line, at.Col = tok.Pos, tok.Line, tok.Col
	}
	return &nodes.Call{Location: at, Func: &nodes.Name{Name: at}, Args: args, Kwargs: map[string]nodes.Expression{}}
}

// Guard helpers as the evaluator calls them: (evaluator, arguments).
type helperFunc = func(*exec.Evaluator, *exec.VarArgs) *exec.Value

// tickHelper starts each loop iteration.
func tickHelper(e *exec.Evaluator, _ *exec.VarArgs) *exec.Value {
	if err := stateOf(e.Environment.Context).step(); err != nil {
		return exec.AsValue(err)
	}
	return exec.AsValue("")
}

// outHelper charges what an output tag prints (text printed inside a macro
// or a block set lands in a buffer no writer limit sees).
func outHelper(e *exec.Evaluator, va *exec.VarArgs) *exec.Value {
	v := va.First()
	if v.IsError() {
		return v
	}
	if err := stateOf(e.Environment.Context).charge(len(v.String())); err != nil {
		return exec.AsValue(err)
	}
	return v
}

// iterHelper hands a for loop the characters of a string (gonja would
// iterate its bytes) and anything else unchanged.
func iterHelper(_ *exec.Evaluator, va *exec.VarArgs) *exec.Value {
	v := va.First()
	if !v.IsString() {
		return v
	}
	s := v.String()
	chars := make([]any, 0, len(s))
	for _, r := range s {
		chars = append(chars, string(r))
	}
	return exec.AsValue(chars)
}

// itemHelper is x[key]: an item of a mapping (falling back to an attribute,
// as Jinja's getitem does), or an element of a list or string counted in
// characters, negative indices from the end. A missing one is undefined.
func itemHelper(_ *exec.Evaluator, va *exec.VarArgs) *exec.Value {
	if len(va.Args) != 2 {
		return exec.AsValue(errors.New("subscript needs a target and a key"))
	}
	v, key := va.Args[0], va.Args[1]
	switch {
	case v.IsError():
		return v
	case key.IsError():
		return key
	case v.IsNil():
		return exec.AsValue(nil)
	case isInt(key) && (v.IsString() || v.IsList()):
		i := intOf(key)
		if v.IsString() {
			r := []rune(v.String())
			if i < 0 {
				i += len(r)
			}
			if i < 0 || i >= len(r) {
				return exec.AsValue(nil)
			}
			return exec.AsValue(string(r[i]))
		}
		n := v.Len()
		if i < 0 {
			i += n
		}
		if i < 0 || i >= n {
			return exec.AsValue(nil)
		}
		item, _ := v.GetItem(i)
		return item
	case v.IsDict() && !key.IsString():
		pairs, _ := orderedItems(v)
		for _, p := range pairs {
			if sameKey(p.Key, key) {
				return p.Value
			}
		}
		return exec.AsValue(nil)
	case key.IsString():
		if item, ok := v.GetItem(key.String()); ok {
			return item
		}
		if item, ok := v.GetAttribute(key.String()); ok {
			return item
		}
		return exec.AsValue(nil)
	}
	return exec.AsValue(nil)
}
