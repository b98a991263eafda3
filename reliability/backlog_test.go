package reliability_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// Scenario 10, Completes under a backlog across a Redis crash (issue 13,
// item 5): 2,000 keys, each delivered four times (copies with their own
// UUIDs, one to each of 4 consumers), every one of the 8,000 messages in
// flight at once, each redelivered at once until it is acked, as GoChannel
// does with a nacked message. The consumers are 4 Deduplicators, each with
// its own Redis client at go-redis' default options (a pool of 10 per
// CPU), sharing one redis-server with an append-only file fsynced on every
// write (--appendonly yes --appendfsync always). Once 100 effects ran (the
// handlers take 100ms), the server is killed (SIGKILL) and started again on
// the same port; it reloads every acknowledged write, with its absolute
// expiry times.
//
// The copies that find a key in progress are nacked and come straight back:
// thousands of new claims compete with the Completes of the handlers that
// finished for the clients' connections. Before the lease engine (commit
// 9525892) nothing bounded the claims in flight, and the heartbeat stopped
// before Complete: Completes queued behind the claim backlog, landed after
// the 5s lease, found the record gone, and the key's second copy ran its
// effect again. With the engine, claims are admitted MaxClaimsInFlight at a
// time and the lease is extended until Complete is acknowledged.
//
// The check is a count, not a timing: every key's effect ran exactly once
// (no handler fails here), and every message was acked.
func TestCompletesUnderBacklogAcrossRedisCrash(t *testing.T) {
	eachAutoPipeline(t, completesUnderBacklogAcrossRedisCrash)
}

func completesUnderBacklogAcrossRedisCrash(t *testing.T, autoPipeline bool) {
	const (
		keys      = 2000
		copies    = 4
		consumers = 4
		lease     = 5 * time.Second
		work      = 100 * time.Millisecond
		crashAt   = 100 // effects run before the crash
		limit     = 50 * time.Second
	)
	srv, err := testserver.StartRedisWithArgs("--appendonly", "yes", "--appendfsync", "always")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	prefix := uniquePrefix("backlog")
	tl := newTally()
	logs := newLogCapture()

	var (
		mu      sync.Mutex
		effects = make(map[string]int, keys)
		ran     atomic.Int64
		crash   = make(chan struct{})
		once    sync.Once
	)
	handler := func(msg *message.Message) ([]*message.Message, error) {
		key := msg.Metadata.Get("order_id")
		mu.Lock()
		effects[key]++
		mu.Unlock()
		if ran.Add(1) == crashAt {
			once.Do(func() { close(crash) })
		}
		time.Sleep(work) // the effect's call to a payment provider
		return nil, nil
	}
	var consumer [consumers]message.HandlerFunc
	for c := range consumers {
		d := newDedup(t, dedup.Config{
			Store: newRedisStore(t, defaultRedisClient(t, srv.Addr), prefix, autoPipeline),
			Key:   keyfuncs.JSON("order_id"),
			Scope: "charge-orders",
			Lease: lease,
			// Complete rides out the restart (50ms doubling, 12.75s in all).
			StoreTimeout:    2 * time.Second,
			CompleteRetries: 8,
			CompleteBackoff: 50 * time.Millisecond,
			Observer:        tl,
			Logger:          logs,
		})
		consumer[c] = d.Middleware(handler)
	}

	stop := make(chan struct{})
	var (
		wg                 sync.WaitGroup
		acked, deliveries  atomic.Int64
		nackedErrs         sync.Map // error class → count, for the figures
		start              = make(chan struct{})
		unacked            atomic.Int64
		inProgressRefusals atomic.Int64
	)
	unacked.Store(keys * copies)
	for k := range keys {
		orderID := fmt.Sprintf("ORDER-%06d", k)
		payload := []byte(fmt.Sprintf(`{"order_id":%q,"amount":150}`, orderID))
		for c := range copies {
			uuid := watermill.NewUUID()
			h := consumer[(k+c)%consumers]
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for {
					msg := message.NewMessage(uuid, payload)
					msg.Metadata.Set("order_id", orderID)
					deliveries.Add(1)
					_, err := h(msg)
					if err == nil {
						acked.Add(1)
						unacked.Add(-1)
						return
					}
					if errors.Is(err, dedup.ErrInProgress) {
						inProgressRefusals.Add(1)
					} else {
						v, _ := nackedErrs.LoadOrStore(errClass(err), new(atomic.Int64))
						v.(*atomic.Int64).Add(1)
					}
					select { // redelivered at once, as GoChannel does
					case <-stop:
						return
					default:
					}
				}
			}()
		}
	}
	began := time.Now()
	close(start)

	var crashedAt, downFor time.Duration
	select {
	case <-crash:
		crashedAt = time.Since(began)
		killed := time.Now()
		if err := srv.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(); err != nil {
			t.Fatalf("restarting redis-server: %v", err)
		}
		downFor = time.Since(killed)
	case <-time.After(limit):
		t.Errorf("%d of %d effects ran within %v: no crash", ran.Load(), crashAt, limit)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		t.Errorf("%d of %d messages still not acked after %v", unacked.Load(), keys*copies, limit)
	}
	close(stop)
	await(t, time.Minute, "the redelivery loop to stop", done)
	elapsed := time.Since(began)

	mu.Lock()
	doubled, missing, extra := 0, 0, 0
	for k := range keys {
		switch n := effects[fmt.Sprintf("ORDER-%06d", k)]; {
		case n == 0:
			missing++
		case n > 1:
			doubled++
			extra += n - 1
		}
	}
	mu.Unlock()
	var nacks []string
	nackedErrs.Range(func(k, v any) bool {
		nacks = append(nacks, fmt.Sprintf("%s=%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	figures(t, "completes-under-backlog",
		"keys", keys, "messages", keys*copies, "consumers", consumers, "lease", lease,
		"crash_after", crashedAt.Round(time.Millisecond), "redis_down_for", downFor.Round(time.Millisecond),
		"effects", ran.Load(), "keys_with_doubled_effect", doubled, "extra_effects", extra, "keys_without_effect", missing,
		"acked", acked.Load(), "deliveries", deliveries.Load(), "in_progress_refusals", inProgressRefusals.Load(),
		"other_nacks", fmt.Sprintf("%v", nacks),
		"claim_lost", fmt.Sprintf("[complete=%d release=%d extend=%d]", tl.event("claim_lost/complete"), tl.event("claim_lost/release"), tl.event("claim_lost/extend")),
		"store_errors_by_op", fmt.Sprintf("[%s]", tl.storeErrorsByOp()),
		"ops", fmt.Sprintf("[claim=%d complete=%d extend=%d]", tl.op("claim"), tl.op("complete"), tl.op("extend")),
		"elapsed", elapsed.Round(time.Millisecond))
	for _, e := range tl.errorSamples() {
		t.Logf("store error: %s", e)
	}
	for _, e := range logs.find(string(event.ClaimLost), "complete") {
		t.Logf("first claim_lost on complete: %v", e.err)
		break
	}
	if doubled != 0 || missing != 0 {
		t.Errorf("%d of %d keys had their effect run more than once (%d extra runs), %d never ran: want every key's effect exactly once",
			doubled, keys, extra, missing)
	}
	if acked.Load() != keys*copies {
		t.Errorf("%d of %d messages acked", acked.Load(), keys*copies)
	}
}

// errClass names an error returned by the middleware, for the figures.
func errClass(err error) string {
	var se *dedup.StoreError
	if errors.As(err, &se) {
		return "store_error/" + se.Op
	}
	return "other"
}

// defaultRedisClient returns a client of its own for addr with go-redis'
// default options, as an application configures it.
func defaultRedisClient(t testing.TB, addr string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
