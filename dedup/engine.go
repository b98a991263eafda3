package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/internal/claimctx"
	"github.com/watermill-dedup/watermill-dedup/internal/keyrule"
	"github.com/watermill-dedup/watermill-dedup/internal/scopedkey"
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
	// quiet: no Observer and the NopLogger: decisions go nowhere.
	quiet bool
}

// newEngine returns the engine of a validated config with its defaults set.
func newEngine(config Config) *Engine {
	_, wall := config.Clock.(realClock)
	quiet := config.Observer == nil
	switch config.Logger.(type) {
	case watermill.NopLogger, *watermill.NopLogger:
	default:
		quiet = false
	}
	return &Engine{cfg: config, claims: make(chan struct{}, config.MaxClaimsInFlight), wallClock: wall, quiet: quiet}
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
	f := &flight{e: e, call: call}
	return f.do(ctx, workFunc(fn))
}

// do is Do for the flight's call (after Do's Tracer, if any, started it).
func (f *flight) do(ctx context.Context, w worker) (ClaimResult, error) {
	e, call := f.e, &f.call
	if call.Scope == "" {
		return ClaimResult{}, ErrNoScope
	}
	if call.KeyErr != nil {
		f.nameUnkeyed()
		return f.keyMissing(ctx, call.KeyErr, w)
	}
	if err := e.checkKey(call.Key, call.MessageUUID); err != nil {
		return f.keyMissing(ctx, err, w)
	}
	key := scopedkey.Of(call.Scope, call.Key)
	f.hc.Key = key
	lease, err := e.callLease(call)
	if err != nil {
		return ClaimResult{}, err
	}

	// The work's context exists before the claim: the claim's request
	// context is derived from it (see opCtx).
	f.newWorkContext(ctx)
	defer func() { f.work.end(nil) }()
	start := time.Now()
	res, err := f.claim(ctx, lease)
	elapsed := time.Since(start)
	var waited time.Duration
	if err == nil && res.Outcome == InProgress && e.cfg.InProgressWait > 0 && !e.cfg.Shadow {
		res, elapsed, waited, err = f.awaitHolder(ctx, elapsed)
	}
	if err == nil && (res.Outcome < Acquired || res.Outcome > Conflict) {
		err = fmt.Errorf("unknown outcome %v", res.Outcome)
	}
	if err != nil {
		if errors.Is(err, errCallDeadline) {
			return ClaimResult{}, err // not sent: no store failure, nothing to fail open
		}
		return f.claimFailed(ctx, w, elapsed, waited, err)
	}
	switch res.Outcome {
	case Acquired:
		f.claimEvent(event.ClaimWon, res, elapsed, waited)
		return f.run(ctx, res.Claim, w)
	case Duplicate:
		if e.cfg.Shadow {
			return f.refused(ctx, res, elapsed, waited, w)
		}
		f.claimEvent(event.SkipDuplicate, res, elapsed, waited)
		return res, nil
	default:
		return f.refused(ctx, res, elapsed, waited, w)
	}
}

// nameUnkeyed names the record of a call whose key the caller could not
// take (Call.KeyErr) by call.Key, if set, in its decision.
func (f *flight) nameUnkeyed() {
	if f.call.Key != "" {
		f.hc.Key = scopedkey.Of(f.call.Scope, f.call.Key)
	}
}

// The cold paths of do are functions of their own. The compiler may
// inline them: forbidding it (//go:noinline, to keep do's frame small)
// did not pay in paired builds (scripts/paired.sh -m callgrind, 3 pairs,
// 2026-12-03: without the 7 directives of this package, 4 % more
// instructions per message on Redis at c=16, 12 % fewer with AutoPipeline
// at c=64, 7 % fewer on the memory store with GOGC=off).

// keyMissing decides a key that cannot be claimed; with Config.Shadow the
// work runs anyway.
func (f *flight) keyMissing(ctx context.Context, err error, w worker) (ClaimResult, error) {
	if f.e.cfg.Shadow {
		return f.runShadow(ctx, Decision{Event: keyEvent(err), Key: f.hc.Key, Err: err}, w)
	}
	f.e.event(&f.call, keyEvent(err), "", f.hc.Key, 0, err)
	return ClaimResult{}, err
}

// claimEvent decides a claim's outcome.
func (f *flight) claimEvent(ev event.Event, res ClaimResult, elapsed, waited time.Duration) {
	if f.e.quiet && f.call.trace == nil {
		return
	}
	f.e.decide(&f.call, Decision{Event: ev, Op: "claim", Key: f.hc.Key, Elapsed: elapsed, Waited: waited, Outcome: res.Outcome,
		Replayed: ev == event.SkipDuplicate && len(res.Result) > 0})
}

// claimFailed reports a claim that got no answer, and runs the work
// unclaimed with Config.FailOpen (or Shadow).
func (f *flight) claimFailed(ctx context.Context, w worker, elapsed, waited time.Duration, err error) (ClaimResult, error) {
	e, call, key := f.e, &f.call, f.hc.Key
	err = &StoreError{Op: "claim", Key: key, Err: err}
	e.decide(call, Decision{Event: event.StoreError, Op: "claim", Key: key, Elapsed: elapsed, Waited: waited, Err: err})
	if !(e.cfg.FailOpen || e.cfg.Shadow) || ctx.Err() != nil {
		return ClaimResult{}, err
	}
	e.event(call, event.FailOpen, "claim", key, 0, err)
	// Marked as a run without a claim, as shadow runs are: it hides the
	// claim of an enclosing call (OutcomeFromContext says 0, false), and
	// stores/postgres RunInTx commits its writes without completing.
	ctx = claimctx.WithShadow(ctx, 0)
	result, err := w.work(ctx)
	return ClaimResult{Result: result}, err
}

// refused reports a claim that found the key in progress or completed
// with another fingerprint (or, with Config.Shadow, completed), and with
// Config.Shadow runs the work without a claim.
func (f *flight) refused(ctx context.Context, res ClaimResult, elapsed, waited time.Duration, w worker) (ClaimResult, error) {
	e, call, key := f.e, &f.call, f.hc.Key
	dec := Decision{Op: "claim", Key: key, Elapsed: elapsed, Waited: waited, Outcome: res.Outcome}
	switch res.Outcome {
	case Duplicate:
		dec.Event = event.SkipDuplicate
	case InProgress:
		dec.Event, dec.Err = event.InProgress, fmt.Errorf("%w: %q", ErrInProgress, key)
		if f.wait != nil && f.wait.err != nil {
			dec.Err = fmt.Errorf("%w: %q; the wait for it ended on a store error: %w", ErrInProgress, key, f.wait.err)
		}
	default: // Conflict
		dec.Event, dec.Err = event.KeyReuse, fmt.Errorf("%w: %q", ErrKeyReuse, key)
	}
	if e.cfg.Shadow {
		return f.runShadow(ctx, dec, w)
	}
	e.decide(call, dec)
	return res, dec.Err
}

// newWorkContext makes the work's context: cancellable with a cause,
// carrying the flight's claim.
func (f *flight) newWorkContext(ctx context.Context) {
	if f.work == nil {
		f.work = &f.workCtx0
	} else {
		f.work = &workCtx{} // the first one may still be in a store's hands
	}
	f.work.init(ctx, f)
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
	if left := call.Deadline.Sub(e.cfg.Clock.Now()); !call.Deadline.IsZero() && left < lease {
		if left <= 0 {
			return 0, fmt.Errorf("%w: %w", errCallDeadline, context.DeadlineExceeded)
		}
		lease = left
	}
	return lease, nil
}

// claim runs Store.Claim once admitted (see Engine.claims), within
// StoreTimeout; a context that ends while waiting for admission fails it.
//
// The keeper's claimedAt is the clock's reading once admitted, just before
// the request is sent: the lease certainly runs until claimedAt+lease (a
// wait for admission does not count against it), cut to end at the call's
// Deadline, if any, as it stands after that wait.
func (f *flight) claim(ctx context.Context, lease time.Duration) (res ClaimResult, err error) {
	e := f.e
	select {
	case e.claims <- struct{}{}:
	default: // a full bound: wait, within ctx
		select {
		case e.claims <- struct{}{}:
		case <-ctx.Done():
			return ClaimResult{}, context.Cause(ctx)
		}
	}
	defer func() { <-e.claims }()
	now := e.cfg.Clock.Now()
	if d := f.call.Deadline; !d.IsZero() && d.Sub(now) < lease {
		// The wait for admission took some of the time left.
		if lease = d.Sub(now); lease <= 0 {
			return ClaimResult{}, fmt.Errorf("%w while waiting for admission: %w", errCallDeadline, context.DeadlineExceeded)
		}
	}
	f.keeper.lease, f.keeper.claimedAt = lease, now
	if f.work.Err() != nil && ctx.Err() == nil {
		// An earlier claim of the call (InProgressWait) timed out and
		// ended the work's context with it.
		f.newWorkContext(ctx)
	}
	op := &f.claimCtx
	if op.parent != nil { // an earlier claim of the call (InProgressWait)
		op = &opCtx{}
	}
	op.start(f.work, f.work, e.cfg.StoreTimeout)
	start := time.Now()
	if e.cfg.InProgressWait > 0 {
		if f.wait == nil {
			f.wait = new(flightWait)
		}
		f.wait.claimSent = start
	}
	res, err = e.cfg.Store.Claim(op, f.hc.Key, f.call.Fingerprint, lease)
	elapsed := time.Since(start)
	timedOut := op.end()
	e.observeOp(ctx, "claim", elapsed, err)
	if timedOut {
		// The deadline ended (or is about to end: the timer's goroutine
		// may not have got there yet) the work's context while the claim
		// was answered: the work, or the next claim of an InProgressWait,
		// gets a fresh one.
		f.newWorkContext(ctx)
	}
	return res, err
}

// checkKey refuses keys that cannot identify a business fact, or that some
// store cannot hold, the same way for every store.
func (e *Engine) checkKey(key, transportID string) error {
	return checkKey(key, transportID, e.cfg.MaxKeyLength)
}

// checkKey applies the engine's key rule (internal/keyrule) and refuses a
// key equal to the message's transport id.
func checkKey(key, transportID string, maxKeyLength int) error {
	if reason := keyrule.Problem(key, maxKeyLength); reason != "" {
		return &KeyError{Reason: reason, MessageUUID: transportID}
	}
	if transportID != "" && key == transportID {
		return fmt.Errorf("%w: key %q is the message's transport id; take the key from the business payload", ErrTransportKey, key)
	}
	return nil
}

// run does the work of an acquired claim and ends the claim exactly once.
func (f *flight) run(ctx context.Context, claim Claim, w worker) (ClaimResult, error) {
	f.hold(claim)
	return f.runHeld(ctx, w, nil)
}

// hold starts keeping an acquired claim: the work's context carries it,
// and the lease keeper extends it (see leaseKeeper).
func (f *flight) hold(claim Claim) {
	f.hc.Key, f.hc.Token, f.hc.Retention = claim.Key, claim.Token, f.e.cfg.Retention
	f.hc.SetStopper(f.keepLease())
}

// runHeld does the work of a held claim and ends the claim exactly once:
// at once, or, in a batch (b not nil), with the batch's completions and
// releases.
func (f *flight) runHeld(ctx context.Context, w worker, b *batchSlot) (ClaimResult, error) {
	claim := f.keeper.claim()
	acquired := ClaimResult{Outcome: Acquired, Claim: claim}
	if sb := f.call.StartBy; !sb.IsZero() && !f.e.cfg.Clock.Now().Before(sb) {
		// Won too late (after an InProgressWait, a slow claim, or, in a
		// batch, the turns of earlier calls): the work would not have the
		// time it needs.
		err := fmt.Errorf("%w: the call's StartBy (%s) has passed; the key %q is released unworked", ErrNotStarted, sb.Format(time.RFC3339Nano), claim.Key)
		if b != nil {
			b.release(err)
		} else {
			f.release(ctx, err)
		}
		return acquired, err
	}

	panicked := true
	defer func() {
		switch {
		case !panicked:
		case f.hc.Completed():
			// The work completed the record itself (stores/postgres
			// RunInTx) before it panicked: nothing to release.
			f.completedInWork(claim)
		default:
			// The panic (or runtime.Goexit) goes on after this function
			// returns; the claim is released first so that a retry runs.
			f.release(ctx, errors.New("handler panicked"))
		}
	}()
	result, err := w.work(f.work)
	panicked = false

	switch {
	case f.hc.Completed():
		// The work completed the record itself, in its own transaction
		// (stores/postgres RunInTx): an error after that (from a
		// middleware outside the transaction) cannot undo it, and a
		// release could only fail.
		f.completedInWork(claim)
		if err != nil {
			return acquired, err
		}
	case err != nil:
		if b != nil {
			b.release(err)
		} else {
			f.release(ctx, err)
		}
		return acquired, err
	case b != nil:
		b.complete(result)
	default:
		f.complete(ctx, result)
	}
	acquired.Result = result
	return acquired, nil
}

// completedInWork ends a claim whose work completed the record itself.
func (f *flight) completedInWork(claim Claim) {
	f.keeper.stop()
	f.e.event(&f.call, event.Completed, "complete", claim.Key, f.e.cfg.Clock.Now().Sub(f.keeper.claimedAt), nil)
}

// release releases the claim's record so that a retry can run the work again.
func (f *flight) release(ctx context.Context, cause error) {
	e, keeper := f.e, &f.keeper
	keeper.finish()
	defer keeper.stop() // also when the store or the Observer panics
	claim := keeper.claim()
	err := f.finishOp(ctx, "release", func(ctx context.Context) error { return e.cfg.Store.Release(ctx, claim) })
	f.released(err, cause)
}

// released stops the keeper and decides a release's answer err.
func (f *flight) released(err, cause error) {
	e, call, keeper := f.e, &f.call, &f.keeper
	keeper.stop()
	claim := keeper.claim()
	elapsed := e.cfg.Clock.Now().Sub(keeper.claimedAt)
	switch {
	case err == nil:
		e.event(call, event.Released, "release", claim.Key, elapsed, cause)
	case errors.Is(err, ErrClaimLost):
		e.event(call, event.ClaimLost, "release", claim.Key, elapsed, fmt.Errorf("releasing after a failure (%v): %w", cause, err))
	default:
		// The record stays in progress until its lease ends; retries get
		// ErrInProgress until then.
		e.event(call, event.StoreError, "release", claim.Key, elapsed, &StoreError{Op: "release", Key: claim.Key, Err: err})
	}
}

// complete records the work as done, retrying store errors with backoff
// while the heartbeat keeps the lease alive.
func (f *flight) complete(ctx context.Context, result []byte) {
	e, keeper := f.e, &f.keeper
	keeper.finish()
	defer keeper.stop() // also when the store or the Observer panics
	claim := keeper.claim()
	var err error
	backoff := e.cfg.CompleteBackoff
	for attempt := 0; ; attempt++ {
		err = f.finishOp(ctx, "complete", func(ctx context.Context) error {
			return e.cfg.Store.Complete(ctx, claim, result, e.cfg.Retention)
		})
		again, pause := f.completeAgain(err, &result, attempt)
		if !again {
			break
		}
		if pause {
			sleep(e.cfg.Clock, backoff)
			backoff *= 2
		}
	}
	f.completed(err)
}

// completeAgain decides on a Complete's answer err, the attempt-th (from
// 0): whether to send it again, and whether to pause first (a store
// error; not a result too large, sent again at once without it).
func (f *flight) completeAgain(err error, result *[]byte, attempt int) (again, pause bool) {
	if errors.Is(err, ErrResultTooLarge) && *result != nil {
		// Record the effect without its result rather than leave the
		// key in progress (which would run the effect again after the
		// lease): the replay is lost, the effect is not repeated. Op is
		// empty: the claim is not over yet.
		f.e.event(&f.call, event.StoreError, "", f.hc.Key, 0, fmt.Errorf("storing the result for replay (%d bytes); completing without it: %w", len(*result), err))
		*result = nil
		return true, false
	}
	if err == nil || errors.Is(err, ErrClaimLost) || errors.Is(err, ErrInvalidDuration) || attempt >= f.e.cfg.CompleteRetries {
		return false, false
	}
	return true, true
}

// completed stops the keeper and decides a completion's last answer err.
func (f *flight) completed(err error) {
	e, call, keeper := f.e, &f.call, &f.keeper
	keeper.stop()
	claim := keeper.claim()
	elapsed := e.cfg.Clock.Now().Sub(keeper.claimedAt)
	switch {
	case err == nil || errors.Is(err, ErrAlreadyCompleted):
		// ErrAlreadyCompleted: an earlier attempt whose reply was lost
		// completed the record with this claim.
		e.event(call, event.Completed, "complete", claim.Key, elapsed, nil)
	case errors.Is(err, ErrClaimLost):
		e.event(call, event.ClaimLost, "complete", claim.Key, elapsed, fmt.Errorf("the work ran but the record was taken over before completing: %w", err))
	default:
		// Reported as success anyway: the record stays in progress until its
		// lease ends, then a retry (if any) would run the work again.
		e.event(call, event.StoreError, "complete", claim.Key, elapsed, &StoreError{Op: "complete", Key: claim.Key, Err: err})
	}
}

// finishOp runs a Complete or Release within StoreTimeout, detached from ctx:
// the record must be finished even when the message's or request's context
// was cancelled. The first attempt uses the flight's own context; retries
// get one each.
func (f *flight) finishOp(ctx context.Context, op string, do func(context.Context) error) error {
	oc := &f.endCtx
	if oc.parent != nil {
		oc = &opCtx{}
	}
	oc.start(context.WithoutCancel(ctx), nil, f.e.cfg.StoreTimeout)
	start := time.Now()
	err := do(oc)
	elapsed := time.Since(start)
	oc.end()
	f.e.observeOp(ctx, op, elapsed, err)
	return err
}

// heartbeat is the extension interval for a lease.
func (e *Engine) heartbeat(lease time.Duration) time.Duration {
	if lease < e.cfg.Lease {
		return lease / 3
	}
	return e.cfg.Heartbeat
}

// event is decide for the fields of a Decision. It builds the Decision
// only when there is someone to tell (an Observer, a logger that is not
// the NopLogger).
func (e *Engine) event(call *Call, ev event.Event, op, key string, elapsed time.Duration, err error) {
	if e.quiet && call.trace == nil {
		return
	}
	e.decide(call, Decision{Event: ev, Op: op, Key: key, Elapsed: elapsed, Err: err})
}

func (e *Engine) decide(call *Call, dec Decision) {
	dec.Handler, dec.Topic, dec.MessageUUID = call.Handler, call.Topic, call.MessageUUID
	dec.log(e.cfg.Logger)
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
