package dedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

type ctxKey struct{}

// stallingStore hangs the operations named in stall until their context
// ends, as a request on a dead link does, and reports what each operation's
// context looked like.
type stallingStore struct {
	dedup.Store
	stall map[string]bool
	seen  chan opSeen
}

type opSeen struct {
	op        string
	value     any  // the caller's context value
	deadline  bool // the context had a deadline
	err       error
	childErr  error // the cause of a context.WithCancel child once the op's context ended
	cancelled bool  // the context was already cancelled when the op started
}

func (s *stallingStore) observe(ctx context.Context, op string) error {
	seen := opSeen{op: op, value: ctx.Value(ctxKey{}), cancelled: ctx.Err() != nil}
	_, seen.deadline = ctx.Deadline()
	if s.stall[op] {
		child, cancel := context.WithCancel(ctx)
		defer cancel()
		<-ctx.Done()
		<-child.Done() // a child ends with its parent
		seen.err, seen.childErr = ctx.Err(), context.Cause(child)
	}
	s.seen <- seen
	return seen.err
}

func (s *stallingStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	if err := s.observe(ctx, "claim"); err != nil {
		return dedup.ClaimResult{}, err
	}
	return s.Store.Claim(ctx, key, fp, lease)
}

func (s *stallingStore) Complete(ctx context.Context, c dedup.Claim, result []byte, retention time.Duration) error {
	if err := s.observe(ctx, "complete"); err != nil {
		return err
	}
	return s.Store.Complete(ctx, c, result, retention)
}

func (s *stallingStore) Release(ctx context.Context, c dedup.Claim) error {
	if err := s.observe(ctx, "release"); err != nil {
		return err
	}
	return s.Store.Release(ctx, c)
}

// TestStoreTimeoutBoundsEveryOperation: each store operation's context
// carries the caller's values and ends at StoreTimeout (DeadlineExceeded),
// and so do its children (their cause is DeadlineExceeded); Complete and Release run on a context that the
// caller's cancellation does not end. The engine gives these contexts
// without a timer until a store asks for Done, so this checks that the lazy
// deadline still fires for a store that waits on it.
func TestStoreTimeoutBoundsEveryOperation(t *testing.T) {
	const timeout = 50 * time.Millisecond
	run := func(t *testing.T, stall string, fail bool, cancelFirst bool) []opSeen {
		t.Helper()
		store := &stallingStore{Store: memstore.New(nil), stall: map[string]bool{stall: true}, seen: make(chan opSeen, 4)}
		e, err := dedup.NewEngine(dedup.Config{Store: store, StoreTimeout: timeout, CompleteRetries: 1, CompleteBackoff: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
		defer cancel()
		done := make(chan error, 1)
		go func() {
			_, err := e.Do(ctx, dedup.Call{Scope: "s", Key: "k"}, func(context.Context) ([]byte, error) {
				if cancelFirst {
					cancel() // the caller gives up while the work runs
				}
				if fail {
					return nil, errors.New("work failed")
				}
				return nil, nil
			})
			done <- err
		}()
		err = recv(t, "Do to return", done)
		if stall == "claim" && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Do with a hung claim: %v, want a StoreError wrapping context.DeadlineExceeded", err)
		}
		close(store.seen)
		var seen []opSeen
		for s := range store.seen {
			seen = append(seen, s)
		}
		return seen
	}
	check := func(t *testing.T, s opSeen, stalled, wantCancelled bool) {
		t.Helper()
		if s.value != "v" || !s.deadline || s.cancelled != wantCancelled {
			t.Errorf("%s: value %v, deadline %v, cancelled at start %v; want the caller's value, a deadline, cancelled %v", s.op, s.value, s.deadline, s.cancelled, wantCancelled)
		}
		if stalled && (!errors.Is(s.err, context.DeadlineExceeded) || !errors.Is(s.childErr, context.DeadlineExceeded)) {
			t.Errorf("%s: hung operation ended with %v (child %v), want context.DeadlineExceeded for both", s.op, s.err, s.childErr)
		}
	}
	t.Run("claim", func(t *testing.T) {
		seen := run(t, "claim", false, false)
		if len(seen) != 1 {
			t.Fatalf("operations %+v, want the claim only", seen)
		}
		check(t, seen[0], true, false)
	})
	t.Run("complete-after-cancel", func(t *testing.T) {
		seen := run(t, "complete", false, true)
		if len(seen) != 3 { // claim, complete, one retry
			t.Fatalf("operations %+v, want claim, complete and its retry", seen)
		}
		check(t, seen[0], false, false)
		check(t, seen[1], true, false) // detached: the caller's cancellation does not reach it
		check(t, seen[2], true, false)
	})
	t.Run("release-after-cancel", func(t *testing.T) {
		seen := run(t, "release", true, true)
		if len(seen) != 2 {
			t.Fatalf("operations %+v, want claim and release", seen)
		}
		check(t, seen[1], true, false)
	})
	t.Run("no-stall", func(t *testing.T) {
		seen := run(t, "", false, false)
		if len(seen) != 2 {
			t.Fatalf("operations %+v, want claim and complete", seen)
		}
		check(t, seen[0], false, false)
		check(t, seen[1], false, false)
	})
}
