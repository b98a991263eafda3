package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// Scenario 4, long handler: consumer A's handler runs 3s, three times its
// 1s lease, on a real redis-server (whose clock decides expiry, so the test
// waits in real time). Meanwhile the broker redelivers the same message to
// consumer B every 100ms (simulated, as an SQS visibility timeout shorter
// than the processing time would).
//
//   - heartbeat on (every 250ms): A's lease is extended while it works; B is
//     refused with ErrInProgress (nacked) until A completes, then acks its
//     copy as a duplicate. One effect.
//   - heartbeat off: A's record expires after 1s; B takes the key over and
//     runs the effect too. The engine cancels A's context at the lease
//     deadline, but this handler ignores it: two effects, the limit
//     README.md documents. A's
//     Complete then finds no record of its own (B's, or none: B has no
//     heartbeat either, so its record expired in turn) and reports
//     claim_lost at error level.
func TestLongHandler(t *testing.T) { eachAutoPipeline(t, longHandler) }

func longHandler(t *testing.T, autoPipeline bool) {
	t.Run("heartbeat-on", func(t *testing.T) { runLongHandler(t, false, autoPipeline) })
	t.Run("heartbeat-off", func(t *testing.T) { runLongHandler(t, true, autoPipeline) })
}

func runLongHandler(t *testing.T, disableHeartbeat, autoPipeline bool) {
	const (
		lease     = time.Second
		heartbeat = 250 * time.Millisecond
		work      = 3 * lease
	)
	prefix := uniquePrefix("long")
	payload := fmt.Sprintf(`{"order_id":"REPORT-%d"}`, time.Now().UnixNano())
	uuid := watermill.NewUUID()
	var effectsA, effectsB atomic.Int64
	consumer := func(logger *logCapture, tl *tally) deduplicator {
		cfg := dedup.Config{
			Store:            newRedisStore(t, newRedisClient(t, redisServer.Addr), prefix, autoPipeline),
			Key:              keyfuncs.JSON("order_id"),
			Scope:            "build-report",
			Lease:            lease,
			Heartbeat:        heartbeat,
			DisableHeartbeat: disableHeartbeat,
			Logger:           logger,
			Observer:         tl,
		}
		if disableHeartbeat {
			cfg.Heartbeat = 0 // refused together with DisableHeartbeat
		}
		return newDedup(t, cfg)
	}
	longHandler := func(effects *atomic.Int64, started chan<- time.Time) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if started != nil {
				started <- time.Now()
			}
			if disableHeartbeat {
				// A handler that ignores its context: the engine cancels it
				// at the lease deadline, but only a handler that listens
				// stops. This one shows the documented limit.
				time.Sleep(work)
			} else {
				select {
				case <-time.After(work): // the long work
				case <-msg.Context().Done():
					return nil, context.Cause(msg.Context())
				}
			}
			effects.Add(1)
			return nil, nil
		}
	}
	logA, logB := newLogCapture(), newLogCapture()
	tlA, tlB := newTally(), newTally()
	startedA, startedB := make(chan time.Time, 1), make(chan time.Time, 8)
	hA := consumer(logA, tlA).Middleware(longHandler(&effectsA, startedA))
	hB := consumer(logB, tlB).Middleware(longHandler(&effectsB, startedB))

	errA := make(chan error, 1)
	go func() {
		_, err := hA(message.NewMessage(uuid, []byte(payload)))
		errA <- err
	}()
	var claimedA time.Time
	select {
	case claimedA = <-startedA:
	case err := <-errA:
		t.Fatalf("consumer A returned before its handler ran: %v", err)
	case <-time.After(waitLimit):
		t.Fatalf("consumer A's handler did not start within %v", waitLimit)
	}

	refusals := 0
	var errB error
	for deadline := time.Now().Add(waitLimit); ; {
		_, errB = hB(message.NewMessage(uuid, []byte(payload)))
		if !errors.Is(errB, dedup.ErrInProgress) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer B still refused with ErrInProgress %v after A started (A's handler runs %v)", waitLimit, work)
		}
		refusals++
		time.Sleep(100 * time.Millisecond) // the simulated broker's redelivery delay
	}
	var takeover time.Duration
	select {
	case at := <-startedB:
		takeover = at.Sub(claimedA)
	default:
	}
	if err := await(t, waitLimit, "consumer A's return", errA); err != nil {
		t.Errorf("consumer A: %v, want an ack", err)
	}
	lostA := logA.find(string(event.ClaimLost), "complete")
	arm := map[bool]string{false: "heartbeat-on", true: "heartbeat-off"}[disableHeartbeat]
	figures(t, "long-handler/"+arm,
		"lease", lease, "handler", work, "heartbeat", map[bool]any{false: heartbeat, true: "off"}[disableHeartbeat],
		"extensions_by_A", tlA.op("extend"), "refusals_of_B", refusals,
		"takeover_by_B_after", takeover.Round(10*time.Millisecond),
		"effects", effectsA.Load()+effectsB.Load(), "claim_lost_logged_by_A", len(lostA),
		"claim_lost_logged_by_B", len(logB.find(string(event.ClaimLost), "complete")))
	for _, e := range append(lostA, logB.find(string(event.ClaimLost), "complete")...) {
		t.Logf("logged at %s level: %s: %v", e.level, e.msg, e.err)
	}

	if errB != nil {
		t.Errorf("consumer B's last delivery: %v, want an ack", errB)
	}
	if refusals == 0 {
		t.Errorf("consumer B was never refused while A held the key")
	}
	if !disableHeartbeat {
		if n := effectsA.Load() + effectsB.Load(); n != 1 {
			t.Errorf("with the heartbeat, the effect ran %d times, want 1", n)
		}
		if tlB.event("claim_won") != 0 || tlB.event("skip_duplicate") != 1 {
			t.Errorf("consumer B: %d claims won, %d duplicates; want 0 and 1", tlB.event("claim_won"), tlB.event("skip_duplicate"))
		}
		if len(lostA) != 0 || tlA.event("claim_lost") != 0 {
			t.Errorf("consumer A lost its claim despite the heartbeat")
		}
		return
	}
	// Without the heartbeat: the takeover, and A's late Complete reported.
	if effectsA.Load() != 1 || effectsB.Load() != 1 {
		t.Errorf("without the heartbeat: effects by A %d, by B %d; want 1 and 1 (B takes over)", effectsA.Load(), effectsB.Load())
	}
	if len(lostA) != 1 || lostA[0].level != "error" || !errors.Is(lostA[0].err, dedup.ErrClaimLost) {
		t.Errorf("consumer A's Complete after the takeover: logged %+v, want one claim_lost at error level wrapping ErrClaimLost", lostA)
	}
}

// Scenario 5, lost claim: consumer A's link to Redis (through an in-process
// proxy) is paused while its handler runs: the heartbeat's next extension
// is held in the proxy, so A's 1s lease ends on the server. Consumer B then
// claims the key, runs the effect and completes. A's handler context was
// cancelled with ErrClaimLost at A's lease deadline, before that takeover.
// A's handler, whose effect was already under way, returns success; Complete finds B's record, changes nothing, and is logged as
// claim_lost at error level, not swallowed: the call's one claim_lost. B's record is left as B wrote
// it. The effect ran twice: an effect outside the claim's lease, which no
// dedup layer can undo without fencing at the effect's side.
func TestLostClaimIsReported(t *testing.T) { eachAutoPipeline(t, lostClaimIsReported) }

func lostClaimIsReported(t *testing.T, autoPipeline bool) {
	const (
		lease     = time.Second
		heartbeat = 250 * time.Millisecond
	)
	ctx := context.Background()
	prefix := uniquePrefix("lost")
	rdb := newRedisClient(t, redisServer.Addr)
	orderID := fmt.Sprintf("ORDER-%d", time.Now().UnixNano())
	payload := fmt.Sprintf(`{"order_id":%q}`, orderID)
	recordKey := prefix + admin.ScopedKey("charge-orders", orderID)
	uuid := watermill.NewUUID()

	proxy := newFaultProxy(t, redisServer.Addr)
	clientA := goredis.NewClient(&goredis.Options{Addr: proxy.Addr(), ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	t.Cleanup(func() { _ = clientA.Close() })
	logA, tlA := newLogCapture(), newTally()
	dA := newDedup(t, dedup.Config{
		Store: newRedisStore(t, clientA, prefix, autoPipeline), Key: keyfuncs.JSON("order_id"), Scope: "charge-orders",
		Lease: lease, Heartbeat: heartbeat, StoreTimeout: time.Minute, Logger: logA, Observer: tlA,
	})
	dB := newDedup(t, dedup.Config{
		Store: newRedisStore(t, newRedisClient(t, redisServer.Addr), prefix, autoPipeline), Key: keyfuncs.JSON("order_id"), Scope: "charge-orders",
		Lease: lease, Heartbeat: heartbeat,
	})
	var effects atomic.Int64
	started := make(chan struct{})
	var cause error
	var cancelledAfter time.Duration
	hA := dA.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		effects.Add(1) // the charge is sent
		close(started)
		begin := time.Now()
		select {
		case <-msg.Context().Done():
			cause, cancelledAfter = context.Cause(msg.Context()), time.Since(begin)
		case <-time.After(20 * time.Second):
		}
		return nil, nil // the charge went through: the handler reports success
	})
	errA := make(chan error, 1)
	go func() {
		_, err := hA(message.NewMessage(uuid, []byte(payload)))
		errA <- err
	}()
	select {
	case <-started:
	case err := <-errA:
		t.Fatalf("consumer A returned before its handler ran: %v", err)
	case <-time.After(waitLimit):
		t.Fatalf("consumer A's handler did not start within %v", waitLimit)
	}
	proxy.add(t, "pause", "latency", "upstream", map[string]any{"latency": 60_000})
	paused := time.Now()
	waitFor(t, time.Minute, "A's record to expire on the server", func() bool {
		return rdb.Exists(ctx, recordKey).Val() == 0
	})
	expiredAfter := time.Since(paused)
	if _, err := dB.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		effects.Add(1)
		return nil, nil
	})(message.NewMessage(uuid, []byte(payload))); err != nil {
		t.Fatalf("consumer B after A's lease ended: %v, want an ack", err)
	}
	recordB, err := rdb.Get(ctx, recordKey).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	proxy.remove(t, "pause")
	var ackA error
	select {
	case ackA = <-errA:
	case <-time.After(time.Minute):
		t.Fatal("consumer A did not return within a minute of the link resuming")
	}
	after, err := rdb.Get(ctx, recordKey).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	lostExtend := logA.find(string(event.ClaimLost), "extend")
	lostComplete := logA.find(string(event.ClaimLost), "complete")
	figures(t, "lost-claim",
		"lease", lease, "heartbeat", heartbeat, "record_expired_after_pause", expiredAfter.Round(10*time.Millisecond),
		"handler_cancelled_after", cancelledAfter.Round(10*time.Millisecond), "cause", fmt.Sprintf("%q", errString(cause)),
		"claim_lost_logged", fmt.Sprintf("[extend=%d complete=%d]", len(lostExtend), len(lostComplete)),
		"record_of_B_unchanged", string(after) == string(recordB), "effects", effects.Load())

	// The engine cancels A's handler at its lease deadline (lease less
	// min(Lease/10, 1s)), before the record expires on the server and B can
	// take it over; before the engine it was cancelled only once the held
	// extension came back with ErrNotOwner, long after B's takeover.
	// The extension is held in the paused proxy, so a cause wrapping the
	// store's ErrNotOwner could only come after the link resumed.
	if !errors.Is(cause, dedup.ErrClaimLost) || errors.Is(cause, redis.ErrNotOwner) {
		t.Errorf("A's handler context: cause %v after %v, want ErrClaimLost from the lease deadline (not ErrNotOwner, found after the takeover)", cause, cancelledAfter)
	}
	// A's handler returned at the deadline, and its Complete was in flight
	// when the lease ended: the Complete's answer is the call's one
	// outcome (claim_lost of op complete), not a second claim_lost of the
	// lease.
	if len(lostExtend) != 0 {
		t.Errorf("the lease's end: logged %+v, want no claim_lost of op extend (the Complete in flight decides)", lostExtend)
	}
	if len(lostComplete) != 1 || lostComplete[0].level != "error" ||
		!errors.Is(lostComplete[0].err, dedup.ErrClaimLost) || !errors.Is(lostComplete[0].err, redis.ErrNotOwner) {
		t.Errorf("A's Complete: logged %+v, want one claim_lost at error level wrapping ErrClaimLost and ErrNotOwner", lostComplete)
	}
	if ackA != nil {
		t.Errorf("consumer A returned %v; its handler succeeded, so the message is acked", ackA)
	}
	if string(after) != string(recordB) || redisRecordState(after) != 'C' {
		t.Errorf("B's completed record was changed by A's late Complete")
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
