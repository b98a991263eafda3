package dedup_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// TestWorkContextFollowsTheCaller: the work's context behaves as
// context.WithCancelCause of the caller's context (with the claim as a
// value), although the engine makes that context only when something waits
// on it: the caller's cancellation and its cause are seen whether the work
// asked for Done before or after it, a child context ends with it, values
// pass through, a caller's deadline shows as DeadlineExceeded, and the
// context is cancelled once Do returned.
func TestWorkContextFollowsTheCaller(t *testing.T) {
	e, err := dedup.NewEngine(dedup.Config{Store: memstore.New(nil)})
	if err != nil {
		t.Fatal(err)
	}
	errCaller := errors.New("the caller gave up")
	type seen struct {
		err, cause, childErr error
		value                any
		claimed              bool
	}
	run := func(t *testing.T, key string, parent context.Context, cancel context.CancelCauseFunc, doneFirst bool) (seen, context.Context) {
		t.Helper()
		var s seen
		var kept context.Context
		_, err := e.Do(parent, dedup.Call{Scope: "s", Key: key}, func(work context.Context) ([]byte, error) {
			kept = work
			s.value = work.Value(ctxKey{})
			_, s.claimed = dedup.HeldClaimFromContext(work)
			var child context.Context
			if doneFirst {
				var cancelChild context.CancelFunc
				child, cancelChild = context.WithCancel(work)
				defer cancelChild()
			}
			if cancel != nil {
				cancel(errCaller)
			}
			if doneFirst {
				recv(t, "the work's context to end with the caller's", work.Done())
				recv(t, "the child's context to end with the work's", child.Done())
				s.childErr = child.Err()
			}
			s.err, s.cause = work.Err(), context.Cause(work)
			if !doneFirst && cancel != nil {
				recv(t, "the work's context (asked after the caller ended) to be done", work.Done())
			}
			return nil, nil
		})
		if err != nil {
			t.Fatalf("Do: %v", err)
		}
		return s, kept
	}
	for _, doneFirst := range []bool{false, true} {
		name := map[bool]string{false: "cancel-then-ask", true: "ask-then-cancel"}[doneFirst]
		t.Run(name, func(t *testing.T) {
			parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), ctxKey{}, "v"))
			defer cancel(nil)
			s, kept := run(t, name, parent, cancel, doneFirst)
			if !errors.Is(s.err, context.Canceled) || !errors.Is(s.cause, errCaller) || s.value != "v" || !s.claimed {
				t.Errorf("work saw err %v, cause %v, value %v, claim %v; want Canceled, the caller's cause, its value, the claim", s.err, s.cause, s.value, s.claimed)
			}
			if doneFirst && !errors.Is(s.childErr, context.Canceled) {
				t.Errorf("child: %v, want context.Canceled", s.childErr)
			}
			if kept.Err() == nil {
				t.Errorf("the work's context is live after Do returned")
			}
		})
	}
	t.Run("deadline", func(t *testing.T) {
		// A caller whose deadline passes while the work runs: the work's
		// context and its children report DeadlineExceeded, as children of
		// the standard library's contexts do.
		parent := &expiringCtx{Context: context.Background(), done: make(chan struct{}), at: time.Now().Add(time.Hour)}
		_, err := e.Do(parent, dedup.Call{Scope: "s", Key: "deadline"}, func(work context.Context) ([]byte, error) {
			if d, ok := work.Deadline(); !ok || !d.Equal(parent.at) {
				t.Errorf("work's deadline %v %v, want the caller's %v", d, ok, parent.at)
			}
			parent.expire()
			if err := work.Err(); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("work's Err after the caller's deadline: %v, want DeadlineExceeded", err)
			}
			child, cancel := context.WithCancel(work)
			defer cancel()
			recv(t, "the child of the work's context to end", child.Done())
			if !errors.Is(child.Err(), context.DeadlineExceeded) {
				t.Errorf("child's Err: %v, want DeadlineExceeded", child.Err())
			}
			return nil, nil
		})
		if err != nil {
			t.Fatalf("Do: %v", err)
		}
	})
	t.Run("no-cancel", func(t *testing.T) {
		s, kept := run(t, "quiet", context.WithValue(context.Background(), ctxKey{}, "v"), nil, false)
		if s.err != nil || s.value != "v" || !s.claimed {
			t.Errorf("work saw err %v, value %v, claim %v; want no error, the caller's value, the claim", s.err, s.value, s.claimed)
		}
		if !errors.Is(kept.Err(), context.Canceled) {
			t.Errorf("after Do: %v, want context.Canceled", kept.Err())
		}
		select {
		case <-kept.Done():
		default:
			t.Errorf("the work's context, asked for Done after Do returned, is not done")
		}
	})
}

// expiringCtx is a context whose deadline passes when the test says so.
type expiringCtx struct {
	context.Context
	done    chan struct{}
	at      time.Time
	mu      sync.Mutex
	expired bool
}

func (c *expiringCtx) expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.expired {
		c.expired = true
		close(c.done)
	}
}

func (c *expiringCtx) Deadline() (time.Time, bool) { return c.at, true }
func (c *expiringCtx) Done() <-chan struct{}       { return c.done }
func (c *expiringCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.expired {
		return context.DeadlineExceeded
	}
	return nil
}
