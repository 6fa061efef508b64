package chat

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// jsonOptions are the json.dumps arguments transformers' tojson filter
// passes on: ensure_ascii is False unless the template asks otherwise.
type jsonOptions struct {
	indent     *string // nil: one line; else the indent string per level
	itemSep    string
	keySep     string
	sortKeys   bool
	ensureASCI bool
}

// pyJSON writes v the way Python's json.dumps does with those options.
func pyJSON(v any, opt jsonOptions) (string, error) {
	var b strings.Builder
	if err := writeJSON(&b, v, opt, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

func writeJSON(b *strings.Builder, v any, opt jsonOptions, depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("tojson: value nested deeper than %d", maxJSONDepth)
	}
	if val, ok := v.(*exec.Value); ok {
		if val.IsError() {
			return val
		}
		v = val.Interface()
	}
	switch t := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(t))
	case string:
		writeJSONString(b, t, opt.ensureASCI)
	case int:
		b.WriteString(strconv.Itoa(t))
	case float64:
		b.WriteString(jsonFloat(t))
	case *exec.Dict:
		pairs := t.Pairs
		if opt.sortKeys {
			pairs = slices.Clone(pairs)
			slices.SortStableFunc(pairs, func(a, b *exec.Pair) int { return strings.Compare(a.Key.String(), b.Key.String()) })
		}
		return writeObject(b, len(pairs), func(i int) (string, any) { return jsonKey(pairs[i].Key), pairs[i].Value }, opt, depth)
	case map[string]any:
		keys := sortedKeys(t)
		return writeObject(b, len(keys), func(i int) (string, any) { return keys[i], t[keys[i]] }, opt, depth)
	default:
		rv := reflect.ValueOf(v)
		switch rv.Kind() {
		case reflect.Slice, reflect.Array:
			return writeArray(b, rv, opt, depth)
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			b.WriteString(strconv.FormatInt(rv.Int(), 10))
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			b.WriteString(strconv.FormatUint(rv.Uint(), 10))
		case reflect.Float32:
			b.WriteString(jsonFloat(rv.Float()))
		case reflect.String:
			writeJSONString(b, rv.String(), opt.ensureASCI)
		default:
			return fmt.Errorf("tojson: object of type %T is not JSON serializable", v)
		}
	}
	return nil
}

// jsonKey is how json.dumps spells a non-string key.
func jsonKey(k *exec.Value) string {
	switch {
	case k.IsString():
		return k.String()
	case k.IsNil():
		return "null"
	case k.IsBool():
		return strconv.FormatBool(k.Bool())
	case k.IsFloat():
		return jsonFloat(k.Float())
	}
	return k.String()
}

func writeObject(b *strings.Builder, n int, item func(int) (string, any), opt jsonOptions, depth int) error {
	if n == 0 {
		b.WriteString("{}")
		return nil
	}
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteString(opt.itemSep)
		}
		newline(b, opt, depth+1)
		k, v := item(i)
		writeJSONString(b, k, opt.ensureASCI)
		b.WriteString(opt.keySep)
		if err := writeJSON(b, v, opt, depth+1); err != nil {
			return err
		}
	}
	newline(b, opt, depth)
	b.WriteByte('}')
	return nil
}

func writeArray(b *strings.Builder, rv reflect.Value, opt jsonOptions, depth int) error {
	if rv.Len() == 0 {
		b.WriteString("[]")
		return nil
	}
	b.WriteByte('[')
	for i := range rv.Len() {
		if i > 0 {
			b.WriteString(opt.itemSep)
		}
		newline(b, opt, depth+1)
		if err := writeJSON(b, rv.Index(i).Interface(), opt, depth+1); err != nil {
			return err
		}
	}
	newline(b, opt, depth)
	b.WriteByte(']')
	return nil
}

func newline(b *strings.Builder, opt jsonOptions, depth int) {
	if opt.indent == nil {
		return
	}
	b.WriteByte('\n')
	for range depth {
		b.WriteString(*opt.indent)
	}
}

// writeJSONString escapes like json.dumps: quotes, backslashes and control
// characters always, everything past ASCII only when ensure_ascii is set.
func writeJSONString(b *strings.Builder, s string, ascii bool) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20 || ascii && r > 0x7e && r <= 0xffff:
				fmt.Fprintf(b, `\u%04x`, r)
			case ascii && r > 0xffff:
				r -= 0x10000
				fmt.Fprintf(b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// jsonFloat is float.__repr__, with json's spelling of the non-finite values.
func jsonFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return pyFloatRepr(f)
}

// pyFloatRepr is Python's repr(float): the shortest digits that round-trip,
// in positional notation when the decimal exponent is in [-4, 16), else in
// scientific notation with at least two exponent digits.
func pyFloatRepr(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	sign := ""
	if math.Signbit(f) {
		sign = "-"
		f = -f
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, expStr, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expStr)
	digits := strings.Replace(mant, ".", "", 1)
	if exp < -4 || exp >= 16 {
		out := digits[:1]
		if len(digits) > 1 {
			out += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es = "-"
			exp = -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, out, es, exp)
	}
	if exp < 0 {
		return sign + "0." + strings.Repeat("0", -exp-1) + digits
	}
	if len(digits) <= exp+1 {
		return sign + digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	}
	return sign + digits[:exp+1] + "." + digits[exp+1:]
}
