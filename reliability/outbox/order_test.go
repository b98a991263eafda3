package outbox_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// TestForwarderDeliversInTransactionOrder shows the order NewForwarder
// documents: watermill-sql orders the outbox by transaction id (assigned at
// a transaction's first write), not by commit, and holds back every message
// behind the oldest open transaction that wrote. Handler A writes its row
// first, then waits until handler B has committed; A commits last: A's
// event is still delivered first, and B's waited for A's COMMIT. (The doc
// said "in commit order".)
func TestForwarderDeliversInTransactionOrder(t *testing.T) {
	ctx := testCtx(t)
	s := openShop(t, newSchema(t), true)
	logger := watermill.NopLogger{}
	goch := gochannel.NewGoChannel(gochannel.Config{}, logger)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dedup.New(dedup.Config{Store: s.store, Key: keyfuncs.Metadata("order_id")})
	if err != nil {
		t.Fatal(err)
	}
	aWrote, bCommitted := make(chan struct{}), make(chan struct{})
	write := func(msg *message.Message) error {
		tx, _ := postgres.TxFromContext(msg.Context())
		_, err := tx.Exec(msg.Context(), "INSERT INTO "+s.orders+" (order_id) VALUES ($1)", msg.Metadata.Get("order_id"))
		return err
	}
	event := func(id string) []*message.Message {
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(id))}
	}
	ha := router.AddHandler("charge-a", "orders-a", goch, paymentsTopic, goch, func(msg *message.Message) ([]*message.Message, error) {
		if err := write(msg); err != nil {
			return nil, err
		}
		close(aWrote)
		<-bCommitted
		return event("A"), nil
	})
	ha.AddMiddleware(d.Middleware, s.store.TxMiddleware, s.ob.Middleware)
	hb := router.AddHandler("charge-b", "orders-b", goch, paymentsTopic, goch, func(msg *message.Message) ([]*message.Message, error) {
		<-aWrote
		if err := write(msg); err != nil {
			return nil, err
		}
		return event("B"), nil
	})
	committed := func(h message.HandlerFunc) message.HandlerFunc { // outermost: after B's COMMIT
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil {
				close(bCommitted)
			}
			return out, err
		}
	}
	hb.AddMiddleware(committed, d.Middleware, s.store.TxMiddleware, s.ob.Middleware)
	// The forwarder publishes to a GoChannel of its own that returns from
	// Publish only once the event is acked below: a GoChannel without
	// BlockPublishUntilSubscriberAck hands each message to its subscriber
	// on a goroutine of its own, so two events published in order could
	// reach the test in either order (it did, once, under load).
	out := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	fwd, err := s.ob.NewForwarder(out, forwarder.Config{CloseTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	payments, err := out.Subscribe(ctx, paymentsTopic)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = router.Run(ctx) }()
	go func() { _ = fwd.Run(ctx) }()
	t.Cleanup(func() { _ = router.Close(); _ = fwd.Close() })
	<-router.Running()

	for topic, id := range map[string]string{"orders-a": "ORDER-A", "orders-b": "ORDER-B"} {
		m := message.NewMessage(watermill.NewUUID(), nil)
		m.Metadata.Set("order_id", id)
		if err := goch.Publish(topic, m); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for len(got) < 2 {
		select {
		case ev := <-payments:
			ev.Ack()
			got = append(got, string(ev.Payload))
		case <-ctx.Done():
			t.Fatalf("events so far %v: %v", got, ctx.Err())
		}
	}
	if got[0] != "A" || got[1] != "B" {
		t.Fatalf("delivered %v; want [A B]: A's transaction wrote first (B committed first)", got)
	}
}
