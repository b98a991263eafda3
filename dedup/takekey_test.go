package dedup_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// TestTakeKey states each rule of Config.TakeKey once: the key
// function's error classes, the transport ids, the fingerprint, and what
// it leaves in the Call. The entry points that call it (the middleware,
// lambdadedup) are tested end to end in their own tests.
func TestTakeKey(t *testing.T) {
	boom := errors.New("boom")
	noKey := &dedup.KeyError{Field: "json:order_id", Reason: "missing"}
	transportKey := errors.Join(dedup.ErrTransportKey, errors.New("the SNS MessageId"))
	metaKey := func(m *message.Message) (string, error) { return m.Metadata.Get("order_id"), nil }
	msg := func(uuid, order string, meta ...string) *message.Message {
		m := message.NewMessage(uuid, nil)
		m.Metadata.Set("order_id", order)
		for i := 0; i+1 < len(meta); i += 2 {
			m.Metadata.Set(meta[i], meta[i+1])
		}
		return m
	}
	type want struct {
		is          error  // errors.Is(err, is); nil: no error
		same        bool   // err is the key function's own error
		field       string // the *KeyError's Field, when err is one
		reason      string // in the *KeyError's Reason
		key         string // call.Key after the call
		fingerprint string
		messageID   string
	}
	cases := []struct {
		name string
		cfg  dedup.Config
		msg  *message.Message
		ids  []string
		want want
	}{
		{"a key", dedup.Config{Key: metaKey}, msg("u", "ORDER-1"), nil,
			want{key: "ORDER-1"}},
		{"a plain error is a KeyError", dedup.Config{Key: func(*message.Message) (string, error) { return "", boom }}, msg("u", ""), nil,
			want{is: boom, reason: "key function failed"}},
		{"a panic is a KeyError", dedup.Config{Key: func(*message.Message) (string, error) { panic("nil map") }}, msg("u", ""), nil,
			want{is: dedup.ErrNoKey, reason: "key function panicked: nil map"}},
		{"no key function is a KeyError", dedup.Config{}, msg("u", ""), nil,
			want{is: dedup.ErrNoKey, reason: "Config.Key is nil"}},
		{"ErrNoKey passes through", dedup.Config{Key: func(*message.Message) (string, error) { return "", noKey }}, msg("u", ""), nil,
			want{is: dedup.ErrNoKey, same: true}},
		{"ErrTransportKey passes through", dedup.Config{Key: func(*message.Message) (string, error) { return "", transportKey }}, msg("u", ""), nil,
			want{is: dedup.ErrTransportKey, same: true}},

		{"the UUID", dedup.Config{Key: metaKey}, msg("ORDER-1", "ORDER-1"), nil,
			want{is: dedup.ErrTransportKey}},
		{"an id given", dedup.Config{Key: metaKey}, msg("u", "ORDER-1"), []string{"seq-9", "ORDER-1"},
			want{is: dedup.ErrTransportKey}},
		{"sqs_message_id by default", dedup.Config{Key: metaKey}, msg("u", "m-1", "sqs_message_id", "m-1"), nil,
			want{is: dedup.ErrTransportKey}},
		{"MessageId by default", dedup.Config{Key: metaKey}, msg("u", "m-1", "MessageId", "m-1"), nil,
			want{is: dedup.ErrTransportKey}},
		{"message_id by default", dedup.Config{Key: metaKey}, msg("u", "m-1", "message_id", "m-1"), nil,
			want{is: dedup.ErrTransportKey}},
		{"sns_message_id by default", dedup.Config{Key: metaKey}, msg("u", "m-1", "sns_message_id", "m-1"), nil,
			want{is: dedup.ErrTransportKey}},
		{"one of TransportIDs", dedup.Config{Key: metaKey, TransportIDs: func(*message.Message) []string { return []string{"", "3/42"} }}, msg("u", "3/42"), nil,
			want{is: dedup.ErrTransportKey}},
		{"TransportIDs replace the default", dedup.Config{Key: metaKey, TransportIDs: func(*message.Message) []string { return nil }}, msg("u", "m-1", "sqs_message_id", "m-1"), nil,
			want{key: "m-1"}},
		{"a panic of TransportIDs is a KeyError", dedup.Config{Key: metaKey, TransportIDs: func(*message.Message) []string { panic("bug") }}, msg("u", "ORDER-1"), nil,
			want{is: dedup.ErrNoKey, field: "transport ids", reason: "TransportIDs panicked: bug"}},
		{"empty ids match nothing", dedup.Config{Key: func(*message.Message) (string, error) { return "", nil }}, msg("", "", "sqs_message_id", ""), []string{""},
			want{}},

		{"the message id: the first id given", dedup.Config{Key: metaKey}, msg("u", "ORDER-1", "sqs_message_id", "m-1"), []string{"", "seq-9"},
			want{key: "ORDER-1", messageID: "seq-9"}},
		{"the message id: the first of TransportIDs", dedup.Config{Key: metaKey, TransportIDs: func(*message.Message) []string { return []string{"", "3/42", "x"} }}, msg("u", "ORDER-1"), nil,
			want{key: "ORDER-1", messageID: "3/42"}},
		{"the message id: the first default entry", dedup.Config{Key: metaKey}, msg("u", "ORDER-1", "message_id", "m-2", "sqs_message_id", "m-1"), nil,
			want{key: "ORDER-1", messageID: "m-1"}},

		{"a fingerprint", dedup.Config{Key: metaKey, Fingerprint: keyfuncs.PayloadFingerprint}, msg("u", "ORDER-1"), nil,
			want{key: "ORDER-1", fingerprint: mustFingerprint(t, msg("u", "ORDER-1"))}},
		{"a fingerprint error is a KeyError", dedup.Config{Key: metaKey, Fingerprint: func(*message.Message) (string, error) { return "", boom }}, msg("u", "ORDER-1"), nil,
			want{is: boom, field: "fingerprint", reason: "fingerprint failed", key: "ORDER-1"}},
		{"a fingerprint panic is a KeyError", dedup.Config{Key: metaKey, Fingerprint: func(*message.Message) (string, error) { panic("bug") }}, msg("u", "ORDER-1"), nil,
			want{is: dedup.ErrNoKey, field: "fingerprint", reason: "fingerprint function panicked: bug", key: "ORDER-1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var call dedup.Call
			err := tc.cfg.TakeKey(&call, tc.msg, tc.ids...)
			w := tc.want
			switch {
			case w.is == nil && err != nil:
				t.Fatalf("TakeKey: %v", err)
			case w.is != nil && !errors.Is(err, w.is):
				t.Fatalf("TakeKey: %v, want an error matching %v", err, w.is)
			case w.is != nil && !dedup.IsPermanent(err):
				t.Errorf("%v is not permanent", err)
			}
			if call.Key != w.key || call.Fingerprint != w.fingerprint || call.MessageID != w.messageID {
				t.Errorf("call: key %q fingerprint %q message id %q, want %q %q %q", call.Key, call.Fingerprint, call.MessageID, w.key, w.fingerprint, w.messageID)
			}
			if err == nil {
				return
			}
			var ke *dedup.KeyError
			isKeyError := errors.As(err, &ke)
			switch {
			case w.same:
				if isKeyError && ke != noKey || !isKeyError && err != transportKey {
					t.Errorf("TakeKey: %#v, want the key function's own error", err)
				}
			case errors.Is(err, dedup.ErrTransportKey):
			case !isKeyError:
				t.Errorf("TakeKey: %#v, want a *dedup.KeyError", err)
			case ke.Field != w.field || !strings.Contains(ke.Reason, w.reason) || ke.MessageUUID != tc.msg.UUID:
				t.Errorf("KeyError %+v, want Field %q, Reason with %q, MessageUUID %q", ke, w.field, w.reason, tc.msg.UUID)
			}
		})
	}
}

// TestTakeKeyKeepsACallsMessageID: a MessageID the caller set (an SQS
// MessageId the Lambda adapter knows) stays.
func TestTakeKeyKeepsACallsMessageID(t *testing.T) {
	cfg := dedup.Config{Key: func(*message.Message) (string, error) { return "ORDER-1", nil }}
	m := message.NewMessage("u", nil)
	m.Metadata.Set("sqs_message_id", "m-1")
	call := dedup.Call{MessageID: "mine"}
	if err := cfg.TakeKey(&call, m, "seq-9"); err != nil || call.MessageID != "mine" {
		t.Fatalf("TakeKey: %v, message id %q, want %q", err, call.MessageID, "mine")
	}
}

// TestTakeKeyAllocatesNothing: taking a key allocates nothing of its own
// (the middleware's hot path; see BenchmarkMiddlewareOverhead).
func TestTakeKeyAllocatesNothing(t *testing.T) {
	cfg := dedup.Config{Key: func(m *message.Message) (string, error) { return m.Metadata.Get("order_id"), nil }}
	m := message.NewMessage("u", nil)
	m.Metadata.Set("order_id", "ORDER-1")
	m.Metadata.Set("sqs_message_id", "m-1")
	var call dedup.Call
	if n := testing.AllocsPerRun(100, func() {
		call = dedup.Call{}
		if err := cfg.TakeKey(&call, m); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations per key, want 0", n)
	}
}

func mustFingerprint(t *testing.T, m *message.Message) string {
	t.Helper()
	fp, err := keyfuncs.PayloadFingerprint(m)
	if err != nil {
		t.Fatal(err)
	}
	return fp
}
