// Package keyfuncs builds dedup.KeyFunc values that take the business key
// out of a message: a JSON field of the payload, a metadata entry (SQS
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
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/tidwall/gjson"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

func noKey(msg *message.Message, field, reason string) error {
	return &dedup.KeyError{Field: field, Reason: reason, MessageUUID: msg.UUID}
}

func blank(s string) bool { return strings.TrimFunc(s, unicode.IsSpace) == "" }

// JSON returns the value at path in the JSON payload, using gjson path
// syntax ("order_id", "order.id", "items.0.sku"). The payload is validated
// and the path is read without unmarshalling the whole document.
//
// Values, and what becomes of them:
//   - a string: the key, verbatim (escapes decoded); empty or blank → ErrNoKey;
//   - an integer (no fraction, no exponent): its decimal text as written,
//     so 42 and "42" give the same key and large ids lose no precision;
//   - null, a fraction or exponent number, true/false, an object or an
//     array: ErrNoKey (wrong type);
//   - missing path, non-JSON payload (including an empty payload): ErrNoKey.
func JSON(path string) dedup.KeyFunc {
	field := "json:" + path
	return func(msg *message.Message) (string, error) {
		if !validJSON(msg.Payload) {
			return "", noKey(msg, field, "payload is not valid JSON")
		}
		return jsonValue(msg, field, gjson.GetBytes(msg.Payload, path))
	}
}

// JSONString is JSON for ids that must be JSON strings: a number at path
// (even an integer) is refused with ErrNoKey ("wrong type: number, a string
// is expected"), so a producer that switched an id's type is caught instead
// of silently sharing keys with string ids. Everything else is as for JSON.
func JSONString(path string) dedup.KeyFunc {
	field := "json:" + path
	return func(msg *message.Message) (string, error) {
		if !validJSON(msg.Payload) {
			return "", noKey(msg, field, "payload is not valid JSON")
		}
		v := gjson.GetBytes(msg.Payload, path)
		if v.Type == gjson.Number {
			return "", noKey(msg, field, "wrong type: number, a string is expected")
		}
		return jsonValue(msg, field, v)
	}
}

func jsonValue(msg *message.Message, field string, v gjson.Result) (string, error) {
	switch v.Type {
	case gjson.String:
		if blank(v.Str) {
			return "", noKey(msg, field, "empty value")
		}
		return v.Str, nil
	case gjson.Number:
		if !isInteger(v.Raw) {
			return "", noKey(msg, field, "number is not an integer: "+v.Raw)
		}
		return v.Raw, nil
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
func Metadata(name string) dedup.KeyFunc {
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
// whose Message is missing or not a string gives ErrNoKey.
func SNSEnvelope(inner dedup.KeyFunc) dedup.KeyFunc {
	return func(msg *message.Message) (string, error) {
		if !validJSON(msg.Payload) {
			return inner(msg)
		}
		env := gjson.ParseBytes(msg.Payload)
		if !env.IsObject() || env.Get("Type").String() != "Notification" || !env.Get("TopicArn").Exists() {
			return inner(msg)
		}
		m := env.Get("Message")
		if m.Type != gjson.String {
			return "", noKey(msg, "sns:Message", "envelope without a string Message")
		}
		unwrapped := message.NewMessage(msg.UUID, []byte(m.Str))
		unwrapped.Metadata = msg.Metadata
		unwrapped.SetContext(msg.Context())
		return inner(unwrapped)
	}
}

// Prefix prepends a fixed prefix to the key inner returns, e.g. to tell apart
// ids from two systems that share a scope. Errors pass through unchanged.
// The prefix is not escaped: one Prefix never maps two keys to one, but two
// Prefix functions give disjoint keys only when neither prefix is a prefix
// of the other ("acme:" and "acme:eu:" both give "acme:eu:1", for "eu:1"
// and for "1"). Use prefixes of which none starts another, such as "sys-a/"
// and "sys-b/".
func Prefix(prefix string, inner dedup.KeyFunc) dedup.KeyFunc {
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
func Join(sep string, parts ...dedup.KeyFunc) dedup.KeyFunc {
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
func FirstOf(fns ...dedup.KeyFunc) dedup.KeyFunc {
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
