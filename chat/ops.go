package chat

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// binaryOp is an operator with Python's semantics and size checks.
type binaryOp struct {
	name string
	fn   func(a, b *exec.Value) (any, error)
}

var binaryOps = map[string]binaryOp{
	"+":  {"add", pyAdd},
	"-":  {"sub", pySub},
	"*":  {"mul", pyMul},
	"/":  {"div", pyDiv},
	"//": {"floordiv", pyFloorDiv},
	"%":  {"mod", pyMod},
	"**": {"pow", pyPow},
	"~":  {"concat", pyConcat},
}

// opHelper adapts a binaryOp to the evaluator and charges its result.
func opHelper(op binaryOp) helperFunc {
	return func(e *exec.Evaluator, va *exec.VarArgs) *exec.Value {
		if len(va.Args) != 2 {
			return exec.AsValue(fmt.Errorf("operator %s: want 2 operands", op.name))
		}
		a, b := va.Args[0], va.Args[1]
		for _, v := range []*exec.Value{a, b} {
			if v.IsError() {
				return v
			}
		}
		r, err := op.fn(a, b)
		if err != nil {
			return exec.AsValue(err)
		}
		out := exec.AsValue(r)
		if err := stateOf(e.Environment.Context).charge(sizeOf(out)); err != nil {
			return exec.AsValue(err)
		}
		return out
	}
}

func typeName(v *exec.Value) string {
	switch {
	case v.IsNil():
		return "NoneType"
	case v.IsBool():
		return "bool"
	case v.IsInteger():
		return "int"
	case v.IsFloat():
		return "float"
	case v.IsString():
		return "str"
	case v.IsList():
		return "list"
	case v.IsDict():
		return "dict"
	}
	return "object"
}

func operandError(op string, a, b *exec.Value) error {
	return fmt.Errorf("unsupported operand type(s) for %s: '%s' and '%s'", op, typeName(a), typeName(b))
}

// isInt reports Python int-ness; bool is an int subclass in Python.
func isInt(v *exec.Value) bool { return v.IsInteger() || v.IsBool() }

func intOf(v *exec.Value) int {
	if v.IsBool() {
		if v.Bool() {
			return 1
		}
		return 0
	}
	return v.Integer()
}

func isNum(v *exec.Value) bool { return isInt(v) || v.IsFloat() }

func floatOf(v *exec.Value) float64 {
	if v.IsFloat() {
		return v.Float()
	}
	return float64(intOf(v))
}

var errOverflow = errors.New("integer overflow")

func pyAdd(a, b *exec.Value) (any, error) {
	switch {
	case isInt(a) && isInt(b):
		x, y := intOf(a), intOf(b)
		s := x + y
		if (s > x) != (y > 0) {
			return nil, errOverflow
		}
		return s, nil
	case isNum(a) && isNum(b):
		return floatOf(a) + floatOf(b), nil
	case a.IsString() && b.IsString():
		if len(a.String())+len(b.String()) > maxValueBytes {
			return nil, fmt.Errorf("%w: string too long", errBudget)
		}
		return a.String() + b.String(), nil
	case a.IsList() && b.IsList():
		if a.Len()+b.Len() > maxValueBytes/16 {
			return nil, fmt.Errorf("%w: list too long", errBudget)
		}
		return append(listOf(a), listOf(b)...), nil
	}
	return nil, operandError("+", a, b)
}

func listOf(v *exec.Value) []any {
	out := make([]any, 0, v.Len())
	v.Iterate(func(_, _ int, item, _ *exec.Value) bool {
		out = append(out, item.Interface())
		return true
	}, func() {})
	return out
}

func pySub(a, b *exec.Value) (any, error) {
	switch {
	case isInt(a) && isInt(b):
		x, y := intOf(a), intOf(b)
		d := x - y
		if (d < x) != (y > 0) {
			return nil, errOverflow
		}
		return d, nil
	case isNum(a) && isNum(b):
		return floatOf(a) - floatOf(b), nil
	}
	return nil, operandError("-", a, b)
}

func pyMul(a, b *exec.Value) (any, error) {
	switch {
	case isInt(a) && isInt(b):
		x, y := intOf(a), intOf(b)
		hi, lo := bits.Mul64(uint64(absInt(x)), uint64(absInt(y)))
		if hi != 0 || lo > math.MaxInt64 {
			return nil, errOverflow
		}
		return x * y, nil
	case isNum(a) && isNum(b):
		return floatOf(a) * floatOf(b), nil
	case isInt(a) && (b.IsString() || b.IsList()):
		a, b = b, a
	}
	if !isInt(b) {
		return nil, operandError("*", a, b)
	}
	n := max(intOf(b), 0)
	switch {
	case a.IsString():
		s := a.String()
		if n > 0 && len(s) > maxValueBytes/n {
			return nil, fmt.Errorf("%w: string repeat too long", errBudget)
		}
		out := make([]byte, 0, len(s)*n)
		for range n {
			out = append(out, s...)
		}
		return string(out), nil
	case a.IsList():
		items := listOf(a)
		if n > 0 && len(items) > maxValueBytes/16/n {
			return nil, fmt.Errorf("%w: list repeat too long", errBudget)
		}
		out := make([]any, 0, len(items)*n)
		for range n {
			out = append(out, items...)
		}
		return out, nil
	}
	return nil, operandError("*", a, b)
}

func absInt(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func pyDiv(a, b *exec.Value) (any, error) {
	if !isNum(a) || !isNum(b) {
		return nil, operandError("/", a, b)
	}
	if floatOf(b) == 0 {
		return nil, errors.New("division by zero")
	}
	return floatOf(a) / floatOf(b), nil
}

// pyFloorDiv rounds toward negative infinity, as Python's // does.
func pyFloorDiv(a, b *exec.Value) (any, error) {
	switch {
	case isInt(a) && isInt(b):
		x, y := intOf(a), intOf(b)
		if y == 0 {
			return nil, errors.New("integer division or modulo by zero")
		}
		if x == math.MinInt && y == -1 {
			return nil, errOverflow
		}
		q := x / y
		if (x%y != 0) && ((x < 0) != (y < 0)) {
			q--
		}
		return q, nil
	case isNum(a) && isNum(b):
		if floatOf(b) == 0 {
			return nil, errors.New("float floor division by zero")
		}
		return math.Floor(floatOf(a) / floatOf(b)), nil
	}
	return nil, operandError("//", a, b)
}

// pyMod takes the sign of the divisor, as Python's % does. String
// formatting with % is not supported.
func pyMod(a, b *exec.Value) (any, error) {
	switch {
	case isInt(a) && isInt(b):
		x, y := intOf(a), intOf(b)
		if y == 0 {
			return nil, errors.New("integer division or modulo by zero")
		}
		if y == -1 {
			return 0, nil
		}
		m := x % y
		if m != 0 && (m < 0) != (y < 0) {
			m += y
		}
		return m, nil
	case isNum(a) && isNum(b):
		y := floatOf(b)
		if y == 0 {
			return nil, errors.New("float modulo")
		}
		m := math.Mod(floatOf(a), y)
		if m != 0 && (m < 0) != (y < 0) {
			m += y
		}
		return m, nil
	case a.IsString():
		return nil, errors.New("printf-style string formatting with % is not supported")
	}
	return nil, operandError("%", a, b)
}

func pyPow(a, b *exec.Value) (any, error) {
	switch {
	case isInt(a) && isInt(b) && intOf(b) >= 0:
		base, exp := intOf(a), intOf(b)
		switch {
		case exp == 0 || base == 1:
			return 1, nil
		case base == 0:
			return 0, nil
		case base == -1:
			return 1 - 2*(exp%2), nil
		}
		// |base| >= 2 overflows within 63 rounds, so the loop is short.
		result := 1
		for range exp {
			hi, lo := bits.Mul64(uint64(absInt(result)), uint64(absInt(base)))
			if hi != 0 || lo > math.MaxInt64 {
				return nil, errOverflow
			}
			result *= base
		}
		return result, nil
	case isNum(a) && isNum(b):
		return math.Pow(floatOf(a), floatOf(b)), nil
	}
	return nil, operandError("**", a, b)
}

// pyConcat is Jinja's ~: both sides as strings.
func pyConcat(a, b *exec.Value) (any, error) {
	x, y := pyStr(a), pyStr(b)
	if len(x)+len(y) > maxValueBytes {
		return nil, fmt.Errorf("%w: string too long", errBudget)
	}
	return x + y, nil
}

// pyStr is str() for the scalar types; containers keep gonja's spelling.
func pyStr(v *exec.Value) string {
	switch {
	case v.IsNil():
		return ""
	case v.IsBool():
		if v.Bool() {
			return "True"
		}
		return "False"
	case v.IsFloat():
		return pyFloatRepr(v.Float())
	}
	return v.String()
}

// rangeHelper is range() under the render's element budget; it returns a
// list, which is what templates iterate or filter.
func rangeHelper(e *exec.Evaluator, va *exec.VarArgs) *exec.Value {
	if len(va.KwArgs) > 0 || len(va.Args) < 1 || len(va.Args) > 3 || slices.ContainsFunc(va.Args, func(v *exec.Value) bool { return !isInt(v) }) {
		return exec.AsValue(errors.New("range expects 1 to 3 integer arguments"))
	}
	start, stop, step := 0, intOf(va.Args[0]), 1
	if len(va.Args) > 1 {
		start, stop = intOf(va.Args[0]), intOf(va.Args[1])
	}
	if len(va.Args) > 2 {
		step = intOf(va.Args[2])
	}
	if step == 0 {
		return exec.AsValue(errors.New("range() arg 3 must not be zero"))
	}
	n := 0
	switch {
	case step > 0 && stop > start:
		n = int((uint64(stop-start) + uint64(step) - 1) / uint64(step))
	case step < 0 && start > stop:
		n = int((uint64(start-stop) + uint64(-step) - 1) / uint64(-step))
	}
	s := stateOf(e.Environment.Context)
	if n > s.rangeLeft {
		return exec.AsValue(fmt.Errorf("%w: range of %d elements", errBudget, n))
	}
	s.rangeLeft -= n
	out := make([]int, n)
	for i := range out {
		out[i] = start + i*step
	}
	return exec.AsValue(out)
}
