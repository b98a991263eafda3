package dedup_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// failingReclaimStore answers claims from the memory store until fail is
// set, then fails them.
type failingReclaimStore struct {
	dedup.Store
	fail atomic.Bool
}

var errReclaim = errors.New("store down")

func (s *failingReclaimStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	if s.fail.Load() {
		return dedup.ClaimResult{}, errReclaim
	}
	res, err := s.Store.Claim(ctx, key, fp, lease)
	if res.Outcome == dedup.InProgress {
		s.fail.Store(true) // the wait's next claim fails
	}
	return res, err
}

// TestDoBatchWaitEndedByAStoreError: a batch's call whose key is held
// waits (Config.InProgressWait); a store error on the wait's claim ends it
// as InProgress with that error, as Do's wait does.
func TestDoBatchWaitEndedByAStoreError(t *testing.T) {
	s := &failingReclaimStore{Store: memstore.New(nil)}
	e, err := dedup.NewEngine(dedup.Config{Store: s, InProgressWait: time.Minute, InProgressPoll: time.Millisecond, Scope: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store.Claim(context.Background(), admin.ScopedKey("s", "k"), "", time.Minute); err != nil {
		t.Fatal(err)
	}
	_, errs := e.DoBatch(context.Background(), dedup.Batch{Calls: []dedup.BatchCall{{Call: dedup.Call{Key: "k"}}}},
		func(context.Context, int) ([]byte, error) {
			t.Error("the work ran although the key is held")
			return nil, nil
		})
	if err := errs[0]; !errors.Is(err, dedup.ErrInProgress) || !errors.Is(err, errReclaim) {
		t.Fatalf("err %v; want ErrInProgress wrapping the store's error", err)
	}
}

// TestDoBatchWaitWatchesSinceTheBatchClaim: a batch's call whose key is
// held watches the key (a store that wakes waiters) for changes since its
// claim was sent with the batch, not since the zero time, which would wake
// it at once for nothing on a watch already in place.
func TestDoBatchWaitWatchesSinceTheBatchClaim(t *testing.T) {
	clock := fakeclock.New(epoch)
	store := newWatchedStore(clock)
	e, err := dedup.NewEngine(dedup.Config{Store: store, Clock: clock, Scope: "charge", InProgressWait: time.Minute,
		InProgressPoll: 100 * time.Millisecond, DisableHeartbeat: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	held, err := store.Store.Claim(ctx, watchKey, "", time.Minute) // not counted: another process's claim
	if err != nil {
		t.Fatal(err)
	}
	type batchResult struct {
		res  []dedup.ClaimResult
		errs []error
	}
	out := make(chan batchResult, 1)
	go func() {
		res, errs := e.DoBatch(ctx, dedup.Batch{Calls: []dedup.BatchCall{{Call: dedup.Call{Key: "ORDER-003"}}}},
			func(context.Context, int) ([]byte, error) {
				t.Error("the work ran although the key is held")
				return nil, nil
			})
		out <- batchResult{res, errs}
	}()
	waitForTimers(t, clock, 1) // the waiting call's pause
	if err := store.Store.Complete(ctx, held.Claim, []byte("charged"), time.Hour); err != nil {
		t.Fatal(err)
	}
	store.wake(watchKey)
	got := recv(t, "the woken batch call to answer", out)
	if got.errs[0] != nil || got.res[0].Outcome != dedup.Duplicate || string(got.res[0].Result) != "charged" {
		t.Fatalf("woken batch call: %+v %v, want the holder's duplicate", got.res[0], got.errs[0])
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if len(store.since) != 1 || len(store.sent) == 0 || store.since[0].IsZero() || store.since[0].After(store.sent[0]) {
		t.Errorf("WatchKey since %v, want the time the batch's claim was sent (at most %v), not zero", store.since, store.sent)
	}
}
