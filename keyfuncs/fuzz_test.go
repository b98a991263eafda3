package keyfuncs_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/tidwall/gjson"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// checkKey holds for every key function on every input: no panic (the fuzzer
// reports it), either a non-blank key or an error wrapping ErrNoKey, never
// both, and the key does not depend on the message UUID. (A payload may
// carry the UUID as its id; the middleware refuses that key with
// ErrTransportKey.)
func checkKey(t *testing.T, kf dedup.KeyFunc, m *message.Message, key string, err error) {
	t.Helper()
	if err != nil {
		if !errors.Is(err, dedup.ErrNoKey) {
			t.Fatalf("error %v does not wrap ErrNoKey", err)
		}
		if key != "" {
			t.Fatalf("key %q returned with error %v", key, err)
		}
		return
	}
	if strings.TrimFunc(key, unicode.IsSpace) == "" {
		t.Fatalf("blank key %q accepted", key)
	}
	other := message.NewMessage(m.UUID+"-other", m.Payload)
	other.Metadata = m.Metadata
	if k2, err2 := kf(other); err2 != nil || k2 != key {
		t.Fatalf("the key depends on the message UUID: %q vs %q (%v)", key, k2, err2)
	}
}

func FuzzJSON(f *testing.F) {
	for _, s := range []string{
		`{"order_id":"ORDER-003"}`, `{"order_id":42}`, `{"order_id":4.2}`, `{"order_id":null}`,
		`null`, ``, `{`, `{"order_id":""}`, `{"order_id":" "}`, "{\"order_id\":\"\xff\"}",
		`{"order_id":{"a":[1,2]}}`, `[{"order_id":"x"}]`, `{"order_id":"\ud800"}`, `{"order_id":-0}`,
	} {
		f.Add([]byte(s))
	}
	kf := keyfuncs.JSON("order_id")
	f.Fuzz(func(t *testing.T, payload []byte) {
		m := message.NewMessage("uuid-1", payload)
		key, err := kf(m)
		checkKey(t, kf, m, key, err)
		if err == nil {
			if !gjson.ValidBytes(payload) {
				t.Fatalf("key %q from invalid JSON", key)
			}
			v := gjson.GetBytes(payload, "order_id")
			if v.Type == gjson.String && v.Str != key || v.Type == gjson.Number && v.Raw != key {
				t.Fatalf("key %q is not the field's value %q", key, v.Raw)
			}
		}
	})
}

func FuzzSNSEnvelope(f *testing.F) {
	for _, s := range []string{
		snsEnvelope(`{"order_id":"ORDER-003"}`), snsEnvelope(`not json`), snsEnvelope(``),
		`{"Type":"Notification","TopicArn":"a","Message":7}`, `{"Type":"Notification"}`, `{"order_id":"raw"}`, `"x"`,
	} {
		f.Add([]byte(s))
	}
	kf := keyfuncs.SNSEnvelope(keyfuncs.JSON("order_id"))
	f.Fuzz(func(t *testing.T, payload []byte) {
		m := message.NewMessage("uuid-1", payload)
		key, err := kf(m)
		checkKey(t, kf, m, key, err)
	})
}

func FuzzMetadataJoin(f *testing.F) {
	f.Add("acme", "ORDER-1")
	f.Add("a:b", "c")
	f.Add(`a\`, ":c")
	f.Add("", "x")
	f.Add(" ", "\x00")
	kf := keyfuncs.Join(":", keyfuncs.Metadata("tenant"), keyfuncs.Metadata("order"))
	f.Fuzz(func(t *testing.T, tenant, order string) {
		m := message.NewMessage("uuid-1", nil)
		m.Metadata.Set("tenant", tenant)
		m.Metadata.Set("order", order)
		key, err := kf(m)
		checkKey(t, kf, m, key, err)
		if err == nil {
			// The parts can be recovered: distinct tuples give distinct keys.
			if got := splitEscaped(key, ':'); len(got) != 2 || got[0] != tenant || got[1] != order {
				t.Fatalf("Join(%q, %q) = %q, splits into %q", tenant, order, key, got)
			}
		}
	})
}

// splitEscaped undoes keyfuncs.Join's escaping.
func splitEscaped(s string, sep byte) []string {
	var parts []string
	var cur strings.Builder
	escaped := false
	for i := 0; i < len(s); i++ {
		r := s[i]
		switch {
		case escaped:
			cur.WriteByte(r)
			escaped = false
		case r == '\\':
			escaped = true
		case r == sep:
			parts = append(parts, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(r)
		}
	}
	return append(parts, cur.String())
}

// FuzzJoinInjective: different tuples never share a key, whatever the
// separator. Each key is decoded back into its parts (a test-side decoder:
// "\" takes the next character literally, an unescaped sep ends a part), and
// every other split of the same characters, (s[:i], s[i:]) for s = a+b, must
// give a different key: the boundary shift of issue 14, ("a:", "b") vs
// ("a", ":b") with "::".
func FuzzJoinInjective(f *testing.F) {
	f.Add("::", "a:", "b")
	f.Add("::", "a", ":b")
	f.Add(":", `a\`, ":c")
	f.Add("ab", "xa", "by")
	f.Add("→|", "x→", "|y")
	f.Add("\xe2\x86", "x", "y")
	f.Add("-", "", "")
	f.Add("::", "\xe2:", ":\x92")
	constant := func(s string) dedup.KeyFunc {
		return func(*message.Message) (string, error) { return s, nil }
	}
	f.Fuzz(func(t *testing.T, sep, a, b string) {
		if sep == "" || strings.Contains(sep, `\`) || !utf8.ValidString(sep) {
			defer func() {
				if recover() == nil {
					t.Fatalf("Join(%q) did not panic", sep)
				}
			}()
			keyfuncs.Join(sep, constant(a))
			return
		}
		m := message.NewMessage("uuid-1", nil)
		join := func(parts ...string) string {
			kfs := make([]dedup.KeyFunc, len(parts))
			for i, p := range parts {
				kfs[i] = constant(p)
			}
			k, err := keyfuncs.Join(sep, kfs...)(m)
			if err != nil {
				t.Fatalf("Join(%q)(%q): %v", sep, parts, err)
			}
			return k
		}
		for _, parts := range [][]string{{a, b}, {a, b, a}, {a}} {
			key := join(parts...)
			if got := unjoin(t, key, sep); !slices.Equal(got, parts) {
				t.Fatalf("Join(%q, %q) = %q, decodes to %q", sep, parts, key, got)
			}
		}
		key := join(a, b)
		s := a + b
		for i := 0; i <= len(s); i++ {
			if i == len(a) {
				continue
			}
			if k := join(s[:i], s[i:]); k == key {
				t.Fatalf("Join(%q): (%q, %q) and (%q, %q) share the key %q", sep, a, b, s[:i], s[i:], key)
			}
		}
		if !strings.ContainsAny(a+b, `\`+sep) && key != a+sep+b {
			t.Fatalf("Join(%q, %q, %q) = %q: parts without separator characters must be kept verbatim", sep, a, b, key)
		}
	})
}

// unjoin splits a Join key: "\" takes the next character literally, an
// unescaped sep ends a part, any other byte is literal.
func unjoin(t *testing.T, key, sep string) []string {
	t.Helper()
	var parts []string
	var cur strings.Builder
	for i := 0; i < len(key); {
		switch {
		case key[i] == '\\':
			if i+1 == len(key) {
				t.Fatalf("key %q ends in a lone escape", key)
			}
			_, w := utf8.DecodeRuneInString(key[i+1:])
			cur.WriteString(key[i+1 : i+1+w])
			i += 1 + w
		case strings.HasPrefix(key[i:], sep):
			parts = append(parts, cur.String())
			cur.Reset()
			i += len(sep)
		default:
			cur.WriteByte(key[i])
			i++
		}
	}
	return append(parts, cur.String())
}
