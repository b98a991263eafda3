package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/internal/keys"
)

// flight is one Engine.Do call (or one message of the middleware) from its
// claim to the end of its record. It holds in one allocation what the
// lifecycle needs: the call, the lease keeper, the claim the work's context
// carries and the contexts of the store operations, which would otherwise
// be a dozen small allocations per call.
//
// This file reads a call top to bottom: do takes the key and claims it
// (claim), an acquired claim runs the work under a kept lease (run,
// runHeld; the lease keeper is in lease.go), and the record is completed
// (complete) or released (release). The contexts and timers the lifecycle
// uses are in context.go; the Engine and its decisions in engine.go.
type flight struct {
	e    *Engine
	call Call

	// work is the work's context (see workCtx). It is made before the
	// claim, whose request context is derived from it (see opCtx): the
	// claim follows the caller's cancellation through it.
	work *workCtx // &workCtx0, or a fresh one (a batch's copy of a running call)
	// workCtx0 is the work context a flight usually needs.
	workCtx0 workCtx
	hc       HeldClaim // hc.key is the scoped key from the start
	keeper   leaseKeeper
	// wait is what an InProgressWait needs (see flightWait); nil without
	// Config.InProgressWait, so that a flight stays in a smaller size
	// class (704 bytes with the middleware's delivery, not 768).
	wait *flightWait

	// claimCtx and endCtx are the contexts of the claim and of the first
	// Complete or Release; later attempts get their own. They are never
	// reused: a store may still hold them after the operation (net/http
	// cancels a request's context from its read loop).
	claimCtx, endCtx opCtx
}

// flightWait is the state of a flight's InProgressWait.
type flightWait struct {
	// err is the store error that ended the wait (see awaitHolder): the
	// call ends as InProgress, with it.
	err error
	// claimSent is when the last claim was sent (time.Now): the wait
	// watches the key for changes since then.
	claimSent time.Time
}

// claimSentAt notes when the flight's claim was sent (the wall clock), for
// a wait that follows it (awaitHolder): the wait watches the key for
// changes since then.
func (f *flight) claimSentAt(sent time.Time) {
	if f.wait == nil {
		f.wait = new(flightWait)
	}
	f.wait.claimSent = sent
}

// worker is the work of a flight: Engine.Do's function, or the middleware's
// handler call (which implements it without a closure).
type worker interface {
	work(ctx context.Context) ([]byte, error)
}

// workFunc is the work of Engine.Do.
type workFunc func(ctx context.Context) ([]byte, error)

func (f workFunc) work(ctx context.Context) ([]byte, error) { return f(ctx) }

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
	key := keys.Scoped(call.Scope, call.Key)
	f.hc.key = key
	lease, err := e.callLease(call)
	if err != nil {
		return ClaimResult{}, err
	}

	// The work's context exists before the claim: the claim's request
	// context is derived from it (see opCtx).
	f.newWorkContext(ctx)
	defer func() { f.work.end(nil) }()
	start := e.stopwatch()
	res, err := f.claim(ctx, lease)
	elapsed := lap(start)
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
		f.hc.key = keys.Scoped(f.call.Scope, f.call.Key)
	}
}

// The cold paths of do are functions of their own. The compiler may
// inline them: forbidding it (//go:noinline, to keep do's frame small) did
// not pay in paired builds (scripts/paired.sh -m callgrind; see
// docs/dev/decisions.md).

// keyMissing decides a key that cannot be claimed; with Config.Shadow the
// work runs anyway.
func (f *flight) keyMissing(ctx context.Context, err error, w worker) (ClaimResult, error) {
	if f.e.cfg.Shadow {
		return f.runShadow(ctx, Decision{Event: keyEvent(err), Key: f.hc.key, Err: err}, w)
	}
	f.e.event(&f.call, keyEvent(err), "", f.hc.key, 0, err)
	return ClaimResult{}, err
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
	op := &f.claimCtx
	if op.parent != nil { // an earlier claim of the call (InProgressWait)
		op = &opCtx{}
	}
	sent := now // on the wall clock, the same reading
	if !e.wallClock {
		sent = time.Now()
	}
	op.start(f.work, f.work, e.cfg.StoreTimeout, sent)
	if e.cfg.InProgressWait > 0 {
		f.claimSentAt(sent)
	}
	res, err = e.cfg.Store.Claim(op, f.hc.key, f.call.Fingerprint, lease)
	op.end()
	if e.timed {
		e.observeOp(ctx, "claim", time.Since(sent), err)
	}
	return res, err
}

// claimEvent decides a claim's outcome.
func (f *flight) claimEvent(ev event.Event, res ClaimResult, elapsed, waited time.Duration) {
	if f.e.quiet && f.call.trace == nil {
		return
	}
	f.e.decide(&f.call, Decision{Event: ev, Op: "claim", Key: f.hc.key, Elapsed: elapsed, Waited: waited, Outcome: res.Outcome,
		Replayed: ev == event.SkipDuplicate && len(res.Result) > 0})
}

// claimFailed reports a claim that got no answer, and runs the work
// unclaimed with Config.FailOpen (or Shadow).
func (f *flight) claimFailed(ctx context.Context, w worker, elapsed, waited time.Duration, err error) (ClaimResult, error) {
	e, call, key := f.e, &f.call, f.hc.key
	err = &StoreError{Op: "claim", Key: key, Err: err}
	e.decide(call, Decision{Event: event.StoreError, Op: "claim", Key: key, Elapsed: elapsed, Waited: waited, Err: err})
	if !(e.cfg.FailOpen || e.cfg.Shadow) || ctx.Err() != nil {
		return ClaimResult{}, err
	}
	e.event(call, event.FailOpen, "claim", key, 0, err)
	// Marked as a run without a claim, as shadow runs are: it hides the
	// claim of an enclosing call (OutcomeFromContext says 0, false), and
	// stores/postgres RunInTx commits its writes without completing.
	ctx = withUnclaimedRun(ctx, 0)
	result, err := w.work(ctx)
	return ClaimResult{Result: result}, err
}

// refused reports a claim that found the key in progress or completed
// with another fingerprint (or, with Config.Shadow, completed), and with
// Config.Shadow runs the work without a claim.
func (f *flight) refused(ctx context.Context, res ClaimResult, elapsed, waited time.Duration, w worker) (ClaimResult, error) {
	e, call, key := f.e, &f.call, f.hc.key
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

// run does the work of an acquired claim and ends the claim exactly once.
func (f *flight) run(ctx context.Context, claim Claim, w worker) (ClaimResult, error) {
	f.hold(claim)
	return f.runHeld(ctx, w, nil)
}

// hold starts keeping an acquired claim: the work's context carries it,
// and the lease keeper extends it (see leaseKeeper).
func (f *flight) hold(claim Claim) {
	f.hc.key, f.hc.token = claim.Key, claim.Token
	f.hc.keeper = f.keepLease()
}

// runHeld does the work of a held claim and ends the claim exactly once:
// at once, or, in a batch (b not nil), by handing its completion or
// release to the batch's sender.
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
		if b != nil {
			b.settle()
		}
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

// completedInWork ends a claim whose work completed the record itself.
func (f *flight) completedInWork(claim Claim) {
	f.keeper.stop()
	if !f.e.tells(&f.call) {
		return
	}
	f.e.event(&f.call, event.Completed, "complete", claim.Key, f.e.cfg.Clock.Now().Sub(f.keeper.claimedAt), nil)
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
		f.e.event(&f.call, event.StoreError, "", f.hc.key, 0, fmt.Errorf("storing the result for replay (%d bytes); completing without it: %w", len(*result), err))
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
	if !e.tells(call) {
		return // the clock is not read for nobody
	}
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
	if !e.tells(call) {
		return
	}
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

// finishOp runs a Complete or Release within StoreTimeout, detached from ctx:
// the record must be finished even when the message's or request's context
// was cancelled. The first attempt uses the flight's own context; retries
// get one each. The context carries the claim (HeldClaimFromContext) and the call's
// Origin, as the claim's did: a store finds there what it noted at the
// claim (HeldClaim.SetNote).
func (f *flight) finishOp(ctx context.Context, op string, do func(context.Context) error) error {
	oc := &f.endCtx
	if oc.parent != nil {
		oc = &opCtx{}
	}
	start := time.Now()
	if f.work != nil { // the work's context has ctx as its parent
		oc.start((*endParent)(f), nil, f.e.cfg.StoreTimeout, start)
	} else {
		oc.start(context.WithoutCancel(ctx), nil, f.e.cfg.StoreTimeout, start)
	}
	err := do(oc)
	oc.end()
	if f.e.timed {
		f.e.observeOp(ctx, op, time.Since(start), err)
	}
	return err
}

// runShadow is Engine.runShadow for the flight (Config.Shadow).
func (f *flight) runShadow(ctx context.Context, dec Decision, w worker) (ClaimResult, error) {
	return f.e.runShadow(ctx, &f.call, dec, w.work)
}
