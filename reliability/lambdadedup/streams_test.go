package lambdadedup_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"

	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

const (
	kinesisARN  = "arn:aws:kinesis:us-east-1:000000000000:stream/orders"
	dynamoDBARN = "arn:aws:dynamodb:us-east-1:000000000000:table/orders/stream/2026-12-01T00:00:00.000"
)

// realStores are the servers the issue asks the stream sources to run on.
var realStores = []struct {
	name string
	new  func(t *testing.T) dedup.Store
}{
	{"redis", newRedisStore},
	{"dynamo", func(t *testing.T) dedup.Store {
		s, err := dynamo.New(context.Background(), dynamo.Config{Client: dynamoClient, Table: dynamoTable, SkipTTL: true})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}},
}

func newRedisStore(t *testing.T) dedup.Store {
	c := goredis.NewClient(&goredis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = c.Close() })
	s, err := dedupredis.New(context.Background(), dedupredis.Config{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// streamRec is a record of either stream: its sequence number and the
// order it carries.
type streamRec struct{ seq, orderID string }

func kinesisEventID(seq string) string  { return "shardId-000000000000:" + seq }
func dynamoDBEventID(seq string) string { return "ev-" + seq }

// stream is one ordered source under test: it invokes a handler with a
// batch built as AWS builds it (JSON through lambda.NewHandler) and returns
// the reported item identifiers.
type stream struct {
	name    string
	eventID func(seq string) string
	invoke  func(t *testing.T, ctx context.Context, h *lambdadedup.Handler, recs ...streamRec) []string
}

var streams = []stream{
	{"kinesis", kinesisEventID, func(t *testing.T, ctx context.Context, h *lambdadedup.Handler, recs ...streamRec) []string {
		var ev events.KinesisEvent
		for _, r := range recs {
			ev.Records = append(ev.Records, events.KinesisEventRecord{
				AwsRegion: "us-east-1", EventID: kinesisEventID(r.seq), EventName: "aws:kinesis:record", EventSource: "aws:kinesis",
				EventSourceArn: kinesisARN, EventVersion: "1.0",
				Kinesis: events.KinesisRecord{Data: []byte(order(r.orderID)), PartitionKey: r.orderID, SequenceNumber: r.seq, KinesisSchemaVersion: "1.0"},
			})
		}
		var resp events.KinesisEventResponse
		invokeJSON(t, ctx, lambda.NewHandler(h.HandleKinesis), ev, &resp)
		var ids []string
		for _, f := range resp.BatchItemFailures {
			ids = append(ids, f.ItemIdentifier)
		}
		return ids
	}},
	{"dynamodb", dynamoDBEventID, func(t *testing.T, ctx context.Context, h *lambdadedup.Handler, recs ...streamRec) []string {
		var ev events.DynamoDBEvent
		for _, r := range recs {
			ev.Records = append(ev.Records, events.DynamoDBEventRecord{
				AWSRegion: "us-east-1", EventID: dynamoDBEventID(r.seq), EventName: "INSERT", EventSource: "aws:dynamodb",
				EventSourceArn: dynamoDBARN, EventVersion: "1.1",
				Change: events.DynamoDBStreamRecord{
					Keys: map[string]events.DynamoDBAttributeValue{"order_id": events.NewStringAttribute(r.orderID)},
					NewImage: map[string]events.DynamoDBAttributeValue{
						"order_id": events.NewStringAttribute(r.orderID), "amount": events.NewNumberAttribute("150"),
					},
					SequenceNumber: r.seq, SizeBytes: 40, StreamViewType: "NEW_AND_OLD_IMAGES",
				},
			})
		}
		var resp events.DynamoDBEventResponse
		invokeJSON(t, ctx, lambda.NewHandler(h.HandleDynamoDB), ev, &resp)
		var ids []string
		for _, f := range resp.BatchItemFailures {
			ids = append(ids, f.ItemIdentifier)
		}
		return ids
	}},
}

// invokeJSON runs handler as the Lambda runtime does: event as JSON in, the
// response decoded from JSON.
func invokeJSON(t *testing.T, ctx context.Context, handler lambda.Handler, event, resp any) {
	t.Helper()
	payload, err := json.Marshal(event)
	if err != nil {
		t.Fatal(err)
	}
	out, err := handler.Invoke(ctx, payload)
	if err != nil {
		t.Fatalf("Invoke: %v", err)
	}
	if err := json.Unmarshal(out, resp); err != nil {
		t.Fatalf("response %s: %v", out, err)
	}
}

// eachStream runs f for each ordered source on each real store, with a
// fresh scope.
func eachStream(t *testing.T, f func(t *testing.T, s stream, cfg lambdadedup.Config)) {
	for _, s := range streams {
		for _, st := range realStores {
			t.Run(s.name+" on "+st.name, func(t *testing.T) {
				f(t, s, lambdadedup.Config{Dedup: dedup.Config{Scope: "charge-orders-" + watermill.NewShortUUID(), Store: st.new(t)}})
			})
		}
	}
}

func recs(pairs ...string) []streamRec {
	var r []streamRec
	for i := 0; i < len(pairs); i += 2 {
		r = append(r, streamRec{pairs[i], pairs[i+1]})
	}
	return r
}

// A failure in the middle of a batch stops it: only the failed record's
// sequence number is reported, the records after it do not start, and the
// batch Lambda retries from that sequence number charges each order once in
// total.
func TestStreamStopsAtFirstFailure(t *testing.T) {
	eachStream(t, func(t *testing.T, s stream, cfg lambdadedup.Config) {
		ctx := context.Background()
		c := newCharger()
		c.fail = func(id string, call int) error {
			if id == "C" && call == 3 {
				return errors.New("gateway down")
			}
			return nil
		}
		h := newHandler(t, cfg, c.handle)
		batch := recs("101", "A", "102", "B", "103", "C", "104", "D", "105", "E")
		if f := s.invoke(t, ctx, h, batch...); !slices.Equal(f, []string{"103"}) {
			t.Errorf("failures %v, want [103] (the first failed sequence number only)", f)
		}
		c.mu.Lock()
		if len(c.calls) != 3 || c.charges["A"] != 1 || c.charges["B"] != 1 || c.charges["C"]+c.charges["D"]+c.charges["E"] != 0 {
			t.Errorf("%d handler calls, charges %v: want A, B charged, C failed, D and E not started", len(c.calls), c.charges)
		}
		c.mu.Unlock()

		// Lambda retries from the failed sequence number.
		if f := s.invoke(t, ctx, h, batch[2:]...); len(f) != 0 {
			t.Errorf("retry from 103: failures %v, want none", f)
		}
		// A whole-batch redelivery (a retry without ReportBatchItemFailures,
		// a replay from TRIM_HORIZON) finds every record completed.
		if f := s.invoke(t, ctx, h, batch...); len(f) != 0 {
			t.Errorf("whole batch again: failures %v, want none", f)
		}
		total := c.total()
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, id := range []string{"A", "B", "C", "D", "E"} {
			if c.charges[id] != 1 {
				t.Errorf("charges %v, want each order once", c.charges)
				break
			}
		}
		t.Logf("%s: %d charges for 5 orders over 3 invocations (5, 3, 5 records), %d handler calls", s.name, total, len(c.calls))
	})
}

// Two records of one order in a batch: the second is a duplicate, skipped,
// and the batch goes on.
func TestStreamDuplicateInBatch(t *testing.T) {
	eachStream(t, func(t *testing.T, s stream, cfg lambdadedup.Config) {
		c := newCharger()
		h := newHandler(t, cfg, c.handle)
		if f := s.invoke(t, context.Background(), h, recs("201", "A", "202", "A", "203", "B")...); len(f) != 0 {
			t.Errorf("failures %v, want none", f)
		}
		if c.charges["A"] != 1 || c.charges["B"] != 1 || len(c.calls) != 2 {
			t.Errorf("charges %v, %d calls, want A:1 B:1 in 2 calls", c.charges, len(c.calls))
		}
	})
}

// A key equal to the sequence number or the event id is refused
// (ErrTransportKey): a failure that stops the batch, or dropped with
// DropPermanent.
func TestStreamTransportKey(t *testing.T) {
	eachStream(t, func(t *testing.T, s stream, cfg lambdadedup.Config) {
		for name, key := range map[string]string{"sequence number": "302", "event id": s.eventID("302")} {
			t.Run(name, func(t *testing.T) {
				obs := &keyEvents{}
				cfg := cfg
				cfg.Dedup.Scope += "-" + watermill.NewShortUUID()
				cfg.Dedup.Observer = obs
				c := newCharger()
				batch := recs("301", "A", "302", key, "303", "B")
				h := newHandler(t, cfg, c.handle)
				if f := s.invoke(t, context.Background(), h, batch...); !slices.Equal(f, []string{"302"}) {
					t.Errorf("failures %v, want [302]", f)
				}
				if c.total() != 1 || c.charges["A"] != 1 {
					t.Errorf("charges %v, want A only (B after the failure)", c.charges)
				}
				if !obs.transportKey() {
					t.Error("no transport_key decision with ErrTransportKey")
				}
				cfg.DropPermanent = true
				h = newHandler(t, cfg, c.handle)
				if f := s.invoke(t, context.Background(), h, batch[1:]...); len(f) != 0 {
					t.Errorf("DropPermanent: failures %v, want none", f)
				}
				if c.charges["A"] != 1 || c.charges["B"] != 1 || c.charges[key] != 0 {
					t.Errorf("DropPermanent: charges %v, want A:1 B:1", c.charges)
				}
			})
		}
	})
}

// keyEvents records whether a key was refused as a transport id.
type keyEvents struct{ seen atomic.Bool }

func (o *keyEvents) ObserveDecision(d dedup.Decision) {
	if d.Event == event.TransportKey && errors.Is(d.Err, dedup.ErrTransportKey) {
		o.seen.Store(true)
	}
}
func (o *keyEvents) ObserveStoreOp(string, time.Duration, error) {}
func (o *keyEvents) transportKey() bool                          { return o.seen.Load() }

// A key held by another consumer stops the batch at that record (never
// acked); once the holder is done, the retry finds a duplicate.
func TestStreamInProgress(t *testing.T) {
	eachStream(t, func(t *testing.T, s stream, cfg lambdadedup.Config) {
		ctx := context.Background()
		res, err := cfg.Dedup.Store.Claim(ctx, admin.ScopedKey(cfg.Dedup.Scope, "B"), "", time.Minute)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("claim B: %v %v", res.Outcome, err)
		}
		c := newCharger()
		h := newHandler(t, cfg, c.handle)
		batch := recs("401", "A", "402", "B", "403", "C")
		if f := s.invoke(t, ctx, h, batch...); !slices.Equal(f, []string{"402"}) {
			t.Errorf("failures %v, want [402]", f)
		}
		if c.total() != 1 {
			t.Errorf("charges %v, want A only", c.charges)
		}
		if err := cfg.Dedup.Store.Complete(ctx, res.Claim, nil, time.Hour); err != nil {
			t.Fatal(err)
		}
		if f := s.invoke(t, ctx, h, batch[1:]...); len(f) != 0 {
			t.Errorf("retry: failures %v, want none", f)
		}
		if c.charges["B"] != 0 || c.charges["C"] != 1 {
			t.Errorf("charges %v, want B skipped (completed by its holder), C:1", c.charges)
		}
	})
}

// Less than DeadlineMargin left: the batch stops at the record reached,
// unclaimed.
func TestStreamDeadlineMargin(t *testing.T) {
	eachStream(t, func(t *testing.T, s stream, cfg lambdadedup.Config) {
		c := newCharger()
		cfg.DeadlineMargin = time.Hour
		h := newHandler(t, cfg, c.handle)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute) // always below the margin
		defer cancel()
		if f := s.invoke(t, ctx, h, recs("501", "A", "502", "B")...); !slices.Equal(f, []string{"501"}) {
			t.Errorf("failures %v, want [501]", f)
		}
		if c.total() != 0 {
			t.Errorf("charges %v, want none", c.charges)
		}
	})
}

// A panicking handler fails its record only (reported, the batch stops) and
// its claim is released, so the retry from it runs the record again.
func TestStreamPanic(t *testing.T) {
	eachStream(t, func(t *testing.T, s stream, cfg lambdadedup.Config) {
		c := newCharger()
		var panicked atomic.Bool
		c.fail = func(id string, _ int) error {
			if id == "B" && !panicked.Swap(true) {
				panic("boom")
			}
			return nil
		}
		h := newHandler(t, cfg, c.handle)
		batch := recs("601", "A", "602", "B", "603", "C")
		if f := s.invoke(t, context.Background(), h, batch...); !slices.Equal(f, []string{"602"}) {
			t.Errorf("failures %v, want [602]", f)
		}
		if f := s.invoke(t, context.Background(), h, batch[1:]...); len(f) != 0 {
			t.Errorf("retry: failures %v, want none (the claim was released)", f)
		}
		if c.charges["A"] != 1 || c.charges["B"] != 1 || c.charges["C"] != 1 {
			t.Errorf("charges %v, want A, B, C once each", c.charges)
		}
	})
}
