package dedup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/watermill-dedup/watermill-dedup/internal/claimctx"
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
}

// NewEngine validates config, applies its defaults and returns an Engine.
// Config.Key, Scope, Fingerprint and Replay are not used: Do takes the scope,
// key and fingerprint of each call, and the result bytes from the work.
func NewEngine(config Config) (*Engine, error) {
	if err := config.validate(false); err != nil {
		return nil, err
	}
	config.setDefaults()
	return &Engine{cfg: config, claims: make(chan struct{}, config.MaxClaimsInFlight)}, nil
}

// Call is one unit of work for Engine.Do: the key it is done at most once
// for, and what its decisions are logged with.
type Call struct {
	// Scope namespaces Key (see ScopedKey): a handler name, an HTTP caller
	// and route. Required.
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
	// there is free again as soon as it can be.
	Deadline time.Time
	// Handler, Topic and MessageUUID are copied into every Decision of the
	// call, for logs and metrics. Optional.
	Handler, Topic, MessageUUID string

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
//     the wait does (see there), and answers as above for what it finds.
//   - the key was completed with another fingerprint: ErrKeyReuse.
//   - the key or scope is unusable: a *KeyError (ErrNoKey) or ErrNoScope.
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
	if e.cfg.Tracer != nil && call.trace == nil {
		return e.doTraced(ctx, call, fn)
	}
	if call.Scope == "" {
		return ClaimResult{}, ErrNoScope
	}
	if err := e.checkKey(call.Key, call.MessageUUID); err != nil {
		if e.cfg.Shadow {
			return e.runShadow(ctx, &call, Decision{Event: EventKeyMissing, Err: err}, fn)
		}
		e.decide(&call, Decision{Event: EventKeyMissing, Err: err})
		return ClaimResult{}, err
	}
	key := scopedkey.Of(call.Scope, call.Key)
	lease, err := e.callLease(&call)
	if err != nil {
		return ClaimResult{}, err
	}

	start := time.Now()
	res, claimedAt, err := e.claim(ctx, key, call.Fingerprint, lease)
	elapsed := time.Since(start)
	var waited time.Duration
	if err == nil && res.Outcome == InProgress && e.cfg.InProgressWait > 0 && !e.cfg.Shadow {
		res, claimedAt, lease, elapsed, waited, err = e.awaitHolder(ctx, &call, key)
	}
	if err == nil && (res.Outcome < Acquired || res.Outcome > Conflict) {
		err = fmt.Errorf("unknown outcome %v", res.Outcome)
	}
	if err != nil {
		err = &StoreError{Op: "claim", Key: key, Err: err}
		e.decide(&call, Decision{Event: EventStoreError, Op: "claim", Key: key, Elapsed: elapsed, Waited: waited, Err: err})
		if !(e.cfg.FailOpen || e.cfg.Shadow) || ctx.Err() != nil {
			return ClaimResult{}, err
		}
		e.decide(&call, Decision{Event: EventFailOpen, Op: "claim", Key: key, Err: err})
		result, err := fn(ctx)
		return ClaimResult{Result: result}, err
	}

	dec := Decision{Op: "claim", Key: key, Elapsed: elapsed, Waited: waited, Outcome: res.Outcome}
	switch res.Outcome {
	case Acquired:
		dec.Event = EventClaimWon
		e.decide(&call, dec)
		return e.run(ctx, &call, res.Claim, lease, claimedAt, fn)
	case Duplicate:
		dec.Event = EventSkipDuplicate
		if e.cfg.Shadow {
			return e.runShadow(ctx, &call, dec, fn)
		}
		dec.Replayed = len(res.Result) > 0
		e.decide(&call, dec)
		return res, nil
	case InProgress:
		dec.Event, dec.Err = EventInProgress, fmt.Errorf("%w: %q", ErrInProgress, key)
		if e.cfg.Shadow {
			return e.runShadow(ctx, &call, dec, fn)
		}
		e.decide(&call, dec)
		return res, dec.Err
	default: // Conflict
		dec.Event, dec.Err = EventKeyReuse, fmt.Errorf("%w: %q", ErrKeyReuse, key)
		if e.cfg.Shadow {
			return e.runShadow(ctx, &call, dec, fn)
		}
		e.decide(&call, dec)
		return res, dec.Err
	}
}

// callLease is the lease of the call's next claim: Config.Lease, or the
// call's shorter Lease, cut to what is left before the call's Deadline.
func (e *Engine) callLease(call *Call) (time.Duration, error) {
	lease := e.cfg.Lease
	if call.Lease > 0 && call.Lease < lease {
		lease = call.Lease
	}
	if left := call.Deadline.Sub(e.cfg.Clock.Now()); !call.Deadline.IsZero() && left < lease {
		if left <= 0 {
			return 0, fmt.Errorf("dedup: the call's deadline has passed: %w", context.DeadlineExceeded)
		}
		lease = left
	}
	return lease, nil
}

// claim runs Store.Claim once admitted (see Engine.claims), within
// StoreTimeout; a context that ends while waiting for admission fails it.
//
// claimedAt is the clock's reading once admitted, just before the request
// is sent: the lease certainly runs until claimedAt+lease (a wait for
// admission does not count against it).
func (e *Engine) claim(ctx context.Context, key, fingerprint string, lease time.Duration) (res ClaimResult, claimedAt time.Time, err error) {
	select {
	case e.claims <- struct{}{}:
	case <-ctx.Done():
		return ClaimResult{}, e.cfg.Clock.Now(), context.Cause(ctx)
	}
	defer func() { <-e.claims }()
	claimedAt = e.cfg.Clock.Now()
	cctx, cancel := context.WithTimeout(ctx, e.cfg.StoreTimeout)
	defer cancel()
	start := time.Now()
	res, err = e.cfg.Store.Claim(cctx, key, fingerprint, lease)
	e.observeOp(ctx, "claim", time.Since(start), err)
	return res, claimedAt, err
}

// checkKey refuses keys that cannot identify a business fact, or that some
// store cannot hold, the same way for every store.
func (e *Engine) checkKey(key, transportID string) error {
	switch {
	case strings.TrimFunc(key, unicode.IsSpace) == "":
		return &KeyError{Reason: "empty or blank key", MessageUUID: transportID}
	case !utf8.ValidString(key):
		return &KeyError{Reason: "key is not valid UTF-8", MessageUUID: transportID}
	case strings.IndexFunc(key, unicode.IsControl) >= 0:
		return &KeyError{Reason: "key contains a control character (NUL, newline, ...)", MessageUUID: transportID}
	case len(key) > e.cfg.MaxKeyLength:
		return &KeyError{Reason: fmt.Sprintf("key is %d bytes, longer than MaxKeyLength %d", len(key), e.cfg.MaxKeyLength), MessageUUID: transportID}
	case transportID != "" && key == transportID:
		return fmt.Errorf("%w: key %q is the message's transport id; take the key from the business payload", ErrTransportKey, key)
	}
	return nil
}

// run does the work of an acquired claim and ends the claim exactly once.
func (e *Engine) run(ctx context.Context, call *Call, claim Claim, lease time.Duration, claimedAt time.Time,
	fn func(ctx context.Context) ([]byte, error)) (ClaimResult, error) {
	hc := &claimctx.Claim{Key: claim.Key, Token: claim.Token, Retention: e.cfg.Retention}
	workCtx, cancelWork := context.WithCancelCause(ctx)
	defer cancelWork(nil)
	keeper := e.keepLease(call, claim, lease, claimedAt, cancelWork)
	workCtx = claimctx.With(workCtx, hc, keeper.stop)
	acquired := ClaimResult{Outcome: Acquired, Claim: claim}

	panicked := true
	defer func() {
		if panicked {
			// The panic (or runtime.Goexit) goes on after this function
			// returns; the claim is released first so that a retry runs.
			e.release(ctx, call, keeper, claimedAt, errors.New("handler panicked"))
		}
	}()
	result, err := fn(workCtx)
	panicked = false

	switch {
	case err != nil:
		e.release(ctx, call, keeper, claimedAt, err)
		return acquired, err
	case hc.Completed():
		keeper.stop()
		e.decide(call, Decision{Event: EventCompleted, Op: "complete", Key: claim.Key, Elapsed: e.cfg.Clock.Now().Sub(claimedAt)})
	default:
		e.complete(ctx, call, keeper, claimedAt, result)
	}
	acquired.Result = result
	return acquired, nil
}

// release deletes the claim's record so that a retry can run the work again.
func (e *Engine) release(ctx context.Context, call *Call, keeper *leaseKeeper, claimedAt time.Time, cause error) {
	keeper.finish()
	claim := keeper.claim
	err := e.storeOp(context.WithoutCancel(ctx), "release", func(ctx context.Context) error { return e.cfg.Store.Release(ctx, claim) })
	keeper.stop()
	elapsed := e.cfg.Clock.Now().Sub(claimedAt)
	switch {
	case err == nil:
		e.decide(call, Decision{Event: EventReleased, Op: "release", Key: claim.Key, Elapsed: elapsed, Err: cause})
	case errors.Is(err, ErrClaimLost):
		e.decide(call, Decision{Event: EventClaimLost, Op: "release", Key: claim.Key, Elapsed: elapsed,
			Err: fmt.Errorf("releasing after a failure (%v): %w", cause, err)})
	default:
		// The record stays in progress until its lease ends; retries get
		// ErrInProgress until then.
		e.decide(call, Decision{Event: EventStoreError, Op: "release", Key: claim.Key, Elapsed: elapsed,
			Err: &StoreError{Op: "release", Key: claim.Key, Err: err}})
	}
}

// complete records the work as done, retrying store errors with backoff
// while the heartbeat keeps the lease alive.
func (e *Engine) complete(ctx context.Context, call *Call, keeper *leaseKeeper, claimedAt time.Time, result []byte) {
	keeper.finish()
	claim := keeper.claim
	var err error
	backoff := e.cfg.CompleteBackoff
	for attempt := 0; ; attempt++ {
		err = e.storeOp(context.WithoutCancel(ctx), "complete", func(ctx context.Context) error {
			return e.cfg.Store.Complete(ctx, claim, result, e.cfg.Retention)
		})
		if errors.Is(err, ErrResultTooLarge) && result != nil {
			// Record the effect without its result rather than leave the
			// key in progress (which would run the effect again after the
			// lease): the replay is lost, the effect is not repeated. Op is
			// empty: the claim is not over yet.
			e.decide(call, Decision{Event: EventStoreError, Key: claim.Key,
				Err: fmt.Errorf("storing the result for replay (%d bytes); completing without it: %w", len(result), err)})
			result = nil
			continue
		}
		if err == nil || errors.Is(err, ErrClaimLost) || errors.Is(err, ErrInvalidDuration) || attempt >= e.cfg.CompleteRetries {
			break
		}
		sleep(e.cfg.Clock, backoff)
		backoff *= 2
	}
	keeper.stop()
	elapsed := e.cfg.Clock.Now().Sub(claimedAt)
	switch {
	case err == nil || errors.Is(err, ErrAlreadyCompleted):
		// ErrAlreadyCompleted: an earlier attempt whose reply was lost
		// completed the record with this claim.
		e.decide(call, Decision{Event: EventCompleted, Op: "complete", Key: claim.Key, Elapsed: elapsed})
	case errors.Is(err, ErrClaimLost):
		e.decide(call, Decision{Event: EventClaimLost, Op: "complete", Key: claim.Key, Elapsed: elapsed,
			Err: fmt.Errorf("the work ran but the record was taken over before completing: %w", err)})
	default:
		// Reported as success anyway: the record stays in progress until its
		// lease ends, then a retry (if any) would run the work again.
		e.decide(call, Decision{Event: EventStoreError, Op: "complete", Key: claim.Key, Elapsed: elapsed,
			Err: &StoreError{Op: "complete", Key: claim.Key, Err: err}})
	}
}

// storeOp runs a Complete, Release or Extend within StoreTimeout (and ctx),
// and observes it. Callers pass a context that outlives the work's caller
// (context.WithoutCancel): the record must be finished even when the
// message's or request's context was cancelled.
func (e *Engine) storeOp(ctx context.Context, op string, f func(context.Context) error) error {
	octx, cancel := context.WithTimeout(ctx, e.cfg.StoreTimeout)
	defer cancel()
	start := time.Now()
	err := f(octx)
	e.observeOp(ctx, op, time.Since(start), err)
	return err
}

// heartbeat is the extension interval for a lease.
func (e *Engine) heartbeat(lease time.Duration) time.Duration {
	if lease < e.cfg.Lease {
		return lease / 3
	}
	return e.cfg.Heartbeat
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
