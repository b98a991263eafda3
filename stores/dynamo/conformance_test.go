package dynamo_test

import (
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/dedup/storetest"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// The suite on dynalite, which ignores ReturnValuesOnConditionCheckFailure:
// every claim that finds a record takes the GetItem fallback. Each subtest's
// store has its own fake clock, so expiry needs no sleeping; the margin is
// below the suite's ShortDuration (100ms), which it waits twice over.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) (dedup.Store, func(time.Duration)) {
		clock := fakeclock.New(epoch)
		return newStore(t, dynamo.Config{Clock: clock, ClockSkewMargin: 40 * time.Millisecond}), clock.Advance
	}, storetest.Features{})
}

// The suite again on the wall clock with one shared store: proves the
// real-time path (deadlines from time.Now, millisecond rounding). The
// contention subtests are smaller here: TestConformance runs them in full.
func TestConformanceRealClock(t *testing.T) {
	store := newStore(t, dynamo.Config{ClockSkewMargin: 50 * time.Millisecond})
	storetest.Run(t, func(t *testing.T) (dedup.Store, func(time.Duration)) {
		return store, nil
	}, storetest.Features{ShortDuration: 400 * time.Millisecond, Contenders: 50, DistinctKeys: 64})
}

// The suite through a client that returns the old item with a failed
// condition, as real DynamoDB does: every Duplicate, InProgress and Conflict
// is then decided from the PutItem's own answer, and the store must never
// issue its fallback GetItem. Contention is smaller than in
// TestConformance, which runs it in full: here it is the path that counts.
func TestConformanceWithOldItemReturned(t *testing.T) {
	c := &allOldClient{Client: client, pk: dynamo.DefaultPartitionKey}
	// t.Run returns once the suite's parallel subtests have finished.
	t.Run("suite", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) (dedup.Store, func(time.Duration)) {
			clock := fakeclock.New(epoch)
			// Without its Admin methods: Inspect's GetItem would count as a
			// fallback (TestConformance covers Admin).
			store := newStore(t, dynamo.Config{Client: c, Clock: clock, ClockSkewMargin: 40 * time.Millisecond})
			return struct{ dedup.Store }{store}, clock.Advance
		}, storetest.Features{Contenders: 50, DistinctKeys: 64})
	})
	if t.Failed() {
		return
	}
	if n := c.attached.Load(); n == 0 {
		t.Fatalf("the wrapper attached no old item: the ALL_OLD path was not exercised")
	}
	if n := c.storeGets.Load(); n != 0 {
		t.Fatalf("the store issued %d fallback GetItem calls although every failed condition carried the old item", n)
	}
}
