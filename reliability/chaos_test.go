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
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// Scenario 2, chaos run: 10,000 messages whose keys are duplicated 1 to 10
// times (shuffled, each copy with its own UUID) go through 4 consumer
// routers (each its own Redis client and Deduplicator, one scope) on
// GoChannel, 8 topics as partitions, 16 publishers each waiting for the ack
// of its message. 10% of handler calls fail before the effect, 10% after it.
// The redis-server the test owns is stopped (SIGTERM) and started again on
// the same port 3 times, at 25%, 50% and 75% of the run; it saves its data
// set on shutdown, as a production server with persistence does.
//
// What the middleware can protect against, and what it cannot:
//
//   - A failure before the effect: the claim is released, the redelivery
//     runs the effect. Exactly once.
//   - A failure after the effect: the effect happened, the handler reports
//     failure, the claim is released and the retry runs the effect again. No
//     dedup layer can tell this apart from a failure before the effect; only
//     an idempotent or transactional effect can (stores/postgres
//     TxMiddleware). The run counts these doubles and checks that they are
//     exactly one per call that failed after its effect, no more.
//
// So the checks are, for every key: exactly one handler call succeeded, and
// the effect ran 1 + (calls that failed after the effect) times; every
// message acked exactly once; the Redis outages surfaced as store errors
// (nacked and redelivered), never as acks without an effect; every key's
// record is completed and no claim was lost. The last needs a lease longer
// than the outages: with a 3s lease, a 2.4s outage on a loaded machine
// expired one claim in flight, whose Complete then found no record
// (claim_lost), leaving the key unprotected against a later copy.
func TestChaosRedisRestarts(t *testing.T) { eachAutoPipeline(t, chaosRedisRestarts) }

func chaosRedisRestarts(t *testing.T, autoPipeline bool) {
	const (
		messages           = 10000
		maxCopies          = 10
		consumers          = 4
		partitionsPerGroup = 2
		partitions         = consumers * partitionsPerGroup
		publishers         = 16
		restarts           = 3
		seed               = 20261130
		limit              = 4 * time.Minute
		lease              = 10 * time.Second
	)
	srv, err := testserver.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	admin := newRedisClient(t, srv.Addr)
	enablePersistence(t, admin)
	prefix := uniquePrefix("chaos")

	wl := newWorkload(seed, messages, maxCopies, "")
	s := newSink()
	s.work = 5 * time.Millisecond
	plan := newFailurePlan(seed, 0.10, 0.10)
	tl := newTally()
	logs := newLogCapture()
	watch := newAckWatch(t)
	var retries atomic.Int64

	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	t.Cleanup(func() { _ = pubSub.Close() })
	for c := range consumers {
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
		if err != nil {
			t.Fatal(err)
		}
		d := newDedup(t, dedup.Config{
			Store: newRedisStore(t, newRedisClient(t, srv.Addr), prefix, autoPipeline),
			Key:   keyfuncs.JSON("order_id"),
			Scope: "charge-orders",
			// The lease must outlast an outage: the server's clock keeps
			// running while it is down (expiry times survive in the saved
			// data set), so a claim in flight when Redis stops expires if
			// Redis is down for longer than what is left of its lease, and
			// its Complete then finds no record.
			Lease:        lease,
			StoreTimeout: 2 * time.Second,
			// Complete rides out an outage (50ms doubling, 12.75s in all)
			// instead of acking an effect whose record stayed in progress.
			CompleteRetries: 8,
			CompleteBackoff: 50 * time.Millisecond,
			Observer:        tl,
			Logger:          logs,
		})
		router.AddMiddleware(
			middleware.Retry{
				MaxRetries: 3, InitialInterval: 20 * time.Millisecond, MaxInterval: 500 * time.Millisecond,
				Multiplier: 2, RandomizationFactor: 0.5,
				OnRetryHook: func(int, time.Duration) { retries.Add(1) },
			}.Middleware,
			d.Middleware,
		)
		for p := range partitionsPerGroup {
			topic := fmt.Sprint("orders-", c*partitionsPerGroup+p)
			router.AddConsumerHandler("charge-"+topic, topic, watch.subscriber(pubSub), s.handler(plan))
		}
		runRouter(t, router)
	}

	start := time.Now()
	logLines := clientLog.lines.Load()
	var (
		next        atomic.Int64
		wg          sync.WaitGroup
		publishErrs = make(chan error, publishers)
	)
	for range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= messages {
					return
				}
				// Returns once the message is acked.
				if err := pubSub.Publish(fmt.Sprint("orders-", i%partitions), wl.message(i)); err != nil {
					publishErrs <- err
					return
				}
			}
		}()
	}

	var outages []time.Duration
	for r := 1; r <= restarts; r++ {
		at := r * messages / (restarts + 1)
		if !waitUntil(t, limit, fmt.Sprintf("%d acks before restart %d", at, r), func() bool { return watch.acked() >= at }) {
			break
		}
		down := time.Now()
		if err := srv.Stop(); err != nil {
			t.Fatal(err)
		}
		// Keep the server down for a second (long enough for claims,
		// completes and extensions in flight to hit it) and until the
		// consumers have felt it: one failed store operation, no more.
		// Waiting for 16 stretched an outage to 14 s on a busy machine (each
		// failing operation takes up to StoreTimeout while go-redis retries
		// its dials), longer than the lease and the Complete retries, which
		// then gave up and acked an effect whose record stayed in progress
		// (1810 of 1811 records completed).
		before := tl.storeErrors()
		waitUntil(t, 30*time.Second, "a store error during the outage", func() bool {
			return tl.storeErrors() > before && time.Since(down) >= time.Second
		})
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		outages = append(outages, time.Since(down).Round(time.Millisecond))
		enablePersistence(t, admin)
	}
	waitUntil(t, limit, "every message acked", func() bool { return watch.acked() >= messages })
	elapsed := time.Since(start)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Errorf("publishers still waiting for acks")
	}
	close(publishErrs)
	for err := range publishErrs {
		t.Error(err)
	}

	watch.checkEachAckedOnce(t, wl.uuids)
	effects, doubles, failedAfter := s.verdict(t, wl.keys)
	completed := countCompleted(t, admin, prefix)
	deliveries, nacks := watch.counts()
	s.mu.Lock()
	calls, failedBefore := s.calls, s.failBefore
	s.mu.Unlock()
	figures(t, "chaos",
		"messages", messages, "keys", wl.distinct, "handler_calls", calls,
		"failed_before_effect", failedBefore, "failed_after_effect", failedAfter,
		"effects", effects, "doubles", doubles, "doubles_not_from_failed_after", doubles-failedAfter,
		"in_place_retries", retries.Load(), "redeliveries", nacks, "deliveries", deliveries,
		"store_errors", tl.storeErrors(), "store_errors_by_op", fmt.Sprintf("[%s]", tl.storeErrorsByOp()),
		"claim_lost", fmt.Sprintf("[complete=%d release=%d extend=%d]", tl.event("claim_lost/complete"), tl.event("claim_lost/release"), tl.event("claim_lost/extend")),
		"lost_complete_replies_recognised", tl.lostCompleteReplies(), "in_progress_refusals", tl.event("in_progress"), "duplicates_acked", tl.event("skip_duplicate"),
		"go_redis_log_lines", clientLog.lines.Load()-logLines, "lease", lease, "restarts", len(outages), "outages", fmt.Sprint(outages), "records_completed", completed,
		"elapsed", elapsed.Round(time.Millisecond))
	for _, e := range tl.errorSamples() {
		t.Logf("store error: %s", e)
	}
	lost := logs.find(string(event.ClaimLost), "")
	for _, e := range lost {
		t.Logf("claim_lost (%s): %v", e.fields["op"], e.err)
	}

	if len(lost) != 0 {
		t.Errorf("%d claims lost (logged claim_lost): an outage outlasted a lease of %v", len(lost), lease)
	}
	if len(outages) != restarts {
		t.Errorf("%d restarts, want %d", len(outages), restarts)
	}
	if completed != wl.distinct {
		t.Errorf("%d completed records in Redis, want one per key: %d", completed, wl.distinct)
	}
	if failedBefore == 0 || failedAfter == 0 {
		t.Errorf("failures before (%d) and after (%d) the effect: both paths must be exercised", failedBefore, failedAfter)
	}
}

// enablePersistence makes the server save its data set on shutdown (it
// starts with --save ""), retrying while a restarted server is not yet
// reachable through the client.
func enablePersistence(t testing.TB, admin *goredis.Client) {
	t.Helper()
	waitFor(t, time.Minute, "CONFIG SET save", func() bool {
		return admin.ConfigSet(context.Background(), "save", "3600 1").Err() == nil
	})
}

// countCompleted returns how many records under prefix are completed.
func countCompleted(t testing.TB, admin *goredis.Client, prefix string) int {
	t.Helper()
	ctx := context.Background()
	keys, err := admin.Keys(ctx, escapeGlob(prefix)+"*").Result()
	if err != nil {
		t.Fatalf("KEYS: %v", err)
	}
	n := 0
	for i := 0; i < len(keys); i += 500 {
		vals, err := admin.MGet(ctx, keys[i:min(i+500, len(keys))]...).Result()
		if err != nil {
			t.Fatalf("MGET: %v", err)
		}
		for _, v := range vals {
			if s, ok := v.(string); ok && redisRecordState(s) == 'C' {
				n++
			}
		}
	}
	return n
}

// The limit the chaos run sizes its lease against, shown deterministically:
// a claim in flight when Redis stops is lost if Redis stays down longer
// than what is left of the lease. The server's clock keeps running while
// it is down (the saved data set keeps absolute expiry times), so the
// restarted server drops the record; the handler's Complete, retried after
// the restart, finds nothing (claim_lost at error level), and a copy
// delivered afterwards runs the effect a second time. The middleware's
// Complete backoff runs on a fake clock, so the retry happens exactly once
// the server is back.
func TestOutageLongerThanLeaseLosesTheClaim(t *testing.T) {
	eachAutoPipeline(t, outageLongerThanLeaseLosesTheClaim)
}

func outageLongerThanLeaseLosesTheClaim(t *testing.T, autoPipeline bool) {
	const lease = time.Second
	ctx := context.Background()
	srv, err := testserver.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	admin := newRedisClient(t, srv.Addr)
	enablePersistence(t, admin)
	prefix := uniquePrefix("outage")
	clock := fakeclock.New(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	logs, tl := newLogCapture(), newTally()
	d := newDedup(t, dedup.Config{
		Store: newRedisStore(t, newRedisClient(t, srv.Addr), prefix, autoPipeline), Key: keyfuncs.JSON("order_id"), Scope: "charge-orders",
		Lease: lease, CompleteRetries: 1, CompleteBackoff: time.Second, Clock: clock, Logger: logs, Observer: tl,
	})
	var effects atomic.Int64
	var stopErr error
	stopped := false
	h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		effects.Add(1)
		if !stopped { // the first delivery: Redis goes down for longer than the lease
			stopped = true
			stopErr = srv.Stop()
			time.Sleep(lease + 500*time.Millisecond) // the outage, on the server's clock
		}
		return nil, nil
	})
	payload := fmt.Sprintf(`{"order_id":"ORDER-%d"}`, time.Now().UnixNano())
	first := make(chan error, 1)
	go func() {
		_, err := h(message.NewMessage(watermill.NewUUID(), []byte(payload)))
		first <- err
	}()
	waitFor(t, time.Minute, "the first Complete to fail", func() bool {
		tl.mu.Lock()
		defer tl.mu.Unlock()
		return tl.storeErrs["complete"] >= 1
	})
	if stopErr != nil {
		t.Fatal(stopErr)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	// The Complete backoff's timer (the heartbeat holds one of its own
	// until Complete is acknowledged).
	if err := clock.WaitForTimerAt(wctx, clock.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if err := await(t, waitLimit, "the first delivery's return after the restart", first); err != nil {
		t.Fatalf("first delivery: %v, want an ack (the effect ran)", err)
	}
	// A copy of the same order, delivered later.
	if _, err := h(message.NewMessage(watermill.NewUUID(), []byte(payload))); err != nil {
		t.Fatalf("copy: %v", err)
	}
	lost := logs.find(string(event.ClaimLost), "complete")
	figures(t, "outage-longer-than-lease", "lease", lease, "outage", lease+500*time.Millisecond,
		"claim_lost_logged", len(lost), "effects", effects.Load())
	if len(lost) != 1 || lost[0].level != "error" || !errors.Is(lost[0].err, dedup.ErrClaimLost) {
		t.Errorf("the Complete after the restart: logged %+v, want one claim_lost at error level", lost)
	}
	if effects.Load() != 2 {
		t.Errorf("effects = %d, want 2: the record was gone, so the copy ran the effect again", effects.Load())
	}
}
