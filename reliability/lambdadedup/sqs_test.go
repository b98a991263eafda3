package lambdadedup_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/examples/lambda/esm"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
)

// fn gives each execution environment its own lambda.Handler.
func fn(handler any) func() lambda.Handler {
	return func() lambda.Handler { return lambda.NewHandler(handler) }
}

func deleted(n int) func(esm.Stats) bool { return func(s esm.Stats) bool { return s.Deleted >= n } }

// Seed 003's lab in Lambda shape: ORDER-003 sent ten times (ten
// MessageIds), five concurrent invocations.
func TestLabLambdaShape(t *testing.T) {
	copies := make([]string, 10)
	for i := range copies {
		copies[i] = order("ORDER-003")
	}
	for _, batch := range []int32{1, 10} {
		t.Run(fmt.Sprintf("batch %d with the adapter", batch), func(t *testing.T) {
			url := newQueue(t, false)
			send(t, url, "", copies...)
			c := newCharger()
			inv := &counting{}
			if batch == 1 {
				// The first charge lasts until five invocations have
				// started, so that copies meet it in progress.
				var once atomic.Bool
				c.fail = func(string, int) error {
					if !once.Swap(true) {
						return waitUntil(func() bool { return inv.started.Load() >= 5 }, "five invocations started")
					}
					return nil
				}
			}
			h := newHandler(t, lambdadedup.Config{}, c.handle)
			s := runMapping(t, esm.Mapping{QueueURL: url, Function: inv.function(h.Handle), BatchSize: batch, Invocations: 5},
				"all ten copies deleted", deleted(10))
			t.Logf("batch %d, adapter: %d charges, %d invocations, %d records delivered, %d failures reported, %d redeliveries",
				batch, c.total(), s.Invocations, s.Records, s.Failures, s.Redeliveries)
			if c.total() != 1 {
				t.Errorf("%d charges, want 1", c.total())
			}
			if n := depth(t, url); n != 0 {
				t.Errorf("%d messages left in the queue", n)
			}
		})
		t.Run(fmt.Sprintf("batch %d without the adapter", batch), func(t *testing.T) {
			url := newQueue(t, false)
			send(t, url, "", copies...)
			var charges atomic.Int64
			plain := func(_ context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
				charges.Add(int64(len(ev.Records)))
				return events.SQSEventResponse{}, nil
			}
			s := runMapping(t, esm.Mapping{QueueURL: url, Function: fn(plain), BatchSize: batch, Invocations: 5},
				"all ten copies deleted", deleted(10))
			t.Logf("batch %d, no adapter: %d charges, %d invocations, %d failures reported", batch, charges.Load(), s.Invocations, s.Failures)
			if charges.Load() != 10 {
				t.Errorf("%d charges, want 10", charges.Load())
			}
		})
	}
}

// counting counts the invocations started.
type counting struct{ started atomic.Int64 }

type countingHandler struct {
	c *counting
	h lambda.Handler
}

func (c *counting) function(handler any) func() lambda.Handler {
	return func() lambda.Handler { return countingHandler{c, lambda.NewHandler(handler)} }
}

func (h countingHandler) Invoke(ctx context.Context, payload []byte) ([]byte, error) {
	h.c.started.Add(1)
	return h.h.Invoke(ctx, payload)
}

// waitUntil polls cond for at most 10s, for a handler (no t.Fatal there).
func waitUntil(cond func() bool, what string) error {
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after 10s waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// One poison record in a batch: only its id comes back.
func TestPoisonRecord(t *testing.T) {
	url := newQueue(t, false)
	bodies := []string{`{"amount":1}`} // no order_id
	for i := range 9 {
		bodies = append(bodies, order(fmt.Sprint("ORDER-", i)))
	}
	ids := send(t, url, "", bodies...)
	poison := ids[0]
	c := newCharger()
	h := newHandler(t, lambdadedup.Config{}, c.handle)
	s := runMapping(t, esm.Mapping{QueueURL: url, Function: fn(h.Handle), BatchSize: 10},
		"the nine good records deleted and the poison record delivered three times",
		func(s esm.Stats) bool { return s.Deleted >= 9 && s.Deliveries[poison] >= 3 })
	t.Logf("poison: %d charges, %d invocations, %d records, %d failures reported, %d redeliveries", c.total(), s.Invocations, s.Records, s.Failures, s.Redeliveries)
	for _, id := range ids[1:] {
		if s.Deliveries[id] != 1 {
			t.Errorf("good record %s delivered %d times, want 1", id, s.Deliveries[id])
		}
	}
	if s.Failures != s.Deliveries[poison] || s.Redeliveries != s.Deliveries[poison]-1 {
		t.Errorf("%d failures and %d redeliveries for %d poison deliveries: only the poison record may fail and come back",
			s.Failures, s.Redeliveries, s.Deliveries[poison])
	}
	if c.total() != 9 {
		t.Errorf("%d charges, want 9", c.total())
	}
}

// A handler that fails once: the record comes back after the visibility
// timeout and is charged once.
func TestHandlerFailsOnce(t *testing.T) {
	url := newQueue(t, false)
	ids := send(t, url, "", order("ORDER-1"), order("ORDER-2"))
	c := newCharger()
	var failed atomic.Bool
	c.fail = func(id string, _ int) error {
		if id == "ORDER-1" && !failed.Swap(true) {
			return errors.New("gateway timeout")
		}
		return nil
	}
	h := newHandler(t, lambdadedup.Config{}, c.handle)
	s := runMapping(t, esm.Mapping{QueueURL: url, Function: fn(h.Handle)}, "both records deleted", deleted(2))
	t.Logf("fails once: %d charges, %d invocations, %d failures reported, %d redeliveries", c.total(), s.Invocations, s.Failures, s.Redeliveries)
	if c.charges["ORDER-1"] != 1 || c.charges["ORDER-2"] != 1 {
		t.Errorf("charges %v, want each order once", c.charges)
	}
	if s.Deliveries[ids[0]] != 2 || s.Deliveries[ids[1]] != 1 || s.Failures != 1 || s.Redeliveries != 1 {
		t.Errorf("deliveries %v, %d failures, %d redeliveries; want ORDER-1 twice, ORDER-2 once, 1 failure, 1 redelivery",
			s.Deliveries, s.Failures, s.Redeliveries)
	}
}

// skewClock is the wall clock plus an offset that a handler moves forward
// to stand for the time its work takes; the offset starts again at zero
// with every invocation (see resetting). The invocation deadlines of the
// mapping are wall-clock times, so a fake clock alone cannot be used.
type skewClock struct{ offset atomic.Int64 }

func (c *skewClock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *skewClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

type resetting struct {
	h     lambda.Handler
	clock *skewClock
}

func (r resetting) Invoke(ctx context.Context, payload []byte) ([]byte, error) {
	r.clock.offset.Store(0)
	return r.h.Invoke(ctx, payload)
}

// The deadline margin on SQS: a 3s function whose charges take 1.5s each
// and a 2s margin runs one record per invocation; the others come back.
func TestDeadlineMarginSQS(t *testing.T) {
	url := newQueue(t, false)
	send(t, url, "", order("ORDER-1"), order("ORDER-2"), order("ORDER-3"))
	clock := &skewClock{}
	c := newCharger()
	c.fail = func(string, int) error { clock.offset.Add(int64(1500 * time.Millisecond)); return nil }
	h := newHandler(t, lambdadedup.Config{DeadlineMargin: 2 * time.Second, Dedup: dedup.Config{Clock: clock}}, c.handle)
	s := runMapping(t, esm.Mapping{QueueURL: url, Function: func() lambda.Handler { return resetting{lambda.NewHandler(h.Handle), clock} }, FunctionTimeout: 3 * time.Second},
		"the three records deleted", deleted(3))
	t.Logf("deadline: %d charges, %d invocations, %d records, %d failures reported, %d redeliveries, batches %v",
		c.total(), s.Invocations, s.Records, s.Failures, s.Redeliveries, s.Batches)
	if c.total() != 3 || len(c.charges) != 3 {
		t.Errorf("charges %v, want each order once", c.charges)
	}
	// Each invocation runs the first record of its batch only: the three
	// records come as batches of 3, 2 and 1 when fauxqs hands all visible
	// messages at once (batches of fewer records only add invocations).
	if s.Invocations < 3 || s.Failures != s.Records-3 {
		t.Errorf("%d invocations, %d records, %d failures: want at least 3 invocations, and every record but the first of each batch failed",
			s.Invocations, s.Records, s.Failures)
	}
}

// FIFO on fauxqs: the group's order holds through a failure and its
// redelivery; the other group goes on.
func TestFIFOOnSQS(t *testing.T) {
	url := newQueue(t, true)
	send(t, url, "A", order("A1"), order("A2"), order("A3"))
	send(t, url, "B", order("B1"), order("B2"))
	var (
		mu    sync.Mutex
		order []string
	)
	var failed atomic.Bool
	h := newHandler(t, lambdadedup.Config{Concurrency: 2}, func(msg *message.Message) error {
		id, err := keyfuncs.JSON("order_id")(msg)
		if err != nil {
			return err
		}
		if id == "A1" && !failed.Swap(true) {
			return errors.New("declined once")
		}
		mu.Lock()
		order = append(order, id)
		mu.Unlock()
		return nil
	})
	s := runMapping(t, esm.Mapping{QueueURL: url, Function: fn(h.Handle)}, "the five FIFO records deleted", deleted(5))
	t.Logf("fifo: charges in order %v, %d invocations, %d records, %d failures reported, %d redeliveries", order, s.Invocations, s.Records, s.Failures, s.Redeliveries)
	var a, b []string
	for _, id := range order {
		if id[0] == 'A' {
			a = append(a, id)
		} else {
			b = append(b, id)
		}
	}
	if !slices.Equal(a, []string{"A1", "A2", "A3"}) || !slices.Equal(b, []string{"B1", "B2"}) {
		t.Errorf("charges %v: want A1 A2 A3 and B1 B2 in order, each once", order)
	}
	if s.Failures < 1 {
		t.Errorf("%d failures, want A1's", s.Failures)
	}
}
