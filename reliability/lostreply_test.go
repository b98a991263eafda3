package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// A Complete whose reply is lost (the connection is reset after Redis ran
// the script) is retried, and the retry finds the record completed by this
// very claim. That is a success: the record is right, the effect recorded
// once. It must be logged as completed, not as claim_lost at error level
// ("another consumer may have run the effect too"), an alarm an operator
// would chase for nothing. go-redis retries commands after network errors
// by default, so one Store.Complete call can meet this on its own, as can
// the middleware's Complete retries.
//
// Deterministic: the proxy resets the connection on the reply of the first
// Complete (go-redis' own retries are off, so the middleware's retry is the
// second run), the middleware's backoff runs on a fake clock, and the reset
// is removed before the clock moves.
//
// This is the end-to-end check of dedup.ErrAlreadyCompleted (commit
// 2ffdf5f). Run against the commit before it, the test fails: "the record
// was completed by this claim, yet the middleware logged 1 claim_lost
// (error level) and 0 completed".
func TestLostCompleteReplyIsNotClaimLost(t *testing.T) {
	eachAutoPipeline(t, lostCompleteReplyIsNotClaimLost)
}

func lostCompleteReplyIsNotClaimLost(t *testing.T, autoPipeline bool) {
	ctx := context.Background()
	prefix := uniquePrefix("lostreply")
	rdb := newRedisClient(t, redisServer.Addr)
	proxy := newFaultProxy(t, redisServer.Addr)
	// One connection, set up before the fault (a fresh connection would die
	// on its HELLO reply, before sending the command), no go-redis retries.
	client := goredis.NewClient(&goredis.Options{Addr: proxy.Addr(), MaxRetries: -1, PoolSize: 1})
	t.Cleanup(func() { _ = client.Close() })
	store := newRedisStore(t, client, prefix, autoPipeline)
	// Load the scripts into the server's cache, as a running system has
	// them: otherwise the lost reply would be EVALSHA's NOSCRIPT, and the
	// script would not have run.
	warm, err := store.Claim(ctx, "warm-up", "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, warm.Claim, nil, time.Minute); err != nil {
		t.Fatal(err)
	}
	clock := fakeclock.New(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	logs, tl := newLogCapture(), newTally()
	d := newDedup(t, dedup.Config{
		Store: store, Key: keyfuncs.JSON("order_id"), Scope: "charge-orders",
		Lease: time.Minute, CompleteRetries: 1, CompleteBackoff: time.Second,
		Clock: clock, Logger: logs, Observer: tl,
	})
	orderID := fmt.Sprintf("ORDER-%d", time.Now().UnixNano())
	h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		// The effect is done; the reply to the coming Complete will be lost.
		return nil, proxy.tryAdd("lose-reply", "reset_peer", "downstream", map[string]any{"timeout": 0})
	})
	result := make(chan error, 1)
	go func() {
		_, err := h(message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"order_id":%q}`, orderID))))
		result <- err
	}()
	// The first Complete failed; the middleware waits for its backoff (the
	// heartbeat holds a timer of its own until Complete is acknowledged).
	waitFor(t, time.Minute, "the first Complete to fail", func() bool {
		tl.mu.Lock()
		defer tl.mu.Unlock()
		return tl.storeErrs["complete"] >= 1
	})
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := clock.WaitForTimerAt(wctx, clock.Now().Add(time.Second)); err != nil {
		t.Fatalf("the middleware never retried Complete: %v", err)
	}
	proxy.remove(t, "lose-reply")
	clock.Advance(time.Second)
	if err := await(t, waitLimit, "the middleware's return after the retried Complete", result); err != nil {
		t.Fatalf("middleware: %v, want an ack", err)
	}

	v, err := rdb.Get(ctx, prefix+admin.ScopedKey("charge-orders", orderID)).Bytes()
	if err != nil || redisRecordState(v) != 'C' {
		t.Fatalf("record: %q %v, want completed (the first Complete ran on the server)", v, err)
	}
	lost := logs.find(string(event.ClaimLost), "complete")
	for _, e := range lost {
		t.Logf("logged at %s level: %s: %v (ErrAlreadyCompleted: %v)", e.level, e.msg, e.err, errors.Is(e.err, dedup.ErrAlreadyCompleted))
	}
	figures(t, "lost-complete-reply",
		"complete_store_errors", tl.storeErrorsByOp(), "claim_lost_logged", len(lost),
		"completed_logged", tl.event("completed"), "record", "completed")
	if len(lost) != 0 || tl.event("completed") != 1 {
		t.Errorf("the record was completed by this claim, yet the middleware logged %d claim_lost (error level) and %d completed; want 0 and 1",
			len(lost), tl.event("completed"))
	}
}
