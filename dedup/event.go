package dedup

import (
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// Event names one decision of the middleware. The names are stable: logs
// carry them in the field "dedup_event" and metrics label by them.
type Event string

const (
	// EventClaimWon: the key was acquired; the handler runs. Debug level.
	EventClaimWon Event = "claim_won"
	// EventCompleted: the handler succeeded and the record is completed.
	// Debug level.
	EventCompleted Event = "completed"
	// EventSkipDuplicate: the key was already completed; acked without
	// calling the handler. Info level.
	EventSkipDuplicate Event = "skip_duplicate"
	// EventInProgress: another consumer holds the key; nacked with
	// ErrInProgress. Info level.
	EventInProgress Event = "in_progress"
	// EventReleased: the handler failed or panicked; the claim was released
	// so a redelivery runs it again. Info level.
	EventReleased Event = "released"
	// EventClaimLost: the record no longer carried this claim's token when
	// extending, completing or releasing it: another consumer may have run
	// the effect too. Error level.
	EventClaimLost Event = "claim_lost"
	// EventKeyMissing: no usable key (ErrNoKey, ErrTransportKey). Error
	// level: the message goes to the poison queue, if any.
	EventKeyMissing Event = "key_missing"
	// EventKeyReuse: the key was recorded with another fingerprint
	// (ErrKeyReuse). Error level.
	EventKeyReuse Event = "key_reuse"
	// EventStoreError: a store operation failed. Error level.
	EventStoreError Event = "store_error"
	// EventFailOpen: Config.FailOpen ran the handler without a claim because
	// the store failed. Error level.
	EventFailOpen Event = "fail_open"
)

// Decision describes one event, as passed to an Observer and logged.
type Decision struct {
	Event Event
	// Op is the store operation that led to the event: "claim", "extend",
	// "complete", "release", or "" when no store was involved (key_missing).
	// Every acquired claim ends with exactly one decision whose Op is
	// "complete" or "release" (a gauge of claims in flight can rely on it).
	Op string
	// Key is the scoped key; empty when no key could be taken.
	Key         string
	Handler     string
	Topic       string
	MessageUUID string
	// Elapsed is the store round trip for claim decisions and the time since
	// the claim for complete/release decisions.
	Elapsed time.Duration
	// Err is the error behind the decision, if any.
	Err error
}

// Observer receives every decision and the latency of every store operation.
// Its methods are called synchronously on the message's goroutine and must
// be fast and safe for concurrent use (e.g. increment Prometheus metrics).
type Observer interface {
	ObserveDecision(Decision)
	ObserveStoreOp(op string, elapsed time.Duration, err error)
}

func (d Decision) fields() watermill.LogFields {
	f := watermill.LogFields{
		"dedup_event":  string(d.Event),
		"handler":      d.Handler,
		"topic":        d.Topic,
		"message_uuid": d.MessageUUID,
	}
	if d.Key != "" {
		f["key"] = d.Key
	}
	if d.Op != "" {
		f["op"] = d.Op
	}
	if d.Elapsed > 0 {
		f["elapsed"] = d.Elapsed
	}
	return f
}

func (d Decision) log(l watermill.LoggerAdapter) {
	switch l.(type) {
	case watermill.NopLogger, *watermill.NopLogger:
		return // skip building the fields
	}
	msg := "dedup: " + string(d.Event)
	switch d.Event {
	case EventClaimWon, EventCompleted:
		l.Debug(msg, d.fields())
	case EventSkipDuplicate, EventInProgress, EventReleased:
		f := d.fields()
		if d.Err != nil {
			f["err"] = d.Err.Error()
		}
		l.Info(msg, f)
	default:
		l.Error(msg, d.Err, d.fields())
	}
}
