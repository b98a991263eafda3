package lambdadedup_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
)

// eventLog records the events of the decisions it is told of.
type eventLog struct {
	mu     sync.Mutex
	events []event.Event
}

func (o *eventLog) ObserveDecision(d dedup.Decision) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, d.Event)
}

func (o *eventLog) ObserveStoreOp(string, time.Duration, error) {}

func (o *eventLog) count(e event.Event) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, got := range o.events {
		if got == e {
			n++
		}
	}
	return n
}

// fingerprintUnless fails (or panics) for the order "FP-BAD".
func fingerprintUnless(panics bool) func(*message.Message) (string, error) {
	return func(msg *message.Message) (string, error) {
		if strings.Contains(string(msg.Payload), "FP-BAD") {
			if panics {
				panic("fingerprint bug")
			}
			return "", errors.New("fingerprint failed")
		}
		return keyfuncs.PayloadFingerprint(msg)
	}
}

// TestShadowRunsEveryRecord: in shadow mode the handler runs for every
// record, as without the adapter, including those without a usable key,
// with the transport id as key, or with a failing fingerprint (they were
// listed as failures and the handler never ran; a stream stopped there).
func TestShadowRunsEveryRecord(t *testing.T) {
	var runs atomic.Int32
	obs := &eventLog{}
	h := newHandler(t, lambdadedup.Config{Dedup: dedup.Config{Shadow: true, Fingerprint: fingerprintUnless(false), Observer: obs}},
		func(*message.Message) error { runs.Add(1); return nil })
	failed := invoke(t, context.Background(), h,
		record("m1", `{"amount":1}`), // no order_id
		record("m2", order("m2")),    // the key is the MessageId
		record("m3", order("FP-BAD")),
		record("m4", order("A")),
		record("m5", order("A"))) // a duplicate
	if len(failed) != 0 {
		t.Errorf("failures %v, want none", failed)
	}
	if n := runs.Load(); n != 5 {
		t.Errorf("the handler ran %d times, want 5", n)
	}
	if n := obs.count(event.WouldReject); n != 3 {
		t.Errorf("%d would_reject decisions, want 3", n)
	}

	runs.Store(0)
	rec := func(seq, data string) events.KinesisEventRecord {
		return events.KinesisEventRecord{EventID: "shardId-000000000000:" + seq, EventSourceArn: "arn:aws:kinesis:us-east-1:000000000000:stream/orders",
			Kinesis: events.KinesisRecord{SequenceNumber: seq, Data: []byte(data)}}
	}
	resp, err := h.HandleKinesis(context.Background(), events.KinesisEvent{Records: []events.KinesisEventRecord{
		rec("101", `{"amount":1}`), rec("102", order("102")), rec("103", order("B")),
	}})
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Errorf("Kinesis: %v, %v; want no failure", resp.BatchItemFailures, err)
	}
	if n := runs.Load(); n != 3 {
		t.Errorf("Kinesis: the handler ran %d times, want 3 (the shard goes on)", n)
	}
}

// TestInProgressWaitEndsByTheDeadlineMargin: a record is started only with
// DeadlineMargin left. The wait for another consumer's claim ends by the
// deadline less the margin; the holder releasing the key after that (but
// before the deadline) must not start the handler with less than the
// margin left. (The wait ran up to the deadline itself.)
func TestInProgressWaitEndsByTheDeadlineMargin(t *testing.T) {
	start := time.Now()
	clock := fakeclock.New(start)
	store := memstore.New(clock)
	const margin = 10 * time.Second
	var runs atomic.Int32
	h := newHandler(t, lambdadedup.Config{DeadlineMargin: margin,
		Dedup: dedup.Config{Store: store, Clock: clock, InProgressWait: time.Minute, InProgressPoll: 100 * time.Millisecond}},
		func(*message.Message) error { runs.Add(1); return nil })
	holder, err := store.Claim(context.Background(), admin.ScopedKey("charge-orders", "A"), "", 5*time.Minute)
	if err != nil || holder.Outcome != dedup.Acquired {
		t.Fatalf("holder: %v %v", holder.Outcome, err)
	}
	// The invocation ends 60s from now (real time bounds the test); the
	// fake clock moves the wait along.
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(60*time.Second))
	defer cancel()
	done := make(chan []string, 1)
	go func() { done <- invoke(t, ctx, h, record("m1", order("A"))) }()
	released := false
	for bound := time.Now().Add(30 * time.Second); ; {
		select {
		case failed := <-done:
			if !slices.Equal(failed, []string{"m1"}) {
				t.Errorf("failures %v, want [m1]", failed)
			}
			if n := runs.Load(); n != 0 {
				t.Errorf("the handler ran %d times, with less than DeadlineMargin left", n)
			}
			if at := clock.Now().Sub(start); at > 60*time.Second-margin+time.Second {
				t.Errorf("the wait ended at %v, want by %v (the deadline less the margin)", at, 60*time.Second-margin)
			}
			return
		default:
		}
		if time.Now().After(bound) {
			t.Fatal("the invocation did not return within 30s")
		}
		if clock.Timers() == 0 {
			time.Sleep(time.Millisecond)
			continue
		}
		clock.Advance(500 * time.Millisecond)
		if !released && clock.Now().Sub(start) >= 55*time.Second {
			released = true
			if err := store.Release(context.Background(), holder.Claim); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestTransportIDsAreRefused: Dedup.TransportIDs names further transport
// ids of a record, as on the router: a key equal to one is refused
// (ErrTransportKey, decided transport_key), not claimed.
func TestTransportIDsAreRefused(t *testing.T) {
	obs := &eventLog{}
	var runs atomic.Int32
	h := newHandler(t, lambdadedup.Config{Dedup: dedup.Config{Observer: obs,
		TransportIDs: func(msg *message.Message) []string { return []string{msg.Metadata.Get("trace")} }}},
		func(*message.Message) error { runs.Add(1); return nil })
	r := record("m1", order("T-1"))
	r.MessageAttributes = map[string]events.SQSMessageAttribute{"trace": {DataType: "String", StringValue: ptr("T-1")}}
	if failed := invoke(t, context.Background(), h, r, record("m2", order("B"))); !slices.Equal(failed, []string{"m1"}) {
		t.Errorf("failures %v, want [m1]", failed)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1 (B)", n)
	}
	if n := obs.count(event.TransportKey); n != 1 {
		t.Errorf("%d transport_key decisions, want 1 (%v)", n, obs.events)
	}
}

func ptr(s string) *string { return &s }

// TestPanickingFingerprintIsPermanent: a Fingerprint that panics on a
// record is a permanent error of that record (key_missing; dropped with
// DropPermanent), not a handler_panic retried until the DLQ; the other
// records run.
func TestPanickingFingerprintIsPermanent(t *testing.T) {
	for _, drop := range []bool{false, true} {
		obs := &eventLog{}
		var runs atomic.Int32
		h := newHandler(t, lambdadedup.Config{DropPermanent: drop, Dedup: dedup.Config{Observer: obs, Fingerprint: fingerprintUnless(true)}},
			func(*message.Message) error { runs.Add(1); return nil })
		failed := invoke(t, context.Background(), h, record("m1", order("FP-BAD")), record("m2", order("B")))
		if want := map[bool][]string{false: {"m1"}, true: nil}[drop]; !slices.Equal(failed, want) {
			t.Errorf("DropPermanent %v: failures %v, want %v", drop, failed, want)
		}
		if n := obs.count(lambdadedup.EventHandlerPanic); n != 0 {
			t.Errorf("DropPermanent %v: %d handler_panic decisions, want none", drop, n)
		}
		if n := obs.count(event.KeyMissing); n != 1 {
			t.Errorf("DropPermanent %v: %d key_missing decisions, want 1", drop, n)
		}
		if n := runs.Load(); n != 1 {
			t.Errorf("DropPermanent %v: the handler ran %d times, want 1 (B)", drop, n)
		}
	}
}

// TestHandleFailsWhenEveryRecordFailed: when every record of a batch
// failed, Handle returns ErrBatchFailed besides listing them, so that a
// mapping without ReportBatchItemFailures does not delete them; with one
// record processed it returns nil.
func TestHandleFailsWhenEveryRecordFailed(t *testing.T) {
	h := newHandler(t, lambdadedup.Config{}, func(msg *message.Message) error {
		if strings.Contains(string(msg.Payload), "BAD") {
			return errors.New("declined")
		}
		return nil
	})
	resp, err := h.Handle(context.Background(), events.SQSEvent{Records: []events.SQSMessage{record("m1", order("BAD-1")), record("m2", order("BAD-2"))}})
	if !errors.Is(err, lambdadedup.ErrBatchFailed) || len(resp.BatchItemFailures) != 2 {
		t.Errorf("every record failed: %v, %v; want both listed and ErrBatchFailed", resp.BatchItemFailures, err)
	}
	resp, err = h.Handle(context.Background(), events.SQSEvent{Records: []events.SQSMessage{record("m3", order("BAD-3")), record("m4", order("OK"))}})
	if err != nil || len(resp.BatchItemFailures) != 1 {
		t.Errorf("one record failed: %v, %v; want it listed and no error", resp.BatchItemFailures, err)
	}
	if _, err := h.Handle(context.Background(), events.SQSEvent{}); err != nil {
		t.Errorf("an empty batch: %v", err)
	}
}

// warnings counts the log lines that mention the mapping's retry limits.
type warnings struct {
	watermill.NopLogger
	n atomic.Int32
}

func (w *warnings) Info(msg string, _ watermill.LogFields) {
	if strings.Contains(msg, "MaximumRetryAttempts") {
		w.n.Add(1)
	}
}

func (w *warnings) Error(msg string, err error, f watermill.LogFields) { w.Info(msg, f) }

// TestStreamWarnsWithoutDropPermanent: a stream handler without
// DropPermanent warns once (a record failing for good blocks its shard)
// and says what to set on the mapping; with DropPermanent, or on SQS, it
// says nothing.
func TestStreamWarnsWithoutDropPermanent(t *testing.T) {
	for _, drop := range []bool{false, true} {
		logs := &warnings{}
		h := newHandler(t, lambdadedup.Config{DropPermanent: drop, Dedup: dedup.Config{Logger: logs}}, func(*message.Message) error { return nil })
		if _, err := h.Handle(context.Background(), events.SQSEvent{Records: []events.SQSMessage{record("m1", order("A"))}}); err != nil {
			t.Fatal(err)
		}
		if n := logs.n.Load(); n != 0 {
			t.Errorf("SQS: %d warnings, want none", n)
		}
		for range 2 {
			if _, err := h.HandleKinesis(context.Background(), events.KinesisEvent{}); err != nil {
				t.Fatal(err)
			}
			if _, err := h.HandleDynamoDB(context.Background(), events.DynamoDBEvent{}); err != nil {
				t.Fatal(err)
			}
		}
		if want := map[bool]int32{false: 1, true: 0}[drop]; logs.n.Load() != want {
			t.Errorf("DropPermanent %v: %d warnings, want %d", drop, logs.n.Load(), want)
		}
	}
}
