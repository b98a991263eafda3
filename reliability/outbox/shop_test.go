package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/embedded"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/kafkabroker"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres/outbox"
)

// The shop consumes orders from Kafka ("orders"), charges each one (a row
// in its orders table, which has no unique constraint: only deduplication
// keeps one row per order) and produces a payment event per order, which
// reaches Kafka ("payments") through the outbox.
const (
	ordersTopic   = "orders"
	paymentsTopic = "payments"
	chargeScope   = "charge"
)

type shop struct {
	schema string
	store  *postgres.Store
	ob     *outbox.Outbox
	orders string // quoted table name
}

// openShop connects to the shop's tables in schema; create makes them.
func openShop(t testing.TB, schema string, create bool) *shop {
	t.Helper()
	ctx := testCtx(t)
	store, err := postgres.New(ctx, postgres.Config{DB: pool, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(pool, outbox.Config{Schema: schema, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s := &shop{schema: schema, store: store, ob: ob, orders: pgx.Identifier{schema, "orders"}.Sanitize()}
	if create {
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if err := ob.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "CREATE TABLE "+s.orders+" (id bigserial PRIMARY KEY, order_id text NOT NULL)"); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// hooks are the points where a test stops the shop.
type hooks struct {
	afterEffect   func(orderID string) // the order row is written, not committed
	beforePublish func()               // the forwarder is about to publish to Kafka
	afterPublish  func()               // Kafka accepted the event; the forwarder has not recorded it
}

// run runs the consumer router and the forwarder until ctx ends.
func (s *shop) run(ctx context.Context, k *kafkabroker.Kafka, lease time.Duration, h hooks) error {
	logger := watermill.NopLogger{}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Second}, logger)
	if err != nil {
		return err
	}
	d, err := dedup.New(dedup.Config{Store: s.store, Key: keyfuncs.Metadata("order_id"), Scope: chargeScope, Lease: lease})
	if err != nil {
		return err
	}
	router.AddMiddleware(d.Middleware, s.store.TxMiddleware, s.ob.Middleware)
	sub, err := k.Subscriber("charge", logger)
	if err != nil {
		return err
	}
	pub, err := k.Publisher(nil, logger)
	if err != nil {
		return err
	}
	router.AddHandler("charge", ordersTopic, sub, paymentsTopic, pub, func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := postgres.TxFromContext(msg.Context())
		if !ok {
			return nil, errors.New("no transaction")
		}
		id := msg.Metadata.Get("order_id")
		if _, err := tx.Exec(msg.Context(), "INSERT INTO "+s.orders+" (order_id) VALUES ($1)", id); err != nil {
			return nil, err
		}
		if h.afterEffect != nil {
			h.afterEffect(id)
		}
		event := message.NewMessage(watermill.NewUUID(), []byte(id))
		event.Metadata.Set("order_id", id)
		return []*message.Message{event}, nil
	})
	var out message.Publisher = pub
	if h.beforePublish != nil || h.afterPublish != nil {
		out = hookedPublisher{Publisher: pub, before: h.beforePublish, after: h.afterPublish}
	}
	fwd, err := s.ob.NewForwarder(out, forwarder.Config{CloseTimeout: time.Second})
	if err != nil {
		return err
	}
	go func() { _ = fwd.Run(ctx) }()
	return router.Run(ctx)
}

type hookedPublisher struct {
	message.Publisher
	before, after func()
}

func (p hookedPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.before != nil {
		p.before()
	}
	err := p.Publisher.Publish(topic, msgs...)
	if err == nil && p.after != nil {
		p.after()
	}
	return err
}

// publishOrders publishes one message per order id to the orders topic.
func publishOrders(t testing.TB, k *kafkabroker.Kafka, ids ...string) {
	t.Helper()
	pub, err := k.Publisher(nil, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pub.Close() }()
	for _, id := range ids {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"`+id+`"}`))
		msg.Metadata.Set("order_id", id)
		if err := pub.Publish(ordersTopic, msg); err != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
	}
}

// state is what the shop left: rows per order, the key's state per order,
// the outbox backlog and the payment events on Kafka per order.
type state struct {
	rows, events map[string]int
	keys         map[string]string
	eventTotal   int
	pending      int64
}

func (st state) String() string {
	return fmt.Sprintf("rows %v, keys %v, outbox pending %d, events on Kafka %v (%d)", st.rows, st.keys, st.pending, st.events, st.eventTotal)
}

func (s *shop) state(t testing.TB, k *kafkabroker.Kafka) state {
	t.Helper()
	ctx := testCtx(t)
	st := state{rows: map[string]int{}, events: map[string]int{}, keys: map[string]string{}}
	rows, err := pool.Query(ctx, "SELECT order_id, count(*) FROM "+s.orders+" GROUP BY order_id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		st.rows[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows, err = pool.Query(ctx, "SELECT business_key, state FROM "+s.store.Table()+" WHERE scope = $1", chargeScope)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, state string
		if err := rows.Scan(&id, &state); err != nil {
			t.Fatal(err)
		}
		st.keys[id] = state
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if st.pending, err = s.ob.Pending(ctx); err != nil {
		t.Fatal(err)
	}
	st.events, st.eventTotal = paymentEvents(t, k)
	return st
}

// paymentEvents reads every record of the payments topic (one partition)
// and counts them per order id.
func paymentEvents(t testing.TB, k *kafkabroker.Kafka) (map[string]int, int) {
	t.Helper()
	client, err := sarama.NewClient(k.Brokers, k.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Close() }()
	newest, err := client.GetOffset(paymentsTopic, 0, sarama.OffsetNewest)
	if err != nil {
		t.Fatal(err)
	}
	oldest, err := client.GetOffset(paymentsTopic, 0, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	events := map[string]int{}
	if newest == oldest {
		return events, 0
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = consumer.Close() }()
	pc, err := consumer.ConsumePartition(paymentsTopic, 0, oldest)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pc.Close() }()
	timeout := time.After(time.Minute)
	for i := oldest; i < newest; i++ {
		select {
		case m := <-pc.Messages():
			events[string(m.Value)]++
		case <-timeout:
			t.Fatalf("reading payment events: %d of %d read after a minute", i-oldest, newest-oldest)
		}
	}
	return events, int(newest - oldest)
}

// waitFor polls the shop's state until done says it is reached, for at
// most two minutes, and returns it.
func (s *shop) waitFor(t testing.TB, k *kafkabroker.Kafka, what string, done func(state) bool) state {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st := s.state(t, k)
		if done(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited two minutes for %s; last state: %v", what, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startKafka starts an in-process Kafka (kfake) in the test process, which
// survives the shop's kill, with the orders and payments topics.
func startKafka(t testing.TB) *kafkabroker.Kafka {
	t.Helper()
	cluster, err := embedded.StartKafka(1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	k := &kafkabroker.Kafka{Brokers: cluster.Addrs}
	for _, topic := range []string{ordersTopic, paymentsTopic} {
		if err := k.CreateTopic(testCtx(t), topic, 1); err != nil {
			t.Fatal(err)
		}
	}
	return k
}
