package dedup

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/internal/defaultlog"
)

// keyEvent is the event of a key that cannot be claimed: transport_key
// for ErrTransportKey, key_missing for the others (ErrNoKey).
func keyEvent(err error) event.Event {
	if errors.Is(err, ErrTransportKey) {
		return event.TransportKey
	}
	return event.KeyMissing
}

// Decision describes one event, as passed to an Observer and logged.
type Decision struct {
	Event event.Event
	// Op is the store operation that led to the event: "claim", "extend",
	// "complete", "release", or "" when no store was involved (key_missing,
	// transport_key).
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
	// Outcome is what the claim found, on the decisions of Op "claim"
	// (claim_won, skip_duplicate, in_progress, key_reuse, would_skip,
	// would_reject); zero on the others.
	Outcome Outcome
	// Replayed is true on a skip_duplicate whose stored result came back
	// for replay (Config.Replay, httpdedup's stored response): what a
	// business metric counts apart from fresh runs (completed).
	Replayed bool
	// Waited is how long the call waited for another claim of the key to
	// end (Config.InProgressWait) before this claim decision; zero when it
	// did not wait.
	Waited time.Duration
}

// Observer receives every decision and the latency of every store operation.
// Its methods are called synchronously, on the message's goroutine or, for
// the lease's extensions and its end, on the lease keeper's timer
// goroutine, and must be fast and safe for concurrent use (e.g. increment
// Prometheus metrics). Every call about a message has returned when the
// middleware (or Engine.Do) returns; one that blocks holds it up. A panic
// on the keeper's goroutine, where no Watermill Recoverer can catch it, is
// recovered and logged to Config.Logger, and the lease goes on.
type Observer interface {
	ObserveDecision(Decision)
	ObserveStoreOp(op string, elapsed time.Duration, err error)
}

// Tracer follows each call of an Engine (each message of a Deduplicator,
// each request of httpdedup) from its start, with the call's context, which
// an Observer does not see: package oteldedup starts a trace span there.
// Set it as Config.Tracer. Unset, it costs a nil check per call, decision
// and store operation.
type Tracer interface {
	// StartCall is called once per call, before the claim. It returns the
	// context the call goes on with (the claim, Complete, Release and the
	// work run in it, so the work's spans are children of a span started
	// here) and the CallTrace that receives the call's decisions and store
	// operations, or nil for none. It runs on the call's goroutine and must
	// be fast.
	StartCall(ctx context.Context, call Call) (context.Context, CallTrace)
}

// CallTrace follows one call started by Tracer.StartCall. ObserveDecision
// receives every decision of the call (also those of its lease, from the
// lease's goroutines while the work runs); ObserveStoreOp every claim,
// complete and release of the call (lease extensions reach only
// Config.Observer). Its methods must be safe for concurrent use.
type CallTrace interface {
	Observer
	// EndCall is called once, when the call returns, with what it returns;
	// when the work panicked, with a zero ClaimResult and an error saying
	// so (the panic then goes on).
	EndCall(res ClaimResult, err error)
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
	if d.Waited > 0 {
		f["waited"] = d.Waited
	}
	if d.Replayed {
		f["replayed"] = true
	}
	// Seed 003's vocabulary: its claim_lost is a lost conditional write,
	// here claim="lost" (this project's claim_lost is a claim lost later).
	if d.Outcome > Acquired {
		f["claim"] = "lost"
	}
	return f
}

// DefaultLogger returns the Logger of a Config that sets none (and of
// httpdedup's and lambdadedup's): it writes the lines at error level to
// log/slog's default logger, slog.Default() read at each line (so that
// slog.SetDefault applies), at slog.LevelError with the fields as
// attributes and the error as "error", and drops the lines at info,
// debug and trace level. The engine recognises it and builds no decision
// below error level for it: a message that goes well costs what it costs
// with watermill.NopLogger{}, which logs nothing at all. An entry point
// of your own that logs decisions can default to it too.
func DefaultLogger() watermill.LoggerAdapter { return defaultlog.New() }

// level is the level a decision is logged at.
type level int8

const (
	levelDebug level = iota
	levelInfo
	levelError
)

// levelOf is the level of an event's lines, the one mapping of events to
// levels (package event's constants say it): debug for a fresh run,
// info for what a healthy consumer meets (copies, handler failures,
// shadow mode), error for the rest (refusals, store errors, lost claims).
func levelOf(ev event.Event) level {
	switch ev {
	case event.ClaimWon, event.Completed:
		return levelDebug
	case event.SkipDuplicate, event.InProgress, event.Released, event.WouldSkip, event.WouldReject:
		return levelInfo
	}
	return levelError
}

// log writes the decision's line to l, with the fields of extra added.
// The fields are not built for a logger that would drop the line: the
// NopLogger, or the default logger (DefaultLogger) below error level.
func (d Decision) log(l watermill.LoggerAdapter, extra watermill.LogFields) {
	lv := levelOf(d.Event)
	switch l.(type) {
	case watermill.NopLogger, *watermill.NopLogger:
		return // skip building the fields
	case *defaultlog.Logger:
		if lv < levelError {
			return
		}
	}
	msg := "dedup: " + string(d.Event)
	f := d.fields()
	for k, v := range extra {
		f[k] = v
	}
	switch lv {
	case levelDebug:
		l.Debug(msg, f)
	case levelInfo:
		if d.Err != nil {
			f["err"] = d.Err.Error()
		}
		l.Info(msg, f)
	default:
		l.Error(msg, d.Err, f)
	}
}
