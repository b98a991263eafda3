package reliability_test

import (
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// Fuzz targets for the key functions keyfuncs/fuzz_test.go does not fuzz
// (Metadata alone, Prefix, FirstOf), for the whole middleware on arbitrary
// input, and for the injectivity of scoped keys (security_test.go). Their
// f.Add seeds run in every `go test`;
// go test -run '^$' -fuzz '^FuzzPrefix$' -fuzztime 30s ./reliability/
// explores further (README.md lists the commands).

const fuzzUUID = "uuid-1"

// checkKeyResult holds for every key function on every input: no panic
// (the fuzzer reports one), either a non-blank key or an error wrapping
// ErrNoKey, never both. (A key equal to the message UUID is the
// middleware's to refuse: a key function reads the payload, and a payload
// may carry any text; FuzzMiddlewareInput checks the refusal.)
func checkKeyResult(t *testing.T, key string, err error) {
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
}

func FuzzMetadata(f *testing.F) {
	for _, s := range []string{"ORDER-1", "", " ", "\t\n", "\u00a0", "ORDER-\xff", "a:b", strings.Repeat("k", 2048), fuzzUUID + "x"} {
		f.Add(s, true)
	}
	f.Add("", false)
	kf := keyfuncs.Metadata("order_id")
	f.Fuzz(func(t *testing.T, value string, present bool) {
		m := message.NewMessage(fuzzUUID, nil)
		if present {
			m.Metadata.Set("order_id", value)
		}
		key, err := kf(m)
		checkKeyResult(t, key, err)
		if err == nil && key != value {
			t.Fatalf("key %q is not the metadata value %q", key, value)
		}
		if !present && err == nil {
			t.Fatalf("key %q from a missing entry", key)
		}
	})
}

// FuzzPrefix: Prefix prepends verbatim and passes errors through. It does
// not escape: two prefixes give disjoint keys only when neither is a
// prefix of the other ("acme:" and "acme:eu:" can collide), which the
// target checks as a property and README.md states.
func FuzzPrefix(f *testing.F) {
	f.Add("billing:", "acme:", "ORDER-1", "ORDER-1")
	f.Add("a:", "a:b:", "b:c", "c")
	f.Add("", "x", "xy", "y")
	f.Add("sys-a/", "sys-b/", "", " ")
	f.Fuzz(func(t *testing.T, p1, p2, v1, v2 string) {
		k1, err1 := keyfuncs.Prefix(p1, keyfuncs.Metadata("id"))(withMetadata("id", v1))
		k2, err2 := keyfuncs.Prefix(p2, keyfuncs.Metadata("id"))(withMetadata("id", v2))
		for _, r := range []struct {
			p, v, k string
			err     error
		}{{p1, v1, k1, err1}, {p2, v2, k2, err2}} {
			_, innerErr := keyfuncs.Metadata("id")(withMetadata("id", r.v))
			if (r.err == nil) != (innerErr == nil) || (r.err != nil && !errors.Is(r.err, dedup.ErrNoKey)) {
				t.Fatalf("Prefix(%q) error %v, inner error %v: errors must pass through", r.p, r.err, innerErr)
			}
			if r.err == nil && r.k != r.p+r.v {
				t.Fatalf("Prefix(%q) of %q = %q", r.p, r.v, r.k)
			}
		}
		if err1 == nil && err2 == nil && k1 == k2 && p1 != p2 &&
			!strings.HasPrefix(p1, p2) && !strings.HasPrefix(p2, p1) {
			t.Fatalf("prefixes %q and %q, neither a prefix of the other, gave the same key %q", p1, p2, k1)
		}
	})
}

// FuzzFirstOf: a header when producers set it, the body field otherwise.
// The key is the first alternative's key that has one; ErrNoKey only when
// none has.
func FuzzFirstOf(f *testing.F) {
	f.Add("ORDER-1", []byte(`{"order_id":"ORDER-2"}`))
	f.Add("", []byte(`{"order_id":"ORDER-2"}`))
	f.Add(" ", []byte(`{"order_id":7}`))
	f.Add("", []byte(`{"order_id":null}`))
	f.Add("", []byte(`not json`))
	f.Add("\xff", []byte("{\"order_id\":\"\xff\"}"))
	f.Add("", []byte(snsEnvelope(`{"order_id":"ORDER-3"}`)))
	header, body := keyfuncs.Metadata("order_id"), keyfuncs.SNSEnvelope(keyfuncs.JSON("order_id"))
	kf := keyfuncs.FirstOf(header, body)
	f.Fuzz(func(t *testing.T, meta string, payload []byte) {
		m := withMetadata("order_id", meta)
		m.Payload = payload
		key, err := kf(m)
		checkKeyResult(t, key, err)
		hk, herr := header(m)
		bk, berr := body(m)
		switch {
		case herr == nil:
			if err != nil || key != hk {
				t.Fatalf("FirstOf = %q, %v; want the header's %q", key, err, hk)
			}
		case berr == nil:
			if err != nil || key != bk {
				t.Fatalf("FirstOf = %q, %v; want the body's %q", key, err, bk)
			}
		default:
			if err == nil {
				t.Fatalf("FirstOf found %q where no alternative did", key)
			}
		}
	})
}

// FuzzMiddlewareInput: any payload and metadata through the whole
// middleware on a MemoryStore. Either the handler runs once and the store
// holds one record (and a redelivery is a duplicate), or the error is a
// permanent, typed one, the handler is not called and the store is empty.
// Never a panic.
func FuzzMiddlewareInput(f *testing.F) {
	for _, in := range badInputs {
		f.Add([]byte(in.payload), in.metadata["order_id"])
	}
	f.Add([]byte(`{"order_id":"ORDER-1"}`), "")
	f.Add([]byte(`{}`), "ORDER-2")
	f.Add([]byte(`{"order_id":"`+fuzzUUID+`"}`), "")
	f.Fuzz(func(t *testing.T, payload []byte, meta string) {
		store := memstore.New(nil)
		calls := 0
		d := newDedup(t, dedup.Config{
			Store: store,
			Key:   keyfuncs.FirstOf(keyfuncs.Metadata("order_id"), keyfuncs.SNSEnvelope(keyfuncs.JSON("order_id"))),
			Scope: "fuzz",
		})
		h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			hc, ok := dedup.HeldClaimFromContext(msg.Context())
			if !ok {
				t.Fatalf("handler called without a claim")
			}
			key := strings.TrimPrefix(hc.Claim().Key, "fuzz:")
			if !utf8.ValidString(key) || len(key) > 1024 || key == fuzzUUID ||
				strings.TrimFunc(key, unicode.IsSpace) == "" {
				t.Fatalf("claimed an unusable key %q", key)
			}
			calls++
			return nil, nil
		})
		deliver := func() error {
			m := withMetadata("order_id", meta)
			m.Payload = payload
			_, err := h(m)
			return err
		}
		err := deliver()
		if err != nil {
			if !dedup.IsPermanent(err) || (!errors.Is(err, dedup.ErrNoKey) && !errors.Is(err, dedup.ErrTransportKey)) {
				t.Fatalf("error %v is not a typed permanent key error", err)
			}
			if calls != 0 || store.Len() != 0 {
				t.Fatalf("bad input: %d handler calls, %d records", calls, store.Len())
			}
			return
		}
		if calls != 1 || store.Len() != 1 {
			t.Fatalf("good input: %d handler calls, %d records; want 1 and 1", calls, store.Len())
		}
		if err := deliver(); err != nil || calls != 1 {
			t.Fatalf("redelivery: %v, %d handler calls; want a duplicate", err, calls)
		}
	})
}

func withMetadata(name, value string) *message.Message {
	m := message.NewMessage(fuzzUUID, nil)
	if value != "" {
		m.Metadata.Set(name, value)
	}
	return m
}
