package lab_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/lab"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// sharedConfig is the one dedup configuration of every end-to-end test
// below: the same value, store, key function and scope on every broker.
// Each test uses order ids of its own.
var sharedConfig dedup.Config

// decisions records every decision of sharedConfig's Deduplicators.
var decisions = &decisionLog{}

func setSharedConfig() error {
	client := goredis.NewClient(&goredis.Options{Addr: redisAddr})
	store, err := dedupredis.New(context.Background(), dedupredis.Config{Client: client, KeyPrefix: "lab-e2e:"})
	if err != nil {
		return err
	}
	sharedConfig = dedup.Config{
		Store:    store,
		Key:      keyfuncs.JSON("order_id"),
		Scope:    "charge-orders-e2e",
		Observer: decisions,
	}
	return nil
}

type decisionLog struct {
	mu  sync.Mutex
	all []dedup.Decision
}

func (l *decisionLog) ObserveDecision(d dedup.Decision) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, d)
}

func (l *decisionLog) ObserveStoreOp(string, time.Duration, error) {}

// count returns how many decisions of event were taken on keys containing
// part.
func (l *decisionLog) count(event event.Event, part string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, d := range l.all {
		if d.Event == event && strings.Contains(d.Key+" "+d.MessageUUID, part) {
			n++
		}
	}
	return n
}

// transportKeyRefused reports whether the message uuid was refused with
// ErrTransportKey.
func (l *decisionLog) transportKeyRefused(uuid string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range l.all {
		if d.Event == event.TransportKey && d.MessageUUID == uuid && errors.Is(d.Err, dedup.ErrTransportKey) {
			return true
		}
	}
	return false
}

// effects is the handler of the end-to-end tests: it charges each order
// and remembers which group member received and charged what.
type effects struct {
	mu       sync.Mutex
	charges  map[string]int
	byMember map[string]int
	fails    map[string]bool // orders whose next charge fails
	received map[string]int  // deliveries per member
	started  map[string]bool // members that received a message
	both     chan struct{}   // closed once both members began one
	calls    map[string]int  // handler calls per order
}

func newEffects() *effects {
	return &effects{charges: map[string]int{}, byMember: map[string]int{}, fails: map[string]bool{},
		received: map[string]int{}, started: map[string]bool{}, both: make(chan struct{}), calls: map[string]int{}}
}

// errDeclined is the payment gateway failing once.
var errDeclined = errors.New("payment gateway timed out")

// groupWait bounds how long a member waits for the other one to begin.
const groupWait = 60 * time.Second

func (e *effects) handle(msg *message.Message) error {
	order, err := keyfuncs.JSON("order_id")(msg)
	if err != nil {
		return err
	}
	member := message.HandlerNameFromCtx(msg.Context())
	e.mu.Lock()
	e.calls[order]++
	fail := e.fails[order]
	delete(e.fails, order)
	e.mu.Unlock()
	if fail {
		return errDeclined
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.charges[order]++
	e.byMember[member]++
	return nil
}

// arrive is the outermost middleware: it counts the deliveries of each
// member, and holds each member's first delivery until the other member
// received one too, so both members of the group take part whatever the
// scheduling.
func (e *effects) arrive(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		member := message.HandlerNameFromCtx(msg.Context())
		e.mu.Lock()
		e.received[member]++
		if !e.started[member] {
			e.started[member] = true
			if len(e.started) == 2 {
				close(e.both)
			}
		}
		e.mu.Unlock()
		select {
		case <-e.both:
		case <-time.After(groupWait):
			return nil, fmt.Errorf("%s: the other group member received nothing within %v", member, groupWait)
		}
		return h(msg)
	}
}

func (e *effects) snapshot(order string) (charges, calls int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.charges[order], e.calls[order]
}

// waitFor polls cond until it holds, failing after a minute with what and
// what state says.
func waitFor(t *testing.T, what string, cond func() bool, state ...func() string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			var s []string
			for _, f := range state {
				s = append(s, f())
			}
			t.Fatalf("waited a minute for %s %v", what, s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *effects) members() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := map[string]int{}
	for k, v := range e.byMember {
		m[k] = v
	}
	return m
}

func publishOrder(t *testing.T, tr *lab.Transport, uuid, order string) {
	t.Helper()
	msg := message.NewMessage(uuid, []byte(fmt.Sprintf(`{"order_id":%q,"amount":150}`, order)))
	if err := tr.Publisher.Publish(tr.Topic, msg); err != nil {
		t.Fatalf("publishing %s: %v", order, err)
	}
}

// checkEndToEnd runs, on one broker, with sharedConfig unchanged:
//   - a consumer group of two: 20 orders, 2 copies each, each charged once,
//     both members charging;
//   - a failed charge: claimed, released, nacked, redelivered by the
//     broker, claimed again and charged once;
//   - the same order published again after completion: skipped as a
//     duplicate, not charged;
//   - a message whose order id is its own transport id (the Watermill UUID
//     the adapter carries): refused with ErrTransportKey, sent to the
//     poison topic, never charged;
//
// and every message is acked (the broker holds none at the end).
func checkEndToEnd(t *testing.T, newTransport lab.NewTransportFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tr, err := newTransport(ctx, "e2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	if tr.Consumers != 2 {
		t.Fatalf("transport with %d consumers, want a group of 2", tr.Consumers)
	}
	e := newEffects()
	startGroup(t, ctx, tr, e)
	run := strings.ToLower(watermill.NewShortUUID())
	checkGroupOfTwo(t, tr, e, "G-"+run+"-")
	checkRedeliveryAfterRelease(t, tr, e, "F-"+run)
	checkDuplicateAfterCompletion(t, tr, e, "F-"+run)
	checkTransportIDRefused(t, tr, e)
	if tr.Pending != nil {
		waitFor(t, "the broker to hold no message", func() bool { n, err := tr.Pending(ctx); return err == nil && n == 0 })
	}
}

// startGroup runs a router with two handlers on tr (a group of two), behind
// the transport's middleware, e.arrive, a poison queue and a Deduplicator
// on sharedConfig, until the test ends.
func startGroup(t *testing.T, ctx context.Context, tr *lab.Transport, e *effects) {
	t.Helper()
	d, err := dedup.New(sharedConfig)
	if err != nil {
		t.Fatal(err)
	}
	poison, err := middleware.PoisonQueueWithFilter(tr.Publisher, tr.PoisonTopic, dedup.IsPermanent)
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(tr.Middleware...)
	router.AddMiddleware(e.arrive, poison, d.Middleware)
	for _, member := range []string{"member-1", "member-2"} {
		router.AddConsumerHandler(member, tr.Topic, tr.Subscriber, e.handle)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	t.Cleanup(func() {
		_ = router.Close()
		if err := <-runErr; err != nil {
			t.Errorf("router: %v", err)
		}
	})
	select {
	case <-router.Running():
	case <-time.After(time.Minute):
		t.Fatal("router not running after a minute")
	}
}

// checkGroupOfTwo: 20 orders, two copies each, shared by the two members:
// each order charged once, the other copy skipped, both members receiving.
func checkGroupOfTwo(t *testing.T, tr *lab.Transport, e *effects, prefix string) {
	t.Helper()
	const orders = 20
	for i := range orders {
		for range 2 {
			publishOrder(t, tr, watermill.NewUUID(), fmt.Sprintf("%s%02d", prefix, i))
		}
	}
	waitFor(t, "every group order charged and every copy skipped", func() bool {
		return decisions.count(event.ClaimWon, prefix) == orders && decisions.count(event.SkipDuplicate, prefix) == orders
	}, func() string {
		return fmt.Sprintf("claims won %d, skipped %d, in progress %d, released %d, charges per member %v",
			decisions.count(event.ClaimWon, prefix), decisions.count(event.SkipDuplicate, prefix),
			decisions.count(event.InProgress, prefix), decisions.count(event.Released, prefix), e.members())
	})
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := range orders {
		if n := e.charges[fmt.Sprintf("%s%02d", prefix, i)]; n != 1 {
			t.Errorf("order %d charged %d times", i, n)
		}
	}
	if e.received["member-1"] == 0 || e.received["member-2"] == 0 {
		t.Errorf("deliveries per member %v: both members should receive messages", e.received)
	}
	t.Logf("group of two: deliveries per member %v, charges per member %v, in progress (nacked, redelivered) %d",
		e.received, e.byMember, decisions.count(event.InProgress, prefix))
}

// checkRedeliveryAfterRelease: the first charge of order fails: claimed,
// released, nacked, redelivered by the broker, claimed again, charged once.
func checkRedeliveryAfterRelease(t *testing.T, tr *lab.Transport, e *effects, order string) {
	t.Helper()
	e.mu.Lock()
	e.fails[order] = true
	e.mu.Unlock()
	publishOrder(t, tr, watermill.NewUUID(), order)
	waitFor(t, "the failed order charged after its redelivery", func() bool { c, _ := e.snapshot(order); return c == 1 })
	_, calls := e.snapshot(order)
	if won, released := decisions.count(event.ClaimWon, order), decisions.count(event.Released, order); won != 2 || released != 1 || calls != 2 {
		t.Errorf("failed order: %d claims won, %d released, %d handler calls; want 2, 1, 2", won, released, calls)
	}
}

// checkDuplicateAfterCompletion: order published again once charged:
// skipped, the handler not called.
func checkDuplicateAfterCompletion(t *testing.T, tr *lab.Transport, e *effects, order string) {
	t.Helper()
	_, before := e.snapshot(order)
	publishOrder(t, tr, watermill.NewUUID(), order)
	waitFor(t, "the completed order's copy skipped", func() bool { return decisions.count(event.SkipDuplicate, order) == 1 })
	if c, calls := e.snapshot(order); c != 1 || calls != before {
		t.Errorf("after the duplicate: %d charges, %d handler calls; want 1, %d", c, calls, before)
	}
}

// checkTransportIDRefused: a message whose order id is its own transport
// id (the Watermill UUID the adapter carries across the broker) is refused
// with ErrTransportKey and never reaches the handler.
func checkTransportIDRefused(t *testing.T, tr *lab.Transport, e *effects) {
	t.Helper()
	uuid := watermill.NewUUID()
	publishOrder(t, tr, uuid, uuid)
	waitFor(t, "the key equal to the transport id refused", func() bool { return decisions.transportKeyRefused(uuid) })
	if _, calls := e.snapshot(uuid); calls != 0 {
		t.Errorf("a message keyed on its transport id reached the handler (%d calls)", calls)
	}
}

func TestEndToEndRedisStream(t *testing.T) {
	t.Parallel()
	checkEndToEnd(t, lab.RedisStream(newRedisClient, "lab-e2e-stream-", 2, nil))
}

func TestEndToEndNATS(t *testing.T) {
	t.Parallel()
	checkEndToEnd(t, lab.NATS(natsURL, 2, nil))
}

func TestEndToEndAMQP(t *testing.T) {
	t.Parallel()
	checkEndToEnd(t, lab.AMQP(amqpURL, 2, nil))
}
