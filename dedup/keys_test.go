package dedup_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// Issue 14, items 3 and 7: keys a store cannot hold (control characters:
// PostgreSQL refuses NUL as a retryable error, so the message came back
// forever) and keys equal to a transport id other than the Watermill UUID
// (the SQS or SNS MessageId, the Kafka partition/offset) are refused before
// the store is touched, the same way on every store. The rules of
// transport ids (the default metadata entries, Config.TransportIDs) are
// TestTakeKey's.
func TestUnusableAndTransportKeysAreRefused(t *testing.T) {
	withMeta := func(uuid, payload string, meta map[string]string) *message.Message {
		m := message.NewMessage(uuid, []byte(payload))
		for k, v := range meta {
			m.Metadata.Set(k, v)
		}
		return m
	}
	cases := []struct {
		name string
		key  keyfuncs.Func
		msg  *message.Message
		want error
	}{
		{"NUL in the key", keyfuncs.JSON("order_id"), withMeta("u1", `{"order_id":"ORDER\u0000-1"}`, nil), dedup.ErrNoKey},
		{"newline in the key", keyfuncs.JSON("order_id"), withMeta("u2", `{"order_id":"ORDER\n1"}`, nil), dedup.ErrNoKey},
		{"DEL in the key", keyfuncs.JSON("order_id"), withMeta("u3", `{"order_id":"ORDER\u007f1"}`, nil), dedup.ErrNoKey},
		{"C1 control in the key", keyfuncs.JSON("order_id"), withMeta("u4", `{"order_id":"ORDER\u00851"}`, nil), dedup.ErrNoKey},
		{"key is the SQS MessageId", keyfuncs.Metadata("sqs_message_id"),
			withMeta("u5", `{}`, map[string]string{"sqs_message_id": "0f3c-sqs-id"}), dedup.ErrTransportKey},
		{"key is the SNS envelope's MessageId", keyfuncs.SNSEnvelope(keyfuncs.JSON("event_id")),
			withMeta("u7", `{"Type":"Notification","MessageId":"9a8b-sns","TopicArn":"arn:aws:sns:us-east-1:1:orders","Message":"{\"event_id\":\"9a8b-sns\"}"}`, nil), dedup.ErrTransportKey},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			store := memstore.New(nil)
			called := false
			d := newDedup(t, dedup.Config{Store: store, Key: tc.key})
			_, err := d.Middleware(func(*message.Message) ([]*message.Message, error) { called = true; return nil, nil })(tc.msg)
			if !errors.Is(err, tc.want) || !dedup.IsPermanent(err) {
				t.Fatalf("got %v, want a permanent %v", err, tc.want)
			}
			if called || store.Len() != 0 {
				t.Fatalf("handler called %v, %d records: a refused key touched the store", called, store.Len())
			}
		})
	}
	// The same ids are fine as keys of other messages.
	store := memstore.New(nil)
	d := newDedup(t, dedup.Config{Store: store, Key: keyfuncs.JSON("order_id")})
	msg := withMeta("u9", `{"order_id":"ORDER-1"}`, map[string]string{"sqs_message_id": "0f3c-sqs-id"})
	if _, err := d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg); err != nil {
		t.Fatal(err)
	}
}
