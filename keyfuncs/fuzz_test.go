package keyfuncs_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strconv"
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
func checkKey(t *testing.T, kf keyfuncs.Func, m *message.Message, key string, err error) {
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

// FuzzJSON: besides checkKey, a key JSON returns is what a handler using
// encoding/json reads at the same path, both into maps (names exact, the
// last repeated member wins) and into a struct (names matched ignoring
// case, the last match wins). Issue 14: gjson alone reads the first.
func FuzzJSON(f *testing.F) {
	for _, s := range []string{
		`{"order_id":"ORDER-003"}`, `{"order_id":42}`, `{"order_id":4.2}`, `{"order_id":null}`,
		`null`, ``, `{`, `{"order_id":""}`, `{"order_id":" "}`, "{\"order_id\":\"\xff\"}",
		`{"order_id":{"a":[1,2]}}`, `[{"order_id":"x"}]`, `{"order_id":"\ud800"}`, `{"order_id":-0}`,
		`{"order_id":"ORDER-B","amount":150,"order_id":"ORDER-A"}`, `{"order_id":"A","ORDER_ID":"B"}`,
		`{"order":{"id":"A"},"order":{"id":"B"}}`, `{"order":{"id":"A","id":"B"}}`, `{"order":{"id":7}}`,
		`{"items":[{"sku":"X"},{"sku":"A","sku":"B"}]}`, `{"items":[{},{"sku":"A"}]}`, `{"order_id":"A","order\u005fid":"B"}`,
	} {
		f.Add([]byte(s))
	}
	paths := []string{"order_id", "order.id", "items.1.sku"}
	f.Fuzz(func(t *testing.T, payload []byte) {
		for _, path := range paths {
			kf := keyfuncs.JSON(path)
			m := message.NewMessage("uuid-1", payload)
			key, err := kf(m)
			checkKey(t, kf, m, key, err)
			if err != nil {
				continue
			}
			if !gjson.ValidBytes(payload) {
				t.Fatalf("key %q from invalid JSON", key)
			}
			v := gjson.GetBytes(payload, path)
			if v.Type == gjson.String && v.Str != key || v.Type == gjson.Number && v.Raw != key {
				t.Fatalf("key %q is not the field's value %q", key, v.Raw)
			}
			checkAgreesWithEncodingJSON(t, "", payload, path, key)
		}
	})
}

// checkAgreesWithEncodingJSON fails unless encoding/json reads key at path
// in payload, decoding into maps and, for a one-member path, into a struct.
func checkAgreesWithEncodingJSON(t *testing.T, how string, payload []byte, path, key string) {
	t.Helper()
	if v, ok := jsonMapAt(payload, path); !ok || !sameKey(v, key) {
		t.Fatalf("key %q, but encoding/json%s (into maps) reads %#v (found: %v) at %q in %q", key, how, v, ok, path, payload)
	}
	if strings.Contains(path, ".") {
		return
	}
	// A struct with one field tagged path: names match ignoring case.
	typ := reflect.StructOf([]reflect.StructField{{Name: "Key", Type: reflect.TypeFor[json.RawMessage](), Tag: reflect.StructTag(`json:"` + path + `"`)}})
	ptr := reflect.New(typ)
	if err := json.Unmarshal(payload, ptr.Interface()); err != nil {
		t.Fatalf("key %q, but encoding/json%s (into a struct) fails on %q: %v", key, how, payload, err)
	}
	raw := ptr.Elem().Field(0).Interface().(json.RawMessage)
	v, ok := decodeValue(raw)
	if !ok || !sameKey(v, key) {
		t.Fatalf("key %q, but encoding/json%s (into a struct) reads %s at %q in %q", key, how, raw, path, payload)
	}
}

// decodeValue decodes one JSON value as a handler would, numbers kept as
// written (json.Number).
func decodeValue(b []byte) (any, bool) {
	if !json.Valid(b) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	return v, true
}

// jsonMapAt walks a dotted path of member names and array indices through
// the maps and slices encoding/json decodes payload into.
func jsonMapAt(payload []byte, path string) (any, bool) {
	v, ok := decodeValue(payload)
	if !ok {
		return nil, false
	}
	for _, seg := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			if v, ok = x[seg]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= len(x) {
				return nil, false
			}
			v = x[i]
		default:
			return nil, false
		}
	}
	return v, true
}

func sameKey(v any, key string) bool {
	switch x := v.(type) {
	case string:
		return x == key
	case json.Number:
		return string(x) == key
	}
	return false
}

// FuzzSNSEnvelope: besides checkKey, a key is what a handler using
// encoding/json reads: it unwraps the envelope when Type is "Notification"
// and TopicArn is present (into maps, and into a struct whose names match
// ignoring case), then reads order_id from Message; otherwise it reads
// order_id from the payload itself.
func FuzzSNSEnvelope(f *testing.F) {
	for _, s := range []string{
		snsEnvelope(`{"order_id":"ORDER-003"}`), snsEnvelope(`not json`), snsEnvelope(``),
		`{"Type":"Notification","TopicArn":"a","Message":7}`, `{"Type":"Notification"}`, `{"order_id":"raw"}`, `"x"`,
		snsEnvelope(`{"order_id":"ORDER-B","order_id":"ORDER-A"}`),
		`{"Type":"Notification","TopicArn":"a","Message":"{\"order_id\":\"B\"}","Message":"{\"order_id\":\"A\"}"}`,
		`{"Type":"Notification","TopicArn":"a","Message":"{\"order_id\":\"B\"}","Type":"x","order_id":"A"}`,
		`{"type":"Notification","TopicArn":"a","Message":"{\"order_id\":\"B\"}","order_id":"A"}`,
		`{"Type":"Notification","TopicArn":null,"Message":"{\"order_id\":\"B\"}","order_id":"A"}`,
	} {
		f.Add([]byte(s))
	}
	kf := keyfuncs.SNSEnvelope(keyfuncs.JSON("order_id"))
	f.Fuzz(func(t *testing.T, payload []byte) {
		m := message.NewMessage("uuid-1", payload)
		key, err := kf(m)
		checkKey(t, kf, m, key, err)
		if err != nil {
			return
		}
		// Into maps: names exact, the last repeated member wins.
		inner := payload
		if v, ok := decodeValue(payload); ok {
			if env, ok := v.(map[string]any); ok {
				_, hasArn := env["TopicArn"]
				if env["Type"] == "Notification" && hasArn {
					s, ok := env["Message"].(string)
					if !ok {
						t.Fatalf("key %q from an envelope whose Message encoding/json does not read as a string", key)
					}
					inner = []byte(s)
				}
			}
		}
		checkAgreesWithEncodingJSON(t, ", unwrapping into maps,", inner, "order_id", key)
		// Into a struct: names match ignoring case.
		var env struct {
			Type, TopicArn, Message json.RawMessage
		}
		inner = payload
		if json.Unmarshal(payload, &env) == nil {
			var typ, message string
			if json.Unmarshal(env.Type, &typ) == nil && typ == "Notification" && len(env.TopicArn) > 0 {
				if err := json.Unmarshal(env.Message, &message); err != nil {
					t.Fatalf("key %q from an envelope whose Message encoding/json (into a struct) does not read as a string: %v", key, err)
				}
				inner = []byte(message)
			}
		}
		checkAgreesWithEncodingJSON(t, ", unwrapping into a struct,", inner, "order_id", key)
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
	constant := func(s string) keyfuncs.Func {
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
			kfs := make([]keyfuncs.Func, len(parts))
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
