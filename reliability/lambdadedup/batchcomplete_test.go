package lambdadedup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/poll"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
)

// realTimeBound bounds, in real time, what a test waits for that the
// fixed adapter does at once but the adapter of the bug never does (a
// completion sent while another record's handler hangs, a batch that ends
// without a wait on the fake clock): generous for a machine busy with
// other tests, short enough to fail rather than hang.
const realTimeBound = 10 * time.Second

// recordState is the state of the record of key in the store s:
// "completed", "in_progress", or why there is none.
func recordState(s admin.Interface, key string) string {
	r, err := s.Inspect(context.Background(), key)
	if err != nil {
		if errors.Is(err, admin.ErrNotFound) {
			return "absent"
		}
		return err.Error()
	}
	return r.State
}

// TestSQSBatchCompletesARecordAsItsHandlerReturns proves that the SQS
// adapter completes a record in the store as soon as its handler returns,
// not once the batch's last handler has returned: order A's handler
// returns at once, order B's hangs past the invocation's deadline (a
// handler that ignores its context), and A's record reads completed while
// B still runs. The invocation is then abandoned at its deadline, as the
// Lambda runtime ends it, and both records redelivered to a new handler
// over the same store: A is a duplicate (charged once over both
// invocations), B runs. (The batch queued its completions until every
// handler had returned: A's record stayed in progress, its lease ended
// with the invocation, and the redelivery charged A again.)
func TestSQSBatchCompletesARecordAsItsHandlerReturns(t *testing.T) {
	for _, concurrency := range []int{1, 2} {
		t.Run(fmt.Sprint("concurrency=", concurrency), func(t *testing.T) {
			clock := fakeclock.New(time.Now())
			store := memstore.New(clock)
			var (
				mu      sync.Mutex
				charges = map[string]int{}
			)
			bStarted, hang, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
			handle := func(msg *message.Message) error {
				id, err := keyfuncs.JSON("order_id")(msg)
				if err != nil {
					return err
				}
				mu.Lock()
				charges[id]++
				n := charges[id]
				mu.Unlock()
				if id == "B" && n == 1 {
					close(bStarted)
					<-hang // B's first handler hangs, whatever its context says
				}
				return nil
			}
			cfg := lambdadedup.Config{Concurrency: concurrency, Dedup: dedup.Config{Store: store, Clock: clock}}
			h := newHandler(t, cfg, handle)

			// The invocation's deadline (real time, for the context; the
			// fake clock reads the same instant and never reaches it
			// unless the test moves it).
			deadline := clock.Now().Add(30 * time.Second)
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			defer cancel()
			payload, err := json.Marshal(events.SQSEvent{Records: []events.SQSMessage{record("m1", order("A")), record("m2", order("B"))}})
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				defer close(done)
				_, _ = lambda.NewHandler(h.Handle).Invoke(ctx, payload)
			}()
			defer func() {
				// The abandoned invocation's goroutine ends once B's
				// handler returns.
				close(hang)
				select {
				case <-done:
				case <-time.After(time.Minute):
					t.Error("the abandoned invocation did not return within a minute of B's handler returning")
				}
			}()
			select {
			case <-bStarted:
			case <-time.After(realTimeBound):
				t.Fatalf("B's handler did not start within %v", realTimeBound)
			}

			keyA := admin.ScopedKey("charge-orders", "A")
			if !poll.Until(realTimeBound, func() bool { return recordState(store, keyA) == admin.StateCompleted }) {
				t.Errorf("A's record is %s %v after A's handler returned, while B's handler still runs; want completed (A's completion waits for the batch's last handler)",
					recordState(store, keyA), realTimeBound)
			}

			// The runtime ends the invocation at its deadline.
			clock.Advance(deadline.Sub(clock.Now()) + time.Second)
			cancel()

			ctx2, cancel2 := context.WithDeadline(context.Background(), clock.Now().Add(30*time.Second))
			defer cancel2()
			if f := invoke(t, ctx2, newHandler(t, cfg, handle), record("m1", order("A")), record("m2", order("B"))); len(f) != 0 {
				t.Errorf("redelivery: failures %v, want none", f)
			}
			mu.Lock()
			defer mu.Unlock()
			if charges["A"] != 1 {
				t.Errorf("A charged %d times over the abandoned invocation and its redelivery, want 1", charges["A"])
			}
			if charges["B"] != 2 {
				t.Errorf("B's handler ran %d times, want 2 (the hung one, and the redelivery's: its lease ended with the invocation)", charges["B"])
			}
		})
	}
}
