package lambdadedup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
)

// Events of the adapter itself, logged and passed to Dedup.Observer like
// the engine's (Op is empty: no store operation was made).
const (
	// EventDeadline: the record was not started because the invocation had
	// less than DeadlineMargin left (or had ended); listed as a failure.
	// Info level.
	EventDeadline event.Event = "deadline_skipped"
	// EventGroupSkipped: an earlier record of the same FIFO message group
	// failed in this batch, so this one was not started; listed as a
	// failure. Info level.
	EventGroupSkipped event.Event = "group_skipped"
	// EventDropped: a permanent failure (ErrNoKey, ErrTransportKey,
	// ErrKeyReuse) reported as processed because Config.DropPermanent is
	// set: SQS deletes the message. Error level.
	EventDropped event.Event = "permanent_dropped"
	// EventHandlerPanic: the handler panicked; its claim was released and
	// the record is listed as a failure. Error level.
	EventHandlerPanic event.Event = "handler_panic"
)

// Handler is an SQS batch handler for AWS Lambda (an event source mapping
// with ReportBatchItemFailures) that claims every record, with
// the same engine, key functions and records as the Watermill middleware.
// Create it with New; it is safe for concurrent use.
type Handler struct {
	cfg     Config
	engine  *dedup.Engine
	handler message.NoPublishHandlerFunc
	// streamWarning: the warning about DropPermanent on a stream was
	// logged (see warnStream).
	streamWarning sync.Once
}

// ErrBatchFailed is the error Handle returns when every record of an SQS
// batch failed. With ReportBatchItemFailures on the event source mapping
// it changes nothing: Lambda retries the same records. Without it, a nil
// error would have Lambda delete every record of the batch, those that
// failed included: the error keeps them. Retryable.
var ErrBatchFailed = errors.New("lambdadedup: every record of the batch failed")

// New validates config, applies its defaults and returns a Handler that
// calls handler for each record it wins. handler has the signature of a
// Watermill router's AddConsumerHandler, so one function serves both
// runtimes; msg.Context() carries the claim (dedup.OutcomeFromContext tells a fresh run), the
// record (RecordFromContext) and the Lambda context, and is cancelled when
// the claim is lost or the invocation's deadline passes. A configuration
// problem fails here, not on the first invocation.
func New(config Config, handler message.NoPublishHandlerFunc) (*Handler, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if handler == nil {
		return nil, errors.New("lambdadedup: handler is required")
	}
	config.setDefaults()
	ecfg := config.Dedup
	if ecfg.Logger == nil {
		ecfg.Logger = dedup.DefaultLogger()
	}
	engine, err := dedup.NewEngine(ecfg)
	if err != nil {
		return nil, err
	}
	config.Dedup = ecfg
	return &Handler{cfg: config, engine: engine, handler: handler}, nil
}

// Handle processes an SQS batch and reports the records to retry. It has
// the signature lambda.Start expects: lambda.Start(h.Handle). Per record:
//
//   - key free, handler ok: completed; success (SQS deletes it);
//   - key free, handler error or panic: released; failure (it comes back
//     after the visibility timeout and runs again);
//   - key completed (a duplicate): success, the handler does not run;
//   - key held by another consumer (dedup.ErrInProgress): failure, never
//     acked, so that the copy is not lost if that consumer crashed;
//   - no usable key, transport id as key, key reused with another
//     fingerprint: failure, so the redrive policy moves it to the
//     dead-letter queue; with Config.DropPermanent, success and an error log;
//   - store unreachable: failure (fail closed); with Dedup.FailOpen the
//     handler runs unclaimed;
//   - less than DeadlineMargin left in the invocation: failure, not started;
//   - a FIFO queue's record after a failed record of its message group:
//     failure, not started (its order must be kept).
//
// The lease of each claim ends at the invocation's deadline at the latest,
// heartbeats included, so a timed-out invocation leaves no record in
// progress past the time it could have run. The error is nil unless every
// record failed: then it is ErrBatchFailed (Lambda retries every record
// of the batch either way), so that a mapping without
// ReportBatchItemFailures does not delete them; with some records
// processed, an error would retry those too, and count a receive against
// each of them.
//
// The batch is claimed at once (dedup.Engine.DoBatch): every record's
// claim goes to the store before any handler runs, and the completions,
// then the releases (failed records, a FIFO group's records after a
// failure, records reached with less than DeadlineMargin left), go
// together after the last handler.
//
// Cost: one claim request for the batch, one completion request and one
// release request when some record needs it, on a store with the batch
// capability (dedup.BatchStore: every store of this module); one request
// per record and operation on another store. A lease that ends at the
// deadline needs no heartbeat.
func (h *Handler) Handle(ctx context.Context, event events.SQSEvent) (events.SQSEventResponse, error) {
	records := event.Records
	items := make([]item, len(records))
	for i := range records {
		rec := &records[i]
		// The store keeps the message's UUID (the Watermill UUID of a
		// message Watermill published, else the SQS MessageId) as the
		// first claim's transport id and the SQS MessageId as its message
		// id, as a router on the same queue does (msg.UUID and
		// sqs_message_id): a record reads the same whichever entry point
		// claimed it.
		items[i] = item{
			topic: queueName(rec.EventSourceARN), uuid: messageUUID(rec), messageID: rec.MessageId, ids: []string{rec.MessageId},
			message: func() (*message.Message, error) { return Message(*rec), nil },
			with:    func(ctx context.Context) context.Context { return context.WithValue(ctx, recordKey{}, rec) },
		}
		if g := rec.Attributes["MessageGroupId"]; g != "" && strings.HasSuffix(rec.EventSourceARN, ".fifo") {
			items[i].group, items[i].fifoGroup = rec.EventSourceARN+"\x00"+g, g
		}
	}
	var resp events.SQSEventResponse
	for i, err := range h.batch(ctx, items, h.cfg.Concurrency) {
		if err != nil {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: records[i].MessageId})
		}
	}
	if len(records) > 0 && len(resp.BatchItemFailures) == len(records) {
		return resp, fmt.Errorf("%w: %d records", ErrBatchFailed, len(records))
	}
	return resp, nil
}

// functionName names the handler in decisions: the Lambda function's name
// when running in Lambda, else the scope.
func functionName(scope string) string {
	if lambdacontext.FunctionName != "" {
		return lambdacontext.FunctionName
	}
	return scope
}

// queueName is the queue's name, the last part of its ARN.
func queueName(arn string) string {
	return arn[strings.LastIndexByte(arn, ':')+1:]
}

// now reads the clock of the engine (the wall clock when none is set).
func (h *Handler) now() time.Time {
	if h.cfg.Dedup.Clock == nil {
		return time.Now()
	}
	return h.cfg.Dedup.Clock.Now()
}
