package outbox_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres/outbox"
)

// Three copies of one order: the charge row, the completed key and the
// payment event commit together once; the forwarder publishes the event.
// (GoChannel stands in for the broker; pool is a *pgxpool.Pool.)
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := "dedup_outbox_example_" + randomHex(4)
	_, _ = pool.Exec(ctx, "CREATE SCHEMA "+schema)
	defer func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") }()
	charges := pgx.Identifier{schema, "charges"}.Sanitize()
	_, _ = pool.Exec(ctx, "CREATE TABLE "+charges+" (order_id text NOT NULL)")

	store, err := postgres.New(ctx, postgres.Config{DB: pool, Schema: schema})
	if err != nil {
		panic(err)
	}
	ob, err := outbox.New(pool, outbox.Config{Schema: schema, PollInterval: 10 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		panic(err)
	}
	d, err := dedup.New(dedup.Config{Store: store, Key: keyfuncs.Metadata("order_id")})
	if err != nil {
		panic(err)
	}

	broker := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(d.Middleware, store.TxMiddleware, ob.Middleware)
	router.AddHandler("charge-orders", "orders", broker, "payments", broker, func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := postgres.TxFromContext(msg.Context())
		orderID := msg.Metadata.Get("order_id")
		if _, err := tx.Exec(msg.Context(), "INSERT INTO "+charges+" (order_id) VALUES ($1)", orderID); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("charged "+orderID))}, nil
	})
	fwd, err := ob.NewForwarder(broker, forwarder.Config{})
	if err != nil {
		panic(err)
	}
	payments, err := broker.Subscribe(ctx, "payments")
	if err != nil {
		panic(err)
	}
	go func() { _ = router.Run(ctx) }()
	go func() { _ = fwd.Run(ctx) }()
	defer func() { _ = router.Close(); _ = fwd.Close() }()
	<-router.Running()

	for range 3 { // three deliveries of ORDER-003, each with its own message id
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		msg.Metadata.Set("order_id", "ORDER-003")
		if err := broker.Publish("orders", msg); err != nil {
			panic(err)
		}
	}
	event := <-payments
	event.Ack()
	var n int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+charges).Scan(&n)
	fmt.Println("payment event:", string(event.Payload))
	fmt.Println("charges:", n)
	// Output:
	// payment event: charged ORDER-003
	// charges: 1
}
