package dedup_test

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
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// ledger counts effects per key and acks per message.
type ledger struct {
	mu      sync.Mutex
	effects map[string]int
	acked   map[string]bool
	nacks   int
	allDone chan struct{}
	want    int
}

func newLedger(wantAcks int) *ledger {
	return &ledger{effects: map[string]int{}, acked: map[string]bool{}, allDone: make(chan struct{}), want: wantAcks}
}

func (l *ledger) effect(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.effects[key]++
}

// middleware is the outermost middleware: it records what the router will
// ack or nack.
func (l *ledger) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		l.mu.Lock()
		defer l.mu.Unlock()
		if err != nil {
			l.nacks++
			return out, err
		}
		if l.acked[msg.UUID] {
			panic("message acked twice: " + msg.UUID)
		}
		l.acked[msg.UUID] = true
		if len(l.acked) == l.want {
			close(l.allDone)
		}
		return out, nil
	}
}

func (l *ledger) wait(t *testing.T) {
	t.Helper()
	select {
	case <-l.allDone:
	case <-time.After(60 * time.Second):
		l.mu.Lock()
		defer l.mu.Unlock()
		t.Fatalf("only %d of %d messages acked (nacks: %d)", len(l.acked), l.want, l.nacks)
	}
}

func startRouter(t *testing.T, pubSub *gochannel.GoChannel, setup func(r *message.Router)) {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	setup(r)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("router: %v", err)
			}
		case <-time.After(time.Minute):
			t.Errorf("router did not stop within a minute")
		}
	})
	recv(t, "the router to start", r.Running())
}

// orders returns copies of distinct orders (each 1–maxCopies times),
// shuffled, every copy with its own UUID.
func orders(n, maxCopies int, rng *rand.Rand) []*message.Message {
	var msgs []*message.Message
	for i := range n {
		id := fmt.Sprintf("ORDER-%04d", i)
		for range 1 + rng.IntN(maxCopies) {
			msgs = append(msgs, order(id))
		}
	}
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	return msgs
}

// TestRouterEveryEffectOnce: duplicate deliveries (Watermill's Duplicator),
// random handler failures (RandomFail, which fails before the effect) and
// concurrent copies; every order is charged exactly once and every message
// is acked.
func TestRouterEveryEffectOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	msgs := orders(200, 5, rng)
	led := newLedger(len(msgs))
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: int64(len(msgs))}, watermill.NopLogger{})
	d := newDedup(t, dedup.Config{Store: memstore.New(nil)})
	startRouter(t, pubSub, func(r *message.Router) {
		r.AddMiddleware(led.middleware, middleware.Duplicator, d.Middleware, middleware.RandomFail(0.2))
		r.AddConsumerHandler("charge", "orders", pubSub, func(m *message.Message) error {
			key, err := keyfuncs.JSON("order_id")(m)
			if err != nil {
				return err
			}
			led.effect(key)
			return nil
		})
	})
	if err := pubSub.Publish("orders", msgs...); err != nil {
		t.Fatal(err)
	}
	led.wait(t)
	led.mu.Lock()
	defer led.mu.Unlock()
	if len(led.effects) != 200 {
		t.Fatalf("%d orders charged, want 200", len(led.effects))
	}
	for k, n := range led.effects {
		if n != 1 {
			t.Fatalf("%s charged %d times", k, n)
		}
	}
	if led.nacks == 0 {
		t.Fatalf("no nacks: RandomFail never fired, the test proved nothing about retries")
	}
	t.Logf("%d messages, 200 orders, 200 charges, %d nacks retried", len(msgs), led.nacks)
}

// TestRouterScopesPerHandler: two handlers consuming the same topic each
// perform their effect once per order.
func TestRouterScopesPerHandler(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	msgs := orders(50, 4, rng)
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: int64(len(msgs))}, watermill.NopLogger{})
	charge, email := newLedger(len(msgs)), newLedger(len(msgs))
	// One store, one Deduplicator, no Scope: each handler's name scopes its keys.
	d, err := dedup.New(dedup.Config{Store: memstore.New(nil), Key: keyfuncs.JSON("order_id")})
	if err != nil {
		t.Fatal(err)
	}
	startRouter(t, pubSub, func(r *message.Router) {
		for name, led := range map[string]*ledger{"charge": charge, "email": email} {
			h := r.AddConsumerHandler(name, "orders", pubSub, func(m *message.Message) error {
				key, _ := keyfuncs.JSON("order_id")(m)
				led.effect(key)
				return nil
			})
			h.AddMiddleware(led.middleware, middleware.Duplicator, d.Middleware)
		}
	})
	if err := pubSub.Publish("orders", msgs...); err != nil {
		t.Fatal(err)
	}
	for name, led := range map[string]*ledger{"charge": charge, "email": email} {
		led.wait(t)
		led.mu.Lock()
		if len(led.effects) != 50 {
			t.Errorf("%s: %d orders, want 50", name, len(led.effects))
		}
		for k, n := range led.effects {
			if n != 1 {
				t.Errorf("%s: %s done %d times", name, k, n)
			}
		}
		led.mu.Unlock()
	}
}
