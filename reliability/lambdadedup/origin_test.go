package lambdadedup_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"

	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
)

// TestRecordKeepsWhoAndWhen: seed 003's ten copies of ORDER-003, each with
// its own SQS MessageId. The first copy's handler fails (released), the
// second charges; the record names the first copy's MessageId (as
// transport id and message id), two claims, and when it was claimed and
// completed.
func TestRecordKeepsWhoAndWhen(t *testing.T) {
	store := memstore.New(nil)
	c := newCharger()
	c.fail = func(_ string, call int) error {
		if call == 1 {
			return errors.New("payment gateway timeout")
		}
		return nil
	}
	var cfg lambdadedup.Config
	cfg.Dedup.Store = store
	h := newHandler(t, cfg, c.handle)
	ctx := context.Background()
	var records []events.SQSMessage
	for i := range 10 {
		records = append(records, record(fmt.Sprintf("73fca7ac-78e9-4ea4-a1bf-71a92e2fbd%02d", i), order("ORDER-003")))
	}
	if failed := invoke(t, ctx, h, records[0]); len(failed) != 1 {
		t.Fatalf("first copy: failed %v, want it reported", failed)
	}
	if failed := invoke(t, ctx, h, records[1:]...); len(failed) != 0 {
		t.Fatalf("the other nine: failed %v", failed)
	}
	if n := c.total(); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	rec, err := store.Inspect(ctx, admin.ScopedKey("charge-orders", "ORDER-003"))
	if err != nil {
		t.Fatal(err)
	}
	first := records[0].MessageId
	if rec.State != admin.StateCompleted || rec.TransportID != first || rec.MessageID != first || rec.Claims != 2 ||
		rec.ClaimedAt.IsZero() || rec.CompletedAt.Before(rec.ClaimedAt) {
		t.Fatalf("record %+v, want completed after 2 claims, first claimed by %s", rec, first)
	}
}

// A message published by Watermill carries its UUID in a message
// attribute: the record keeps that UUID as its transport id and the SQS
// MessageId as its message id, as a Watermill router on the same queue
// does (msg.UUID and the sqs_message_id metadata), so a record reads the
// same whichever runtime claimed it. The SQS MessageId is still refused
// as a key.
func TestRecordOfAWatermillMessageKeepsItsUUID(t *testing.T) {
	store := memstore.New(nil)
	var cfg lambdadedup.Config
	cfg.Dedup.Store = store
	h := newHandler(t, cfg, func(*message.Message) error { return nil })
	const uuid, sqsID = "0b9f8e3c-4d1a-4e2b-9c3d-5e6f7a8b9c0d", "73fca7ac-78e9-4ea4-a1bf-71a92e2fbda8"
	published := func(id, body string) events.SQSMessage {
		r := record(id, body)
		v := uuid
		r.MessageAttributes = map[string]events.SQSMessageAttribute{lambdadedup.UUIDAttribute: {DataType: "String", StringValue: &v}}
		return r
	}
	if failed := invoke(t, context.Background(), h, published(sqsID, order("ORDER-8"))); len(failed) != 0 {
		t.Fatalf("failed %v", failed)
	}
	rec, err := store.Inspect(context.Background(), admin.ScopedKey("charge-orders", "ORDER-8"))
	if err != nil || rec.TransportID != uuid || rec.MessageID != sqsID {
		t.Fatalf("record %+v %v, want transport id %s (the Watermill UUID) and message id %s", rec, err, uuid, sqsID)
	}
	const other = "5d2c7e1f-1111-4222-8333-944455556666"
	for key, r := range map[string]events.SQSMessage{
		"the Watermill UUID": published(other, order(uuid)),
		"the SQS MessageId":  published(other, order(other)),
	} {
		if failed := invoke(t, context.Background(), h, r); len(failed) != 1 {
			t.Errorf("key = %s: failed %v, want the record refused", key, failed)
		}
	}
}

// Kinesis: the sequence number is the transport id, the event id the
// message id.
func TestStreamRecordKeepsWhoAndWhen(t *testing.T) {
	store := memstore.New(nil)
	var cfg lambdadedup.Config
	cfg.Dedup.Store = store
	h := newHandler(t, cfg, func(*message.Message) error { return nil })
	var r events.KinesisEventRecord
	r.EventID, r.EventSourceArn = "shardId-000:4960", "arn:aws:kinesis:us-east-1:000000000000:stream/orders"
	r.Kinesis.SequenceNumber, r.Kinesis.Data = "4960", []byte(order("ORDER-7"))
	if resp, _ := h.HandleKinesis(context.Background(), events.KinesisEvent{Records: []events.KinesisEventRecord{r}}); len(resp.BatchItemFailures) != 0 {
		t.Fatalf("failures %v", resp.BatchItemFailures)
	}
	rec, err := store.Inspect(context.Background(), admin.ScopedKey("charge-orders", "ORDER-7"))
	if err != nil || rec.TransportID != "4960" || rec.MessageID != "shardId-000:4960" || rec.Claims != 1 {
		t.Fatalf("record %+v %v", rec, err)
	}
}
