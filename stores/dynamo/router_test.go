package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/internal/storekit"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// TestRouterEndToEnd: a Watermill router on GoChannel, Watermill's
// Duplicator outside the dedup middleware (every delivery is handled
// twice), three copies of every order under different message ids,
// published concurrently, and two handlers sharing one scope (two replicas
// of one consumer, so they race for the same keys on dynalite). The first
// attempt at every fifth order fails before its effect, so its claim is
// released and the redelivery must run it. Effects == distinct orders.
func TestRouterEndToEnd(t *testing.T) {
	const distinct, copies = 20, 3
	scope := "charge-" + storekit.NewToken()[:12]
	store := newStore(t, dynamo.Config{})
	d, err := dedup.New(dedup.Config{
		Store: store,
		Key: func(msg *message.Message) (string, error) {
			if k := msg.Metadata.Get("order_id"); k != "" {
				return k, nil
			}
			return "", dedup.ErrNoKey
		},
		Scope: scope,
		Lease: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}

	var (
		mu       sync.Mutex
		effects  = map[string]int{}
		failed   = map[string]bool{}
		failures int
	)
	handler := func(msg *message.Message) error {
		id := msg.Metadata.Get("order_id")
		mu.Lock()
		defer mu.Unlock()
		var n int
		if _, err := fmt.Sscanf(id, "ORDER-%d", &n); err != nil {
			return err
		}
		if n%5 == 0 && !failed[id] {
			failed[id] = true
			failures++
			return errors.New("transient failure before the effect")
		}
		effects[id]++
		return nil
	}

	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(middleware.Duplicator, d.Middleware) // first added = outermost
	router.AddConsumerHandler("replica-a", "orders", pubSub, handler)
	router.AddConsumerHandler("replica-b", "orders", pubSub, handler)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	// Run's error is kept and stopped closed when it returns, so the start
	// and the cleanup can both see it; both waits are bounded.
	var runErr error
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		runErr = router.Run(runCtx)
	}()
	t.Cleanup(func() {
		stop()
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

	var msgs []*message.Message
	for i := range distinct {
		for range copies {
			msg := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":150}`))
			msg.Metadata.Set("order_id", fmt.Sprintf("ORDER-%03d", i))
			msgs = append(msgs, msg)
		}
	}
	rand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })

	// Four concurrent publishers; each Publish returns once both replicas
	// acked the message (nacks, such as ErrInProgress, are redelivered).
	var wg sync.WaitGroup
	errs := make(chan error, len(msgs))
	next := make(chan *message.Message, len(msgs)) // buffered: sending never blocks the test
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for msg := range next {
				if err := pubSub.Publish("orders", msg); err != nil {
					errs <- err
				}
			}
		}()
	}
	for _, msg := range msgs {
		next <- msg
	}
	close(next)
	published := make(chan struct{})
	go func() { wg.Wait(); close(published) }()
	select {
	case <-published:
	case <-time.After(2 * time.Minute):
		t.Fatal("the publishers were not done within 2 minutes (each Publish returns once both replicas acked)")
	}
	close(errs)
	for err := range errs {
		t.Fatalf("Publish: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(effects) != distinct {
		t.Fatalf("%d orders had an effect, want %d: %v", len(effects), distinct, effects)
	}
	for id, n := range effects {
		if n != 1 {
			t.Fatalf("%s had %d effects, want 1 (all: %v)", id, n, effects)
		}
	}
	if failures != distinct/5 {
		t.Fatalf("%d injected failures, want %d: the release path was not exercised", failures, distinct/5)
	}
	for i := range distinct {
		key := admin.ScopedKey(scope, fmt.Sprintf("ORDER-%03d", i))
		if st := rawItem(t, key)["state"].(*types.AttributeValueMemberS).Value; st != "completed" {
			t.Fatalf("record of %s is %q, want completed", key, st)
		}
	}
	t.Logf("%d deliveries (x2 by the Duplicator, x2 replicas), %d orders, %d effects, %d failures retried",
		len(msgs), distinct, len(effects), failures)
}
