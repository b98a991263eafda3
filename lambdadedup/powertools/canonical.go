package powertools

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// object is a JavaScript object's own properties in their enumeration
// order, as TypeScript's deepSort leaves them.
type object struct {
	keys   []string
	values []any
}

// deepSortKeys is Powertools' deepSort followed by JavaScript's property
// order: keys sorted by their lower case (compared as UTF-16 code units,
// as JavaScript compares strings), then the keys that are array indices
// ("0" to "4294967294" written canonically) moved first in numeric order,
// as every JavaScript object enumerates them. "__proto__" is dropped:
// deepSort assigns it to a fresh object, which sets the prototype instead
// of a property. Keys equal but for case ("id", "ID") come out in
// encoding/json's map order here, where deepSort keeps the event's order:
// such an object may not agree (see the tests).
func deepSortKeys(v any) any {
	switch v := v.(type) {
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = deepSortKeys(e)
		}
		return out
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			if k != "__proto__" {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys) // a fixed order for the stable sort below
		lower := make(map[string][]uint16, len(keys))
		for _, k := range keys {
			lower[k] = utf16.Encode([]rune(strings.ToLower(k)))
		}
		sort.SliceStable(keys, func(i, j int) bool { return slices.Compare(lower[keys[i]], lower[keys[j]]) < 0 })
		var index, named []string
		for _, k := range keys {
			if arrayIndex(k) {
				index = append(index, k)
			} else {
				named = append(named, k)
			}
		}
		sort.SliceStable(index, func(i, j int) bool {
			a, _ := strconv.ParseUint(index[i], 10, 64)
			b, _ := strconv.ParseUint(index[j], 10, 64)
			return a < b
		})
		o := &object{keys: append(index, named...)}
		for _, k := range o.keys {
			o.values = append(o.values, deepSortKeys(v[k]))
		}
		return o
	}
	return v
}

// arrayIndex reports whether k is a canonical array index, which a
// JavaScript object enumerates before its other keys.
func arrayIndex(k string) bool {
	if k == "" || len(k) > 10 || k != "0" && k[0] == '0' {
		return false
	}
	n, err := strconv.ParseUint(k, 10, 64)
	return err == nil && n <= math.MaxUint32-1
}

// writeJS writes v as JavaScript's JSON.stringify does.
func writeJS(buf *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case nil:
		buf.WriteString("null")
	case bool:
		buf.WriteString(strconv.FormatBool(v))
	case float64:
		if math.IsInf(v, 0) || math.IsNaN(v) {
			buf.WriteString("null")
		} else {
			buf.WriteString(jsNumber(v))
		}
	case string:
		writeJSString(buf, v)
	case []any:
		buf.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeJS(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case *object:
		buf.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			writeJSString(buf, k)
			buf.WriteByte(':')
			if err := writeJS(buf, v.values[i]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	default:
		return fmt.Errorf("cannot serialize a %T", v)
	}
	return nil
}

// writeJSString quotes s as JSON.stringify does: '"' and '\' escaped, the
// control characters below U+0020 as \b \f \n \r \t or \u00xx, everything
// else as it is.
func writeJSString(buf *bytes.Buffer, s string) { writeQuoted(buf, s, false) }

// writePythonString quotes s as json.dumps with ensure_ascii does: as
// writeJSString, and every rune outside printable ASCII as \uXXXX
// (a surrogate pair above U+FFFF).
func writePythonString(buf *bytes.Buffer, s string) { writeQuoted(buf, s, true) }

func writeQuoted(buf *bytes.Buffer, s string, asciiOnly bool) {
	buf.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			buf.WriteString(`\"`)
		case '\\':
			buf.WriteString(`\\`)
		case '\b':
			buf.WriteString(`\b`)
		case '\f':
			buf.WriteString(`\f`)
		case '\n':
			buf.WriteString(`\n`)
		case '\r':
			buf.WriteString(`\r`)
		case '\t':
			buf.WriteString(`\t`)
		default:
			switch {
			case r < 0x20:
				fmt.Fprintf(buf, `\u%04x`, r)
			case !asciiOnly || r <= 0x7e:
				buf.WriteRune(r)
			case r > 0xffff:
				r1, r2 := utf16.EncodeRune(r)
				fmt.Fprintf(buf, `\u%04x\u%04x`, r1, r2)
			case r == utf8.RuneError:
				buf.WriteString(`\ufffd`)
			default:
				fmt.Fprintf(buf, `\u%04x`, r)
			}
		}
	}
	buf.WriteByte('"')
}

// jsNumber is JavaScript's Number::toString of a finite double: the
// shortest digits that read back as x, written without an exponent from
// 1e-7 to below 1e21.
func jsNumber(x float64) string {
	if x == 0 {
		return "0" // -0 too
	}
	sign := ""
	if x < 0 {
		sign, x = "-", -x
	}
	digits, n := shortest(x)
	k := len(digits)
	switch {
	case k <= n && n <= 21:
		return sign + digits + strings.Repeat("0", n-k)
	case 0 < n && n <= 21:
		return sign + digits[:n] + "." + digits[n:]
	case -6 < n && n <= 0:
		return sign + "0." + strings.Repeat("0", -n) + digits
	}
	e := n - 1
	es := "+" + strconv.Itoa(e)
	if e < 0 {
		es = strconv.Itoa(e)
	}
	if k == 1 {
		return sign + digits + "e" + es
	}
	return sign + digits[:1] + "." + digits[1:] + "e" + es
}

// shortest returns the shortest decimal digits of x > 0 that read back as
// x, and n, the position of the decimal point: x = 0.digits × 10^n.
func shortest(x float64) (string, int) {
	s := strconv.FormatFloat(x, 'e', -1, 64) // d.ddde±XX
	mant, exp, _ := strings.Cut(s, "e")
	e, _ := strconv.Atoi(exp)
	return strings.Replace(mant, ".", "", 1), e + 1
}

// writePython writes v as Python's json.dumps(v, sort_keys=True) does:
// ", " and ": " between items, keys sorted by code point, every
// character outside printable ASCII escaped (ensure_ascii), integers as
// they are, floats as repr writes them.
func writePython(buf *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case nil:
		buf.WriteString("null")
	case bool:
		if v {
			buf.WriteString("true")
		} else {
			buf.WriteString("false")
		}
	case json.Number:
		s, err := pythonNumber(string(v))
		if err != nil {
			return err
		}
		buf.WriteString(s)
	case float64: // a number a JMESPath function computed: Python's is an int when whole
		if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
			buf.WriteString(strconv.FormatInt(int64(v), 10))
		} else {
			buf.WriteString(pythonFloat(v))
		}
	case string:
		writePythonString(buf, v)
	case []any:
		buf.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				buf.WriteString(", ")
			}
			if err := writePython(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys) // UTF-8 byte order is code point order, Python's
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteString(", ")
			}
			writePythonString(buf, k)
			buf.WriteString(": ")
			if err := writePython(buf, v[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	default:
		return fmt.Errorf("cannot serialize a %T", v)
	}
	return nil
}

// pythonNumber writes a JSON number as json.loads and then json.dumps do:
// an integer literal stays as it is (Python's int is exact; "-0" is 0), a
// literal with a fraction or an exponent becomes a float.
func pythonNumber(lit string) (string, error) {
	if !strings.ContainsAny(lit, ".eE") {
		if lit == "-0" {
			return "0", nil
		}
		return lit, nil
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil && !strings.Contains(err.Error(), "range") {
		return "", err
	}
	return pythonFloat(f), nil
}

// pythonFloat is Python's repr of a float (float_repr_style "short"): the
// shortest digits that read back, fixed-point with at least one decimal
// from 1e-4 to below 1e16, else d.ddde±XX with two exponent digits at
// least; inf and nan as json.dumps writes them.
func pythonFloat(x float64) string {
	switch {
	case math.IsInf(x, 1):
		return "Infinity"
	case math.IsInf(x, -1):
		return "-Infinity"
	case math.IsNaN(x):
		return "NaN"
	case x == 0:
		if math.Signbit(x) {
			return "-0.0"
		}
		return "0.0"
	}
	sign := ""
	if x < 0 {
		sign, x = "-", -x
	}
	digits, n := shortest(x)
	k := len(digits)
	if -4 < n && n <= 16 {
		switch {
		case n <= 0:
			return sign + "0." + strings.Repeat("0", -n) + digits
		case n >= k:
			return sign + digits + strings.Repeat("0", n-k) + ".0"
		default:
			return sign + digits[:n] + "." + digits[n:]
		}
	}
	e := n - 1
	es := fmt.Sprintf("%+03d", e)
	if k == 1 {
		return sign + digits + "e" + es
	}
	return sign + digits[:1] + "." + digits[1:] + "e" + es
}
