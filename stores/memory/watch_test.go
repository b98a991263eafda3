package memory_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// woken reports whether c holds a wake, without waiting: the memory store
// wakes in the same step as the change, so there is nothing to wait for.
func woken(t *testing.T, c <-chan struct{}) bool {
	t.Helper()
	select {
	case _, ok := <-c:
		if !ok {
			t.Fatal("the watch was closed")
		}
		return true
	default:
		return false
	}
}

func acquire(t *testing.T, s *memory.Store, key string) dedup.Claim {
	t.Helper()
	res, err := s.Claim(context.Background(), key, "", time.Minute)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("Claim(%s): %v %v", key, res.Outcome, err)
	}
	return res.Claim
}

func watchKey(t *testing.T, s *memory.Store, key string) (<-chan struct{}, func()) {
	t.Helper()
	wake, stop, err := s.WatchKey(context.Background(), key, time.Now())
	if err != nil {
		t.Fatalf("WatchKey(%s): %v", key, err)
	}
	t.Cleanup(stop)
	return wake, stop
}

// Every operation that ends a claim wakes the key's watches, in the same
// step: Complete, Release, their batch forms, a RunInTx's completion, an
// Evict. Another key's change wakes nobody, and a watch of a held record
// does not wake when it starts.
func TestWatchWokenByEveryChange(t *testing.T) {
	ctx := context.Background()
	s := memstore.New(fakeclock.New(epoch))
	e, err := dedup.NewEngine(dedup.Config{Store: s, Clock: fakeclock.New(epoch)})
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []struct {
		name string
		do   func(key string, c dedup.Claim) error
	}{
		{"Complete", func(_ string, c dedup.Claim) error { return s.Complete(ctx, c, nil, time.Hour) }},
		{"Release", func(_ string, c dedup.Claim) error { return s.Release(ctx, c) }},
		{"CompleteBatch", func(_ string, c dedup.Claim) error {
			return s.CompleteBatch(ctx, []dedup.CompleteRequest{{Claim: c, Retention: time.Hour}})[0]
		}},
		{"ReleaseBatch", func(_ string, c dedup.Claim) error { return s.ReleaseBatch(ctx, []dedup.Claim{c})[0] }},
		{"Evict", func(key string, _ dedup.Claim) error { _, err := s.Evict(ctx, key); return err }},
	} {
		key := "w:" + op.name
		c := acquire(t, s, key)
		acquire(t, s, key+"-other")
		wake, _ := watchKey(t, s, key)
		other, _ := watchKey(t, s, key+"-other")
		if woken(t, wake) {
			t.Fatalf("%s: a watch of a held key woke when it started", op.name)
		}
		if err := op.do(key, c); err != nil {
			t.Fatalf("%s: %v", op.name, err)
		}
		if !woken(t, wake) {
			t.Fatalf("%s did not wake the key's watch", op.name)
		}
		if woken(t, other) {
			t.Fatalf("%s woke the watch of another key", op.name)
		}
	}

	// RunInTx: the completion written with the work's writes.
	wake, _ := watchKey(t, s, "tx:k")
	if _, err := e.Do(ctx, dedup.Call{Scope: "tx", Key: "k"}, func(ctx context.Context) ([]byte, error) {
		return s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
			tx, _ := memory.TxFromContext(ctx)
			return nil, tx.Set("charged:k", []byte("1"))
		})
	}); err != nil {
		t.Fatal(err)
	}
	if !woken(t, wake) {
		t.Fatal("RunInTx's completion did not wake the key's watch")
	}
}

// A watch that starts when the record may have changed since the caller's
// claim wakes at once: the key has no record, or a completed one, or a
// released one, or one whose lease ended, or a record that took over a
// released one. Values coalesce: two changes leave one wake.
func TestWatchWakesAtOnceAfterAChange(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(epoch)
	s := memstore.New(clock)
	c := acquire(t, s, "completed")
	if err := s.Complete(ctx, c, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	c = acquire(t, s, "released")
	if err := s.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
	c = acquire(t, s, "retried")
	if err := s.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
	acquire(t, s, "retried") // held again, by a claim that followed a release
	acquire(t, s, "abandoned")
	clock.Advance(time.Minute) // abandoned's lease ends
	for _, key := range []string{"none", "completed", "released", "retried", "abandoned"} {
		if wake, _ := watchKey(t, s, key); !woken(t, wake) {
			t.Errorf("a watch of %s did not wake when it started", key)
		}
	}

	c = acquire(t, s, "twice")
	wake, _ := watchKey(t, s, "twice")
	if err := s.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
	acquire(t, s, "twice")
	if _, err := s.Evict(ctx, "twice"); err != nil {
		t.Fatal(err)
	}
	if !woken(t, wake) || woken(t, wake) {
		t.Fatal("two changes: want exactly one wake waiting")
	}
}

// stop ends the watch, once however often it is called; Close closes every
// watch still open (its waiter polls), refuses new ones with
// storekit.ErrWatchesClosed, and leaves the store working.
func TestWatchStopAndClose(t *testing.T) {
	ctx := context.Background()
	s := memstore.New(nil)
	c := acquire(t, s, "k")
	stopped, stop := watchKey(t, s, "k")
	stop()
	stop()
	open, _ := watchKey(t, s, "k")
	if err := s.Complete(ctx, c, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	if woken(t, stopped) {
		t.Fatal("a stopped watch was woken")
	}
	if !woken(t, open) {
		t.Fatal("the open watch was not woken")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-open; ok {
		t.Fatal("Close did not close the open watch")
	}
	stop() // after Close: nothing to do
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, _, err := s.WatchKey(ctx, "k", time.Now()); !errors.Is(err, storekit.ErrWatchesClosed) {
		t.Fatalf("WatchKey after Close: %v, want ErrWatchesClosed", err)
	}
	if res, err := s.Claim(ctx, "k", "", time.Minute); err != nil || res.Outcome != dedup.Duplicate {
		t.Fatalf("Claim after Close: %v %v, want the completed record's duplicate", res.Outcome, err)
	}
}

// claimCounter counts the claims of the memory store; embedding keeps
// its WatchKey, so the engine still watches.
type claimCounter struct {
	*memory.Store
	n atomic.Int64
}

func (c *claimCounter) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	c.n.Add(1)
	return c.Store.Claim(ctx, key, fp, lease)
}

// waitingCopy starts a copy of call on an engine over s whose waits poll
// every hour (InProgressFallback) on clock, and returns once the copy
// pauses, its key watched; its answer comes on the channel.
func waitingCopy(t *testing.T, s dedup.Store, clock *fakeclock.Clock, call dedup.Call) <-chan dedup.ClaimResult {
	t.Helper()
	e, err := dedup.NewEngine(dedup.Config{Store: s, Clock: clock, InProgressWait: 2 * time.Hour, InProgressFallback: time.Hour,
		DisableHeartbeat: true})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan dedup.ClaimResult, 1)
	go func() {
		res, err := e.Do(context.Background(), call, func(context.Context) ([]byte, error) { return nil, errors.New("the copy ran") })
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := clock.WaitForTimerAt(ctx, clock.Now().Add(time.Hour)); err != nil {
		t.Fatalf("the copy's pause: %v", err)
	}
	return done
}

func answer(t *testing.T, what string, done <-chan dedup.ClaimResult) dedup.ClaimResult {
	t.Helper()
	select {
	case res := <-done:
		return res
	case <-time.After(time.Minute):
		t.Fatalf("%s: no answer within a minute", what)
		panic("unreachable")
	}
}

// The engine watches the key of a copy that finds it held: the copy
// answers the holder's completion without a poll (the fallback is an hour
// and the engine's clock never moves), with one claim before the wake and
// one after.
func TestEngineWaitWokenByTheStore(t *testing.T) {
	clock := fakeclock.New(epoch)
	s := &claimCounter{Store: memstore.New(clock)}
	holder := acquire(t, s.Store, "charge:ORDER-003")
	done := waitingCopy(t, s, clock, dedup.Call{Scope: "charge", Key: "ORDER-003"})
	if err := s.Complete(context.Background(), holder, []byte("charged"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if res := answer(t, "the copy woken by the completion", done); res.Outcome != dedup.Duplicate || string(res.Result) != "charged" {
		t.Fatalf("copy: %v %q, want the holder's duplicate", res.Outcome, res.Result)
	}
	if n := s.n.Load(); n != 2 {
		t.Fatalf("%d claims, want 2 (the first, and one after the wake)", n)
	}
}

// Close ends the watch of a waiting copy: the engine polls from then on
// (InProgressPoll) and answers the holder's completion at its next poll.
func TestEngineWaitPollsAfterClose(t *testing.T) {
	clock := fakeclock.New(epoch)
	s := memstore.New(clock)
	holder := acquire(t, s, "charge:ORDER-003")
	done := waitingCopy(t, s, clock, dedup.Call{Scope: "charge", Key: "ORDER-003"})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	poll := clock.Now().Add(20 * time.Millisecond) // dedup.Config.InProgressPoll's default
	if err := clock.WaitForTimerAt(ctx, poll); err != nil {
		t.Fatalf("the copy's poll after Close: %v", err)
	}
	if err := s.Complete(context.Background(), holder, []byte("charged"), time.Hour); err != nil {
		t.Fatal(err)
	}
	clock.Advance(20 * time.Millisecond)
	if res := answer(t, "the copy polling after Close", done); res.Outcome != dedup.Duplicate || string(res.Result) != "charged" {
		t.Fatalf("copy: %v %q, want the holder's duplicate", res.Outcome, res.Result)
	}
}
