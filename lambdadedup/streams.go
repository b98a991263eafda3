package lambdadedup

import (
	"context"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// HandleKinesis processes a batch of a Kinesis stream (an event source
// mapping with ReportBatchItemFailures) and reports where to resume. It has
// the signature lambda.Start expects: lambda.Start(h.HandleKinesis).
//
// A shard is ordered, and Lambda retries a batch from the sequence number
// it is given: the records run one after the other, in batch order (
// Config.Concurrency is not used; use the mapping's ParallelizationFactor),
// and the first record that fails stops the batch. Only its sequence number
// is reported; the records after it are not started and come back in the
// retried batch. Per record the outcomes are those of Handle (success,
// duplicate, ErrInProgress, permanent errors and DropPermanent, store
// errors, DeadlineMargin); a duplicate, including one earlier in the same
// batch, is skipped and the batch goes on.
//
// The message given to the key function and handler is KinesisMessage's:
// the payload is the record's data. A key equal to the sequence number or
// the event id is refused (dedup.ErrTransportKey). The error is always nil.
func (h *Handler) HandleKinesis(ctx context.Context, event events.KinesisEvent) (events.KinesisEventResponse, error) {
	h.warnStream()
	items := make([]item, len(event.Records))
	for i := range event.Records {
		r := &event.Records[i]
		items[i] = item{
			topic: streamName(r.EventSourceArn), uuid: r.Kinesis.SequenceNumber, messageID: r.EventID,
			ids: []string{r.EventID}, group: "shard",
			message: func() (*message.Message, error) { return KinesisMessage(*r), nil },
			with:    func(ctx context.Context) context.Context { return context.WithValue(ctx, kinesisKey{}, r) },
		}
	}
	var resp events.KinesisEventResponse
	if i := firstFailure(h.batch(ctx, items, 1)); i >= 0 {
		resp.BatchItemFailures = []events.KinesisBatchItemFailure{{ItemIdentifier: event.Records[i].Kinesis.SequenceNumber}}
	}
	return resp, nil
}

// warnStream logs once per Handler, at its first stream batch, that a
// record failing permanently blocks its shard unless DropPermanent is set
// or the mapping's retry limits end it.
func (h *Handler) warnStream() {
	if h.cfg.DropPermanent {
		return
	}
	h.streamWarning.Do(func() {
		h.cfg.Dedup.Logger.Info("lambdadedup: warning: DropPermanent is off on a stream: a record that fails for good (no usable key, transport id as key, key reused) "+
			"blocks its shard until the event source mapping's retry limits end it; set MaximumRetryAttempts, MaximumRecordAgeInSeconds and "+
			"BisectBatchOnFunctionError with an OnFailure destination on the mapping, or set lambdadedup.Config.DropPermanent", nil)
	})
}

// firstFailure is the index of the first record that failed, or -1.
func firstFailure(errs []error) int {
	for i, err := range errs {
		if err != nil {
			return i
		}
	}
	return -1
}

// HandleDynamoDB processes a batch of a DynamoDB stream (an event source
// mapping with ReportBatchItemFailures), as HandleKinesis does a Kinesis
// batch: in order, stopping at the first failure, whose sequence number
// (dynamodb.SequenceNumber) is the only one reported. lambda.Start(h.HandleDynamoDB).
//
// The message is DynamoDBMessage's: the payload is the item (NewImage, else
// Keys) as plain JSON, so keyfuncs.JSON("order_id") reads an attribute. A
// record that cannot be converted is a *dedup.KeyError (ErrNoKey). A key
// equal to the event id or the sequence number is refused
// (dedup.ErrTransportKey). The error is always nil.
func (h *Handler) HandleDynamoDB(ctx context.Context, event events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
	h.warnStream()
	items := make([]item, len(event.Records))
	for i := range event.Records {
		r := &event.Records[i]
		items[i] = item{
			topic: streamName(r.EventSourceArn), uuid: r.EventID, messageID: r.Change.SequenceNumber,
			ids: []string{r.Change.SequenceNumber}, group: "shard",
			message: func() (*message.Message, error) { return DynamoDBMessage(*r) },
			with:    func(ctx context.Context) context.Context { return context.WithValue(ctx, dynamoDBKey{}, r) },
		}
	}
	var resp events.DynamoDBEventResponse
	if i := firstFailure(h.batch(ctx, items, 1)); i >= 0 {
		resp.BatchItemFailures = []events.DynamoDBBatchItemFailure{{ItemIdentifier: event.Records[i].Change.SequenceNumber}}
	}
	return resp, nil
}

// HandleEventBridge processes one EventBridge event (an asynchronous
// invocation: lambda.Start(h.HandleEventBridge)). It returns nil when the
// event was handled or is a duplicate, and an error, so that Lambda retries
// the invocation (and then sends it to the function's on-failure
// destination or DLQ), when the handler failed or panicked (the claim is
// released), the key is held by another consumer (dedup.ErrInProgress), the
// store failed, less than DeadlineMargin was left, or the error is
// permanent (no key, transport id as key, key reuse) and DropPermanent is
// not set; with DropPermanent a permanent error is logged and nil returned.
//
// The message is EventBridgeMessage's: the payload is the event's detail.
// A key equal to the event id is refused (dedup.ErrTransportKey).
func (h *Handler) HandleEventBridge(ctx context.Context, event events.EventBridgeEvent) error {
	return h.batch(ctx, []item{{
		topic: event.Source, uuid: event.ID,
		message: func() (*message.Message, error) { return EventBridgeMessage(event), nil },
		with:    func(ctx context.Context) context.Context { return context.WithValue(ctx, eventBridgeKey{}, &event) },
	}}, 1)[0]
}

// permanentItem decides on a record that can never succeed: nil (dropped)
// with DropPermanent, else err.
func (h *Handler) permanentItem(it item, err error) error {
	if !h.cfg.DropPermanent {
		return err
	}
	h.decideItem(it, dedup.Decision{Event: EventDropped, Err: fmt.Errorf("lambdadedup: record dropped (DropPermanent): %w", err)})
	return nil
}

// decideItem is decide for a record of any source.
func (h *Handler) decideItem(it item, d dedup.Decision) {
	d.Handler, d.Topic, d.MessageUUID = functionName(h.cfg.Dedup.Scope), it.topic, it.uuid
	if o := h.cfg.Dedup.Observer; o != nil {
		o.ObserveDecision(d)
	}
	l := h.cfg.Dedup.Logger
	if _, nop := l.(watermill.NopLogger); nop {
		return
	}
	f := watermill.LogFields{"dedup_event": string(d.Event), "handler": d.Handler, "topic": d.Topic, "message_uuid": d.MessageUUID}
	if d.Key != "" {
		f["key"] = d.Key
	}
	if d.Event == EventDeadline || d.Event == EventGroupSkipped {
		f["err"] = d.Err.Error()
		l.Info("dedup: "+string(d.Event), f)
		return
	}
	l.Error("dedup: "+string(d.Event), d.Err, f)
}

// streamName is the stream's or table's name in a Kinesis
// (arn:...:stream/NAME) or DynamoDB stream
// (arn:...:table/NAME/stream/LABEL) ARN.
func streamName(arn string) string {
	res := arn // the resource: after the fifth colon (a stream label holds colons)
	if parts := strings.SplitN(arn, ":", 6); len(parts) == 6 {
		res = parts[5]
	}
	if parts := strings.Split(res, "/"); len(parts) >= 2 && (parts[0] == "stream" || parts[0] == "table") {
		return parts[1]
	}
	return res
}
