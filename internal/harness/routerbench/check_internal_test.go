package routerbench

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// forgetful is a broken store: every claim is Acquired, so nothing is ever
// a duplicate.
type forgetful struct{ n atomic.Int64 }

func (f *forgetful) Claim(_ context.Context, key, _ string, _ time.Duration) (dedup.ClaimResult, error) {
	return dedup.ClaimResult{Outcome: dedup.Acquired, Claim: dedup.Claim{Key: key, Token: strings.Repeat("t", int(f.n.Add(1)%7+1))}}, nil
}
func (*forgetful) Complete(context.Context, dedup.Claim, []byte, time.Duration) error { return nil }
func (*forgetful) Release(context.Context, dedup.Claim) error                         { return nil }
func (*forgetful) Extend(context.Context, dedup.Claim, time.Duration) error           { return nil }

// TestDuplicateLaneCatchesHandlerCalls shows that the harness refuses to
// report a duplicate path that runs the handler: a figure for a path that
// does not deduplicate would be meaningless.
func TestDuplicateLaneCatchesHandlerCalls(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := newRig(ctx, &forgetful{}, "check", 2, 0, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.stop() }()
	_, _, err = r.checked(ctx, r.lanes[vDup], 2, 0, 20)
	if err == nil || !strings.Contains(err.Error(), "the handler ran 20 times for 20 messages, want 0") {
		t.Fatalf("checked on a store that forgets: %v, want the handler-call mismatch", err)
	}
	// The happy lane on the same store is fine: every message reaches the
	// handler once.
	if _, _, err := r.checked(ctx, r.lanes[vHappy], 2, 0, 20); err != nil {
		t.Fatalf("happy lane: %v", err)
	}
}

// TestFloorLaneRunsFloor shows that the router+raw pair lane's handler
// runs the floor once per message, with the message's scoped key, and
// that a failing floor fails the measurement.
func TestFloorLaneRunsFloor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var (
		calls atomic.Int64
		fail  atomic.Bool
		bad   atomic.Value
	)
	floor := func(_ context.Context, key string) error {
		calls.Add(1)
		if !strings.HasPrefix(key, scope+":ORDER-check-pair-") {
			bad.Store(key)
		}
		if fail.Load() {
			return errors.New("floor failed")
		}
		return nil
	}
	r, err := newRig(ctx, &forgetful{}, "check", 2, 0, false, floor)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.stop() }()
	l, ok := r.lanes[vRouterFloor]
	if !ok {
		t.Fatalf("no %s lane", vRouterFloor)
	}
	if _, _, err := r.checked(ctx, l, 2, 0, 20); err != nil {
		t.Fatalf("floor lane: %v", err)
	}
	if got := calls.Load(); got != 20 {
		t.Errorf("floor ran %d times for 20 messages", got)
	}
	if k := bad.Load(); k != nil {
		t.Errorf("floor got key %q, want the message's scoped key", k)
	}
	fail.Store(true)
	if _, _, err := r.checked(ctx, l, 2, 0, 4); err == nil || !strings.Contains(err.Error(), "floor failed") {
		t.Errorf("checked with a failing floor: %v, want its error", err)
	}
}
