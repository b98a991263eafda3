package lambdadedup_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// A message handled in Lambda is a duplicate for a Watermill router on the
// same store and scope, and the other way round.
func TestSameRecordsAcrossRuntimes(t *testing.T) {
	stores := map[string]func(t *testing.T) dedup.Store{
		"redis": func(t *testing.T) dedup.Store {
			c := goredis.NewClient(&goredis.Options{Addr: redisAddr})
			t.Cleanup(func() { _ = c.Close() })
			s, err := dedupredis.New(context.Background(), dedupredis.Config{Client: c})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"dynamo": func(t *testing.T) dedup.Store {
			s, err := dynamo.New(context.Background(), dynamo.Config{Client: dynamoClient, Table: dynamoTable, SkipTTL: true})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			store := newStore(t)
			scope := "charge-orders-" + watermill.NewShortUUID()
			shared := dedup.Config{Store: store, Key: keyfuncs.JSON("order_id"), Scope: scope}
			c := newCharger()
			lh, err := lambdadedup.New(lambdadedup.Config{Dedup: shared}, c.handle)
			if err != nil {
				t.Fatal(err)
			}
			d, err := dedup.New(shared)
			if err != nil {
				t.Fatal(err)
			}

			// The router: GoChannel, the Watermill middleware, the same
			// handler function.
			pubsub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			routerCalls := make(chan string, 10)
			acked := make(chan string, 10)
			// Outermost: what the broker sees (a duplicate is acked too).
			router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
				return func(msg *message.Message) ([]*message.Message, error) {
					out, err := h(msg)
					if err == nil {
						id, _ := keyfuncs.JSON("order_id")(msg)
						acked <- id
					}
					return out, err
				}
			})
			router.AddMiddleware(d.Middleware)
			router.AddConsumerHandler("charge-orders", "orders", pubsub, func(msg *message.Message) error {
				id, _ := keyfuncs.JSON("order_id")(msg)
				routerCalls <- id
				return c.handle(msg)
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { _ = router.Run(ctx) }()
			defer func() { _ = router.Close() }()
			select {
			case <-router.Running():
			case <-time.After(time.Minute):
				t.Fatal("the router did not start within a minute")
			}
			publish := func(id string) {
				t.Helper()
				if err := pubsub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(order(id)))); err != nil {
					t.Fatal(err)
				}
				select {
				case got := <-acked:
					if got != id {
						t.Fatalf("router acked %s, want %s", got, id)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("timed out after 10s waiting for the router to ack %s", id)
				}
			}

			// Lambda first, then the router.
			if f := invoke(t, ctx, lh, record("sqs-1", order("ORDER-L"))); len(f) != 0 {
				t.Fatalf("lambda failures %v", f)
			}
			publish("ORDER-L")
			// The router first, then Lambda.
			publish("ORDER-R")
			if f := invoke(t, ctx, lh, record("sqs-2", order("ORDER-R"))); len(f) != 0 {
				t.Fatalf("lambda failures %v", f)
			}
			if c.charges["ORDER-L"] != 1 || c.charges["ORDER-R"] != 1 {
				t.Errorf("charges %v, want each order once across both runtimes", c.charges)
			}
			close(routerCalls)
			var calls []string
			for id := range routerCalls {
				calls = append(calls, id)
			}
			if fmt.Sprint(calls) != "[ORDER-R]" {
				t.Errorf("router handler calls %v, want [ORDER-R] (ORDER-L was a duplicate)", calls)
			}
		})
	}
}
