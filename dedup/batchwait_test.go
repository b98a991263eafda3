package dedup_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/internal/memstore"
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
