package dedup

import (
	"context"
	"errors"
	"testing"
	"time"
)

// wait fails t unless ch closes within a minute (the bound only keeps a
// broken build from hanging; nothing here is timed).
func wait(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// attachedOp starts a claim's context on a fresh work context over parent.
func attachedOp(parent context.Context, timeout time.Duration) (*opContext, *callRun) {
	f := &callRun{}
	f.newWorkContext(parent)
	op := &opContext{}
	op.start(f.work, f.work, timeout, time.Now())
	return op, f
}

// TestClaimDoneLeavesTheWorkContextUnmade: a store that asks the claim's
// context for Done (go-redis does, for every command) and is answered
// within linkDelay makes neither the work's cancellable context nor a
// registration with the caller's context: the operation's channel is its
// own. The work's context still follows the caller afterwards. (It was
// made for every claim before: a node, two channels and the caller's map
// of children per message.)
func TestClaimDoneLeavesTheWorkContextUnmade(t *testing.T) {
	parent, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	op, f := attachedOp(parent, time.Hour)
	done := op.Done()
	select {
	case <-done:
		t.Fatal("the claim's context is done while it runs")
	default:
	}
	op.end()
	wait(t, "the ended claim's Done", done)
	if f.work.inner.Load() != nil {
		t.Error("the claim's Done made the work's context")
	}
	if op.Err() != context.Canceled || context.Cause(op) != context.Canceled {
		t.Errorf("ended claim: Err %v, Cause %v; want context.Canceled", op.Err(), context.Cause(op))
	}
	errCaller := errors.New("the caller gave up")
	workDone := f.work.Done()
	cancel(errCaller)
	wait(t, "the work's context to end with the caller's", workDone)
	if context.Cause(f.work) != errCaller {
		t.Errorf("work's cause %v, want the caller's", context.Cause(f.work))
	}
}

// TestSlowClaimSeesTheCallersCancellation: a claim still running past
// linkDelay links to the work's context, so that a store waiting on Done
// sees the caller's cancellation (and its cause), as do the claim's
// children; a caller cancelled before the store asks is seen at once; the
// link is undone when the claim ends.
func TestSlowClaimSeesTheCallersCancellation(t *testing.T) {
	errCaller := errors.New("the caller gave up")
	linked := func(op *opContext) chan struct{} {
		ch := make(chan struct{})
		go func() {
			for {
				op.mu.Lock()
				ok := op.more != nil && op.more.unlink != nil
				op.mu.Unlock()
				if ok {
					close(ch)
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
		return ch
	}
	t.Run("cancelled while waiting", func(t *testing.T) {
		parent, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		op, _ := attachedOp(parent, time.Hour)
		defer op.end()
		child, cancelChild := context.WithCancel(op)
		defer cancelChild()
		done := op.Done()
		wait(t, "the claim to link to its parent", linked(op))
		cancel(errCaller)
		wait(t, "the claim's Done after the caller's cancellation", done)
		wait(t, "the claim's child", child.Done())
		if op.Err() != context.Canceled || context.Cause(op) != errCaller {
			t.Errorf("claim: Err %v, Cause %v; want context.Canceled and the caller's cause", op.Err(), context.Cause(op))
		}
		if context.Cause(child) != errCaller {
			t.Errorf("child's cause %v, want the caller's", context.Cause(child))
		}
	})
	t.Run("cancelled before Done", func(t *testing.T) {
		parent, cancel := context.WithCancelCause(context.Background())
		op, _ := attachedOp(parent, time.Hour)
		defer op.end()
		cancel(errCaller)
		select {
		case <-op.Done():
		default:
			t.Fatal("the claim's Done is open after the caller's cancellation")
		}
	})
	t.Run("ended after linking", func(t *testing.T) {
		parent, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		op, f := attachedOp(parent, time.Hour)
		op.Done()
		wait(t, "the claim to link to its parent", linked(op))
		op.end()
		op.mu.Lock()
		left := op.more.unlink
		op.mu.Unlock()
		if left != nil {
			// A registration left behind would grow a long-lived
			// caller's children with every slow claim.
			t.Error("the ended claim kept its link to the work's context")
		}
		if f.work.inner.Load() == nil {
			t.Error("the link did not go through the work's context")
		}
	})
	t.Run("deadline", func(t *testing.T) {
		parent, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		op, f := attachedOp(parent, 20*time.Millisecond)
		defer op.end()
		wait(t, "the claim's deadline", op.Done())
		if op.Err() != context.DeadlineExceeded || context.Cause(op) != context.DeadlineExceeded {
			t.Errorf("claim past its deadline: Err %v, Cause %v; want DeadlineExceeded", op.Err(), context.Cause(op))
		}
		if err := f.work.Err(); err != nil {
			t.Errorf("the claim's deadline ended the work's context: %v", err)
		}
	})
}

// TestClaimErrStaysOnceReported: a claim's context keeps the error (and
// cause) it reported: the caller's, after the caller ended first, also once
// the claim returned; DeadlineExceeded, with that cause, once its deadline
// passed, also before its timer fired (the store never asked for Done).
func TestClaimErrStaysOnceReported(t *testing.T) {
	errCaller := errors.New("the caller gave up")
	t.Run("caller first", func(t *testing.T) {
		parent, cancel := context.WithCancelCause(context.Background())
		op, _ := attachedOp(parent, time.Hour)
		cancel(errCaller)
		if op.Err() != context.Canceled || context.Cause(op) != errCaller {
			t.Fatalf("running: Err %v, Cause %v; want context.Canceled and the caller's cause", op.Err(), context.Cause(op))
		}
		op.end()
		if op.Err() != context.Canceled || context.Cause(op) != errCaller {
			t.Errorf("ended: Err %v, Cause %v; want the caller's, as before the end", op.Err(), context.Cause(op))
		}
	})
	t.Run("deadline passed, no timer", func(t *testing.T) {
		parent, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		op, _ := attachedOp(parent, -time.Second) // its deadline already passed
		defer op.end()
		if op.Err() != context.DeadlineExceeded || context.Cause(op) != context.DeadlineExceeded {
			t.Errorf("past its deadline: Err %v, Cause %v; want DeadlineExceeded for both", op.Err(), context.Cause(op))
		}
	})
}
