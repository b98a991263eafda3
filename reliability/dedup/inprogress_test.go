package dedup_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// holdKey runs a call on e whose work blocks until release is closed, then
// returns result (or fails with err). It returns once the work has started,
// and the channel that receives Do's error.
func holdKey(t *testing.T, e *dedup.Engine, call dedup.Call, result string, err error, release <-chan struct{}) <-chan error {
	t.Helper()
	entered, done := make(chan struct{}), make(chan error, 1)
	go func() {
		_, derr := e.Do(context.Background(), call, func(context.Context) ([]byte, error) {
			close(entered)
			<-release
			return []byte(result), err
		})
		done <- derr
	}()
	recv(t, "the holder's work to start", entered)
	return done
}

type doResult struct {
	res dedup.ClaimResult
	err error
}

// startDo runs e.Do in a goroutine and returns what it returns.
func startDo(e *dedup.Engine, call dedup.Call, fn func(context.Context) ([]byte, error)) <-chan doResult {
	out := make(chan doResult, 1)
	go func() {
		res, err := e.Do(context.Background(), call, fn)
		out <- doResult{res, err}
	}()
	return out
}

// waitTimers waits (bounded) until the fake clock has n pending timers.
func waitTimers(t *testing.T, clock *fakeclock.Clock, n int, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := clock.WaitForTimers(ctx, n); err != nil {
		t.Fatalf("waited a minute for %d timers (%s): %v", n, what, err)
	}
}

// With InProgressWait, a copy that finds the key in progress claims again
// after 100ms, 200ms, ... and once the holder has completed it is a
// duplicate with the holder's result: acked with a replay, no nack, its
// work never run.
func TestInProgressWaitEndsAsDuplicateWithReplay(t *testing.T) {
	forEachStore(t, nil, func(t *testing.T, store dedup.Store) {
		clock := fakeclock.New(epoch)
		counted := newFaultStore(store)
		seen := newDecisions()
		cfg := dedup.Config{Store: counted, Clock: clock, InProgressWait: 10 * time.Second, InProgressPoll: 100 * time.Millisecond,
			DisableHeartbeat: true, Observer: seen}
		e := newEngine(t, cfg)
		call := dedup.Call{Scope: "charge", Key: "ORDER-003"}
		release := make(chan struct{})
		holder := holdKey(t, e, call, "charged 150", nil, release)
		// The holder's lease deadline is one timer; the copy's pause the other.
		ran := false
		copyDone := startDo(e, call, func(context.Context) ([]byte, error) { ran = true; return nil, nil })
		waitTimers(t, clock, 2, "the copy's first pause")
		clock.Advance(100 * time.Millisecond) // second claim: still in progress
		waitTimers(t, clock, 2, "the copy's second pause")
		close(release)
		if err := recv(t, "the holder to complete", holder); err != nil {
			t.Fatal(err)
		}
		clock.Advance(200 * time.Millisecond) // third claim: completed
		got := recv(t, "the copy to end its wait", copyDone)
		if got.err != nil || got.res.Outcome != dedup.Duplicate || string(got.res.Result) != "charged 150" || ran {
			t.Fatalf("copy after waiting: %+v (result %q), %v, work ran: %v; want a duplicate with the holder's result", got.res, got.res.Result, got.err, ran)
		}
		if n := counted.Count("claim"); n != 4 {
			t.Errorf("%d claims, want 4 (the holder's, the copy's first, two after pauses)", n)
		}
		dups := seen.of(event.SkipDuplicate)
		if len(dups) != 1 || dups[0].Waited != 300*time.Millisecond || !dups[0].Replayed {
			t.Errorf("skip_duplicate decisions %+v, want one with Waited 300ms, Replayed", dups)
		}
		if n := len(seen.of(event.InProgress)); n != 0 {
			t.Errorf("%d in_progress decisions, want 0 (no nack)", n)
		}
	})
}

// The wait is bounded: claims after 100, 200, 400ms and one at the 1s
// bound itself, then ErrInProgress (a nack) as without the option.
func TestInProgressWaitGivesUpAtItsBound(t *testing.T) {
	forEachStore(t, nil, func(t *testing.T, store dedup.Store) {
		clock := fakeclock.New(epoch)
		counted := newFaultStore(store)
		seen := newDecisions()
		e := newEngine(t, dedup.Config{Store: counted, Clock: clock, InProgressWait: time.Second, InProgressPoll: 100 * time.Millisecond,
			DisableHeartbeat: true, Observer: seen})
		call := dedup.Call{Scope: "charge", Key: "ORDER-003"}
		release := make(chan struct{})
		holder := holdKey(t, e, call, "charged 150", nil, release)
		copyDone := startDo(e, call, func(context.Context) ([]byte, error) { return nil, nil })
		for i, step := range []time.Duration{100, 200, 400, 300} {
			waitTimers(t, clock, 2, "the copy's pause")
			if n := counted.Count("claim"); n != 2+i {
				t.Fatalf("before pause %d: %d claims, want %d", i+1, n, 2+i)
			}
			clock.Advance(step * time.Millisecond)
		}
		got := recv(t, "the copy to give up", copyDone)
		if !errors.Is(got.err, dedup.ErrInProgress) {
			t.Fatalf("copy at the bound: %+v, %v; want ErrInProgress", got.res, got.err)
		}
		if n := counted.Count("claim"); n != 6 {
			t.Errorf("%d claims, want 6 (holder, copy, 4 after pauses)", n)
		}
		inprog := seen.of(event.InProgress)
		if len(inprog) != 1 || inprog[0].Waited != time.Second {
			t.Errorf("in_progress decisions %+v, want one with Waited 1s", inprog)
		}
		close(release)
		if err := recv(t, "the holder to complete", holder); err != nil {
			t.Fatal(err)
		}
	})
}

// When the holder fails, its claim is released: the waiting copy wins the
// next claim and runs the work, as the redelivery would have.
func TestInProgressWaitTakesOverAReleasedKey(t *testing.T) {
	forEachStore(t, nil, func(t *testing.T, store dedup.Store) {
		clock := fakeclock.New(epoch)
		seen := newDecisions()
		// Polling: Redis would wake the copy at the release (see
		// TestInProgressWaitWokenByRedis).
		e := newEngine(t, dedup.Config{Store: polling{store}, Clock: clock, InProgressWait: time.Minute, InProgressPoll: 100 * time.Millisecond,
			DisableHeartbeat: true, Observer: seen})
		call := dedup.Call{Scope: "charge", Key: "ORDER-003"}
		release := make(chan struct{})
		gateway := errors.New("gateway timeout")
		holder := holdKey(t, e, call, "", gateway, release)
		copyDone := startDo(e, call, func(ctx context.Context) ([]byte, error) {
			if o, _ := dedup.OutcomeFromContext(ctx); o != dedup.Acquired {
				return nil, errors.New("the copy runs without its claim")
			}
			return []byte("charged by the copy"), nil
		})
		waitTimers(t, clock, 2, "the copy's first pause")
		close(release)
		if err := recv(t, "the holder to fail", holder); !errors.Is(err, gateway) {
			t.Fatalf("holder: %v", err)
		}
		waitTimers(t, clock, 1, "the copy's pause alone")
		clock.Advance(100 * time.Millisecond)
		got := recv(t, "the copy to run", copyDone)
		if got.err != nil || got.res.Outcome != dedup.Acquired || string(got.res.Result) != "charged by the copy" {
			t.Fatalf("copy: %+v, %v; want it to win the released key and run", got.res, got.err)
		}
		won := seen.of(event.ClaimWon)
		if len(won) != 2 || won[1].Waited != 100*time.Millisecond {
			t.Fatalf("claim_won decisions %+v, want the copy's with Waited 100ms", won)
		}
	})
}

func TestInProgressWaitValidated(t *testing.T) {
	_, err := dedup.New(dedup.Config{Store: memstore.New(nil), Key: keyfuncs.JSON("order_id"), InProgressWait: -time.Second, InProgressPoll: -time.Millisecond})
	if !errors.Is(err, dedup.ErrInvalidDuration) {
		t.Fatalf("New: %v, want ErrInvalidDuration", err)
	}
	for _, field := range []string{"InProgressWait", "InProgressPoll"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("New does not name %s: %v", field, err)
		}
	}
}
