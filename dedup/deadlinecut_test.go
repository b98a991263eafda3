package dedup_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// extendCountingStore counts the Extend requests sent to the inner store.
type extendCountingStore struct {
	dedup.Store
	extends atomic.Int64
}

func (s *extendCountingStore) Extend(ctx context.Context, c dedup.Claim, lease time.Duration) error {
	s.extends.Add(1)
	return s.Store.Extend(ctx, c, lease)
}

// TestNoExtensionOnceTheLeaseEndsAtTheDeadline: a call whose Deadline
// (a Lambda invocation's) comes before its lease would end gets a lease
// cut to end there, and an extension cannot move that end: it would only
// send the store a write that changes nothing (a DynamoDB write unit per
// heartbeat). The keeper arms the deadline's timer alone. Before, it
// armed a heartbeat at a third of the cut lease and sent an Extend there
// and at every heartbeat after it.
func TestNoExtensionOnceTheLeaseEndsAtTheDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	clock := fakeclock.New(epoch)
	store := &extendCountingStore{Store: memstore.New(clock)}
	e, err := dedup.NewEngine(dedup.Config{Store: store, Clock: clock, Lease: 30 * time.Second, Heartbeat: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	deadline := epoch.Add(20 * time.Second) // lease cut to 20s; the work is cancelled 1s before
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), dedup.Call{Scope: "s", Key: "k", Deadline: deadline}, func(ctx context.Context) ([]byte, error) {
			<-ctx.Done() // work that runs until it is cut off
			return nil, context.Cause(ctx)
		})
		done <- err
	}()
	if err := clock.WaitForTimerAt(ctx, deadline.Add(-time.Second)); err != nil {
		t.Fatalf("no timer at the deadline less the margin (%v): the keeper armed a heartbeat (%d timers) although no extension can move a lease cut to the call's Deadline", err, clock.Timers())
	}
	clock.Advance(deadline.Add(-time.Second).Sub(clock.Now()))
	if err := recv(t, "Do to return", done); !errors.Is(err, dedup.ErrClaimLost) {
		t.Fatalf("Do = %v, want the work cut off at the deadline (ErrClaimLost)", err)
	}
	if n := store.extends.Load(); n != 0 {
		t.Fatalf("%d Extend requests sent, want none", n)
	}
}
