package chat

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/exec"
)

// environment is the shared, read-only part of every render: gonja's
// builtins where they match Python, this package's versions where they do
// not (argument order, key order, whitespace, Python's string methods), and
// the guard helpers. Per-render data lives in a child context.
var environment = &exec.Environment{
	Context:           globals(),
	Filters:           filters(),
	Tests:             builtins.Tests,
	ControlStructures: structures,
	Methods: exec.Methods{
		Bool:  builtins.Methods.Bool,
		Int:   builtins.Methods.Int,
		Float: builtins.Methods.Float,
		Str:   strMethods(),
		Dict:  exec.NewMethodSet(dictMethods),
		List:  exec.NewMethodSet(map[string]exec.Method[[]any]{}),
	},
}

func globals() *exec.Context {
	g := map[string]any{
		"range":           rangeHelper,
		"raise_exception": raiseHelper,
		"strftime_now":    strftimeHelper,
		tickName:          tickHelper,
		outName:           outHelper,
		itemName:          itemHelper,
		iterName:          iterHelper,
	}
	for _, name := range []string{"namespace", "dict", "cycler", "joiner"} {
		fn, ok := builtins.GlobalFunctions.Get(name)
		if !ok {
			panic("gonja lacks the global " + name)
		}
		g[name] = fn
	}
	for _, op := range binaryOps {
		g[opPrefix+op.name+">"] = opHelper(op)
	}
	return exec.NewContext(g)
}

// Exception is what a template's raise_exception(message) produces; Render
// returns it inside an *Error, so callers can tell a conversation the
// template rejects (errors.As) from a broken template.
type Exception struct {
	Message string
}

func (e *Exception) Error() string { return e.Message }

func raiseHelper(e *exec.Evaluator, va *exec.VarArgs) *exec.Value {
	msg := pyStr(va.First())
	ex := &Exception{Message: msg}
	s := stateOf(e.Environment.Context)
	if s.raised == nil {
		s.raised = ex
	}
	return exec.AsValue(ex)
}

func strftimeHelper(e *exec.Evaluator, va *exec.VarArgs) *exec.Value {
	if len(va.Args) != 1 || !va.Args[0].IsString() {
		return exec.AsValue(errors.New("strftime_now takes one format string"))
	}
	return exec.AsValue(strftime(stateOf(e.Environment.Context).now, va.Args[0].String()))
}

// sizedFilters take a width or count; larger values than maxSizeArg are
// refused before the filter allocates.
var sizedFilters = map[string]bool{"center": true, "indent": true, "wordwrap": true, "truncate": true, "batch": true, "slice": true, "urlize": true}

func filters() *exec.FilterSet {
	keep := []string{"abs", "attr", "batch", "capitalize", "center", "default", "d", "dictsort", "e", "escape",
		"first", "float", "forceescape", "groupby", "indent", "int", "last", "length", "count", "list", "lower",
		"map", "max", "min", "pprint", "random", "rejectattr", "reject", "round", "safe", "selectattr", "select",
		"slice", "sort", "string", "striptags", "sum", "title", "truncate", "unique", "upper", "urlencode",
		"urlize", "wordcount", "wordwrap", "xmlattr"}
	m := map[string]exec.FilterFunction{
		"tojson":  filterToJSON,
		"items":   filterItems,
		"reverse": filterReverse,
		"trim":    filterTrim,
		"replace": filterReplace,
		"join":    filterJoin,
	}
	for _, name := range keep {
		f, ok := builtins.Filters.Get(name)
		if !ok {
			panic("gonja lacks the filter " + name)
		}
		m[name] = f
	}
	for name, f := range m {
		m[name] = guardFilter(name, f)
	}
	return exec.NewFilterSet(m)
}

// guardFilter bounds size arguments and charges the result.
func guardFilter(name string, f exec.FilterFunction) exec.FilterFunction {
	sized := sizedFilters[name]
	return func(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
		if in.IsError() {
			return in
		}
		if sized {
			if err := checkSizeArgs(va); err != nil {
				return exec.AsValue(fmt.Errorf("filter %s: %w", name, err))
			}
		}
		out := f(e, in, va)
		if out.IsError() {
			return out
		}
		if err := stateOf(e.Environment.Context).charge(sizeOf(out)); err != nil {
			return exec.AsValue(err)
		}
		return out
	}
}

func checkSizeArgs(va *exec.VarArgs) error {
	for _, v := range va.Args {
		if v.IsInteger() && absInt(v.Integer()) > maxSizeArg {
			return fmt.Errorf("%w: size argument %d", errBudget, v.Integer())
		}
	}
	for _, v := range va.KwArgs {
		if v.IsInteger() && absInt(v.Integer()) > maxSizeArg {
			return fmt.Errorf("%w: size argument %d", errBudget, v.Integer())
		}
	}
	return nil
}

// bindArgs matches positional and keyword arguments to Python parameter
// names, leaving missing ones nil.
func bindArgs(fn string, va *exec.VarArgs, names ...string) ([]*exec.Value, error) {
	if len(va.Args) > len(names) {
		return nil, fmt.Errorf("%s takes at most %d arguments", fn, len(names))
	}
	out := make([]*exec.Value, len(names))
	copy(out, va.Args)
	for k, v := range va.KwArgs {
		i := slices.Index(names, k)
		if i < 0 {
			return nil, fmt.Errorf("%s got an unexpected keyword argument %q", fn, k)
		}
		if out[i] != nil {
			return nil, fmt.Errorf("%s got multiple values for argument %q", fn, k)
		}
		out[i] = v
	}
	return out, nil
}

func given(v *exec.Value) bool { return v != nil && !v.IsNil() }

// filterToJSON is transformers' tojson: json.dumps(x, ensure_ascii=False,
// indent=None, separators=None, sort_keys=False), in that argument order.
func filterToJSON(_ *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	args, err := bindArgs("tojson", va, "ensure_ascii", "indent", "separators", "sort_keys")
	if err != nil {
		return exec.AsValue(err)
	}
	opt := jsonOptions{itemSep: ", ", keySep: ": "}
	if given(args[0]) {
		opt.ensureASCI = args[0].IsTrue()
	}
	if given(args[1]) {
		var ind string
		switch {
		case args[1].IsString():
			ind = args[1].String()
		case isInt(args[1]):
			n := intOf(args[1])
			if n > maxSizeArg {
				return exec.AsValue(fmt.Errorf("%w: tojson indent %d", errBudget, n))
			}
			ind = strings.Repeat(" ", max(n, 0))
		default:
			return exec.AsValue(fmt.Errorf("tojson: indent must be an int or a string"))
		}
		opt.indent = &ind
		opt.itemSep = ","
	}
	if given(args[2]) {
		seps := listOf(args[2])
		if !args[2].IsList() || len(seps) != 2 {
			return exec.AsValue(errors.New("tojson: separators must be an (item, key) pair"))
		}
		opt.itemSep, opt.keySep = exec.AsValue(seps[0]).String(), exec.AsValue(seps[1]).String()
	}
	if given(args[3]) {
		opt.sortKeys = args[3].IsTrue()
	}
	s, err := pyJSON(in, opt)
	if err != nil {
		return exec.AsValue(err)
	}
	return exec.AsValue(s)
}

// orderedItems lists a mapping's pairs in insertion order (sorted for a Go
// map, which has none).
func orderedItems(v *exec.Value) ([]*exec.Pair, bool) {
	switch d := v.Interface().(type) {
	case *exec.Dict:
		return d.Pairs, true
	case map[string]any:
		pairs := make([]*exec.Pair, 0, len(d))
		for _, k := range sortedKeys(d) {
			pairs = append(pairs, &exec.Pair{Key: exec.AsValue(k), Value: exec.AsValue(d[k])})
		}
		return pairs, true
	}
	return nil, false
}

func itemsOf(v *exec.Value) ([]any, error) {
	pairs, ok := orderedItems(v)
	if !ok {
		return nil, fmt.Errorf("items: %s is not a mapping", typeName(v))
	}
	out := make([]any, len(pairs))
	for i, p := range pairs {
		out[i] = []any{p.Key.Interface(), p.Value.Interface()}
	}
	return out, nil
}

func filterItems(_ *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if len(va.Args)+len(va.KwArgs) > 0 {
		return exec.AsValue(errors.New("items takes no arguments"))
	}
	if in.IsNil() {
		return exec.AsValue([]any{})
	}
	items, err := itemsOf(in)
	if err != nil {
		return exec.AsValue(err)
	}
	return exec.AsValue(items)
}

func filterReverse(_ *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	switch {
	case in.IsString():
		r := []rune(in.String())
		slices.Reverse(r)
		return exec.AsValue(string(r))
	case in.IsList():
		l := listOf(in)
		slices.Reverse(l)
		return exec.AsValue(l)
	}
	if pairs, ok := orderedItems(in); ok {
		keys := make([]any, len(pairs))
		for i, p := range pairs {
			keys[len(pairs)-1-i] = p.Key.Interface()
		}
		return exec.AsValue(keys)
	}
	return exec.AsValue(fmt.Errorf("reverse: %s is not reversible", typeName(in)))
}

func filterTrim(_ *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	args, err := bindArgs("trim", va, "chars")
	if err != nil {
		return exec.AsValue(err)
	}
	return exec.AsValue(pyStrip(pyStr(in), optString(args[0]), true, true))
}

func optString(v *exec.Value) *string {
	if !given(v) {
		return nil
	}
	s := v.String()
	return &s
}

func filterReplace(_ *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	args, err := bindArgs("replace", va, "old", "new", "count")
	if err != nil {
		return exec.AsValue(err)
	}
	if !given(args[0]) || !given(args[1]) {
		return exec.AsValue(errors.New("replace needs old and new"))
	}
	count := -1
	if given(args[2]) {
		count = intOf(args[2])
	}
	out, err := pyReplace(pyStr(in), args[0].String(), args[1].String(), count)
	if err != nil {
		return exec.AsValue(err)
	}
	return exec.AsValue(out)
}

// pyReplace is str.replace, refusing results past maxValueBytes before
// building them.
func pyReplace(s, old, repl string, count int) (string, error) {
	n := strings.Count(s, old)
	if count >= 0 && count < n {
		n = count
	}
	if n > 0 && len(repl) > len(old) && (len(repl)-len(old)) > (maxValueBytes-len(s))/n {
		return "", fmt.Errorf("%w: replace result too long", errBudget)
	}
	return strings.Replace(s, old, repl, n), nil
}

func filterJoin(_ *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	args, err := bindArgs("join", va, "d", "attribute")
	if err != nil {
		return exec.AsValue(err)
	}
	sep := ""
	if given(args[0]) {
		sep = args[0].String()
	}
	var items []string
	in.Iterate(func(_, _ int, item, _ *exec.Value) bool {
		if given(args[1]) {
			item = lookup(item, args[1].String())
		}
		items = append(items, pyStr(item))
		return true
	}, func() {})
	out, err := joinChecked(items, sep)
	if err != nil {
		return exec.AsValue(err)
	}
	return exec.AsValue(out)
}

func joinChecked(items []string, sep string) (string, error) {
	total := len(sep) * max(len(items)-1, 0)
	for _, s := range items {
		total += len(s)
		if total > maxValueBytes {
			return "", fmt.Errorf("%w: join result too long", errBudget)
		}
	}
	if total > maxValueBytes {
		return "", fmt.Errorf("%w: join result too long", errBudget)
	}
	return strings.Join(items, sep), nil
}

// strMethods are Python's str methods: gonja's where they agree with
// Python, this package's for strip, split, replace and join, and the
// size-taking ones bounded. format and format_map are left out: their
// widths hide inside the format string, beyond any bound.
func strMethods() *exec.MethodSet[string] {
	m := map[string]exec.Method[string]{
		"strip":   stripMethod(true, true),
		"lstrip":  stripMethod(true, false),
		"rstrip":  stripMethod(false, true),
		"split":   splitMethod,
		"replace": replaceMethod,
		"join":    joinMethod,
		"title":   func(s string, _ *exec.Value, va *exec.VarArgs) (any, error) { return pyTitle(s), noArgs("title", va) },
		"upper": func(s string, _ *exec.Value, va *exec.VarArgs) (any, error) {
			return strings.ToUpper(s), noArgs("upper", va)
		},
		"lower": func(s string, _ *exec.Value, va *exec.VarArgs) (any, error) {
			return strings.ToLower(s), noArgs("lower", va)
		},
	}
	keep := []string{"capitalize", "casefold", "count", "endswith", "find", "isalnum", "isalpha", "isascii",
		"isdecimal", "isdigit", "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper",
		"partition", "removeprefix", "removesuffix", "rfind", "rpartition", "rsplit", "splitlines",
		"startswith", "swapcase"}
	sized := []string{"center", "expandtabs", "ljust", "rjust", "zfill"}
	for _, name := range append(keep, sized...) {
		f, ok := builtins.Methods.Str.Get(name)
		if !ok {
			panic("gonja lacks the str method " + name)
		}
		if slices.Contains(sized, name) {
			inner := f
			f = func(s string, v *exec.Value, va *exec.VarArgs) (any, error) {
				if err := checkSizeArgs(va); err != nil {
					return nil, err
				}
				return inner(s, v, va)
			}
		}
		m[name] = f
	}
	return exec.NewMethodSet(m)
}

func noArgs(name string, va *exec.VarArgs) error {
	if len(va.Args)+len(va.KwArgs) > 0 {
		return fmt.Errorf("%s() takes no arguments", name)
	}
	return nil
}

func stripMethod(left, right bool) exec.Method[string] {
	return func(s string, _ *exec.Value, va *exec.VarArgs) (any, error) {
		args, err := bindArgs("strip", va, "chars")
		if err != nil {
			return nil, err
		}
		return pyStrip(s, optString(args[0]), left, right), nil
	}
}

func splitMethod(s string, _ *exec.Value, va *exec.VarArgs) (any, error) {
	args, err := bindArgs("split", va, "sep", "maxsplit")
	if err != nil {
		return nil, err
	}
	maxsplit := -1
	if given(args[1]) {
		maxsplit = intOf(args[1])
	}
	parts, err := pySplit(s, optString(args[0]), maxsplit)
	if err != nil {
		return nil, err
	}
	out := make([]any, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out, nil
}

func replaceMethod(s string, _ *exec.Value, va *exec.VarArgs) (any, error) {
	args, err := bindArgs("replace", va, "old", "new", "count")
	if err != nil {
		return nil, err
	}
	if !given(args[0]) || !given(args[1]) || !args[0].IsString() || !args[1].IsString() {
		return nil, errors.New("replace() needs two strings")
	}
	count := -1
	if given(args[2]) {
		count = intOf(args[2])
	}
	return pyReplace(s, args[0].String(), args[1].String(), count)
}

func joinMethod(sep string, _ *exec.Value, va *exec.VarArgs) (any, error) {
	if len(va.Args) != 1 || len(va.KwArgs) > 0 {
		return nil, errors.New("join() takes one iterable")
	}
	var items []string
	var bad error
	va.Args[0].Iterate(func(_, _ int, item, _ *exec.Value) bool {
		if !item.IsString() {
			bad = fmt.Errorf("sequence item %d: expected str instance, %s found", len(items), typeName(item))
			return false
		}
		items = append(items, item.String())
		return true
	}, func() {})
	if bad != nil {
		return nil, bad
	}
	return joinChecked(items, sep)
}

// dictMethods are the read-only dict methods (the sandbox transformers uses
// forbids the mutating ones), keeping insertion order.
var dictMethods = map[string]exec.Method[map[string]any]{
	"keys": func(_ map[string]any, v *exec.Value, va *exec.VarArgs) (any, error) {
		pairs, _ := orderedItems(v)
		out := make([]any, len(pairs))
		for i, p := range pairs {
			out[i] = p.Key.Interface()
		}
		return out, noArgs("keys", va)
	},
	"values": func(_ map[string]any, v *exec.Value, va *exec.VarArgs) (any, error) {
		pairs, _ := orderedItems(v)
		out := make([]any, len(pairs))
		for i, p := range pairs {
			out[i] = p.Value.Interface()
		}
		return out, noArgs("values", va)
	},
	"items": func(_ map[string]any, v *exec.Value, va *exec.VarArgs) (any, error) {
		if err := noArgs("items", va); err != nil {
			return nil, err
		}
		return itemsOf(v)
	},
	"get": func(_ map[string]any, v *exec.Value, va *exec.VarArgs) (any, error) {
		args, err := bindArgs("get", va, "key", "default")
		if err != nil {
			return nil, err
		}
		if args[0] == nil {
			return nil, errors.New("get() needs a key")
		}
		pairs, _ := orderedItems(v)
		for _, p := range pairs {
			if sameKey(p.Key, args[0]) {
				return p.Value.Interface(), nil
			}
		}
		if args[1] != nil {
			return args[1].Interface(), nil
		}
		return nil, nil
	},
}

// sameKey compares dict keys without tripping over uncomparable values.
func sameKey(a, b *exec.Value) bool {
	switch {
	case a.IsString() && b.IsString():
		return a.String() == b.String()
	case isNum(a) && isNum(b):
		return floatOf(a) == floatOf(b)
	case a.IsNil() && b.IsNil():
		return true
	}
	return false
}

// lookup is Jinja's getattr for filters' attribute= arguments: an item of
// a mapping, else an attribute.
func lookup(v *exec.Value, name string) *exec.Value {
	if r, ok := v.GetItem(name); ok {
		return r
	}
	r, _ := v.GetAttribute(name)
	return r
}
