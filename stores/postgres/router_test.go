package postgres_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
)

// TestRouterEndToEnd runs a Watermill router on GoChannel with the
// Duplicator middleware (every delivery is handled twice) and three copies
// of each order published under different message ids. Two handlers consume
// the topic with the same business key: "charge" writes the order row
// through TxMiddleware, "email" has an in-memory effect and only the store.
// Each handler's effects equal the number of distinct orders, and the two
// handlers' scopes (their names) keep their records apart.
func TestRouterEndToEnd(t *testing.T) {
	ctx := testCtx(t)
	o := newOrders(t)
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dedup.New(dedup.Config{Store: o.store, Key: orderKey, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(middleware.Duplicator, d.Middleware) // first added = outermost

	charge := router.AddConsumerHandler("charge", "orders", pubSub, func(msg *message.Message) error {
		return o.insert(msg)
	})
	charge.AddMiddleware(o.store.TxMiddleware) // inside the dedup middleware

	var (
		mu     sync.Mutex
		emails = map[string]int{}
	)
	router.AddConsumerHandler("email", "orders", pubSub, func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		emails[msg.Metadata.Get("order_id")]++
		return nil
	})

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

	const distinct, copies = 10, 3
	var msgs []*message.Message
	for i := range distinct {
		for range copies {
			msgs = append(msgs, delivery(context.Background(), fmt.Sprintf("ORDER-%03d", i)))
		}
	}
	rand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	for _, msg := range msgs { // returns once both handlers acked
		if err := pubSub.Publish("orders", msg); err != nil {
			t.Fatal(err)
		}
	}

	if rows := countRows(t, o.table); rows != distinct {
		t.Fatalf("%d order rows for %d distinct orders (%d deliveries)", rows, distinct, 2*len(msgs))
	}
	if calls := o.calls.Load(); calls != distinct {
		t.Fatalf("charge handler ran %d times, want %d", calls, distinct)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range distinct {
		id := fmt.Sprintf("ORDER-%03d", i)
		if emails[id] != 1 {
			t.Fatalf("email effects: %v, want one per order", emails)
		}
		if r, ok := readRecord(t, o.store, admin.ScopedKey("email", id)); !ok || r.State != "completed" {
			t.Fatalf("email record of %s: %+v %v", id, r, ok)
		}
		if r, ok := readRecord(t, o.store, admin.ScopedKey("charge", id)); !ok || r.State != "completed" {
			t.Fatalf("charge record of %s: %+v %v", id, r, ok)
		}
	}
}
