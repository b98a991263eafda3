package keyfuncs_test

import (
	"errors"
	"strings"
	"testing"
	"unicode"

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
