package outbox_test

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres/outbox"
)

func TestConfigValidate(t *testing.T) {
	if err := (outbox.Config{}).Validate(); err != nil {
		t.Fatalf("zero Config: %v", err)
	}
	err := outbox.Config{Topic: "bad topic/" + strings.Repeat("x", 50), PollInterval: -time.Second}.Validate()
	for _, want := range []string{"only letters", "at most 45", "PollInterval"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want it to mention %q", err, want)
		}
	}
	if _, err := outbox.New(nil, outbox.Config{}); err == nil {
		t.Error("New without a DB succeeded")
	}
	ob, err := outbox.New(pool, outbox.Config{Topic: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.NewForwarder(gochannel.NewGoChannel(gochannel.Config{}, nil), forwarder.Config{ForwarderTopic: "b"}); err == nil {
		t.Error("NewForwarder accepted another ForwarderTopic")
	}
}

// TestNoTransaction: without TxMiddleware the handler does not run.
func TestNoTransaction(t *testing.T) {
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	called := false
	_, err = ob.Middleware(func(*message.Message) ([]*message.Message, error) { called = true; return nil, nil })(message.NewMessage("1", nil))
	if !errors.Is(err, outbox.ErrNoTransaction) || called {
		t.Fatalf("%v (handler called: %v), want ErrNoTransaction and no call", err, called)
	}
}

// TestNoTopic: a handler called outside a router (no publish topic) that
// returns messages fails with ErrNoTopic; its row is rolled back with the
// released key.
func TestNoTopic(t *testing.T) {
	ctx := testCtx(t)
	s := openShop(t, newSchema(t), true)
	d, err := dedup.New(dedup.Config{Store: s.store, Key: keyfuncs.Metadata("order_id"), Scope: chargeScope})
	if err != nil {
		t.Fatal(err)
	}
	h := d.Middleware(s.store.TxMiddleware(s.ob.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := postgres.TxFromContext(msg.Context())
		if _, err := tx.Exec(msg.Context(), "INSERT INTO "+s.orders+" (order_id) VALUES ('ORDER-1')"); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("ORDER-1"))}, nil
	})))
	msg := message.NewMessage(watermill.NewUUID(), nil)
	msg.Metadata.Set("order_id", "ORDER-1")
	msg.SetContext(ctx)
	if _, err := h(msg); !errors.Is(err, outbox.ErrNoTopic) {
		t.Fatalf("%v, want ErrNoTopic", err)
	}
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+s.orders).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if _, err := s.store.Inspect(ctx, admin.ScopedKey(chargeScope, "ORDER-1")); rows != 0 || !errors.Is(err, admin.ErrNotFound) {
		t.Fatalf("%d rows, key: %v; want 0 rows and the key released", rows, err)
	}
}

// TestOutboxRollsBackWithTheTransaction: on a real router, the first
// attempt writes its row and its event, then its key is evicted, so the
// completion in the transaction fails: row, event and completion roll back
// together and the message is redelivered. The second attempt commits. The
// forwarder delivers exactly one event.
func TestOutboxRollsBackWithTheTransaction(t *testing.T) {
	ctx := testCtx(t)
	s := openShop(t, newSchema(t), true)
	var attempts atomic.Int64
	goch, payments := runOnGoChannel(t, s, dedup.Config{}, func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := postgres.TxFromContext(msg.Context())
		id := msg.Metadata.Get("order_id")
		if _, err := tx.Exec(msg.Context(), "INSERT INTO "+s.orders+" (order_id) VALUES ($1)", id); err != nil {
			return nil, err
		}
		if attempts.Add(1) == 1 { // an operator evicts the key while the first attempt runs
			if _, err := s.store.Evict(msg.Context(), admin.ScopedKey(chargeScope, id)); err != nil {
				return nil, err
			}
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(id))}, nil
	})

	order := message.NewMessage(watermill.NewUUID(), nil)
	order.Metadata.Set("order_id", "ORDER-1")
	if err := goch.Publish(ordersTopic, order); err != nil { // returns once acked
		t.Fatal(err)
	}
	select {
	case ev := <-payments:
		ev.Ack()
		if string(ev.Payload) != "ORDER-1" {
			t.Fatalf("event %q", ev.Payload)
		}
	case <-time.After(time.Minute):
		t.Fatal("no payment event within a minute")
	}
	var rows, outboxed int
	if err := pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+s.orders+"), (SELECT count(*) FROM "+
		strings.Replace(s.orders, `"orders"`, `"watermill_dedup_outbox"`, 1)+")").Scan(&rows, &outboxed); err != nil {
		t.Fatal(err)
	}
	if attempts.Load() != 2 || rows != 1 || outboxed != 1 {
		t.Fatalf("%d attempts, %d rows, %d outbox messages; want 2, 1, 1", attempts.Load(), rows, outboxed)
	}
}

// TestReplayWithOutbox: with the dedup middleware's Replay on, a duplicate
// publishes nothing: TxMiddleware saw no messages (the outbox took them),
// so the record holds none. One event in all, through the outbox.
func TestReplayWithOutbox(t *testing.T) {
	ctx := testCtx(t)
	s := openShop(t, newSchema(t), true)
	goch, payments := runOnGoChannel(t, s, dedup.Config{Replay: true}, func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(msg.Metadata.Get("order_id")))}, nil
	})
	var events atomic.Int64
	go func() {
		for ev := range payments {
			events.Add(1)
			ev.Ack()
		}
	}()
	for range 2 { // each Publish returns once the router acked the copy
		order := message.NewMessage(watermill.NewUUID(), nil)
		order.Metadata.Set("order_id", "ORDER-1")
		if err := goch.Publish(ordersTopic, order); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		n, err := s.ob.Pending(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 && events.Load() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for the outbox to deliver: %d pending, %d events", n, events.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := events.Load(); n != 1 {
		t.Fatalf("%d payment events, want 1", n)
	}
}

// runOnGoChannel runs handler on a Watermill router fed by a GoChannel
// (orders in, payments out), behind the dedup middleware (configured by
// cfg), TxMiddleware and the outbox, with the forwarder publishing to the
// same GoChannel, until the test ends. It returns the GoChannel and a
// subscription to the payments topic.
func runOnGoChannel(t *testing.T, s *shop, cfg dedup.Config, handler message.HandlerFunc) (*gochannel.GoChannel, <-chan *message.Message) {
	t.Helper()
	ctx := testCtx(t)
	logger := watermill.NopLogger{}
	goch := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store, cfg.Key, cfg.Scope = s.store, keyfuncs.Metadata("order_id"), chargeScope
	d, err := dedup.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(d.Middleware, s.store.TxMiddleware, s.ob.Middleware)
	router.AddHandler("charge", ordersTopic, goch, paymentsTopic, goch, handler)
	fwd, err := s.ob.NewForwarder(goch, forwarder.Config{CloseTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	payments, err := goch.Subscribe(ctx, paymentsTopic)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = router.Run(ctx) }()
	go func() { _ = fwd.Run(ctx) }()
	t.Cleanup(func() { _ = router.Close(); _ = fwd.Close() })
	<-router.Running()
	return goch, payments
}
