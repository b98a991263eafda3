package powertools

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/jmespath/go-jmespath"
)

// expr is a compiled expression: a pipe of stages, each an optional
// Powertools function applied to a sub-expression, then a plain JMESPath
// expression (go-jmespath) applied to its result.
type expr struct {
	stages  []stage
	runtime Runtime
}

type stage struct {
	fn   string // "", or a Powertools function applied first
	arg  *expr  // fn's argument, evaluated on the stage's input
	rest *jmespath.JMESPath
}

// ptFunctions are Powertools' JMESPath functions.
var ptFunctions = map[string]bool{"powertools_json": true, "powertools_base64": true, "powertools_base64_gzip": true}

var ptCall = regexp.MustCompile(`^\s*(powertools_json|powertools_base64_gzip|powertools_base64)\s*\(`)

// compile splits s at its top-level pipes; a stage that starts with a
// Powertools function call is that call and what follows it (which must
// continue the path: ".field", "[0]", nothing). A Powertools function
// anywhere else is refused, as go-jmespath cannot call it.
func compile(s string, rt Runtime) (*expr, error) {
	parts, err := split(s, '|')
	if err != nil {
		return nil, err
	}
	e := &expr{runtime: rt}
	for _, p := range parts {
		var st stage
		rest := p
		if m := ptCall.FindStringSubmatchIndex(p); m != nil {
			st.fn = p[m[2]:m[3]]
			end, err := closing(p, m[1]-1)
			if err != nil {
				return nil, err
			}
			if st.arg, err = compile(p[m[1]:end], rt); err != nil {
				return nil, err
			}
			rest = strings.TrimSpace(p[end+1:])
			if rest != "" && rest[0] != '.' && rest[0] != '[' {
				return nil, fmt.Errorf("%q follows %s(…): only a path may (\".field\", \"[0]\"); put anything else after a pipe", rest, st.fn)
			}
			if err := noTopLevelOperator(rest); err != nil {
				return nil, fmt.Errorf("after %s(…): %w", st.fn, err)
			}
			rest = "@" + rest
		}
		if name := usesPowertools(rest); name != "" {
			return nil, fmt.Errorf("%s is supported only at the start of the expression or of a pipe's stage, as in \"%s(body).order_id\" or \"detail | %s(payload)\"", name, name, name)
		}
		if rt == Python {
			if err := pythonSafe(rest); err != nil {
				return nil, err
			}
		}
		if st.rest, err = jmespath.Compile(rest); err != nil {
			return nil, err
		}
		e.stages = append(e.stages, st)
	}
	return e, nil
}

// search evaluates e on data (nil e: data itself).
func (e *expr) search(data any) (any, error) {
	if e == nil {
		return data, nil
	}
	v := data
	for _, st := range e.stages {
		in := v
		if st.fn != "" {
			arg, err := st.arg.search(v)
			if err != nil {
				return nil, err
			}
			if in, err = call(st.fn, arg, e.runtime); err != nil {
				return nil, err
			}
		}
		var err error
		if v, err = st.rest.Search(in); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// call applies a Powertools function to its argument, as the runtime's
// PowertoolsFunctions do: powertools_json parses a string as JSON,
// powertools_base64 decodes standard padded base64 to UTF-8 text
// (TypeScript also drops a leading byte order mark, as TextDecoder does),
// powertools_base64_gzip decodes base64 and gunzips to UTF-8 text. An
// argument that is not a string, or text that is not valid UTF-8 (which
// the runtimes replace or refuse), is an error.
func call(fn string, arg any, rt Runtime) (any, error) {
	s, ok := arg.(string)
	if !ok {
		return nil, fmt.Errorf("%s: the argument is a %s, not a string", fn, jsonType(arg))
	}
	switch fn {
	case "powertools_json":
		return decode([]byte(s), rt)
	case "powertools_base64", "powertools_base64_gzip":
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fn, err)
		}
		if fn == "powertools_base64_gzip" {
			r, err := gzip.NewReader(bytes.NewReader(b))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", fn, err)
			}
			if b, err = io.ReadAll(r); err != nil {
				return nil, fmt.Errorf("%s: %w", fn, err)
			}
		} else if rt == TypeScript {
			b = bytes.TrimPrefix(b, []byte("\ufeff"))
		}
		if !utf8.Valid(b) {
			return nil, fmt.Errorf("%s: the decoded bytes are not UTF-8 text", fn)
		}
		return string(b), nil
	}
	return nil, fmt.Errorf("unknown function %s", fn)
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "number"
}

// scan walks s outside its quoted parts (identifiers "…", raw strings
// '…', literals `…`), calling f with each byte's index and the nesting
// depth of (), [] and {} before it.
func scan(s string, f func(i, depth int) bool) error {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"', '\'', '`':
			j := i + 1
			for ; j < len(s) && s[j] != c; j++ {
				if s[j] == '\\' {
					j++
				}
			}
			if j >= len(s) {
				return fmt.Errorf("unterminated %c at %d", c, i)
			}
			i = j
			continue
		case '(', '[', '{':
			if !f(i, depth) {
				return nil
			}
			depth++
			continue
		case ')', ']', '}':
			depth--
			if depth < 0 {
				return fmt.Errorf("unbalanced %c at %d", c, i)
			}
		}
		if !f(i, depth) {
			return nil
		}
	}
	if depth != 0 {
		return errors.New("unbalanced brackets")
	}
	return nil
}

// split cuts s at the top-level occurrences of sep that are not part of
// "||".
func split(s string, sep byte) ([]string, error) {
	var parts []string
	start := 0
	err := scan(s, func(i, depth int) bool {
		if depth == 0 && s[i] == sep && !(i+1 < len(s) && s[i+1] == sep) && !(i > 0 && s[i-1] == sep) {
			parts = append(parts, s[start:i])
			start = i + 1
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	return append(parts, s[start:]), nil
}

// closing returns the index of the ")" that closes the "(" at open.
func closing(s string, open int) (int, error) {
	end := -1
	base := 0
	first := true
	err := scan(s[open:], func(i, depth int) bool {
		if first {
			base, first = depth, false
			return true
		}
		if s[open+i] == ')' && depth == base {
			end = open + i
			return false
		}
		return true
	})
	if err == nil && end < 0 {
		err = errors.New("unclosed (")
	}
	return end, err
}

// noTopLevelOperator refuses an operator that would combine the path
// after a Powertools function with something evaluated on the function's
// input (||, &&, comparisons, !).
func noTopLevelOperator(s string) error {
	var found string
	err := scan(s, func(i, depth int) bool {
		if depth == 0 && strings.ContainsRune("|&=!<>", rune(s[i])) {
			found = s[i:min(i+2, len(s))]
			return false
		}
		return true
	})
	if err != nil {
		return err
	}
	if found != "" {
		return fmt.Errorf("operator %q at the top level: put it after a pipe", found)
	}
	return nil
}

// usesPowertools returns the name of a Powertools function called in s
// outside its quoted parts, or "".
func usesPowertools(s string) string {
	var name string
	_ = scan(s, func(i, depth int) bool {
		if s[i] != '(' {
			return true
		}
		j := i
		for j > 0 && (s[j-1] == ' ' || s[j-1] == '\t' || s[j-1] == '\n') {
			j--
		}
		k := j
		for k > 0 && (s[k-1] == '_' || s[k-1] >= 'a' && s[k-1] <= 'z' || s[k-1] >= 'A' && s[k-1] <= 'Z' || s[k-1] >= '0' && s[k-1] <= '9') {
			k--
		}
		if ptFunctions[s[k:j]] {
			name = s[k:j]
			return false
		}
		return true
	})
	return name
}

// pythonSafe refuses what go-jmespath would decide otherwise than Python's
// jmespath on numbers kept as their text (json.Number): comparisons
// (<, <=, >, >=, and == or != with a number), literals, and the functions
// that compute on numbers or sort.
func pythonSafe(s string) error {
	var found string
	_ = scan(s, func(i, depth int) bool {
		switch s[i] {
		case '<', '>':
			found = "a comparison"
			return false
		case '(':
			j := i
			for j > 0 && s[j-1] == ' ' {
				j--
			}
			k := j
			for k > 0 && (s[k-1] == '_' || s[k-1] >= 'a' && s[k-1] <= 'z') {
				k--
			}
			switch s[k:j] {
			case "abs", "avg", "ceil", "floor", "max", "max_by", "min", "min_by", "sort", "sort_by", "sum", "to_number", "to_string", "contains":
				found = s[k:j] + "()"
				return false
			}
		}
		return true
	})
	if found == "" && strings.Contains(s, "`") {
		found = "a literal"
	}
	if found != "" {
		return fmt.Errorf("%s is not supported for the Python runtime: numbers keep Python's exact values there, which go-jmespath cannot compare or compute with", found)
	}
	return nil
}
