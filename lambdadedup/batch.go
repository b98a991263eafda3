package lambdadedup

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
)

// item is one record of any event source, as the shared batch path
// (Handler.batch) sees it.
type item struct {
	topic string // queue, stream, table or event source: Decision.Topic
	// uuid is the record's transport id: the message's UUID,
	// Call.MessageUUID and Decision.MessageUUID, refused as a key.
	uuid string
	// messageID is Call.MessageID: the SQS MessageId, the event id
	// (Kinesis), the sequence number (DynamoDB).
	messageID string
	// ids are the record's other transport ids (the SQS MessageId, a
	// stream record's event id or sequence number), refused as a key
	// (dedup.Config.TakeKey).
	ids []string
	// group orders records: a FIFO message group, a stream's batch.
	group string
	// fifoGroup names the FIFO message group in the group_skipped
	// decision of a record that did not start; empty for streams.
	fifoGroup string
	message   func() (*message.Message, error)
	with      func(context.Context) context.Context // puts the record in the context
}

// batch claims every record of an invocation's batch at once
// (dedup.Engine.DoBatch: one claim request for the batch, one completion
// request, one release request), runs the handler for each record won,
// and returns each record's end: nil when the source may consider it
// processed. Records of one group run in order and stop at the group's
// first failure (a dropped permanent error is no failure); records run
// concurrency at a time. Every lease ends at the invocation's deadline.
// With less than DeadlineMargin left nothing is claimed; a won record
// reached with less than that left is not started (dedup.Call.StartBy: an
// InProgressWait ends by then too), and its claim is released with the
// batch's other releases. A record whose key cannot be taken is decided by
// the engine as dedup.Engine.Do decides a dedup.Call with KeyErr:
// refused, or, in shadow mode, run without a claim.
func (h *Handler) batch(ctx context.Context, items []item, concurrency int) []error {
	errs := make([]error, len(items))
	if err := h.timeLeft(ctx); err != nil {
		for i, it := range items {
			h.decideItem(it, dedup.Decision{Event: EventDeadline, Err: err})
			errs[i] = err
		}
		return errs
	}
	deadline, hasDeadline := ctx.Deadline()
	calls := make([]dedup.BatchCall, len(items))
	msgs := make([]*message.Message, len(items))
	for i, it := range items {
		c := dedup.BatchCall{Group: it.group, Call: dedup.Call{Scope: h.cfg.Dedup.Scope, Handler: functionName(h.cfg.Dedup.Scope), Topic: it.topic,
			MessageUUID: it.uuid, MessageID: it.messageID}}
		if hasDeadline {
			c.Deadline, c.StartBy = deadline, h.startBy(deadline)
		}
		msg, err := it.message()
		if err != nil {
			// No message for the handler, not even in shadow mode.
			err = &dedup.KeyError{Reason: "the record cannot be converted to a message", MessageUUID: it.uuid, Err: err}
			h.decideItem(it, dedup.Decision{Event: event.KeyMissing, Err: err})
			c.Err = err
		} else {
			msg.SetContext(it.with(ctx))
			msgs[i] = msg
			// The engine decides a key that cannot be taken (key_missing,
			// transport_key; would_reject and a run in shadow mode).
			c.KeyErr = h.cfg.Dedup.TakeKey(&c.Call, msg, it.ids...)
		}
		calls[i] = c
	}
	run := func(workCtx context.Context, i int) (_ []byte, err error) {
		it, msg := items[i], msgs[i]
		// A claimed record was checked by the engine (Call.StartBy); this
		// checks the runs without a claim (Dedup.Shadow, Dedup.FailOpen).
		if err := h.timeLeft(ctx); err != nil {
			h.decideItem(it, dedup.Decision{Event: EventDeadline, Err: err})
			return nil, err
		}
		recCtx := it.with(ctx)
		msg.SetContext(it.with(workCtx))
		defer msg.SetContext(recCtx)
		defer func() {
			if p := recover(); p != nil {
				// Only this record fails (its claim is released): a
				// panicking invocation would fail the whole batch.
				err = fmt.Errorf("lambdadedup: handler panicked: %v\n%s", p, debug.Stack())
				h.decideItem(it, dedup.Decision{Event: EventHandlerPanic, Key: admin.ScopedKey(h.cfg.Dedup.Scope, calls[i].Key), Err: err})
			}
		}()
		return nil, h.handler(msg)
	}
	// turned[i]: call i took its turn (Batch.Stops saw it), so an
	// ErrNotStarted of it is its StartBy, not its group's earlier failure.
	turned := make([]bool, len(calls))
	_, callErrs := h.engine.DoBatch(ctx, dedup.Batch{Calls: calls, Concurrency: concurrency,
		Stops: func(i int, _ dedup.ClaimResult, err error) bool {
			turned[i] = true
			return err != nil && !(h.cfg.DropPermanent && dedup.IsPermanent(err))
		},
	}, run)
	for i, err := range callErrs {
		it := items[i]
		switch {
		case err == nil:
		case errors.Is(err, dedup.ErrNotStarted) && !turned[i]:
			if it.fifoGroup != "" {
				h.decideItem(it, dedup.Decision{Event: EventGroupSkipped,
					Err: fmt.Errorf("lambdadedup: message group %q: an earlier record of the batch failed", it.fifoGroup)})
			}
			errs[i] = err
		case errors.Is(err, dedup.ErrNotStarted):
			// Won, but reached (or won after an InProgressWait) with less
			// than DeadlineMargin left: released unstarted.
			h.decideItem(it, dedup.Decision{Event: EventDeadline, Err: err})
			errs[i] = err
		case dedup.IsPermanent(err):
			errs[i] = h.permanentItem(it, err)
		default:
			errs[i] = err
		}
	}
	return errs
}

// startBy is the latest start of a record in an invocation ending at
// deadline: DeadlineMargin before it (dedup.Call.StartBy bounds an
// InProgressWait and is checked again at the record's turn, once its claim
// is won).
func (h *Handler) startBy(deadline time.Time) time.Time {
	return deadline.Add(-h.cfg.DeadlineMargin)
}

// timeLeft is nil while the invocation has at least DeadlineMargin left,
// else the error that says why a record is not started.
func (h *Handler) timeLeft(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("lambdadedup: the invocation ended: %w", context.Cause(ctx))
	}
	if deadline, has := ctx.Deadline(); has {
		if left := deadline.Sub(h.now()); left < h.cfg.DeadlineMargin {
			return fmt.Errorf("lambdadedup: %v left in the invocation, less than DeadlineMargin %v", left, h.cfg.DeadlineMargin)
		}
	}
	return nil
}
