package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// Ten copies of ORDER-003, each with its own message id, charge once.
func Example() {
	store, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		panic(err)
	}
	d, err := dedup.New(dedup.Config{
		Store: store, // a Redis, DynamoDB or PostgreSQL store in production
		Key:   keyfuncs.JSON("order_id"),
	})
	if err != nil {
		panic(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(d.Middleware)

	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	charges := 0
	router.AddConsumerHandler("charge-orders", "orders", pubSub, func(msg *message.Message) error {
		charges++ // the effect: charge the card
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case <-time.After(time.Minute):
		panic("the router did not start within a minute")
	}

	for range 10 {
		copyOfOrder := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"ORDER-003","amount":150}`))
		if err := pubSub.Publish("orders", copyOfOrder); err != nil {
			panic(err)
		}
	}
	_ = router.Close()
	fmt.Println("messages: 10, charges:", charges)
	// Output: messages: 10, charges: 1
}

// Permanent errors (no key, key reuse) go to a poison queue; everything else
// (in progress, store down, handler errors) is retried.
func ExampleIsPermanent() {
	store, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		panic(err)
	}
	d, err := dedup.New(dedup.Config{Store: store, Key: keyfuncs.JSON("order_id")})
	if err != nil {
		panic(err)
	}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	poisoned, err := pubSub.Subscribe(context.Background(), "orders.poison")
	if err != nil {
		panic(err)
	}
	poisonQueue, err := middleware.PoisonQueueWithFilter(pubSub, "orders.poison", dedup.IsPermanent)
	if err != nil {
		panic(err)
	}
	retry := middleware.Retry{
		MaxRetries:      5,
		InitialInterval: 10 * time.Millisecond,
		ShouldRetry:     func(p middleware.RetryParams) bool { return !dedup.IsPermanent(p.Err) },
	}

	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	// Outermost first: poison queue, then retry, then dedup.
	router.AddMiddleware(poisonQueue, retry.Middleware, d.Middleware)
	router.AddConsumerHandler("charge-orders", "orders", pubSub, func(msg *message.Message) error {
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case <-time.After(time.Minute):
		panic("the router did not start within a minute")
	}

	go func() {
		_ = pubSub.Publish("orders", message.NewMessage("msg-1", []byte(`{"amount":150}`)))
	}()
	var bad *message.Message
	select {
	case bad = <-poisoned:
	case <-time.After(time.Minute):
		panic("nothing reached the poison topic within a minute")
	}
	bad.Ack()
	_ = router.Close()
	fmt.Println(bad.Metadata.Get(middleware.ReasonForPoisonedKey))
	// Output:
	// dedup: no usable business key at json:order_id: missing (message msg-1)
}

// Plain Go, no router: run a function at most once per key. The second call
// with the same key does not run it and gets the stored result instead.
func ExampleEngine_Do() {
	ctx := context.Background()
	store, err := memory.New(ctx, memory.Config{})
	if err != nil {
		panic(err)
	}
	engine, err := dedup.NewEngine(dedup.Config{Store: store})
	if err != nil {
		panic(err)
	}
	charge := func(ctx context.Context) ([]byte, error) {
		fmt.Println("charging ORDER-003")
		return []byte("receipt-7"), nil // stored with the record
	}
	for range 2 {
		res, err := engine.Do(ctx, dedup.Call{Scope: "charge-orders", Key: "ORDER-003"}, charge)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: %s\n", res.Outcome, res.Result)
	}

	failing := func(ctx context.Context) ([]byte, error) { return nil, errors.New("card declined") }
	_, err = engine.Do(ctx, dedup.Call{Scope: "charge-orders", Key: "ORDER-004"}, failing)
	fmt.Println("error:", err) // released: a retry runs it again
	_, err = engine.Do(ctx, dedup.Call{Scope: "charge-orders", Key: "ORDER\x00-5"}, charge)
	fmt.Println("no key:", errors.Is(err, dedup.ErrNoKey))
	// Output:
	// charging ORDER-003
	// acquired: receipt-7
	// duplicate: receipt-7
	// error: card declined
	// no key: true
}
