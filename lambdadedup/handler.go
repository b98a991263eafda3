package lambdadedup

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
)

// Events of the adapter itself, logged and passed to Dedup.Observer like
// the engine's (Op is empty: no store operation was made).
const (
	// EventDeadline: the record was not started because the invocation had
	// less than DeadlineMargin left (or had ended); listed as a failure.
	// Info level.
	EventDeadline dedup.Event = "deadline_skipped"
	// EventGroupSkipped: an earlier record of the same FIFO message group
	// failed in this batch, so this one was not started; listed as a
	// failure. Info level.
	EventGroupSkipped dedup.Event = "group_skipped"
	// EventDropped: a permanent failure (ErrNoKey, ErrTransportKey,
	// ErrKeyReuse) reported as processed because Config.DropPermanent is
	// set: SQS deletes the message. Error level.
	EventDropped dedup.Event = "permanent_dropped"
	// EventHandlerPanic: the handler panicked; its claim was released and
	// the record is listed as a failure. Error level.
	EventHandlerPanic dedup.Event = "handler_panic"
)

// Handler is an SQS batch handler for AWS Lambda (an event source mapping
// with ReportBatchItemFailures) that claims every record on its own, with
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
		ecfg.Logger = watermill.NopLogger{}
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
// Cost: per record, the store round trips of dedup.Engine.Do (two for a
// new key, one for a duplicate), plus one per heartbeat.
func (h *Handler) Handle(ctx context.Context, event events.SQSEvent) (events.SQSEventResponse, error) {
	records := event.Records
	failed := make([]bool, len(records))
	units := orderedUnits(records)

	next := make(chan []int)
	var wg sync.WaitGroup
	for range min(h.cfg.Concurrency, len(units)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for unit := range next {
				h.runUnit(ctx, records, unit, failed)
			}
		}()
	}
	for _, u := range units {
		next <- u
	}
	close(next)
	wg.Wait()

	var resp events.SQSEventResponse
	for i, f := range failed {
		if f {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: records[i].MessageId})
		}
	}
	if len(records) > 0 && len(resp.BatchItemFailures) == len(records) {
		return resp, fmt.Errorf("%w: %d records", ErrBatchFailed, len(records))
	}
	return resp, nil
}

// runUnit runs the records of one unit (one record, or one FIFO message
// group) in order; after a failure the rest of the unit fails unstarted.
// Each goroutine writes only its own unit's entries of failed.
func (h *Handler) runUnit(ctx context.Context, records []events.SQSMessage, unit []int, failed []bool) {
	for n, i := range unit {
		if n > 0 && failed[unit[n-1]] {
			failed[i] = true
			h.decide(&records[i], dedup.Decision{Event: EventGroupSkipped,
				Err: fmt.Errorf("lambdadedup: message group %q: an earlier record of the batch failed", records[i].Attributes["MessageGroupId"])})
			continue
		}
		failed[i] = !h.record(ctx, &records[i])
	}
}

// orderedUnits groups the records that must run in order: on a FIFO queue
// (an event source ARN ending in ".fifo"), the records of one message
// group, in batch order; every other record is a unit of its own.
func orderedUnits(records []events.SQSMessage) [][]int {
	var units [][]int
	group := map[string]int{} // FIFO message group -> index in units
	for i, r := range records {
		g, fifo := r.Attributes["MessageGroupId"], strings.HasSuffix(r.EventSourceARN, ".fifo")
		if !fifo || g == "" {
			units = append(units, []int{i})
			continue
		}
		key := r.EventSourceARN + "\x00" + g
		if u, ok := group[key]; ok {
			units[u] = append(units[u], i)
			continue
		}
		group[key] = len(units)
		units = append(units, []int{i})
	}
	return units
}

// record claims and handles one record; it reports whether SQS may delete
// it.
func (h *Handler) record(ctx context.Context, rec *events.SQSMessage) (ok bool) {
	// The store keeps the message's UUID (the Watermill UUID of a message
	// Watermill published, else the SQS MessageId) as the first claim's
	// transport id and the SQS MessageId as its message id, as a router on
	// the same queue does (msg.UUID and sqs_message_id): a record reads the
	// same whichever entry point claimed it. Set once the message is built.
	call := dedup.Call{Scope: h.cfg.Scope, Handler: functionName(h.cfg.Scope), Topic: queueName(rec.EventSourceARN), MessageUUID: rec.MessageId,
		MessageID: rec.MessageId}
	if err := ctx.Err(); err != nil {
		h.decide(rec, dedup.Decision{Event: EventDeadline, Err: fmt.Errorf("lambdadedup: the invocation ended: %w", context.Cause(ctx))})
		return false
	}
	if deadline, has := ctx.Deadline(); has {
		left := deadline.Sub(h.now())
		if left < h.cfg.DeadlineMargin {
			h.decide(rec, dedup.Decision{Event: EventDeadline,
				Err: fmt.Errorf("lambdadedup: %v left in the invocation, less than DeadlineMargin %v", left, h.cfg.DeadlineMargin)})
			return false
		}
		call.Deadline, call.StartBy = deadline, h.startBy(deadline)
	}
	recCtx := context.WithValue(ctx, recordKey{}, rec)
	msg := Message(*rec)
	msg.SetContext(recCtx)
	call.MessageUUID = msg.UUID // the engine refuses it as a key; businessKey the MessageId

	defer func() {
		if p := recover(); p != nil {
			// The engine released the claim before the panic reached here.
			// Only this record fails: a panicking invocation would fail the
			// whole batch and move its other records towards the DLQ too.
			h.decide(rec, dedup.Decision{Event: EventHandlerPanic, Key: admin.ScopedKey(call.Scope, call.Key),
				Err: fmt.Errorf("lambdadedup: handler panicked: %v\n%s", p, debug.Stack())})
			ok = false
		}
	}()

	err := h.claimAndRun(recCtx, &call, msg, rec.MessageId, nil)
	switch {
	case err == nil:
		return true
	case dedup.IsPermanent(err):
		return h.permanent(rec, err)
	default:
		return false
	}
}

// claimAndRun takes the record's key (see identify) and runs the handler
// through the engine: under a claim (Engine.Do), or, when no key can be
// taken, as the engine decides for an unusable key (Engine.Unkeyed:
// refused, or run without a claim in shadow mode). msg's context is the
// record's; the handler gets the engine's.
func (h *Handler) claimAndRun(recCtx context.Context, call *dedup.Call, msg *message.Message, messageID string, others []string) error {
	work := func(workCtx context.Context) ([]byte, error) {
		msg.SetContext(workCtx)
		defer msg.SetContext(recCtx)
		return nil, h.handler(msg)
	}
	var err error
	if call.Key, call.Fingerprint, err = h.identify(msg, messageID, others); err != nil {
		_, err = h.engine.Unkeyed(recCtx, *call, err, work)
		return err
	}
	_, err = h.engine.Do(recCtx, *call, work)
	return err
}

// startBy is the latest start of a record in an invocation ending at
// deadline: DeadlineMargin before it (Call.StartBy bounds an
// InProgressWait and is checked again once the claim is won).
func (h *Handler) startBy(deadline time.Time) time.Time {
	return deadline.Add(-h.cfg.DeadlineMargin)
}

// permanent decides on a record that can never succeed (the engine or
// businessKey has logged why).
func (h *Handler) permanent(rec *events.SQSMessage, err error) bool {
	if !h.cfg.DropPermanent {
		return false
	}
	h.decide(rec, dedup.Decision{Event: EventDropped, Err: fmt.Errorf("lambdadedup: record dropped (DropPermanent): %w", err)})
	return true
}

// identify takes the record's key (see businessKey), refuses one equal to
// another of the record's ids (others: a sequence number, an event id) or
// to one of Dedup.TransportIDs, and takes its fingerprint: what the record
// is claimed under. A panicking TransportIDs or Fingerprint is a
// *dedup.KeyError of the record (permanent), as a panicking key function
// is.
func (h *Handler) identify(msg *message.Message, messageID string, others []string) (key, fingerprint string, err error) {
	if key, err = h.businessKey(msg, messageID); err != nil {
		return "", "", err
	}
	defer func() {
		if p := recover(); p != nil {
			key, fingerprint, err = "", "", &dedup.KeyError{Field: "fingerprint", Reason: fmt.Sprintf("Fingerprint or TransportIDs panicked: %v", p), MessageUUID: messageID}
		}
	}()
	if ids := h.cfg.Dedup.TransportIDs; ids != nil {
		others = append(others[:len(others):len(others)], ids(msg)...)
	}
	for _, id := range others {
		if id != "" && key == id {
			return "", "", fmt.Errorf("%w: key %q is a transport id of the record (its sequence number, event id or one of Dedup.TransportIDs); take the key from the business payload", dedup.ErrTransportKey, key)
		}
	}
	if h.cfg.Dedup.Fingerprint != nil {
		if fingerprint, err = h.cfg.Dedup.Fingerprint(msg); err != nil {
			return "", "", &dedup.KeyError{Field: "fingerprint", Reason: "fingerprint failed", MessageUUID: messageID, Err: err}
		}
	}
	return key, fingerprint, nil
}

// businessKey runs the key function as the Watermill middleware does (a
// panic or a plain error is a *dedup.KeyError), and also refuses the SQS
// MessageId: the engine compares the key with the message's UUID only (the
// Watermill UUID of a message Watermill published).
func (h *Handler) businessKey(msg *message.Message, messageID string) (key string, err error) {
	defer func() {
		if p := recover(); p != nil {
			key, err = "", &dedup.KeyError{Reason: fmt.Sprintf("key function panicked: %v", p), MessageUUID: messageID}
		}
	}()
	key, err = h.cfg.Dedup.Key(msg)
	switch {
	case err != nil && !errors.Is(err, dedup.ErrNoKey) && !errors.Is(err, dedup.ErrTransportKey):
		return "", &dedup.KeyError{Reason: "key function failed", MessageUUID: messageID, Err: err}
	case err != nil:
		return "", err
	case key != "" && key == messageID:
		return "", fmt.Errorf("%w: key %q is the record's SQS MessageId; take the key from the business payload", dedup.ErrTransportKey, key)
	}
	return key, nil
}

// decide logs an adapter decision and passes it to the Observer, as the
// engine does with its own.
func (h *Handler) decide(rec *events.SQSMessage, d dedup.Decision) {
	d.Handler, d.Topic, d.MessageUUID = functionName(h.cfg.Scope), queueName(rec.EventSourceARN), messageUUID(rec)
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
	switch d.Event {
	case EventDeadline, EventGroupSkipped:
		f["err"] = d.Err.Error()
		l.Info("dedup: "+string(d.Event), f)
	default:
		l.Error("dedup: "+string(d.Event), d.Err, f)
	}
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
