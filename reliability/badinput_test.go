package reliability_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// snsEnvelope wraps inner as the Message of an SNS notification delivered to
// SQS without raw message delivery.
func snsEnvelope(inner string) string {
	b, _ := json.Marshal(inner)
	return `{"Type":"Notification","MessageId":"b1946ac9-sns","TopicArn":"arn:aws:sns:us-east-1:000000000000:orders",` +
		`"Message":` + string(b) + `,"Timestamp":"2026-11-30T12:00:00.000Z"}`
}

// badInput is one malformed message: its payload (and metadata), the key
// function the consumer uses, and the typed error it must give.
type badInput struct {
	name     string
	payload  string
	metadata map[string]string
	key      keyfuncs.Func // nil: SNSEnvelope(JSON("order_id")), which also takes raw payloads
	want     error
}

const badInputUUID = "0b7c1f2e-5d4a-4c43-9f0e-7a1d2c3b4a59"

var badInputs = []badInput{
	{name: "malformed JSON", payload: `{"order_id":"ORDER-1"`, want: dedup.ErrNoKey},
	{name: "empty payload", payload: ``, want: dedup.ErrNoKey},
	{name: "payload null", payload: `null`, want: dedup.ErrNoKey},
	{name: "missing key field", payload: `{"amount":150}`, want: dedup.ErrNoKey},
	{name: "key null", payload: `{"order_id":null}`, want: dedup.ErrNoKey},
	{name: "empty key", payload: `{"order_id":""}`, want: dedup.ErrNoKey},
	{name: "whitespace key", payload: `{"order_id":" \t\n\u00a0 "}`, want: dedup.ErrNoKey},
	{name: "10 KB key", payload: `{"order_id":"` + strings.Repeat("K", 10*1024) + `"}`, want: dedup.ErrNoKey},
	{name: "invalid UTF-8 in the payload", payload: "{\"order_id\":\"ORDER-\xff\"}", want: dedup.ErrNoKey},
	{name: "invalid UTF-8 in a metadata key", payload: `{}`, metadata: map[string]string{"order_id": "ORDER-\xfe"},
		key: keyfuncs.Metadata("order_id"), want: dedup.ErrNoKey},
	{name: "key equal to the message UUID", payload: `{"order_id":"` + badInputUUID + `"}`, want: dedup.ErrTransportKey},
	{name: "key equal to the message UUID, in metadata", payload: `{}`, metadata: map[string]string{"order_id": badInputUUID},
		key: keyfuncs.Metadata("order_id"), want: dedup.ErrTransportKey},
	{name: "integer where a string id is expected (JSONString)", payload: `{"order_id":42}`,
		key: keyfuncs.JSONString("order_id"), want: dedup.ErrNoKey},
	{name: "number with a fraction where a string id is expected", payload: `{"order_id":12.5}`, want: dedup.ErrNoKey},
	{name: "number with an exponent where a string id is expected", payload: `{"order_id":1e3}`, want: dedup.ErrNoKey},
	{name: "boolean id", payload: `{"order_id":true}`, want: dedup.ErrNoKey},
	{name: "object id", payload: `{"order_id":{"id":"ORDER-1"}}`, want: dedup.ErrNoKey},
	{name: "SNS envelope whose inner message is not JSON", payload: snsEnvelope("order ORDER-1 paid"), want: dedup.ErrNoKey},
	{name: "SNS envelope whose Message is not a string", payload: `{"Type":"Notification","TopicArn":"arn:aws:sns:us-east-1:0:orders","Message":42}`, want: dedup.ErrNoKey},
	{name: "key function panics", payload: `{"order_id":"ORDER-1"}`, key: func(*message.Message) (string, error) { panic("index out of range") }, want: dedup.ErrNoKey},
}

// Bad input: each malformed message of the table goes through a Watermill
// router (GoChannel) with PoisonQueueWithFilter(dedup.IsPermanent) in front
// of the dedup middleware. Each gives the typed error (errors.Is), logged as
// key_missing (transport_key for a transport id as key); the handler is never called; the store is untouched
// (inspected: no Redis key under the run's prefix, no MemoryStore record);
// the message lands on the poison topic, acked, with the error text in its
// "reason_poisoned" metadata.
func TestBadInputIsPoisonedAndTouchesNothing(t *testing.T) {
	for _, backend := range []string{"memory", "redis", "redis-autopipeline"} {
		t.Run(backend, func(t *testing.T) {
			var (
				store  dedup.Store
				stored func() int
			)
			switch backend {
			case "memory":
				m := memstore.New(nil)
				store, stored = m, m.Len
			case "redis", "redis-autopipeline":
				prefix := uniquePrefix("badinput")
				admin := newRedisClient(t, redisServer.Addr)
				store = newRedisStore(t, newRedisClient(t, redisServer.Addr), prefix, backend == "redis-autopipeline")
				stored = func() int { return scanCount(t, admin, prefix) }
			}
			runBadInputs(t, store, stored)
		})
	}
}

func runBadInputs(t *testing.T, store dedup.Store, stored func() int) {
	logger := watermill.NopLogger{}
	// The poison queue: its own GoChannel, whose Publish does not wait.
	poisonQueue := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, logger)
	t.Cleanup(func() { _ = poisonQueue.Close() })
	poisoned, err := poisonQueue.Subscribe(context.Background(), "orders.poison")
	if err != nil {
		t.Fatal(err)
	}
	poison, err := middleware.PoisonQueueWithFilter(poisonQueue, "orders.poison", dedup.IsPermanent)
	if err != nil {
		t.Fatal(err)
	}
	// The error the dedup middleware returned for the message in flight.
	var lastErr atomic.Pointer[error]
	record := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			lastErr.Store(&err)
			return out, err
		}
	}
	var calls atomic.Int64
	for i, in := range badInputs {
		t.Run(in.name, func(t *testing.T) {
			key := in.key
			if key == nil {
				key = keyfuncs.SNSEnvelope(keyfuncs.JSON("order_id"))
			}
			tl := newTally()
			d := newDedup(t, dedup.Config{Store: store, Key: key, Observer: tl})
			// A GoChannel of each case's own: a stopping router may close its
			// handlers' subscriber (watermill's handleClose closes it when the
			// router's close wins its race with the context's cancellation,
			// which a busy machine makes likely), so a GoChannel shared by
			// the cases' routers could be closed under the next case's router,
			// which then failed at start: "cannot subscribe topic orders-13:
			// Pub/Sub closed".
			pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
			t.Cleanup(func() { _ = pubSub.Close() })
			router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
			if err != nil {
				t.Fatal(err)
			}
			router.AddMiddleware(poison, record, d.Middleware)
			topic := fmt.Sprint("orders-", i)
			router.AddConsumerHandler("charge-orders", topic, pubSub, func(*message.Message) error {
				calls.Add(1)
				return nil
			})
			runRouter(t, router)

			msg := message.NewMessage(badInputUUID, []byte(in.payload))
			for k, v := range in.metadata {
				msg.Metadata.Set(k, v)
			}
			lastErr.Store(nil)
			if err := pubSub.Publish(topic, msg); err != nil { // returns once acked
				t.Fatal(err)
			}
			var got error
			if p := lastErr.Load(); p != nil {
				got = *p
			}
			if !errors.Is(got, in.want) {
				t.Errorf("error %v, want one matching %v", got, in.want)
			}
			if in.want == dedup.ErrNoKey && !errors.As(got, new(*dedup.KeyError)) {
				t.Errorf("error %v is not a *dedup.KeyError", got)
			}
			if !dedup.IsPermanent(got) {
				t.Errorf("error %v is not permanent", got)
			}
			if n := calls.Load(); n != 0 {
				t.Errorf("the handler was called %d times", n)
			}
			if n := stored(); n != 0 {
				t.Errorf("the store holds %d records after a bad message, want none", n)
			}
			// A transport id as key is its own event (transport_key).
			ev := string(event.KeyMissing)
			if in.want == dedup.ErrTransportKey {
				ev = string(event.TransportKey)
			}
			if ops := tl.op("claim") + tl.op("complete") + tl.op("release") + tl.op("extend"); tl.event(ev) != 1 || ops != 0 {
				t.Errorf("%d %s decisions, %d store operations; want 1 and none", tl.event(ev), ev, ops)
			}
			if got == nil {
				return // acked: nothing was poisoned (already reported above)
			}
			select {
			case p := <-poisoned:
				p.Ack()
				if p.UUID != badInputUUID || string(p.Payload) != in.payload {
					t.Errorf("poisoned message %s %q is not the bad message", p.UUID, p.Payload)
				}
				if got != nil && p.Metadata.Get(middleware.ReasonForPoisonedKey) != got.Error() {
					t.Errorf("reason_poisoned = %q, want the error %q", p.Metadata.Get(middleware.ReasonForPoisonedKey), got.Error())
				}
				if p.Metadata.Get(middleware.PoisonedTopicKey) != topic || p.Metadata.Get(middleware.PoisonedHandlerKey) != "charge-orders" {
					t.Errorf("poison metadata %v does not name the topic and handler", p.Metadata)
				}
				t.Logf("poisoned with reason %.160q", p.Metadata.Get(middleware.ReasonForPoisonedKey))
			case <-time.After(30 * time.Second):
				t.Errorf("nothing on the poison topic")
			}
		})
	}
	figures(t, "bad-input/"+strings.TrimPrefix(t.Name(), "TestBadInputIsPoisonedAndTouchesNothing/"),
		"cases", len(badInputs), "handler_calls", calls.Load(), "records_in_store", stored())
}

// An integer where a string id is expected is not an error:
// keyfuncs.JSON documents that 42 and "42" give the same key (large ids keep
// their digits), so both copies are one business fact and the second is a
// duplicate. Consumers that want a typed error for a numeric id use
// keyfuncs.JSONString (a row of the bad-input table); this test pins the
// lenient behaviour of keyfuncs.JSON.
func TestIntegerIDIsTheSameKeyAsItsString(t *testing.T) {
	store := memstore.New(nil)
	var calls atomic.Int64
	h := newDedup(t, dedup.Config{Store: store, Key: keyfuncs.JSON("order_id"), Scope: "charge-orders"}).
		Middleware(func(*message.Message) ([]*message.Message, error) { calls.Add(1); return nil, nil })
	for _, p := range []string{`{"order_id":9007199254740993}`, `{"order_id":"9007199254740993"}`} {
		if _, err := h(message.NewMessage(watermill.NewUUID(), []byte(p))); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	if calls.Load() != 1 || store.Len() != 1 {
		t.Errorf("handler calls %d, records %d; want 1 and 1 (one key, digits kept beyond float64 precision)", calls.Load(), store.Len())
	}
}
