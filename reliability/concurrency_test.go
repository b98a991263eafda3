package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// Scenario 1, concurrency: 1000 deliveries of one business key, each with
// its own message UUID, spread over 8 independent routers (each its own
// GoChannel, Deduplicator and store client, like 8 replicas of a consumer),
// all released at once by a barrier in front of the middleware. Exactly one
// delivery may run the effect. The winner holds its claim until the first
// attempt of every other delivery has been decided, so each of them meets a
// live claim: exactly 999 first attempts must be refused with ErrInProgress
// (nacked, not acked), and after the winner completes, every redelivery is
// acked as a duplicate. Every message is acked exactly once.
func TestConcurrencyOneKey(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) { runConcurrency(t, kind) })
	}
}

func runConcurrency(t *testing.T, kind storeKind) {
	const (
		routers    = 8
		perRouter  = 125
		deliveries = routers * perRouter
		limit      = 3 * time.Minute
	)
	open, recordState := kind.setup(t)
	key := fmt.Sprintf("ORDER-%d", time.Now().UnixNano())
	const handlerName = "charge-orders"
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()

	var (
		effects, entered, firstDone atomic.Int64
		firstRefused, firstStoreErr atomic.Int64
		firstOther                  atomic.Int64
		redeliveries                atomic.Int64
		arrived                     atomic.Int64
		allArrived                  = make(chan struct{})
		seen                        sync.Map // UUIDs whose first attempt began
		publishErrs                 = make(chan error, routers)
	)
	tl := newTally()
	watch := newAckWatch(t)

	// firstWave closes once the first attempt of every delivery returned.
	firstWave := make(chan struct{})
	var firstWaveOnce sync.Once

	// probe sits right outside the dedup middleware. On a delivery's first
	// attempt it waits at the barrier until all deliveries have arrived, and
	// counts how that attempt was decided.
	probe := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if _, again := seen.LoadOrStore(msg.UUID, true); again {
				return h(msg)
			}
			if arrived.Add(1) == deliveries {
				close(allArrived)
			}
			select {
			case <-allArrived:
			case <-ctx.Done():
				t.Errorf("barrier: only %d of %d deliveries arrived", arrived.Load(), deliveries)
			}
			out, err := h(msg)
			switch {
			case errors.Is(err, dedup.ErrInProgress):
				firstRefused.Add(1)
			case errors.As(err, new(*dedup.StoreError)):
				firstStoreErr.Add(1)
			case err != nil:
				firstOther.Add(1)
			}
			if firstDone.Add(1) == deliveries {
				firstWaveOnce.Do(func() { close(firstWave) })
			}
			return out, err
		}
	}
	// redeliver plays the broker: a nacked delivery comes back once the
	// first wave is over, as it would after a visibility timeout longer
	// than the first wave; if it is refused again it comes back after a
	// pause growing from 50ms to 1s.
	redeliver := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			pause := 50 * time.Millisecond
			for attempt := 0; ; attempt++ {
				out, err := h(msg)
				if err == nil {
					return out, nil
				}
				redeliveries.Add(1)
				select {
				case <-firstWave:
				case <-ctx.Done():
					return nil, err
				}
				if attempt > 0 {
					time.Sleep(pause)
					pause = min(2*pause, time.Second)
				}
			}
		}
	}
	// The effect. The winner keeps its claim until every other delivery's
	// first attempt has returned or reached the handler itself.
	handler := func(msg *message.Message) error {
		entered.Add(1)
		effects.Add(1)
		for entered.Load()+firstDone.Load() < deliveries {
			select {
			case <-ctx.Done():
				t.Errorf("handler: only %d first attempts decided", entered.Load()+firstDone.Load())
				return ctx.Err()
			case <-time.After(time.Millisecond):
			}
		}
		return nil
	}

	logger := watermill.NopLogger{}
	var pubs []*gochannel.GoChannel
	start := time.Now()
	for r := range routers {
		pubSub := gochannel.NewGoChannel(gochannel.Config{}, logger)
		pubs = append(pubs, pubSub)
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
		if err != nil {
			t.Fatal(err)
		}
		d := newDedup(t, dedup.Config{
			Store:    open(),
			Key:      keyfuncs.JSON("order_id"),
			Lease:    time.Minute,
			Observer: tl,
			// The 1000 claims queue up behind one another in the client
			// pools; dynalite serves a few dozen a second on a loaded
			// 2-core machine, so the default 5s would time them out.
			StoreTimeout: limit,
		})
		router.AddMiddleware(
			redeliver,
			probe,
			d.Middleware,
		)
		router.AddConsumerHandler(handlerName, fmt.Sprint("orders-", r), watch.subscriber(pubSub), handler)
		runRouter(t, router)
	}
	var wg sync.WaitGroup
	for r := range routers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perRouter {
				msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"order_id":%q}`, key)))
				if err := pubs[r].Publish(fmt.Sprint("orders-", r), msg); err != nil {
					publishErrs <- err
					return
				}
			}
		}()
	}
	awaitGroup(t, limit, "the publishers (each Publish returns once acked)", &wg)
	close(publishErrs)
	for err := range publishErrs {
		t.Fatal(err)
	}
	waitUntil(t, limit, "every delivery acked", func() bool { return watch.acked() >= deliveries })
	elapsed := time.Since(start)

	uuids := make([]string, 0, deliveries)
	seen.Range(func(u, _ any) bool {
		uuids = append(uuids, u.(string))
		return true
	})
	watch.checkEachAckedOnce(t, uuids)
	_, nacks := watch.counts()
	state := recordState(admin.ScopedKey(handlerName, key))
	figures(t, "concurrency/"+kind.name,
		"deliveries", deliveries, "routers", routers, "effects", effects.Load(),
		"claims_won", tl.event("claim_won"), "first_attempts_refused_in_progress", firstRefused.Load(),
		"in_progress_total", tl.event("in_progress"), "duplicates_acked", tl.event("skip_duplicate"),
		"redeliveries", redeliveries.Load(), "nacks_seen_by_broker", nacks,
		"store_errors", tl.storeErrorsByOp(), "arrived", arrived.Load(), "first_attempts_done", firstDone.Load(), "acked", watch.acked(), "record", state, "elapsed", elapsed.Round(time.Millisecond))

	for _, e := range tl.errorSamples() {
		t.Logf("store error: %s", e)
	}
	if n := effects.Load(); n != 1 {
		t.Errorf("the effect ran %d times for one key, want exactly 1", n)
	}
	if n := tl.event("claim_won"); n != 1 {
		t.Errorf("%d claims won, want 1", n)
	}
	if n := tl.event("completed"); n != 1 {
		t.Errorf("%d completions, want 1", n)
	}
	// Every first attempt but the winner's met the live claim. A store
	// error (nacked too) is tolerated and shown, but none is expected.
	if got := firstRefused.Load() + firstStoreErr.Load(); got != deliveries-1 || firstOther.Load() != 0 {
		t.Errorf("first attempts: %d refused with ErrInProgress, %d store errors, %d other errors; want %d refusals",
			firstRefused.Load(), firstStoreErr.Load(), firstOther.Load(), deliveries-1)
	}
	if n := tl.event("skip_duplicate"); n != deliveries-1 {
		t.Errorf("%d deliveries acked as duplicates, want %d", n, deliveries-1)
	}
	if state != "completed" {
		t.Errorf("record of the key: %s, want completed", state)
	}
}

// routerLimit bounds how long a router may take to start, and to stop once
// its context is cancelled: the scenarios' CloseTimeout (10s) and slack.
const routerLimit = 30 * time.Second

// runRouter runs router until the test ends. Both waits are bounded and
// name what they awaited: a router that does not start, or does not stop at
// the end of the test, fails it instead of hanging the suite. When Run fails
// at start the test stops at once, and the cleanup finds Run returned.
func runRouter(t testing.TB, router *message.Router) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var runErr error
	stopped := make(chan struct{}) // closed once Run returned runErr
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
		case <-time.After(routerLimit):
			t.Errorf("router did not stop within %v of the end of the test", routerLimit)
		}
	})
	select {
	case <-router.Running():
	case <-stopped:
		t.Fatalf("router stopped at once: %v", runErr)
	case <-time.After(routerLimit):
		t.Fatalf("router did not start within %v", routerLimit)
	}
}
