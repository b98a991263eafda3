package storetest

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

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// routerCases are the cases RunRouter runs, in order.
var routerCases = []suiteCase{
	{"RouterDuplicatesSkipped", TestRouterDuplicatesSkipped},
	{"RouterFailedHandlerRetried", TestRouterFailedHandlerRetried},
	{"RouterReplay", TestRouterReplay},
	{"RouterInProgressNacked", TestRouterInProgressNacked},
	{"RouterEffectInTransaction", TestRouterEffectInTransaction},
}

// RunRouter runs the middleware end to end on the store, through a real
// Watermill router on GoChannel, in parallel: copies of a message under new
// ids are skipped, a failing or panicking handler is retried after its
// claim is released, a duplicate replays the stored output, a copy that
// arrives while another consumer holds the key is nacked (never acked), and
// with Features.Transactions the effect commits with the record. Every
// wait is bounded and names what it waited for.
func RunRouter(t *testing.T, newStore Constructor, features Features) {
	t.Helper()
	runAll(t, routerCases, newStore, features)
}

// routerWait bounds every wait of a router case.
const routerWait = 2 * time.Minute

// routerEnv is a router case: its store, a GoChannel that blocks every
// Publish until each subscriber acked, and a router not yet running.
type routerEnv struct {
	*env
	pubSub *gochannel.GoChannel
	router *message.Router
}

func newRouterEnv(t *testing.T, name string, newStore Constructor, features Features) *routerEnv {
	t.Helper()
	e := newEnv(t, name, newStore, features)
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	t.Cleanup(func() { _ = pubSub.Close() })
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	return &routerEnv{env: e, pubSub: pubSub, router: router}
}

// orderKey is the business key of the router cases: the order_id metadata.
func orderKey(msg *message.Message) (string, error) {
	if id := msg.Metadata.Get("order_id"); id != "" {
		return id, nil
	}
	return "", &dedup.KeyError{Field: "metadata:order_id", Reason: "missing", MessageUUID: msg.UUID}
}

// deduplicator returns a Deduplicator on the case's store with orderKey and
// cfg's other fields.
func (r *routerEnv) deduplicator(cfg dedup.Config) *dedup.Deduplicator {
	r.t.Helper()
	cfg.Store, cfg.Key = r.store, orderKey
	if cfg.Lease == 0 {
		cfg.Lease = time.Minute
	}
	d, err := dedup.New(cfg)
	if err != nil {
		r.t.Fatalf("dedup.New: %v", err)
	}
	return d
}

// order returns a new delivery of orderID: a new message id every time, as
// a producer's retry or an SNS fan-out would give it.
func order(orderID string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"`+orderID+`","amount":150}`))
	msg.Metadata.Set("order_id", orderID)
	return msg
}

// orders returns copies deliveries of each of n orders, shuffled.
func orders(n, copies int) ([]*message.Message, []string) {
	var msgs []*message.Message
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("ORDER-%03d", i)
		for range copies {
			msgs = append(msgs, order(ids[i]))
		}
	}
	rand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	return msgs, ids
}

// run starts the router and stops it when the case ends; both waits are
// bounded.
func (r *routerEnv) run() {
	r.t.Helper()
	t := r.t
	ctx, cancel := context.WithCancel(context.Background())
	// Run's error is kept and stopped closed when it returns, so the start
	// and the cleanup can both see it.
	var runErr error
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		runErr = r.router.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-stopped:
			if runErr != nil {
				t.Errorf("router: %v", runErr)
			}
		case <-time.After(routerWait):
			t.Errorf("the router did not stop within %v of the end of the case", routerWait)
		}
	})
	select {
	case <-r.router.Running():
	case <-stopped:
		t.Fatalf("the router stopped at once: %v", runErr)
	case <-time.After(routerWait):
		t.Fatalf("the router did not start within %v", routerWait)
	}
}

// publish publishes msgs on topic from four goroutines and returns once
// every Publish returned, that is once every subscriber acked its copy
// (nacked copies are redelivered first).
func (r *routerEnv) publish(topic string, msgs []*message.Message) {
	r.t.Helper()
	next := make(chan *message.Message, len(msgs))
	for _, m := range msgs {
		next <- m
	}
	close(next)
	errs := make(chan error, len(msgs))
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for m := range next {
				if err := r.pubSub.Publish(topic, m); err != nil {
					errs <- err
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(routerWait):
		r.t.Fatalf("%d messages on %q were not all acked within %v (each Publish returns once every handler acked)", len(msgs), topic, routerWait)
	}
	close(errs)
	for err := range errs {
		r.t.Fatalf("Publish: %v", err)
	}
}

// effects counts the effects of each key, safe for concurrent handlers.
type effects struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *effects) add(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[key]++
	return c.n[key]
}

// expectOnce fails unless every id had exactly one effect, and no other key
// had any.
func (c *effects) expectOnce(t *testing.T, what string, ids []string) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.n) != len(ids) {
		t.Errorf("%s: effects for %d orders, want %d: %v", what, len(c.n), len(ids), c.n)
	}
	for _, id := range ids {
		if c.n[id] != 1 {
			t.Errorf("%s: %s had %d effects, want 1", what, id, c.n[id])
		}
	}
}

// expectCompleted fails unless the record of every id under scope is a
// completed record (a duplicate).
func (r *routerEnv) expectCompleted(scope string, ids []string) {
	r.t.Helper()
	for _, id := range ids {
		r.expect(admin.ScopedKey(scope, id), "", dedup.Duplicate)
	}
}

// TestRouterDuplicatesSkipped: Watermill's Duplicator outside the dedup
// middleware (every delivery is handled twice), three copies of every order
// under new message ids published concurrently, two replicas of one
// consumer sharing a scope (they race for the same keys), and a second
// consumer whose scope is its handler name (the default): each consumer's
// effect happens once per order, and their records stay apart. The charge
// consumer fingerprints payloads, so copies are compared byte for byte.
func TestRouterDuplicatesSkipped(t *testing.T, newStore Constructor, features Features) {
	r := newRouterEnv(t, "RouterDuplicatesSkipped", newStore, features)
	chargeScope, emailHandler := r.prefix+"charge", r.prefix+"email"
	charge := r.deduplicator(dedup.Config{Scope: chargeScope, Fingerprint: keyfuncs.PayloadFingerprint})
	email := r.deduplicator(dedup.Config{}) // scope: the handler's name
	var charges, emails effects
	for _, replica := range []string{"charge-a", "charge-b"} {
		h := r.router.AddConsumerHandler(r.prefix+replica, "orders", r.pubSub, func(msg *message.Message) error {
			charges.add(msg.Metadata.Get("order_id"))
			return nil
		})
		h.AddMiddleware(middleware.Duplicator, charge.Middleware)
	}
	h := r.router.AddConsumerHandler(emailHandler, "orders", r.pubSub, func(msg *message.Message) error {
		emails.add(msg.Metadata.Get("order_id"))
		return nil
	})
	h.AddMiddleware(middleware.Duplicator, email.Middleware)
	r.run()

	msgs, ids := orders(20, 3)
	r.publish("orders", msgs)
	charges.expectOnce(t, "charge (two replicas, one scope)", ids)
	emails.expectOnce(t, "email (scope: its handler name)", ids)
	r.expectCompleted(chargeScope, ids)
	r.expectCompleted(emailHandler, ids)
}

// TestRouterFailedHandlerRetried: a handler that fails, or panics, before
// its effect has its claim released, so the redelivery runs it at once (the
// lease is 10 minutes: a claim left in progress would hold the copy back
// past every wait of the case); copies published after the effect are
// skipped.
func TestRouterFailedHandlerRetried(t *testing.T, newStore Constructor, features Features) {
	r := newRouterEnv(t, "RouterFailedHandlerRetried", newStore, features)
	scope := r.prefix + "charge"
	d := r.deduplicator(dedup.Config{Scope: scope, Lease: 10 * time.Minute})
	var (
		charges          effects
		attempts         effects
		failures, panics int
		mu               sync.Mutex
	)
	h := r.router.AddConsumerHandler(r.prefix+"charge", "orders", r.pubSub, func(msg *message.Message) error {
		id := msg.Metadata.Get("order_id")
		var n int
		if _, err := fmt.Sscanf(id, "ORDER-%d", &n); err != nil {
			return err
		}
		if attempts.add(id) == 1 {
			mu.Lock()
			defer mu.Unlock()
			switch n % 3 {
			case 0:
				failures++
				return errors.New("payment provider timed out") // before the effect
			case 1:
				panics++
				panic("handler bug before the effect")
			}
		}
		charges.add(id)
		return nil
	})
	h.AddMiddleware(middleware.Recoverer, d.Middleware) // a panic is re-raised after the release
	r.run()

	msgs, ids := orders(12, 1)
	r.publish("orders", msgs)
	again, _ := orders(12, 1)
	r.publish("orders", again) // duplicates now
	charges.expectOnce(t, "charge", ids)
	mu.Lock()
	defer mu.Unlock()
	if failures != 4 || panics != 4 {
		t.Errorf("%d failures and %d panics, want 4 and 4: the release path was not exercised", failures, panics)
	}
	r.expectCompleted(scope, ids)
}

// TestRouterReplay: with Config.Replay, a duplicate returns the handler's
// stored output messages (payload and metadata), and the router publishes
// them again, so an output lost after the effect is not lost forever; the
// handler runs once.
func TestRouterReplay(t *testing.T, newStore Constructor, features Features) {
	r := newRouterEnv(t, "RouterReplay", newStore, features)
	d := r.deduplicator(dedup.Config{Scope: r.prefix + "charge", Replay: true})
	var charges effects
	h := r.router.AddHandler(r.prefix+"charge", "orders", r.pubSub, "receipts", r.pubSub, func(msg *message.Message) ([]*message.Message, error) {
		id := msg.Metadata.Get("order_id")
		n := charges.add(id)
		out := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf("receipt of %s, charge #%d", id, n)))
		out.Metadata.Set("order_id", id)
		out.Metadata.Set("receipt", "\x00binary\xff")
		return []*message.Message{out}, nil
	})
	h.AddMiddleware(d.Middleware)

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	receiptsCh, err := r.pubSub.Subscribe(ctx, "receipts")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		receipts []*message.Message
	)
	go func() {
		for m := range receiptsCh {
			mu.Lock()
			receipts = append(receipts, m)
			mu.Unlock()
			m.Ack()
		}
	}()
	r.run()

	for range 3 { // each Publish returns once the receipt was published and acked
		r.publish("orders", []*message.Message{order("ORDER-007")})
	}
	charges.expectOnce(t, "charge", []string{"ORDER-007"})
	mu.Lock()
	defer mu.Unlock()
	if len(receipts) != 3 {
		t.Fatalf("%d receipts published, want 3 (one output, two replays)", len(receipts))
	}
	for i, m := range receipts {
		if string(m.Payload) != "receipt of ORDER-007, charge #1" || m.Metadata.Get("order_id") != "ORDER-007" || m.Metadata.Get("receipt") != "\x00binary\xff" {
			t.Errorf("receipt %d = %q %v, want the first output again", i, m.Payload, m.Metadata)
		}
	}
}

// TestRouterInProgressNacked: while one replica runs the handler, the other
// replica's copy is refused with ErrInProgress and nacked, never acked (if
// the first consumer crashed, that copy would be all that is left); once
// the first completes, the redelivered copy is acked as a duplicate.
func TestRouterInProgressNacked(t *testing.T, newStore Constructor, features Features) {
	r := newRouterEnv(t, "RouterInProgressNacked", newStore, features)
	d := r.deduplicator(dedup.Config{Scope: r.prefix + "charge"})
	var (
		charges   effects
		entered   = make(chan struct{})
		release   = make(chan struct{})
		sawBusy   = make(chan struct{})
		enterOnce sync.Once
		busyOnce  sync.Once
	)
	for _, replica := range []string{"charge-a", "charge-b"} {
		h := r.router.AddConsumerHandler(r.prefix+replica, "orders", r.pubSub, func(msg *message.Message) error {
			enterOnce.Do(func() { close(entered) })
			select {
			case <-release:
			case <-time.After(routerWait):
				return errors.New("the test never released the handler")
			}
			charges.add(msg.Metadata.Get("order_id"))
			return nil
		})
		// Outside the dedup middleware: sees what it returns to the router.
		h.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := next(msg)
				if errors.Is(err, dedup.ErrInProgress) {
					busyOnce.Do(func() { close(sawBusy) })
					// Hold the nack until the first consumer may finish,
					// rather than spin through redeliveries meanwhile.
					select {
					case <-release:
					case <-time.After(routerWait):
					}
				}
				return out, err
			}
		}, d.Middleware)
	}
	r.run()

	published := make(chan error, 1)
	go func() { published <- r.pubSub.Publish("orders", order("ORDER-001")) }()
	for what, ch := range map[string]chan struct{}{"a handler to start": entered, "a copy refused as in progress": sawBusy} {
		select {
		case <-ch:
		case err := <-published:
			t.Fatalf("Publish returned (%v) before %s: the in-progress copy was acked", err, what)
		case <-time.After(routerWait):
			t.Fatalf("no %s within %v", what, routerWait)
		}
	}
	select {
	case err := <-published:
		t.Fatalf("Publish returned (%v) while the key was in progress: a copy was acked", err)
	default:
	}
	close(release)
	select {
	case err := <-published:
		if err != nil {
			t.Fatalf("Publish: %v", err)
		}
	case <-time.After(routerWait):
		t.Fatalf("the message was not acked by both replicas within %v of the release", routerWait)
	}
	charges.expectOnce(t, "charge", []string{"ORDER-001"})
	r.expectCompleted(r.prefix+"charge", []string{"ORDER-001"})
}

// TestRouterEffectInTransaction (needs Transactions): the handler writes its
// effect through the transaction the store's middleware opened inside the
// dedup middleware. When the handler fails after writing, the effect rolls
// back with the release and the redelivery writes it again; duplicates
// write nothing. Every order ends with exactly one committed effect, though
// the failing ones were written twice.
func TestRouterEffectInTransaction(t *testing.T, newStore Constructor, features Features) {
	tx := features.Transactions
	if tx == nil {
		t.Skip("storetest: Features.Transactions is not set: the store does not complete records in the handler's transaction")
	}
	if tx.Middleware == nil || tx.Effect == nil || tx.Effects == nil {
		t.Fatal("storetest: Features.Transactions needs Middleware, Effect and Effects")
	}
	r := newRouterEnv(t, "RouterEffectInTransaction", newStore, features)
	scope := r.prefix + "charge"
	d := r.deduplicator(dedup.Config{Scope: scope})
	var writes effects
	h := r.router.AddConsumerHandler(r.prefix+"charge", "orders", r.pubSub, func(msg *message.Message) error {
		id := msg.Metadata.Get("order_id")
		key := scope + "/" + id
		if err := tx.Effect(msg, key); err != nil {
			return err
		}
		var n int
		if _, err := fmt.Sscanf(id, "ORDER-%d", &n); err != nil {
			return err
		}
		if writes.add(id) == 1 && n%3 == 0 {
			return errors.New("failure after the effect was written") // rolled back
		}
		return nil
	})
	h.AddMiddleware(middleware.Duplicator, d.Middleware, tx.Middleware) // the first added is the outermost
	r.run()

	msgs, ids := orders(9, 3)
	r.publish("orders", msgs)
	for _, id := range ids {
		n, err := tx.Effects(r.ctx, scope+"/"+id)
		if err != nil {
			t.Fatalf("Effects(%s): %v", id, err)
		}
		if n != 1 {
			t.Errorf("%s has %d committed effects, want 1", id, n)
		}
	}
	writes.mu.Lock()
	rolledBack := 0
	for _, n := range writes.n {
		rolledBack += n - 1
	}
	writes.mu.Unlock()
	if rolledBack != 3 {
		t.Errorf("%d effects were written and rolled back, want 3 (one per failing order)", rolledBack)
	}
	r.expectCompleted(scope, ids)
}
