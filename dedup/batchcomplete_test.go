package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/poll"
)

// realTimeBound bounds, in real time, what a test waits for that the
// fixed engine does at once but the engine of the bug never does (a
// completion sent while another record's work hangs, a batch that ends
// without a wait on the fake clock): generous for a machine busy with
// other tests, short enough to fail rather than hang.
const realTimeBound = 10 * time.Second

// invocationCalls are the calls of a Lambda invocation ending at deadline
// on the keys of scope s, as lambdadedup makes them: each call's Deadline
// is the invocation's, its StartBy the deadline less a margin of 2s.
func invocationCalls(deadline time.Time, keys ...string) []dedup.BatchCall {
	b := calls("s", keys...)
	for i := range b {
		b[i].Deadline, b[i].StartBy = deadline, deadline.Add(-2*time.Second)
	}
	return b
}

// recordState is the state of the record of key in the store s:
// "completed", "in_progress", or why there is none.
func recordState(ctx context.Context, s admin.Interface, key string) string {
	r, err := s.Inspect(ctx, key)
	if err != nil {
		if errors.Is(err, admin.ErrNotFound) {
			return "absent"
		}
		return err.Error()
	}
	return r.State
}

// TestDoBatchCompletesEachRecordAsItsWorkReturns proves that a batch's
// record is completed in the store as soon as its work returns, not once
// the batch's last work has returned: record a's work returns at once,
// record b's hangs past the invocation's deadline (a handler that ignores
// its context), and a's record reads completed while b still runs. The
// invocation is then abandoned at its deadline, as the Lambda runtime
// ends it, and the batch redelivered to a new engine over the same
// store: a is a Duplicate and its work ran once over both invocations.
// (The completions were queued until every work had returned: a's record
// stayed in progress, its lease ended with the invocation, and the
// redelivery ran a's effect a second time.)
func TestDoBatchCompletesEachRecordAsItsWorkReturns(t *testing.T) {
	for _, concurrency := range []int{1, 2} {
		t.Run(fmt.Sprint("concurrency=", concurrency), func(t *testing.T) {
			ctx := context.Background()
			clock := fakeclock.New(batchEpoch)
			mem := memstore.New(clock)
			deadline := batchEpoch.Add(10 * time.Second)

			var aRuns atomic.Int32
			bStarted, hang, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
			first := newBatchEngine(t, mem, clock)
			go func() {
				defer close(done)
				first.DoBatch(ctx, dedup.Batch{Calls: invocationCalls(deadline, "a", "b"), Concurrency: concurrency},
					func(_ context.Context, i int) ([]byte, error) {
						if i == 0 {
							aRuns.Add(1)
							return []byte("charged"), nil
						}
						close(bStarted)
						<-hang // b's handler hangs, whatever its context says
						return nil, nil
					})
			}()
			defer func() {
				// The abandoned invocation's goroutine ends once b's work
				// returns.
				close(hang)
				select {
				case <-done:
				case <-time.After(time.Minute):
					t.Error("the abandoned DoBatch did not return within a minute of b's work returning")
				}
			}()
			select {
			case <-bStarted:
			case <-time.After(realTimeBound):
				t.Fatalf("b's work did not start within %v", realTimeBound)
			}

			if !poll.Until(realTimeBound, func() bool { return recordState(ctx, mem, "s:a") == admin.StateCompleted }) {
				t.Errorf("a's record is %s %v after a's work returned, while b's work still runs; want completed (a's completion waits for the batch's last work)",
					recordState(ctx, mem, "s:a"), realTimeBound)
			}

			// The invocation ends at its deadline: the runtime stops it,
			// nothing more of it runs.
			clock.Advance(deadline.Sub(clock.Now()) + time.Second)

			second := newBatchEngine(t, mem, clock)
			res := doBatch(second, ctx, dedup.Batch{Calls: invocationCalls(clock.Now().Add(10*time.Second), "a", "b"), Concurrency: concurrency},
				func(_ context.Context, i int) ([]byte, error) {
					if i == 0 {
						aRuns.Add(1)
						return []byte("charged"), nil
					}
					return nil, nil
				})
			if n := aRuns.Load(); n != 1 {
				t.Errorf("a's work ran %d times over the abandoned invocation and its redelivery, want 1", n)
			}
			if r := res[0]; r.Err != nil || r.Outcome != dedup.Duplicate || string(r.Result) != "charged" {
				t.Errorf("redelivered a: %v %q %v; want a duplicate of the first run (\"charged\")", r.Outcome, r.Result, r.Err)
			}
			if r := res[1]; r.Err != nil || r.Outcome != dedup.Acquired {
				t.Errorf("redelivered b: %v %v; want acquired (its lease ended with the invocation)", r.Outcome, r.Err)
			}
		})
	}
}
