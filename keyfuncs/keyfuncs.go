// Package keyfuncs builds key functions ([Func], for dedup.Config.Key) that
// take the business key out of a message: a JSON field of the payload, a metadata entry (SQS
// message attributes and Kafka headers arrive as Watermill metadata), the
// inner message of an SNS notification envelope, and compositions of those.
//
// Every function returns an error wrapping dedup.ErrNoKey (a *dedup.KeyError
// naming the field, the reason and the message UUID) when the key is
// missing, empty, blank, null, of the wrong type, or when the payload is not
// JSON. None of them ever derives a key from the message UUID, and none
// invents a placeholder key for a malformed message.
package keyfuncs

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
	"unsafe"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/tidwall/gjson"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

func noKey(msg *message.Message, field, reason string) error {
	return &dedup.KeyError{Field: field, Reason: reason, MessageUUID: msg.UUID}
}

// Func returns the business key of a message: an order id, a payment id, a
// client's Idempotency-Key. It must not return the transport id (the
// Watermill UUID, an SQS MessageId): those differ between copies of the
// same fact. When the message carries no usable key it returns an error
// wrapping dedup.ErrNoKey (see dedup.KeyError). It is the type of
// dedup.Config.Key, which takes any function of this signature.
type Func func(msg *message.Message) (string, error)

func blank(s string) bool { return strings.TrimFunc(s, unicode.IsSpace) == "" }

// JSON returns the value at path in the JSON payload. The path is member
// names and array indices separated by dots ("order_id", "order.id",
// "items.0.sku"); a backslash makes the next character literal
// (`a\.b` names the member "a.b"). The payload is validated and only the
// objects and arrays along the path are walked, without unmarshalling the
// whole document.
//
// Values, and what becomes of them:
//   - a string: the key, verbatim (escapes decoded); empty or blank → ErrNoKey;
//   - an integer (no fraction, no exponent): its decimal text as written,
//     so 42 and "42" give the same key and large ids lose no precision;
//   - null, a fraction or exponent number, true/false, an object or an
//     array: ErrNoKey (wrong type);
//   - missing path, non-JSON payload (including an empty payload): ErrNoKey.
//
// A member on the path that appears more than once in its object, with
// names compared ignoring case, gives ErrNoKey (`ambiguous: member
// "order_id" appears twice`), whatever the values: gjson reads the first
// such member, encoding/json the last (and, into a struct, one spelled in
// any case), so a key read from either would name one order to dedup and
// another to a handler. Repeated members elsewhere in the document are not
// looked at. Like every ErrNoKey, this is permanent.
//
// JSON panics at construction on an empty path, an empty name ("a..b"), a
// trailing lone backslash, or gjson query syntax that does not name one
// member: an unescaped '*', '?', '#' or '|', or a name starting with '@',
// '!', '[' or '{' (escape the character to name such a member).
func JSON(path string) Func {
	steps := parsePath("JSON", path)
	field := "json:" + path
	return func(msg *message.Message) (string, error) {
		v, err := lookup(msg, field, steps)
		if err != nil {
			return "", err
		}
		return jsonValue(msg, field, v)
	}
}

// JSONString is JSON for ids that must be JSON strings: a number at path
// (even an integer) is refused with ErrNoKey ("wrong type: number, a string
// is expected"), so a producer that switched an id's type is caught instead
// of silently sharing keys with string ids. Everything else, including the
// refusal of repeated members and the path syntax, is as for JSON.
func JSONString(path string) Func {
	steps := parsePath("JSONString", path)
	field := "json:" + path
	return func(msg *message.Message) (string, error) {
		v, err := lookup(msg, field, steps)
		if err != nil {
			return "", err
		}
		if v.Type == gjson.Number {
			return "", noKey(msg, field, "wrong type: number, a string is expected")
		}
		return jsonValue(msg, field, v)
	}
}

// pathStep is one name of a path; index is the array index it also names
// (its digits), or -1.
type pathStep struct {
	name  string
	index int
}

// parsePath splits path into names (see JSON), panicking on a path that is
// not a plain sequence of names.
func parsePath(fn, path string) []pathStep {
	bad := func(why string) {
		panic(fmt.Sprintf("keyfuncs.%s: path %q %s", fn, path, why))
	}
	var steps []pathStep
	var name strings.Builder
	escaped, start := false, true
	end := func() {
		n := name.String()
		if n == "" {
			bad("has an empty member name")
		}
		index := -1
		if strings.Trim(n, "0123456789") == "" {
			if i, err := strconv.Atoi(n); err == nil {
				index = i
			}
		}
		steps = append(steps, pathStep{name: n, index: index})
		name.Reset()
		start = true
	}
	for i := 0; i < len(path); i++ {
		c := path[i]
		switch {
		case escaped:
			name.WriteByte(c)
			escaped, start = false, false
			continue
		case c == '\\':
			escaped = true
			continue
		case c == '.':
			end()
			continue
		case c == '*' || c == '?' || c == '#' || c == '|':
			bad(fmt.Sprintf("uses gjson query syntax %q (escape it with a backslash to name a member)", c))
		case start && (c == '@' || c == '!' || c == '[' || c == '{'):
			bad(fmt.Sprintf("has a name starting with gjson syntax %q (escape it with a backslash to name a member)", c))
		}
		name.WriteByte(c)
		start = false
	}
	if escaped {
		bad("ends in a lone backslash")
	}
	end()
	return steps
}

// lookup validates the payload and walks steps through it. Every object on
// the path is read to its end, so that a repeated member is found; arrays
// are read up to the index.
func lookup(msg *message.Message, field string, steps []pathStep) (gjson.Result, error) {
	if !validJSON(msg.Payload) {
		return gjson.Result{}, noKey(msg, field, "payload is not valid JSON")
	}
	cur := gjson.Parse(view(msg.Payload))
	for _, st := range steps {
		switch {
		case cur.IsObject():
			v, n, exact := member(cur, st.name)
			if n > 1 {
				return gjson.Result{}, noKey(msg, field, ambiguous(st.name, n, exact))
			}
			cur = v
		case cur.IsArray() && st.index >= 0:
			var v gjson.Result
			i := 0
			cur.ForEach(func(_, e gjson.Result) bool {
				if i == st.index {
					v = e
					return false
				}
				i++
				return true
			})
			cur = v
		default:
			return gjson.Result{}, nil // missing
		}
		if !cur.Exists() {
			return cur, nil
		}
	}
	return cur, nil
}

// member returns obj's member spelled name, how many members have name
// ignoring case (encoding/json matches struct fields so), and how many of
// those are spelled exactly name.
func member(obj gjson.Result, name string) (v gjson.Result, n, exact int) {
	obj.ForEach(func(k, e gjson.Result) bool {
		if strings.EqualFold(k.Str, name) {
			n++
			if k.Str == name {
				exact++
				if exact == 1 {
					v = e
				}
			}
		}
		return true
	})
	return v, n, exact
}

func ambiguous(name string, n, exact int) string {
	times := "twice"
	if n > 2 {
		times = strconv.Itoa(n) + " times"
	}
	s := fmt.Sprintf("ambiguous: member %q appears %s", name, times)
	if exact != n {
		s += " (names compared ignoring case, as encoding/json matches struct fields)"
	}
	return s
}

func jsonValue(msg *message.Message, field string, v gjson.Result) (string, error) {
	switch v.Type {
	case gjson.String:
		if blank(v.Str) {
			return "", noKey(msg, field, "empty value")
		}
		return strings.Clone(v.Str), nil // not a view of the payload's copy
	case gjson.Number:
		if !isInteger(v.Raw) {
			return "", noKey(msg, field, "number is not an integer: "+v.Raw)
		}
		return strings.Clone(v.Raw), nil
	case gjson.Null:
		if !v.Exists() {
			return "", noKey(msg, field, "missing")
		}
		return "", noKey(msg, field, "null")
	case gjson.True, gjson.False:
		return "", noKey(msg, field, "wrong type: boolean")
	default: // gjson.JSON: object or array
		return "", noKey(msg, field, "wrong type: object or array")
	}
}

// view returns b as a string without copying it, as gjson.GetBytes does
// internally: the payload is read only during the key function's call, and
// whatever outlives the call (the key, error reasons, the unwrapped SNS
// Message) is copied out of it first.
func view(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// validJSON reports whether b is one JSON value in UTF-8 (RFC 8259 §8.1;
// gjson alone accepts invalid UTF-8 inside strings).
func validJSON(b []byte) bool {
	return utf8.Valid(b) && gjson.ValidBytes(b)
}

// isInteger reports whether a JSON number literal is an integer written
// without fraction or exponent.
func isInteger(raw string) bool {
	s := strings.TrimPrefix(raw, "-")
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// Metadata returns the message's metadata entry name. SQS message attributes
// and Kafka headers arrive as Watermill metadata. A missing, empty or blank
// entry gives ErrNoKey.
func Metadata(name string) Func {
	field := "metadata:" + name
	return func(msg *message.Message) (string, error) {
		v, ok := msg.Metadata[name]
		if !ok {
			return "", noKey(msg, field, "missing")
		}
		if blank(v) {
			return "", noKey(msg, field, "empty value")
		}
		return v, nil
	}
}

// SNSEnvelope unwraps an SNS notification envelope
// ({"Type":"Notification","Message":"…",…}), as delivered to an SQS queue
// without raw message delivery, and runs inner on a copy of the message whose
// payload is the inner Message (metadata and UUID unchanged). A payload that
// is not an envelope is passed to inner unchanged, so the same key function
// serves subscriptions with and without raw message delivery. An envelope
// whose Message is missing or not a string gives ErrNoKey; a key equal to
// the envelope's MessageId (SNS gives every publish a new one) gives
// dedup.ErrTransportKey.
//
// A payload is an envelope when its Type member is the string
// "Notification" and it has a TopicArn member. When a member named Type
// (ignoring case) is "Notification", each of Type, TopicArn and Message
// must appear at most once and spelled exactly so, or the envelope is
// ambiguous and gives ErrNoKey (`ambiguous: member "Message" appears
// twice`): gjson reads the first repeated member, encoding/json the last,
// and into a struct it also reads "message" as Message, so dedup and a
// handler could unwrap different messages. The envelope is read in one
// pass over its members; inner then reads the Message as it reads any
// payload (JSON refuses repeated members on its own path).
func SNSEnvelope(inner Func) Func {
	return func(msg *message.Message) (string, error) {
		if !validJSON(msg.Payload) {
			return inner(msg)
		}
		env := gjson.Parse(view(msg.Payload))
		if !env.IsObject() {
			return inner(msg)
		}
		names := [...]string{"Type", "TopicArn", "Message"}
		var (
			vals           [len(names)]gjson.Result
			count, spelled [len(names)]int
			notification   bool
			snsID          string // the envelope's MessageId: a transport id
		)
		env.ForEach(func(k, v gjson.Result) bool {
			if k.Str == "MessageId" && v.Type == gjson.String {
				snsID = v.Str
			}
			for i, name := range names {
				if strings.EqualFold(k.Str, name) {
					count[i]++
					if k.Str == name {
						spelled[i]++
						vals[i] = v
					}
					if i == 0 && v.Type == gjson.String && v.Str == "Notification" {
						notification = true
					}
				}
			}
			return true
		})
		if !notification || count[1] == 0 {
			return inner(msg) // not an envelope, read whichever way
		}
		for i, name := range names {
			switch {
			case count[i] > 1:
				return "", noKey(msg, "sns:"+name, ambiguous(name, count[i], spelled[i]))
			case count[i] == 1 && spelled[i] == 0:
				return "", noKey(msg, "sns:"+name, fmt.Sprintf("ambiguous: member %q is spelled in another case (encoding/json reads it into a struct field, not into a map)", name))
			}
		}
		m := vals[2]
		if m.Type != gjson.String {
			return "", noKey(msg, "sns:Message", "envelope without a string Message")
		}
		unwrapped := message.NewMessage(msg.UUID, []byte(m.Str))
		unwrapped.Metadata = msg.Metadata
		unwrapped.SetContext(msg.Context())
		key, err := inner(unwrapped)
		if err == nil && snsID != "" && key == snsID {
			return "", fmt.Errorf("%w: key %q is the SNS notification's MessageId (new for every publish); take the key from the business payload", dedup.ErrTransportKey, key)
		}
		return key, err
	}
}

// Prefix prepends a fixed prefix to the key inner returns, e.g. to tell apart
// ids from two systems that share a scope. Errors pass through unchanged.
// The prefix is not escaped: one Prefix never maps two keys to one, but two
// Prefix functions give disjoint keys only when neither prefix is a prefix
// of the other ("acme:" and "acme:eu:" both give "acme:eu:1", for "eu:1"
// and for "1"). Use prefixes of which none starts another, such as "sys-a/"
// and "sys-b/".
func Prefix(prefix string, inner Func) Func {
	return func(msg *message.Message) (string, error) {
		k, err := inner(msg)
		if err != nil {
			return "", err
		}
		return prefix + k, nil
	}
}

// Join runs every key function and joins their keys with sep, for facts
// identified by several fields (tenant + order id). Different tuples never
// share a key, whatever sep: in each part a backslash and every character
// that occurs in sep are escaped with a backslash (`\` → `\\`,
// c → `\c`), so an unescaped character of sep only ever belongs to a
// separator and the parts can be read back. Escaping every character, not
// only whole occurrences of sep, matters for a separator of several
// characters: with "::", ("a:", "b") gives `a\::::b` and ("a", ":b") gives
// `a::\:b` (escaping whole occurrences gave "a:::b" for both). Parts
// containing neither a backslash nor a character of sep are kept verbatim,
// and for a one-character sep the encoding is unchanged from earlier
// versions. Any part's error is returned. Join panics at construction when
// sep is empty, contains a backslash or is not valid UTF-8.
func Join(sep string, parts ...Func) Func {
	if sep == "" || strings.Contains(sep, `\`) || !utf8.ValidString(sep) {
		panic(fmt.Sprintf("keyfuncs.Join: separator %q must be non-empty valid UTF-8 without a backslash", sep))
	}
	esc := escaper(sep)
	return func(msg *message.Message) (string, error) {
		keys := make([]string, len(parts))
		for i, p := range parts {
			k, err := p(msg)
			if err != nil {
				return "", err
			}
			keys[i] = esc.Replace(k)
		}
		return strings.Join(keys, sep), nil
	}
}

// escaper returns a replacer that puts a backslash before every backslash
// and every character (rune) of sep. Matching a rune's bytes anywhere in a
// part is the same as matching it rune by rune: a valid UTF-8 sequence
// starts with a byte that cannot continue another one, so it cannot begin
// inside another character, even next to invalid bytes.
func escaper(sep string) *strings.Replacer {
	pairs := []string{`\`, `\\`}
	seen := map[rune]bool{}
	for _, r := range sep {
		if !seen[r] {
			seen[r] = true
			pairs = append(pairs, string(r), `\`+string(r))
		}
	}
	return strings.NewReplacer(pairs...)
}

// FirstOf returns the key of the first function that finds one, e.g. a
// header when producers set it and a body field otherwise. Functions failing
// with ErrNoKey are skipped; any other error is returned at once. When none
// finds a key, the error wraps ErrNoKey and every function's error. The
// alternatives share one key space, as they should when they carry the same
// id; wrap them in Prefix when they carry different ones.
func FirstOf(fns ...Func) Func {
	return func(msg *message.Message) (string, error) {
		var errs []error
		for _, f := range fns {
			k, err := f(msg)
			if err == nil {
				return k, nil
			}
			if !errors.Is(err, dedup.ErrNoKey) {
				return "", err
			}
			errs = append(errs, err)
		}
		return "", &dedup.KeyError{Field: "first-of", Reason: "no alternative found a key", MessageUUID: msg.UUID, Err: errors.Join(errs...)}
	}
}
