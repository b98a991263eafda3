// Command quickstart is the README's Quick start, complete: a Watermill
// router whose "charge-orders" handler charges each order once, however
// many copies arrive, and sends a message without a usable key to a poison
// topic instead of retrying it forever. Ten copies of ORDER-003, each with
// a new message id, cause one charge. It needs a Redis 7 at REDIS_ADDR
// (default 127.0.0.1:6379) and leaves one key there,
// dedup:charge-orders:ORDER-003, for 24 hours: run it again within that
// time and nothing is charged.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis" // go-redis keeps its name
)

func main() {
	if err := run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

var charges, poisoned atomic.Int64

// chargeOrder is the effect that must happen once per order.
func chargeOrder(msg *message.Message) error {
	charges.Add(1)
	return nil
}

func run(ctx context.Context) error {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	logger := watermill.NewStdLogger(false, false) // info and errors, on stderr
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	var subscriber message.Subscriber = pubSub // your broker's: SQS, SNS, Kafka, ...
	var publisher message.Publisher = pubSub
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}

	// Outermost first: a panic becomes an error; a message that can never
	// succeed (no key, a key reused for another payload) goes to the poison
	// topic instead of coming back forever; other errors are retried with
	// a backoff before the message is nacked.
	poison, err := middleware.PoisonQueueWithFilter(publisher, "orders.poison", dedup.IsPermanent)
	if err != nil {
		return err
	}
	retry := middleware.Retry{
		MaxRetries: 3, InitialInterval: 100 * time.Millisecond, Multiplier: 2, Logger: logger,
		ShouldRetry: func(p middleware.RetryParams) bool { return !dedup.IsPermanent(p.Err) },
	}
	router.AddMiddleware(middleware.Recoverer, poison, retry.Middleware)

	store, err := dedupredis.New(ctx, dedupredis.Config{Client: redis.NewClient(&redis.Options{Addr: addr})})
	if err != nil {
		return err // unreachable, or older than Redis 7.0
	}
	d, err := dedup.New(dedup.Config{
		Store:     store,
		Key:       keyfuncs.JSON("order_id"), // the business key, never the message UUID
		Lease:     30 * time.Second,          // how long a crashed consumer holds a key
		Retention: 24 * time.Hour,            // how long a completed key suppresses copies
		Logger:    logger,
	})
	if err != nil {
		return err
	}
	charge := router.AddConsumerHandler("charge-orders", "orders", subscriber, chargeOrder)
	charge.AddMiddleware(d.Middleware) // this handler only, innermost
	router.AddConsumerHandler("read-poison", "orders.poison", subscriber, func(msg *message.Message) error {
		poisoned.Add(1) // in production: a queue someone reads, with an alert on its depth
		return nil
	})

	stopped := make(chan error, 1)
	go func() { stopped <- router.Run(ctx) }()
	defer router.Close()
	select {
	case <-router.Running():
	case err := <-stopped:
		return err
	}
	for range 10 { // a producer's retries, an SNS fan-out: new ids, one order
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"ORDER-003","amount":150}`))
		if err := pubSub.Publish("orders", msg); err != nil { // returns once acked
			return err
		}
	}
	typo := message.NewMessage(watermill.NewUUID(), []byte(`{"orderId":"ORDER-004","amount":90}`))
	if err := pubSub.Publish("orders", typo); err != nil {
		return err
	}
	fmt.Printf("10 copies of ORDER-003, %d charge(s); %d message(s) without a key on orders.poison\n",
		charges.Load(), poisoned.Load())
	return nil
}
