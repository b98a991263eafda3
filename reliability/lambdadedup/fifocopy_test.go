package lambdadedup_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
)

// duplicates records the MessageUUIDs (the SQS MessageIds here) of the
// records decided skip_duplicate.
type duplicates struct {
	mu  sync.Mutex
	ids []string
}

func (o *duplicates) ObserveDecision(d dedup.Decision) {
	if d.Event == event.SkipDuplicate {
		o.mu.Lock()
		o.ids = append(o.ids, d.MessageUUID)
		o.mu.Unlock()
	}
}

func (o *duplicates) ObserveStoreOp(string, time.Duration, error) {}

func (o *duplicates) got() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	ids := slices.Clone(o.ids)
	slices.Sort(ids)
	return ids
}

// invokeWithin runs an invocation of records on h, ending at deadline,
// and returns its failures. When it has not returned within realTimeBound
// it fails the test, moves the fake clock to the invocation's deadline
// less margin (where an InProgressWait ends at the latest, as it would in
// Lambda), and returns the failures it ends with then.
func invokeWithin(t *testing.T, h *lambdadedup.Handler, clock *fakeclock.Clock, deadline time.Time, margin time.Duration, records ...events.SQSMessage) []string {
	t.Helper()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	payload, err := json.Marshal(events.SQSEvent{Records: records})
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		out []byte
		err error
	}
	done := make(chan answer, 1)
	go func() {
		out, err := lambda.NewHandler(h.Handle).Invoke(ctx, payload)
		done <- answer{out, err}
	}()
	var a answer
	select {
	case a = <-done:
	case <-time.After(realTimeBound):
		t.Errorf("the invocation has not returned %v after it started: a copy waits (InProgressWait, on the fake clock) for a record of its key that cannot start before it",
			realTimeBound)
		clock.Advance(deadline.Add(-margin).Sub(clock.Now()))
		select {
		case a = <-done:
		case <-time.After(realTimeBound):
			t.Fatalf("the invocation has not returned %v after its wait reached the deadline margin", realTimeBound)
		}
	}
	if errors.Is(a.err, lambdadedup.ErrBatchFailed) {
		var failed []string
		for _, r := range records {
			failed = append(failed, r.MessageId)
		}
		return failed
	}
	if a.err != nil {
		t.Fatalf("Invoke: %v", a.err)
	}
	var resp events.SQSEventResponse
	if err := json.Unmarshal(a.out, &resp); err != nil {
		t.Fatalf("response %s: %v", a.out, err)
	}
	var failed []string
	for _, f := range resp.BatchItemFailures {
		failed = append(failed, f.ItemIdentifier)
	}
	return failed
}

// TestFIFOCopyInAnEarlierGroupRunsFirst proves that on a FIFO queue, one
// order in two message groups of one batch runs once, in the record that
// takes its turn first, and the other record is its duplicate, without
// waiting: records [g2:OTHER, g1:K, g2:K] with Concurrency 1 take their
// turns group g2 first (OTHER, then K), g1 after; with
// Dedup.InProgressWait a minute (on a fake clock the test does not move),
// the invocation returns at once with no failure, K charged once, the
// other K record decided skip_duplicate, and a redelivery of the batch is
// a duplicate for every record. (The first record of a key was the lowest
// batch index, g1's K: g2's K waited for it, queued behind g2's turn,
// until the deadline margin, then g1's K was released unstarted, and
// every redelivery did the same.)
func TestFIFOCopyInAnEarlierGroupRunsFirst(t *testing.T) {
	const margin = 2 * time.Second
	clock := fakeclock.New(time.Now())
	store := memstore.New(clock)
	var (
		mu      sync.Mutex
		charges = map[string]int{}
	)
	charge := func(msg *message.Message) error {
		id, err := keyfuncs.JSON("order_id")(msg)
		if err != nil {
			return err
		}
		mu.Lock()
		charges[id]++
		mu.Unlock()
		return nil
	}
	batch := []events.SQSMessage{fifoRecord("m1", "g2", "OTHER"), fifoRecord("m2", "g1", "K"), fifoRecord("m3", "g2", "K")}
	newFIFOHandler := func(obs dedup.Observer) *lambdadedup.Handler {
		return newHandler(t, lambdadedup.Config{Concurrency: 1, DeadlineMargin: margin,
			Dedup: dedup.Config{Store: store, Clock: clock, InProgressWait: time.Minute, Observer: obs}}, charge)
	}

	dups := &duplicates{}
	deadline := clock.Now().Add(60 * time.Second)
	if f := invokeWithin(t, newFIFOHandler(dups), clock, deadline, margin, batch...); len(f) != 0 {
		t.Errorf("failures %v, want none", f)
	}
	mu.Lock()
	if charges["K"] != 1 || charges["OTHER"] != 1 {
		t.Errorf("charges %v, want K and OTHER once each", charges)
	}
	mu.Unlock()
	if got := dups.got(); len(got) != 1 || !slices.Contains([]string{"m2", "m3"}, got[0]) {
		t.Errorf("records decided skip_duplicate: %v; want one of K's (m2 or m3)", got)
	}
	if t.Failed() {
		return
	}

	redelivered := &duplicates{}
	if f := invokeWithin(t, newFIFOHandler(redelivered), clock, clock.Now().Add(60*time.Second), margin, batch...); len(f) != 0 {
		t.Errorf("redelivery: failures %v, want none", f)
	}
	if got := redelivered.got(); !slices.Equal(got, []string{"m1", "m2", "m3"}) {
		t.Errorf("redelivery: records decided skip_duplicate: %v; want every record", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if charges["K"] != 1 || charges["OTHER"] != 1 {
		t.Errorf("charges after the redelivery %v, want K and OTHER once each", charges)
	}
}
