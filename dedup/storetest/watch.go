package storetest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// watchWait bounds every wait of a watch case for a wake. The engine of
// TestWatchWakesWaiters polls only every hour: a copy that answers within
// it was woken by the store.
const watchWait = time.Minute

func skipWithoutWatch(t *testing.T, features Features) {
	t.Helper()
	if !features.Watch {
		t.Skip("storetest: Features.Watch is not set: the store does not implement dedup.KeyWatcher (waiters poll)")
	}
}

// awaitWake waits (bounded) for a value on wake; a closed wake fails the
// case (the store ended the watch).
func awaitWake(t *testing.T, what string, wake <-chan struct{}) {
	t.Helper()
	timer := time.NewTimer(watchWait)
	defer timer.Stop()
	select {
	case _, ok := <-wake:
		if !ok {
			t.Fatalf("%s: the watch was closed, not woken", what)
		}
	case <-timer.C:
		t.Fatalf("%s: no wake within %v", what, watchWait)
	}
}

// TestWatchAfterChange (needs Watch): a watch that starts after the key's
// record was completed, or released, since the caller's since wakes its
// caller (dedup.KeyWatcher: the change happened before the watch came into
// place). Its stop may be called twice.
func TestWatchAfterChange(t *testing.T, newStore Constructor, features Features) {
	skipWithoutWatch(t, features)
	e := newEnv(t, "WatchAfterChange", newStore, features)
	watcher := e.store.(dedup.KeyWatcher)
	for _, op := range []string{"complete", "release"} {
		key := e.key(op)
		c := e.acquire(key, "", longLease)
		since := time.Now() // before the waiter's claim, as the engine takes it
		e.expect(key, "", dedup.InProgress)
		var err error
		if op == "complete" {
			err = e.store.Complete(e.ctx, c, []byte("done"), longLease)
		} else {
			err = e.store.Release(e.ctx, c)
		}
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		wake, stop, err := watcher.WatchKey(e.ctx, key, since)
		if err != nil {
			t.Fatalf("WatchKey after the %s: %v", op, err)
		}
		awaitWake(t, "a watch started after the "+op, wake)
		stop()
		stop()
	}
}

// watchCounter is the case's store with WatchKey counted, so that the case
// knows when every waiting copy watches the key.
type watchCounter struct {
	dedup.Store
	watcher dedup.KeyWatcher
	watches atomic.Int64
}

func (w *watchCounter) WatchKey(ctx context.Context, key string, since time.Time) (<-chan struct{}, func(), error) {
	wake, stop, err := w.watcher.WatchKey(ctx, key, since)
	if err == nil {
		w.watches.Add(1)
	}
	return wake, stop, err
}

// TestWatchWakesWaiters (needs Watch): copies of a call wait
// (dedup.Config.InProgressWait) for the holder of their key on an engine
// that polls only every hour (InProgressFallback), so only the store's
// wakes can end their wait. Once every copy watches the key: when the
// holder completes, every copy answers the duplicate with its result; when
// its work fails (the engine releases the claim), one copy runs the work
// and the others answer its duplicate.
func TestWatchWakesWaiters(t *testing.T, newStore Constructor, features Features) {
	skipWithoutWatch(t, features)
	e := newEnv(t, "WatchWakesWaiters", newStore, features)
	store := &watchCounter{Store: e.store, watcher: e.store.(dedup.KeyWatcher)}
	engine, err := dedup.NewEngine(dedup.Config{Store: store, Lease: longLease, Retention: longLease,
		InProgressWait: 2 * watchWait, InProgressFallback: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	const copies = 4
	errFailed := errors.New("the holder's work failed")
	for _, holderErr := range []error{nil, errFailed} {
		name := "complete"
		if holderErr != nil {
			name = "release"
		}
		call := dedup.Call{Scope: e.prefix + "watch", Key: name}
		entered, release, holder := make(chan struct{}), make(chan struct{}), make(chan error, 1)
		go func() {
			_, err := engine.Do(e.ctx, call, func(context.Context) ([]byte, error) {
				close(entered)
				<-release
				return []byte("holder"), holderErr
			})
			holder <- err
		}()
		select {
		case <-entered:
		case <-time.After(watchWait):
			t.Fatalf("%s: the holder's work did not start within %v", name, watchWait)
		}
		before := store.watches.Load()
		var ran atomic.Int64
		answers := make(chan dedup.ClaimResult, copies)
		errs := make(chan error, copies)
		for range copies {
			go func() {
				res, err := engine.Do(e.ctx, call, func(context.Context) ([]byte, error) {
					ran.Add(1)
					return []byte("copy"), nil
				})
				if err != nil {
					errs <- err
					return
				}
				answers <- res
			}()
		}
		deadline := time.Now().Add(watchWait)
		for store.watches.Load() < before+copies {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d of %d copies watch the key after %v", name, store.watches.Load()-before, copies, watchWait)
			}
			time.Sleep(time.Millisecond) // polls a counter; no clock is simulated
		}
		close(release)
		if err := <-holder; !errors.Is(err, holderErr) {
			t.Fatalf("%s: the holder's Do: %v, want %v", name, err, holderErr)
		}
		want := "holder"
		if holderErr != nil {
			want = "copy"
		}
		acquired := 0
		timer := time.NewTimer(watchWait)
		for range copies {
			select {
			case res := <-answers:
				switch {
				case res.Outcome == dedup.Acquired && holderErr != nil:
					acquired++
				case res.Outcome != dedup.Duplicate || string(res.Result) != want:
					t.Errorf("%s: a copy answered %v %q, want a duplicate of %q", name, res.Outcome, res.Result, want)
				}
			case err := <-errs:
				t.Errorf("%s: a copy failed: %v", name, err)
			case <-timer.C:
				t.Fatalf("%s: a waiting copy was not woken within %v (the engine polls every hour)", name, watchWait)
			}
		}
		timer.Stop()
		wantRan := 0 // the holder's completion: no copy runs the work
		if holderErr != nil {
			wantRan = 1 // its release: one copy does
		}
		if int(ran.Load()) != wantRan || acquired != wantRan {
			t.Errorf("%s: %d copies ran the work (%d acquired), want %d", name, ran.Load(), acquired, wantRan)
		}
	}
}
