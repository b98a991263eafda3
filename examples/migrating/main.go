// Command migrating is the router of docs/migrating-from-deduplicator.md
// after the move from Watermill's middleware.Deduplicator: the same key
// (the order_id metadata field) and window (one hour), now claimed by the
// dedup middleware on the handler that charges, with the Quick start's
// poison queue read by a handler of the same router. Ten copies of
// ORDER-003 and one message without order_id go through it: one charge,
// one message on orders.poison. With -shadow (the first deployment) every
// message runs the handler, and the log says what enforcing would change.
// The store is in process, as Watermill's map was: swap in stores/redis,
// stores/dynamo or stores/postgres to share records between replicas.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

func main() {
	shadow := flag.Bool("shadow", false, "run the handler for every message and log what dedup would skip or refuse")
	flag.Parse()
	if err := run(context.Background(), *shadow); err != nil {
		log.Fatal(err)
	}
}

var charges, poisoned atomic.Int64

// chargeOrder is the effect that must happen once per order.
func chargeOrder(msg *message.Message) error {
	charges.Add(1)
	return nil
}

// readPoison reads the poison topic. Its messages are the ones dedup
// refused, many without a key: it must not be deduplicated itself.
func readPoison(msg *message.Message) error {
	poisoned.Add(1) // in production: a queue someone reads, with an alert on its depth
	return nil
}

func run(ctx context.Context, shadow bool) error {
	logger := watermill.NewStdLogger(false, false) // info and errors, on stderr
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	var subscriber message.Subscriber = pubSub // your broker's: SQS, SNS, Kafka, ...
	var publisher message.Publisher = pubSub
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}

	// The Quick start's router-wide middlewares: they suit every handler,
	// the poison topic's reader included.
	poison, err := middleware.PoisonQueueWithFilter(publisher, "orders.poison", dedup.IsPermanent)
	if err != nil {
		return err
	}
	retry := middleware.Retry{
		MaxRetries: 3, InitialInterval: 100 * time.Millisecond, Multiplier: 2, Logger: logger,
		ShouldRetry: func(p middleware.RetryParams) bool { return !dedup.IsPermanent(p.Err) },
	}
	router.AddMiddleware(middleware.Recoverer, poison, retry.Middleware)

	store, err := memory.New(ctx, memory.Config{})
	if err != nil {
		return err
	}
	d, err := dedup.New(dedup.Config{
		Store:     store,                         // memory.New(ctx, memory.Config{}) for one process, as before; Redis, DynamoDB, PostgreSQL to share
		Key:       keyfuncs.Metadata("order_id"), // was KeyFactory
		Retention: time.Hour,                     // was the repository's window
		Logger:    logger,                        // the router's: every decision, and in shadow mode what enforcing would change
		Shadow:    shadow,                        // true for the first deployment, then false: see "Moving a running consumer"
	})
	if err != nil {
		return err
	}
	charge := router.AddConsumerHandler("charge-orders", "orders", subscriber, chargeOrder)
	charge.AddMiddleware(d.Middleware) // this handler only: not router.AddMiddleware, which would deduplicate readPoison too
	router.AddConsumerHandler("read-poison", "orders.poison", subscriber, readPoison)

	stopped := make(chan error, 1)
	go func() { stopped <- router.Run(ctx) }()
	defer router.Close()
	select {
	case <-router.Running():
	case err := <-stopped:
		return err
	}
	for range 10 { // a producer's retries: new message ids, one order
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":150}`))
		msg.Metadata.Set("order_id", "ORDER-003")
		if err := pubSub.Publish("orders", msg); err != nil { // returns once acked
			return err
		}
	}
	typo := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":90}`))
	typo.Metadata.Set("orderId", "ORDER-004") // no order_id: no usable key
	if err := pubSub.Publish("orders", typo); err != nil {
		return err
	}
	fmt.Printf("10 copies of ORDER-003 and 1 message without order_id: %d charge(s); %d message(s) on orders.poison\n",
		charges.Load(), poisoned.Load())
	return nil
}
