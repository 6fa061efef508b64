package gguf

import (
	"encoding/binary"
	"fmt"
	"iter"
	"math"
	"strconv"
)

// ValueType is the type tag of a metadata value.
type ValueType uint32

// The 13 GGUF metadata value types.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64", "float64"}

func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return "type(" + strconv.Itoa(int(t)) + ")"
}

// fixedSize returns the encoded size of a scalar type, or 0 for strings,
// arrays and unknown tags.
func (t ValueType) fixedSize() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// minSize is the fewest bytes a value of type t can take when encoded:
// used to bound counts by the bytes left before allocating anything.
func (t ValueType) minSize() int {
	switch t {
	case TypeString:
		return 8
	case TypeArray:
		return 12
	}
	return t.fixedSize()
}

// Value is one metadata value. Scalars are held decoded; an array keeps a
// view of its encoded bytes and decodes elements only when asked.
type Value struct {
	typ  ValueType
	bits uint64 // scalars: the value's bits, zero-extended
	str  string
	arr  Array
}

// Type returns the value's type tag.
func (v Value) Type() ValueType { return v.typ }

// Uint returns an unsigned integer value (any unsigned width, or a
// non-negative signed one).
func (v Value) Uint() (uint64, bool) {
	switch v.typ {
	case TypeUint8, TypeUint16, TypeUint32, TypeUint64:
		return v.bits, true
	case TypeInt8, TypeInt16, TypeInt32, TypeInt64:
		if i, _ := v.Int(); i >= 0 {
			return uint64(i), true
		}
	}
	return 0, false
}

// Int returns an integer value of any width, signed or not, that fits int64.
func (v Value) Int() (int64, bool) {
	switch v.typ {
	case TypeInt8:
		return int64(int8(v.bits)), true
	case TypeInt16:
		return int64(int16(v.bits)), true
	case TypeInt32:
		return int64(int32(v.bits)), true
	case TypeInt64:
		return int64(v.bits), true
	case TypeUint8, TypeUint16, TypeUint32:
		return int64(v.bits), true
	case TypeUint64:
		if v.bits <= math.MaxInt64 {
			return int64(v.bits), true
		}
	}
	return 0, false
}

// Float returns a floating-point value; integers convert.
func (v Value) Float() (float64, bool) {
	switch v.typ {
	case TypeFloat32:
		// The shortest decimal that round-trips the float32, so 1e-5
		// stored as float32 reads as 1e-5, not 9.99999974738e-06;
		// converting back to float32 gives the stored bits.
		f := math.Float32frombits(uint32(v.bits))
		d, err := strconv.ParseFloat(strconv.FormatFloat(float64(f), 'g', -1, 32), 64)
		if err != nil {
			return float64(f), true
		}
		return d, true
	case TypeFloat64:
		return math.Float64frombits(v.bits), true
	}
	if i, ok := v.Int(); ok {
		return float64(i), true
	}
	if u, ok := v.Uint(); ok {
		return float64(u), true
	}
	return 0, false
}

// Bool returns a boolean value.
func (v Value) Bool() (bool, bool) {
	if v.typ == TypeBool {
		return v.bits != 0, true
	}
	return false, false
}

// Str returns a string value.
func (v Value) Str() (string, bool) {
	if v.typ == TypeString {
		return v.str, true
	}
	return "", false
}

// Array returns an array value.
func (v Value) Array() (Array, bool) {
	if v.typ == TypeArray {
		return v.arr, true
	}
	return Array{}, false
}

// String formats the value for people; long arrays are summarised.
func (v Value) String() string {
	switch v.typ {
	case TypeString:
		return strconv.Quote(v.str)
	case TypeBool:
		return strconv.FormatBool(v.bits != 0)
	case TypeFloat32, TypeFloat64:
		f, _ := v.Float()
		bits := 64
		if v.typ == TypeFloat32 {
			bits = 32
		}
		return strconv.FormatFloat(f, 'g', -1, bits)
	case TypeArray:
		budget := 64
		return v.arr.summary(8, &budget)
	}
	if i, ok := v.Int(); ok {
		return strconv.FormatInt(i, 10)
	}
	u, _ := v.Uint()
	return strconv.FormatUint(u, 10)
}

// Interface converts the value to a plain Go value for JSON: numbers, bool,
// string, or []any for arrays. At most maxArray elements of each array are
// kept (maxArray < 0: all), and nested arrays share one budget of
// maxArray*maxArray elements so deep nesting cannot blow up.
func (v Value) Interface(maxArray int) any {
	budget := -1
	if maxArray >= 0 {
		budget = maxArray * maxArray
	}
	return v.toAny(maxArray, &budget)
}

func (v Value) toAny(maxArray int, budget *int) any {
	switch v.typ {
	case TypeString:
		return v.str
	case TypeBool:
		return v.bits != 0
	case TypeFloat32, TypeFloat64:
		f, _ := v.Float()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return v.String()
		}
		return f
	case TypeArray:
		n := v.arr.Len()
		if maxArray >= 0 && n > maxArray {
			n = maxArray
		}
		out := make([]any, 0, min(n, 64))
		for i, e := range v.arr.All() {
			if i >= n || *budget == 0 {
				break
			}
			if *budget > 0 {
				*budget--
			}
			out = append(out, e.toAny(maxArray, budget))
		}
		return out
	}
	if i, ok := v.Int(); ok {
		return i
	}
	u, _ := v.Uint()
	return u
}

// Scalar constructors, used by writers.

// Uint8 returns a uint8 value.
func Uint8(x uint8) Value { return Value{typ: TypeUint8, bits: uint64(x)} }

// Int8 returns an int8 value.
func Int8(x int8) Value { return Value{typ: TypeInt8, bits: uint64(uint8(x))} }

// Uint16 returns a uint16 value.
func Uint16(x uint16) Value { return Value{typ: TypeUint16, bits: uint64(x)} }

// Int16 returns an int16 value.
func Int16(x int16) Value { return Value{typ: TypeInt16, bits: uint64(uint16(x))} }

// Uint32 returns a uint32 value.
func Uint32(x uint32) Value { return Value{typ: TypeUint32, bits: uint64(x)} }

// Int32 returns an int32 value.
func Int32(x int32) Value { return Value{typ: TypeInt32, bits: uint64(uint32(x))} }

// Uint64 returns a uint64 value.
func Uint64(x uint64) Value { return Value{typ: TypeUint64, bits: x} }

// Int64 returns an int64 value.
func Int64(x int64) Value { return Value{typ: TypeInt64, bits: uint64(x)} }

// Float32 returns a float32 value.
func Float32(x float32) Value { return Value{typ: TypeFloat32, bits: uint64(math.Float32bits(x))} }

// Float64 returns a float64 value.
func Float64(x float64) Value { return Value{typ: TypeFloat64, bits: math.Float64bits(x)} }

// Bool returns a bool value.
func Bool(x bool) Value {
	v := Value{typ: TypeBool}
	if x {
		v.bits = 1
	}
	return v
}

// String returns a string value.
func String(s string) Value { return Value{typ: TypeString, str: s} }

// ArrayOf returns an array value holding elems, which must all have type
// elem (strings, scalars, or arrays).
func ArrayOf(elem ValueType, elems []Value) (Value, error) {
	var b []byte
	for i, e := range elems {
		if e.typ != elem {
			return Value{}, fmt.Errorf("gguf: array element %d is %s, want %s", i, e.typ, elem)
		}
		b = appendValue(b, e, false)
	}
	return Value{typ: TypeArray, arr: Array{elem: elem, n: uint64(len(elems)), raw: b}}, nil
}

// Strings returns a string-array value.
func Strings(ss []string) Value {
	var b []byte
	for _, s := range ss {
		b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
		b = append(b, s...)
	}
	return Value{typ: TypeArray, arr: Array{elem: TypeString, n: uint64(len(ss)), raw: b}}
}

// Float32s returns a float32-array value.
func Float32s(fs []float32) Value {
	b := make([]byte, 0, 4*len(fs))
	for _, f := range fs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return Value{typ: TypeArray, arr: Array{elem: TypeFloat32, n: uint64(len(fs)), raw: b}}
}

// Int32s returns an int32-array value.
func Int32s(xs []int32) Value {
	b := make([]byte, 0, 4*len(xs))
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint32(b, uint32(x))
	}
	return Value{typ: TypeArray, arr: Array{elem: TypeInt32, n: uint64(len(xs)), raw: b}}
}

// Array is a lazily decoded metadata array: a view of its encoded elements.
type Array struct {
	elem ValueType
	n    uint64
	raw  []byte // the encoded elements, validated at parse time
}

// Elem returns the element type.
func (a Array) Elem() ValueType { return a.elem }

// Len returns the number of elements.
func (a Array) Len() int { return int(a.n) }

// All yields the elements in order, decoding each as it goes.
func (a Array) All() iter.Seq2[int, Value] {
	return func(yield func(int, Value) bool) {
		p := 0
		for i := 0; i < int(a.n); i++ {
			v, next := decodeTrusted(a.raw, p, a.elem)
			p = next
			if !yield(i, v) {
				return
			}
		}
	}
}

// At returns element i. Fixed-size elements are found directly; strings and
// nested arrays are found by walking from the start, so callers reading
// every element should use All.
func (a Array) At(i int) Value {
	if i < 0 || uint64(i) >= a.n {
		panic(fmt.Sprintf("gguf: array index %d out of range [0,%d)", i, a.n))
	}
	if sz := a.elem.fixedSize(); sz > 0 {
		v, _ := decodeTrusted(a.raw, i*sz, a.elem)
		return v
	}
	for j, v := range a.All() {
		if j == i {
			return v
		}
	}
	return Value{}
}

// Strings decodes a string array.
func (a Array) Strings() ([]string, error) {
	if a.elem != TypeString {
		return nil, fmt.Errorf("gguf: array of %s, want strings", a.elem)
	}
	out := make([]string, 0, a.n)
	for _, v := range a.All() {
		out = append(out, v.str)
	}
	return out, nil
}

// Float32s decodes an array of numbers as float32.
func (a Array) Float32s() ([]float32, error) {
	out := make([]float32, 0, a.n)
	for i, v := range a.All() {
		f, ok := v.Float()
		if !ok {
			return nil, fmt.Errorf("gguf: array element %d is %s, want a number", i, v.typ)
		}
		out = append(out, float32(f))
	}
	return out, nil
}

// Int64s decodes an array of integers.
func (a Array) Int64s() ([]int64, error) {
	out := make([]int64, 0, a.n)
	for i, v := range a.All() {
		x, ok := v.Int()
		if !ok {
			if b, isBool := v.Bool(); isBool {
				x, ok = 0, true
				if b {
					x = 1
				}
			}
		}
		if !ok {
			return nil, fmt.Errorf("gguf: array element %d is %s, want an integer", i, v.typ)
		}
		out = append(out, x)
	}
	return out, nil
}

// summary formats up to max elements; nested arrays share budget so
// formatting stays linear however deep the nesting.
func (a Array) summary(max int, budget *int) string {
	s := "[" + a.elem.String() + " × " + strconv.FormatUint(a.n, 10) + ":"
	for i, v := range a.All() {
		if i >= max || *budget <= 0 {
			s += " …"
			break
		}
		*budget--
		if v.typ == TypeArray {
			s += " " + v.arr.summary(max, budget)
		} else {
			s += " " + v.String()
		}
	}
	return s + "]"
}

// decodeTrusted decodes a value of type t at b[p:], which the parser has
// already validated, and returns it with the offset just past it.
func decodeTrusted(b []byte, p int, t ValueType) (Value, int) {
	le := binary.LittleEndian
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return Value{typ: t, bits: uint64(b[p])}, p + 1
	case TypeUint16, TypeInt16:
		return Value{typ: t, bits: uint64(le.Uint16(b[p:]))}, p + 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return Value{typ: t, bits: uint64(le.Uint32(b[p:]))}, p + 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return Value{typ: t, bits: le.Uint64(b[p:])}, p + 8
	case TypeString:
		n := int(le.Uint64(b[p:]))
		return Value{typ: t, str: string(b[p+8 : p+8+n])}, p + 8 + n
	case TypeArray:
		elem := ValueType(le.Uint32(b[p:]))
		n := le.Uint64(b[p+4:])
		start := p + 12
		q := start
		if sz := elem.fixedSize(); sz > 0 {
			q += int(n) * sz
		} else {
			for i := uint64(0); i < n; i++ {
				_, q = decodeTrusted(b, q, elem)
			}
		}
		return Value{typ: t, arr: Array{elem: elem, n: n, raw: b[start:q]}}, q
	}
	panic("gguf: decodeTrusted on unvalidated type " + t.String())
}

// appendValue encodes v; withTag prefixes its type tag (as metadata values
// are stored; array elements are not tagged).
func appendValue(b []byte, v Value, withTag bool) []byte {
	le := binary.LittleEndian
	if withTag {
		b = le.AppendUint32(b, uint32(v.typ))
	}
	switch v.typ {
	case TypeUint8, TypeInt8, TypeBool:
		return append(b, byte(v.bits))
	case TypeUint16, TypeInt16:
		return le.AppendUint16(b, uint16(v.bits))
	case TypeUint32, TypeInt32, TypeFloat32:
		return le.AppendUint32(b, uint32(v.bits))
	case TypeUint64, TypeInt64, TypeFloat64:
		return le.AppendUint64(b, v.bits)
	case TypeString:
		b = le.AppendUint64(b, uint64(len(v.str)))
		return append(b, v.str...)
	case TypeArray:
		b = le.AppendUint32(b, uint32(v.arr.elem))
		b = le.AppendUint64(b, v.arr.n)
		return append(b, v.arr.raw...)
	}
	panic("gguf: cannot encode value of " + v.typ.String())
}
