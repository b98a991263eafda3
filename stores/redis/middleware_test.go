package redis_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// The middleware end to end on a Watermill router and GoChannel, with
// middleware.Duplicator running every delivery twice: three handlers with
// the same scope all receive every copy of every message, some keys fail
// once (release, nack, redelivery), and each key's effect happens exactly
// once.
func TestMiddlewareEffectsEqualDistinctKeys(t *testing.T) {
	const (
		keys     = 30
		copies   = 3 // each key is published three times, with new UUIDs
		handlers = 3
	)
	store := newStore(t, newClient(t), redis.Config{KeyPrefix: fmt.Sprintf("dedup-e2e-%d:", time.Now().UnixNano())})
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dedup.New(dedup.Config{
		Store: store,
		Key: func(msg *message.Message) (string, error) {
			if k := msg.Metadata.Get("order_id"); k != "" {
				return k, nil
			}
			return "", &dedup.KeyError{Field: "metadata:order_id", Reason: "missing"}
		},
		Scope:       "charge-orders",
		Fingerprint: keyfuncs.PayloadFingerprint,
	})
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(middleware.Duplicator, d.Middleware)

	var (
		mu       sync.Mutex
		effects  = map[string]int{}
		failures = map[string]int{}
	)
	for i := range handlers {
		router.AddConsumerHandler(fmt.Sprint("charge-", i), "orders", pubSub, func(msg *message.Message) error {
			key := msg.Metadata.Get("order_id")
			mu.Lock()
			defer mu.Unlock()
			if msg.Metadata.Get("flaky") == "yes" && failures[key] == 0 {
				failures[key]++
				return errors.New("payment provider timed out") // released, then redelivered
			}
			effects[key]++
			return nil
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Run's error is kept and stopped closed when it returns, so the start
	// and the cleanup can both see it; both waits are bounded.
	var runErr error
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		runErr = router.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-stopped:
			if runErr != nil {
				t.Errorf("router: %v", runErr)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("router did not stop within 30s of the end of the test")
		}
	})
	select {
	case <-router.Running():
	case <-stopped:
		t.Fatalf("router stopped at once: %v", runErr)
	case <-time.After(30 * time.Second):
		t.Fatal("router did not start within 30s")
	}

	var (
		wg      sync.WaitGroup
		pubErrs = make(chan error, copies)
	)
	for range copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range keys {
				msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"order":%d,"amount":150}`, k)))
				msg.Metadata.Set("order_id", fmt.Sprintf("ORDER-%03d", k))
				if k%5 == 0 {
					msg.Metadata.Set("flaky", "yes")
				}
				// Returns once every handler acked the message.
				if err := pubSub.Publish("orders", msg); err != nil {
					pubErrs <- err
					return
				}
			}
		}()
	}
	published := make(chan struct{})
	go func() { wg.Wait(); close(published) }()
	select {
	case <-published:
	case <-time.After(2 * time.Minute):
		t.Fatal("the publishers were not done within 2 minutes (each Publish returns once every handler acked)")
	}
	close(pubErrs)
	for err := range pubErrs {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(effects) != keys {
		t.Fatalf("effects for %d keys, want %d", len(effects), keys)
	}
	for k, n := range effects {
		if n != 1 {
			t.Errorf("%s: effect ran %d times", k, n)
		}
	}
	if len(failures) == 0 {
		t.Fatalf("no handler failed: the release path was not exercised")
	}
}
