package dedup_test

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// lostExtendStore is the memory store whose Extend, once let go, finds
// the claim lost (the store's clock ran ahead, another consumer took it).
type lostExtendStore struct {
	*memory.Store
	sent chan struct{}
	gate chan struct{}
}

func (s *lostExtendStore) Extend(ctx context.Context, c dedup.Claim, lease time.Duration) error {
	s.sent <- struct{}{}
	<-s.gate
	return dedup.ErrClaimLost
}

// blockingLostObserver records decisions; the first claim_lost blocks the
// goroutine that decides it until proceed is closed.
type blockingLostObserver struct {
	decisions
	lost    atomic.Int32
	entered chan struct{}
	proceed chan struct{}
}

func (o *blockingLostObserver) ObserveDecision(d dedup.Decision) {
	o.decisions.ObserveDecision(d)
	if d.Event == event.ClaimLost && o.lost.Add(1) == 1 {
		close(o.entered)
		<-o.proceed
	}
}

// expireRunning reports whether a goroutine runs (or is about to run) the
// lease keeper's expire.
func expireRunning() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Contains(string(buf), "dedup.(*leaseKeeper).expire")
}

// TestClaimLostIsDecidedOnce: an extension that finds the claim lost
// decides claim_lost and cancels the work; the lease deadline's own timer
// (armed while the extension was in flight, stopped only after extend
// returned) must not decide claim_lost a second time for the same loss
// when it fires meanwhile. (Nothing recorded that the extension had
// already reported the claim lost: the loss was logged, at error level,
// and counted twice.)
func TestClaimLostIsDecidedOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const lease, heartbeat = 30 * time.Second, 10 * time.Second // deadline at 29s
	clock := fakeclock.New(epoch)
	store := &lostExtendStore{Store: memstore.New(clock), sent: make(chan struct{}, 1), gate: make(chan struct{})}
	obs := &blockingLostObserver{entered: make(chan struct{}), proceed: make(chan struct{})}
	e, err := dedup.NewEngine(dedup.Config{Store: store, Clock: clock, Lease: lease, Heartbeat: heartbeat, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	workGo, done := doHeld(e, false)
	if err := clock.WaitForTimers(ctx, 1); err != nil { // the first heartbeat
		t.Fatal(err)
	}
	clock.Advance(heartbeat)
	recv(t, "the extension to be sent", store.sent)
	close(store.gate)                                           // it finds the claim lost...
	recv(t, "the extension's claim_lost decision", obs.entered) // ...and decides so
	clock.Advance(lease - deadlineMarginOf(lease) - heartbeat)  // the deadline's timer fires meanwhile
	for expireRunning() {
		if ctx.Err() != nil {
			t.Fatal("expire never ended")
		}
		runtime.Gosched()
	}
	close(obs.proceed)
	close(workGo)
	if err := recv(t, "Do to return", done); err != nil {
		t.Logf("Do: %v", err)
	}
	var extendLost int
	for _, d := range obs.of(event.ClaimLost) {
		t.Logf("claim_lost op %q: %v", d.Op, d.Err)
		if d.Op == "extend" {
			extendLost++
		}
	}
	if extendLost != 1 {
		t.Errorf("%d claim_lost decisions of the lease (op extend) for one loss, want 1", extendLost)
	}
}

func deadlineMarginOf(lease time.Duration) time.Duration { return min(lease/10, time.Second) }

// doHeld runs e.Do of key "k" in scope "s" on a goroutine of its own, whose
// work returns once workGo is closed (or, when it heeds its context, once
// that ends, with its cause); done receives Do's error.
func doHeld(e *dedup.Engine, heedContext bool) (workGo chan struct{}, done chan error) {
	workGo, done = make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), dedup.Call{Scope: "s", Key: "k"}, func(ctx context.Context) ([]byte, error) {
			if !heedContext {
				<-workGo
				return nil, nil
			}
			select {
			case <-workGo:
				return nil, nil
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		})
		done <- err
	}()
	return workGo, done
}
