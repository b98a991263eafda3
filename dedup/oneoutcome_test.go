package dedup_test

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// TestClaimLostThenCompletedReportsOneOutcome: the extensions fail, the
// lease deadline (a margin before the lease's end) cancels the work, which
// returns at once, and its Complete, still within the lease, succeeds.
// The call's one outcome is completed: no claim_lost (an alert on it
// fired, although nobody else could have taken the key).
func TestClaimLostThenCompletedReportsOneOutcome(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const lease, heartbeat = 30 * time.Second, 10 * time.Second // deadline at 29s
	clock := fakeclock.New(epoch)
	obs := newDecisions()
	e, err := dedup.NewEngine(dedup.Config{Store: failingExtendStore{memstore.New(clock)}, Clock: clock, Lease: lease, Heartbeat: heartbeat, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), dedup.Call{Scope: "s", Key: "k"}, func(ctx context.Context) ([]byte, error) {
			<-ctx.Done()
			return nil, nil // it had finished anyway
		})
		done <- err
	}()
	for i, at := range []time.Duration{heartbeat, 2 * heartbeat, lease - deadlineMarginOf(lease)} {
		for len(obs.of(event.StoreError)) < i { // the previous extension failed
			if ctx.Err() != nil {
				t.Fatalf("extension %d never failed", i)
			}
			runtime.Gosched()
		}
		if err := clock.WaitForTimerAt(ctx, epoch.Add(at)); err != nil {
			t.Fatal(err)
		}
		clock.Advance(epoch.Add(at).Sub(clock.Now()))
	}
	if err := recv(t, "Do to return", done); err != nil {
		t.Fatalf("Do: %v", err)
	}
	for _, d := range obs.of(event.ClaimLost) {
		t.Errorf("claim_lost (op %q) for a claim whose Complete succeeded: %v", d.Op, d.Err)
	}
	if n := len(obs.of(event.Completed)); n != 1 {
		t.Errorf("%d completed decisions, want 1", n)
	}
	res, err := e.Do(context.Background(), dedup.Call{Scope: "s", Key: "k"}, func(context.Context) ([]byte, error) { return nil, nil })
	if err != nil || res.Outcome != dedup.Duplicate {
		t.Errorf("a copy: %v, %v; want Duplicate", res.Outcome, err)
	}
}

// inProgressThenDownStore answers the first claim InProgress (another
// consumer holds the key), and fails every later one (the store went
// away).
type inProgressThenDownStore struct {
	dedup.Store
	claims atomic.Int32
}

func (s *inProgressThenDownStore) Claim(context.Context, string, string, time.Duration) (dedup.ClaimResult, error) {
	if s.claims.Add(1) == 1 {
		return dedup.ClaimResult{Outcome: dedup.InProgress}, nil
	}
	return dedup.ClaimResult{}, errNetwork
}

// TestInProgressWaitStoreErrorStaysInProgress: once a claim answered
// InProgress, another consumer is known to hold the key; a store error
// during the wait ends it as InProgress (ErrInProgress: nack, 409), never
// as a store failure that FailOpen (or a caller) would run the work on.
func TestInProgressWaitStoreErrorStaysInProgress(t *testing.T) {
	store := &inProgressThenDownStore{Store: memstore.New(nil)}
	obs := newDecisions()
	e, err := dedup.NewEngine(dedup.Config{Store: store, FailOpen: true, InProgressWait: time.Minute, InProgressPoll: time.Millisecond, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	_, err = e.Do(context.Background(), dedup.Call{Scope: "s", Key: "k"}, func(context.Context) ([]byte, error) {
		ran = true
		return nil, nil
	})
	if !errors.Is(err, dedup.ErrInProgress) {
		t.Errorf("Do: %v, want ErrInProgress", err)
	}
	if !errors.Is(err, errNetwork) {
		t.Errorf("Do: %v does not carry the store's error", err)
	}
	if ran {
		t.Error("the work ran (fail-open) although another consumer holds the key")
	}
	if n := store.claims.Load(); n != 2 {
		t.Errorf("%d claims, want 2 (the wait ends on the first error)", n)
	}
	if d := obs.of(event.InProgress); len(d) != 1 {
		t.Errorf("%d in_progress decisions, want 1", len(d))
	}
	if d := obs.of(event.FailOpen); len(d) != 0 {
		t.Errorf("fail_open decided: %v", d)
	}
}
