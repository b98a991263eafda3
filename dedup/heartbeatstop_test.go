package dedup_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// stallingExtendStore is the memory store whose Extend signals that it is
// in flight and then waits for its context to end (a slow store).
type stallingExtendStore struct {
	*memory.Store
	inFlight chan struct{}
	once     sync.Once
}

func (s *stallingExtendStore) Extend(ctx context.Context, claim dedup.Claim, lease time.Duration) error {
	s.once.Do(func() { close(s.inFlight) })
	<-ctx.Done()
	return ctx.Err()
}

// TestStoppingTheHeartbeatIsNoStoreError: when the work ends while a lease
// extension is in flight, the keeper's stop (after Complete, or
// claimctx StopHeartbeat from stores/postgres RunInTx) cancels that
// extension, which is no store_error: nothing failed, the record was
// completed. (It was reported as one, at error level, and counted by
// metrics as a store failure.)
func TestStoppingTheHeartbeatIsNoStoreError(t *testing.T) {
	store := &stallingExtendStore{Store: memstore.New(nil), inFlight: make(chan struct{})}
	obs := newDecisions()
	e, err := dedup.NewEngine(dedup.Config{Store: store, Lease: time.Minute, Heartbeat: 10 * time.Millisecond, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.Do(context.Background(), dedup.Call{Scope: "s", Key: "k"}, func(ctx context.Context) ([]byte, error) {
		<-store.inFlight // an extension is in flight
		return nil, nil
	})
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("Do = %v, %v", res.Outcome, err)
	}
	for _, d := range obs.of(event.StoreError) {
		t.Errorf("spurious %s on %q after a successful completion: %v", d.Event, d.Op, d.Err)
	}
}
