package keyfuncs_test

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// show prints the key a key function takes from a message, or why it takes
// none (every such error wraps dedup.ErrNoKey, a permanent error).
func show(kf keyfuncs.Func, m *message.Message) {
	key, err := kf(m)
	if err != nil {
		fmt.Printf("ErrNoKey: %v (permanent: %v)\n", errors.Is(err, dedup.ErrNoKey), dedup.IsPermanent(err))
		fmt.Println(" ", err)
		return
	}
	fmt.Printf("key %q\n", key)
}

func ExampleJSON() {
	kf := keyfuncs.JSON("order.id")
	show(kf, message.NewMessage("uuid-1", []byte(`{"order":{"id":"ORDER-003","amount":150}}`)))
	show(kf, message.NewMessage("uuid-2", []byte(`{"order":{"id":12345678901234567890}}`)))
	show(kf, message.NewMessage("uuid-3", []byte(`{"order":{"amount":150}}`)))
	// A repeated member is read first-wins by gjson and last-wins by
	// encoding/json: refused rather than guessed.
	show(kf, message.NewMessage("uuid-4", []byte(`{"order":{"id":"ORDER-B","id":"ORDER-A"}}`)))
	// Output:
	// key "ORDER-003"
	// key "12345678901234567890"
	// ErrNoKey: true (permanent: true)
	//   dedup: no usable business key at json:order.id: missing (message uuid-3)
	// ErrNoKey: true (permanent: true)
	//   dedup: no usable business key at json:order.id: ambiguous: member "id" appears twice (message uuid-4)
}

func ExampleJSONString() {
	kf := keyfuncs.JSONString("order_id")
	show(kf, message.NewMessage("uuid-1", []byte(`{"order_id":"42"}`)))
	show(kf, message.NewMessage("uuid-2", []byte(`{"order_id":42}`)))
	// Output:
	// key "42"
	// ErrNoKey: true (permanent: true)
	//   dedup: no usable business key at json:order_id: wrong type: number, a string is expected (message uuid-2)
}

func ExampleMetadata() {
	kf := keyfuncs.Metadata("order_id")
	m := message.NewMessage("uuid-1", nil)
	m.Metadata.Set("order_id", "ORDER-003") // an SQS message attribute or a Kafka header
	show(kf, m)
	m = message.NewMessage("uuid-2", nil)
	m.Metadata.Set("order_id", "  ")
	show(kf, m)
	// Output:
	// key "ORDER-003"
	// ErrNoKey: true (permanent: true)
	//   dedup: no usable business key at metadata:order_id: empty value (message uuid-2)
}

func ExampleSNSEnvelope() {
	kf := keyfuncs.SNSEnvelope(keyfuncs.JSON("order_id"))
	envelope := `{"Type":"Notification","MessageId":"b1946ac9","TopicArn":"arn:aws:sns:us-east-1:000000000000:orders",` +
		`"Message":"{\"order_id\":\"ORDER-003\"}"}`
	show(kf, message.NewMessage("uuid-1", []byte(envelope)))
	// Raw message delivery: the payload is the message itself.
	show(kf, message.NewMessage("uuid-2", []byte(`{"order_id":"ORDER-004"}`)))
	show(kf, message.NewMessage("uuid-3", []byte(`{"Type":"Notification","TopicArn":"arn:x","Message":7}`)))
	// Output:
	// key "ORDER-003"
	// key "ORDER-004"
	// ErrNoKey: true (permanent: true)
	//   dedup: no usable business key at sns:Message: envelope without a string Message (message uuid-3)
}

func ExampleJoin() {
	// tenant (a header) + order id (the body), with an id prefix per system.
	kf := keyfuncs.Join("::", keyfuncs.Metadata("tenant"), keyfuncs.Prefix("shop-a/", keyfuncs.JSON("order_id")))
	m := message.NewMessage("uuid-1", []byte(`{"order_id":"ORDER-003"}`))
	m.Metadata.Set("tenant", "acme")
	show(kf, m)
	// Characters of the separator in a part are escaped, so that
	// ("acme:", "b") and ("acme", ":b") cannot share a key.
	m = message.NewMessage("uuid-2", []byte(`{"order_id":"ORDER-003"}`))
	m.Metadata.Set("tenant", "acme:")
	show(kf, m)
	// Any part's error is the error.
	show(kf, message.NewMessage("uuid-3", []byte(`{"order_id":"ORDER-003"}`)))
	// Output:
	// key "acme::shop-a/ORDER-003"
	// key "acme\\:::shop-a/ORDER-003"
	// ErrNoKey: true (permanent: true)
	//   dedup: no usable business key at metadata:tenant: missing (message uuid-3)
}

func ExampleFirstOf() {
	// The header when producers set it, the body field otherwise.
	kf := keyfuncs.FirstOf(keyfuncs.Metadata("order_id"), keyfuncs.JSON("order_id"))
	show(kf, message.NewMessage("uuid-1", []byte(`{"order_id":"ORDER-003"}`)))
	show(kf, message.NewMessage("uuid-2", []byte(`{}`)))
	// Output:
	// key "ORDER-003"
	// ErrNoKey: true (permanent: true)
	//   dedup: no usable business key at first-of: no alternative found a key (message uuid-2): dedup: no usable business key at metadata:order_id: missing (message uuid-2)
	// dedup: no usable business key at json:order_id: missing (message uuid-2)
}

// Two systems whose ids may coincide share one scope: a prefix per system
// keeps their keys apart.
func ExamplePrefix() {
	billing := keyfuncs.Prefix("billing/", keyfuncs.JSON("invoice_id"))
	shop := keyfuncs.Prefix("shop/", keyfuncs.JSON("order_id"))
	show(billing, message.NewMessage("uuid-1", []byte(`{"invoice_id":42}`)))
	show(shop, message.NewMessage("uuid-2", []byte(`{"order_id":42}`)))
	show(shop, message.NewMessage("uuid-3", []byte(`{"invoice_id":42}`))) // errors pass through
	// Output:
	// key "billing/42"
	// key "shop/42"
	// ErrNoKey: true (permanent: true)
	//   dedup: no usable business key at json:order_id: missing (message uuid-3)
}

// With Config.Fingerprint, a key reused for another payload is refused
// (dedup.ErrKeyReuse) instead of being taken for a duplicate. Metadata is
// not part of the fingerprint: brokers add their own to every copy.
func ExamplePayloadFingerprint() {
	first := message.NewMessage("uuid-1", []byte(`{"order_id":"ORDER-003","amount":150}`))
	copyOfFirst := message.NewMessage("uuid-2", []byte(`{"order_id":"ORDER-003","amount":150}`))
	copyOfFirst.Metadata.Set("sqs_message_id", "m-2")
	reused := message.NewMessage("uuid-3", []byte(`{"order_id":"ORDER-003","amount":999}`))
	a, _ := keyfuncs.PayloadFingerprint(first)
	b, _ := keyfuncs.PayloadFingerprint(copyOfFirst)
	c, _ := keyfuncs.PayloadFingerprint(reused)
	fmt.Println("copy:", a == b)
	fmt.Println("reused key:", a == c)
	fmt.Println(a) // sha256sum of the payload
	// Output:
	// copy: true
	// reused key: false
	// aa06a236b4284ca629d46ef89db0fd15c036a4259dd6faeac3d3dddcd9a8b95e
}
