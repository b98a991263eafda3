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
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// Scenario 6, network faults: 3,000 messages whose keys are duplicated 1 to
// 5 times run through 4 consumer routers whose Redis clients all connect
// through an in-process TCP proxy (toxiproxy). Four times during the run
// the proxy adds 200ms (±50ms) of latency to every reply until 50 claims
// went through it, then resets every connection that sends data (RST) until
// the consumers saw at least 5 store errors, alternating the direction:
// client → server (the command is lost before Redis sees it) and
// server → client (Redis ran the command, its reply is lost). 10% of handler
// calls fail before their effect, so releases cross the faults too.
//
// go-redis retries a command after a network error (3 retries by default),
// so a lost reply is often followed by a second run of the same command:
// a claim recognises its own record (stores/redis outcomeOf) and is
// acquired; a Complete finds the record already completed by this claim
// and reports ErrClaimLost (ErrAlreadyCompleted), which the middleware logs
// as claim_lost although the record is right; the run counts those.
//
// Checks: every key's effect ran exactly once (no handler fails after its
// effect here), every message acked exactly once, and every store error
// of a claim came back from the middleware as an error (a nack), never as
// an ack.
func TestNetworkFaults(t *testing.T) { eachAutoPipeline(t, networkFaults) }

func networkFaults(t *testing.T, autoPipeline bool) {
	const (
		messages           = 3000
		maxCopies          = 5
		consumers          = 4
		partitionsPerGroup = 2
		partitions         = consumers * partitionsPerGroup
		publishers         = 16
		cycles             = 4
		seed               = 6
		limit              = 3 * time.Minute
	)
	prefix := uniquePrefix("netfault")
	admin := newRedisClient(t, redisServer.Addr)
	proxy := newFaultProxy(t, redisServer.Addr)

	wl := newWorkload(seed, messages, maxCopies, "")
	s := newSink()
	s.work = 2 * time.Millisecond
	plan := newFailurePlan(seed, 0.10, 0)
	tl := newTally()
	watch := newAckWatch(t)
	var retries, storeErrorsReturned atomic.Int64
	// nacked counts the store errors the middleware returned (nack).
	nacked := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if se := (*dedup.StoreError)(nil); errors.As(err, &se) {
				storeErrorsReturned.Add(1)
			}
			return out, err
		}
	}

	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	t.Cleanup(func() { _ = pubSub.Close() })
	for c := range consumers {
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
		if err != nil {
			t.Fatal(err)
		}
		d := newDedup(t, dedup.Config{
			Store:           newRedisStore(t, newRedisClient(t, proxy.Addr()), prefix, autoPipeline),
			Key:             keyfuncs.JSON("order_id"),
			Scope:           "charge-orders",
			Lease:           2 * time.Second,
			StoreTimeout:    2 * time.Second,
			CompleteRetries: 8,
			CompleteBackoff: 50 * time.Millisecond,
			Observer:        tl,
		})
		router.AddMiddleware(
			middleware.Retry{
				MaxRetries: 3, InitialInterval: 20 * time.Millisecond, MaxInterval: 500 * time.Millisecond,
				Multiplier: 2, RandomizationFactor: 0.5,
				OnRetryHook: func(int, time.Duration) { retries.Add(1) },
			}.Middleware,
			nacked,
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
				if err := pubSub.Publish(fmt.Sprint("orders-", i%partitions), wl.message(i)); err != nil {
					publishErrs <- err
					return
				}
			}
		}()
	}

	spikes, resets := 0, map[string]int{}
	for c := range cycles {
		at := (c + 1) * messages / (cycles + 2)
		if !waitUntil(t, limit, fmt.Sprintf("%d acks before fault cycle %d", at, c+1), func() bool { return watch.acked() >= at }) {
			break
		}
		proxy.add(t, "spike", "latency", "downstream", map[string]any{"latency": 200, "jitter": 50})
		claims := tl.op("claim")
		waitUntil(t, 15*time.Second, "claims through the latency spike", func() bool { return tl.op("claim") >= claims+50 })
		proxy.remove(t, "spike")
		spikes++

		stream := map[bool]string{true: "upstream", false: "downstream"}[c%2 == 0]
		proxy.add(t, "reset", "reset_peer", stream, map[string]any{"timeout": 0})
		errs := tl.storeErrors()
		waitUntil(t, 15*time.Second, "store errors from the resets", func() bool { return tl.storeErrors() >= errs+5 })
		proxy.remove(t, "reset")
		resets[stream]++
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
	effects, doubles, _ := s.verdict(t, wl.keys)
	completed := countCompleted(t, admin, prefix)
	deliveries, nacks := watch.counts()
	tl.mu.Lock()
	claimStoreErrors := tl.storeErrs["claim"]
	tl.mu.Unlock()
	s.mu.Lock()
	calls, failedBefore := s.calls, s.failBefore
	s.mu.Unlock()
	figures(t, "network-faults",
		"messages", messages, "keys", wl.distinct, "handler_calls", calls, "failed_before_effect", failedBefore,
		"effects", effects, "doubles", doubles, "latency_spikes", spikes,
		"reset_windows", fmt.Sprintf("[upstream=%d downstream=%d]", resets["upstream"], resets["downstream"]),
		"store_errors", tl.storeErrors(), "store_errors_by_op", fmt.Sprintf("[%s]", tl.storeErrorsByOp()),
		"store_errors_returned_as_nacks", storeErrorsReturned.Load(),
		"in_place_retries", retries.Load(), "redeliveries", nacks, "deliveries", deliveries,
		"claim_lost", fmt.Sprintf("[complete=%d release=%d extend=%d]", tl.event("claim_lost/complete"), tl.event("claim_lost/release"), tl.event("claim_lost/extend")),
		"lost_complete_replies_recognised", tl.lostCompleteReplies(), "in_progress_refusals", tl.event("in_progress"), "duplicates_acked", tl.event("skip_duplicate"),
		"go_redis_log_lines", clientLog.lines.Load()-logLines, "records_completed", completed,
		"elapsed", elapsed.Round(time.Millisecond))
	for _, e := range tl.errorSamples() {
		t.Logf("store error: %s", e)
	}

	if completed != wl.distinct {
		t.Errorf("%d completed records in Redis, want one per key: %d", completed, wl.distinct)
	}
	if claimStoreErrors == 0 || int64(claimStoreErrors) != storeErrorsReturned.Load() {
		t.Errorf("%d claim store errors, %d store errors returned by the middleware: every failed claim must be nacked", claimStoreErrors, storeErrorsReturned.Load())
	}
	if spikes != cycles || resets["upstream"]+resets["downstream"] != cycles {
		t.Errorf("%d latency spikes and %v reset windows, want %d of each", spikes, resets, cycles)
	}
}
