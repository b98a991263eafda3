package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/internal/defaultlog"
	"github.com/watermill-dedup/watermill-dedup/internal/keys"
)

// Engine runs the claim lifecycle that every entry point shares: the
// Watermill middleware (Deduplicator), httpdedup, the Lambda adapter, and
// plain Go code that calls Do. It claims a key, runs the work while keeping
// the lease alive, and completes or releases the record, with one decision
// (log event, Observer call) per outcome. Create it with NewEngine; it is
// safe for concurrent use.
type Engine struct {
	cfg Config
	// claims admits at most cfg.MaxClaimsInFlight Claim requests at once,
	// so that Complete, Release and Extend never queue behind a backlog of
	// new claims for the store's connections.
	claims chan struct{}
	// wallClock: cfg.Clock is the wall clock, whose timers can be pooled.
	wallClock bool
	// quiet: no Observer, and the NopLogger or the default logger
	// (DefaultLogger): decisions below error level go nowhere.
	quiet bool
	// errorsLogged: the Logger is the default logger, which writes the
	// decisions at error level: those are decided even when quiet.
	errorsLogged bool
	// logs: the Logger is not the NopLogger.
	logs bool
	// repeats counts the refusals of messages that come back (see
	// repeatLog); hint is the advice of their first line.
	repeats repeatLog
	hint    string
	// timed: someone is told how long a claim or a store operation took
	// (not quiet, or a Tracer): only then is the clock read for it.
	timed bool
}

// newEngine returns the engine of a validated config with its defaults set.
func newEngine(config Config) *Engine {
	_, wall := config.Clock.(realClock)
	quiet, errorsLogged, logs := config.Observer == nil, false, true
	switch config.Logger.(type) {
	case watermill.NopLogger, *watermill.NopLogger:
		logs = false
	case *defaultlog.Logger:
		errorsLogged = true
	default:
		quiet = false
	}
	return &Engine{cfg: config, claims: make(chan struct{}, config.MaxClaimsInFlight), wallClock: wall, quiet: quiet,
		errorsLogged: errorsLogged, logs: logs, hint: refusedHint,
		timed: !quiet || config.Tracer != nil}
}

// NewEngine validates config, applies its defaults and returns an Engine.
// Config.Key, Fingerprint and Replay are not used: Do takes the key and
// fingerprint of each call, and the result bytes from the work;
// Config.Scope is the scope of the calls that name none.
func NewEngine(config Config) (*Engine, error) {
	if err := config.validate(false); err != nil {
		return nil, err
	}
	config.setDefaults()
	return newEngine(config), nil
}

// Call is one unit of work for Engine.Do: the key it is done at most once
// for, and what its decisions are logged with.
type Call struct {
	// Scope namespaces Key (see ScopedKey): a handler name, an HTTP caller
	// and route. Defaults to Config.Scope; with neither, Do returns
	// ErrNoScope.
	Scope string
	// Key is the business key. Required: blank keys, invalid UTF-8, control
	// characters and keys longer than Config.MaxKeyLength are refused with
	// a *KeyError (ErrNoKey) before the store is touched.
	Key string
	// Fingerprint, when not empty, is stored with the claim and compared on
	// every later claim of the key (ErrKeyReuse on mismatch).
	Fingerprint string
	// Lease, when positive and shorter than Config.Lease, is this call's
	// lease (and its heartbeat a third of it).
	Lease time.Duration
	// Deadline, when set, is when the work certainly ends (a Lambda
	// invocation's deadline): no lease of the call, the claim's or an
	// extension's, reaches past it, so the record of work that was cut off
	// there is free again as soon as it can be. A lease that ends at the
	// Deadline is not extended (no extension could move it).
	Deadline time.Time
	// Handler, Topic and MessageUUID are copied into every Decision of the
	// call, for logs and metrics. Optional.
	Handler, Topic, MessageUUID string
	// MessageID is the broker's own id of this copy of the message (the
	// SQS MessageId) when it has one besides MessageUUID. The store keeps
	// MessageUUID and MessageID of the key's first claim with its record,
	// as its Origin (TransportID and MessageID). When both are empty, an
	// Origin that Do's context already carries (httpdedup puts the
	// request id there), if any, is kept instead. Optional.
	MessageID string
	// StartBy, when set, is the latest time the work may start (a Lambda
	// invocation's deadline less the time a record needs): an
	// InProgressWait ends by then, and a claim acquired later is released
	// without running the work, Do returning ErrNotStarted. Optional.
	StartBy time.Time
	// KeyErr, when not nil, says why the caller could not take the call's
	// key (it should match ErrNoKey or ErrTransportKey: the key function or
	// the fingerprint failed, the key is a transport id): nothing is
	// claimed. Without Config.Shadow the call decides key_missing
	// (transport_key for ErrTransportKey) and Do returns KeyErr; with
	// Config.Shadow it decides would_reject and runs the work without a
	// claim, returning its result and error, as Do does for a key it
	// refuses itself. Key, if set, names the record in the decision. Entry
	// points that take keys themselves (the Lambda adapter) set it, so that
	// every refusal is decided, traced and shadowed alike. Cost: no store
	// round trip. Optional.
	KeyErr error

	// trace follows the call when Config.Tracer is set (see doTraced).
	trace CallTrace
}

// Do runs fn at most once for (call.Scope, call.Key) across every process
// sharing the store, and reports what happened:
//
//   - the key was free: fn runs with a context that carries the claim and is
//     cancelled (cause ErrClaimLost) if the claim is lost or the lease
//     deadline passes without a successful extension. When fn succeeds, the
//     record is completed with the bytes fn returned (kept for replay; a
//     result the store cannot hold is dropped and the loss logged) and Do
//     returns Outcome Acquired with those bytes. When fn fails or panics,
//     the claim is released so that a retry runs fn again, and Do returns
//     fn's error unchanged (a panic goes on after the release).
//   - the key was completed: fn does not run; Do returns Outcome Duplicate
//     with the stored result (nil when none was stored).
//   - another call holds the key: an error wrapping ErrInProgress. With
//     Config.InProgressWait, Do first claims again until that call ends or
//     the wait does (see there), and answers as above for what it finds; a
//     store error during the wait ends it with ErrInProgress too (wrapping
//     the store's error), never with a fail-open run.
//   - the key was completed with another fingerprint: ErrKeyReuse.
//   - the key or scope is unusable: a *KeyError (ErrNoKey) or ErrNoScope;
//     the caller could not take the key: call.KeyErr (see there).
//   - the store failed: a *StoreError; with Config.FailOpen, fn runs
//     unclaimed instead and Do returns its result with a zero Outcome.
//
// With Config.Shadow, fn runs in every case but ErrNoScope and a passed
// deadline: where Do would have skipped or refused it (Duplicate,
// InProgress, ErrKeyReuse, ErrNoKey), it runs without a claim, leaves the
// record alone, and Do returns its result and error with a zero Outcome.
//
// If Complete fails after fn succeeded, Do still returns success and logs
// the error: the effect happened, and the record stays in progress until
// its lease ends. Cost: two store round trips (claim, complete) for work
// that runs, one for a duplicate or a refusal, plus one per heartbeat.
func (e *Engine) Do(ctx context.Context, call Call, fn func(ctx context.Context) ([]byte, error)) (ClaimResult, error) {
	if call.Scope == "" {
		call.Scope = e.cfg.Scope
	}
	if e.cfg.Tracer != nil && call.trace == nil {
		return e.doTraced(ctx, call, fn)
	}
	f := &callRun{e: e, call: call}
	return f.do(ctx, workFunc(fn))
}

// errCallDeadline is the error of a call whose Deadline passed before its
// claim was sent (before Do, or while it waited for admission); it also
// matches context.DeadlineExceeded.
var errCallDeadline = errors.New("dedup: the call's deadline has passed")

// callLease is the lease of the call's next claim: Config.Lease, or the
// call's shorter Lease, cut to what is left before the call's Deadline.
func (e *Engine) callLease(call *Call) (time.Duration, error) {
	lease := e.cfg.Lease
	if call.Lease > 0 && call.Lease < lease {
		lease = call.Lease
	}
	if call.Deadline.IsZero() {
		return lease, nil // the clock is not read
	}
	if left := call.Deadline.Sub(e.cfg.Clock.Now()); left < lease {
		if left <= 0 {
			return 0, fmt.Errorf("%w: %w", errCallDeadline, context.DeadlineExceeded)
		}
		lease = left
	}
	return lease, nil
}

// checkKey refuses keys that cannot identify a business fact, or that some
// store cannot hold, the same way for every store.
func (e *Engine) checkKey(key, transportID string) error {
	return checkKey(key, transportID, e.cfg.MaxKeyLength)
}

// checkKey applies the engine's key rule (internal/keys) and refuses a
// key equal to the message's transport id.
func checkKey(key, transportID string, maxKeyLength int) error {
	if reason := keys.Problem(key, maxKeyLength); reason != "" {
		return &KeyError{Reason: reason, MessageUUID: transportID}
	}
	if transportID != "" && key == transportID {
		return fmt.Errorf("%w: key %q is the message's transport id; take the key from the business payload", ErrTransportKey, key)
	}
	return nil
}

// heartbeat is the extension interval for a lease.
func (e *Engine) heartbeat(lease time.Duration) time.Duration {
	if lease < e.cfg.Lease {
		return lease / 3
	}
	return e.cfg.Heartbeat
}

// tell is report for the fields of a Decision. It builds the Decision
// only when there is someone to tell (an Observer, a logger that writes
// the event's level, the call's trace).
func (e *Engine) tell(call *Call, ev event.Event, op, key string, elapsed time.Duration, err error) {
	if !e.listened(call) && !(e.errorsLogged && levelOf(ev) == levelError) {
		return
	}
	e.report(call, Decision{Event: ev, Op: op, Key: key, Elapsed: elapsed, Err: err})
}

// listened reports whether the call's decisions below error level go
// somewhere: an Observer, a logger that is neither the NopLogger nor the
// default logger, or the call's trace. Those at error level go somewhere
// also when errorsLogged.
func (e *Engine) listened(call *Call) bool { return !e.quiet || call.trace != nil }

// stopwatch starts timing something someone is told about: the clock is
// read only when the engine is timed (see lap).
func (e *Engine) stopwatch() time.Time {
	if !e.timed {
		return time.Time{}
	}
	return time.Now()
}

// lap is the time since a stopwatch's start; zero when it was not read.
func lap(start time.Time) time.Duration {
	if start.IsZero() {
		return 0
	}
	return time.Since(start)
}

func (e *Engine) report(call *Call, dec Decision) {
	dec.Handler, dec.Topic, dec.MessageUUID = call.Handler, call.Topic, call.MessageUUID
	if e.logs {
		e.logDecision(call, dec)
	}
	if e.cfg.Observer != nil {
		e.cfg.Observer.ObserveDecision(dec)
	}
	if call.trace != nil {
		call.trace.ObserveDecision(dec)
	}
}

// observeOp reports a store operation to the Observer, and to the trace of
// the call whose context ctx is (see traceOf).
func (e *Engine) observeOp(ctx context.Context, op string, elapsed time.Duration, err error) {
	if e.cfg.Observer != nil {
		e.cfg.Observer.ObserveStoreOp(op, elapsed, err)
	}
	if e.cfg.Tracer != nil {
		if t := traceOf(ctx); t != nil {
			t.ObserveStoreOp(op, elapsed, err)
		}
	}
}
