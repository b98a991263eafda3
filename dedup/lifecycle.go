package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/internal/keys"
)

// callRun is one Engine.Do call (or one message of the middleware) from its
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
type callRun struct {
	e    *Engine
	call Call

	// callContexts are the work's context and the store operations'
	// (context.go): the plumbing, kept out of the protocol's way.
	callContexts
	held   HeldClaim // held.key is the scoped key from the start
	keeper leaseKeeper
	// wait is what an InProgressWait needs (see inProgressWait); nil without
	// Config.InProgressWait, so that a callRun stays in a smaller size
	// class (704 bytes with the middleware's delivery, not 768).
	wait *inProgressWait
}

// inProgressWait is the state of a call's InProgressWait.
type inProgressWait struct {
	// err is the store error that ended the wait (see awaitHolder): the
	// call ends as InProgress, with it.
	err error
	// claimSent is when the last claim was sent (time.Now): the wait
	// watches the key for changes since then.
	claimSent time.Time
}

// claimSentAt notes when the call's claim was sent (the wall clock), for
// a wait that follows it (awaitHolder): the wait watches the key for
// changes since then.
func (c *callRun) claimSentAt(sent time.Time) {
	if c.wait == nil {
		c.wait = new(inProgressWait)
	}
	c.wait.claimSent = sent
}

// worker is the work of a call: Engine.Do's function, or the middleware's
// handler call (which implements it without a closure).
type worker interface {
	work(ctx context.Context) ([]byte, error)
}

// workFunc is the work of Engine.Do.
type workFunc func(ctx context.Context) ([]byte, error)

func (f workFunc) work(ctx context.Context) ([]byte, error) { return f(ctx) }

// do is Do for the run's call (after Do's Tracer, if any, started it).
func (c *callRun) do(ctx context.Context, w worker) (ClaimResult, error) {
	e, call := c.e, &c.call
	if call.Scope == "" {
		return ClaimResult{}, ErrNoScope
	}
	if call.KeyErr != nil {
		c.nameUnkeyed()
		return c.keyMissing(ctx, call.KeyErr, w)
	}
	if err := e.checkKey(call.Key, call.MessageUUID); err != nil {
		return c.keyMissing(ctx, err, w)
	}
	key := keys.Scoped(call.Scope, call.Key)
	c.held.key = key
	lease, err := e.callLease(call)
	if err != nil {
		return ClaimResult{}, err
	}

	// The work's context exists before the claim: the claim's request
	// context is derived from it (see opContext).
	c.newWorkContext(ctx)
	defer func() { c.work.end(nil) }()
	start := e.stopwatch()
	res, err := c.claim(ctx, lease)
	elapsed := lap(start)
	var waited time.Duration
	if err == nil && res.Outcome == InProgress && e.cfg.InProgressWait > 0 && !e.cfg.Shadow {
		res, elapsed, waited, err = c.awaitHolder(ctx, elapsed)
	}
	if err == nil && (res.Outcome < Acquired || res.Outcome > Conflict) {
		err = fmt.Errorf("unknown outcome %v", res.Outcome)
	}
	if err != nil {
		if errors.Is(err, errCallDeadline) {
			return ClaimResult{}, err // not sent: no store failure, nothing to fail open
		}
		return c.claimFailed(ctx, w, elapsed, waited, err)
	}
	switch res.Outcome {
	case Acquired:
		c.reportClaim(event.ClaimWon, res, elapsed, waited)
		return c.run(ctx, res.Claim, w)
	case Duplicate:
		if e.cfg.Shadow {
			return c.refused(ctx, res, elapsed, waited, w)
		}
		c.reportClaim(event.SkipDuplicate, res, elapsed, waited)
		return res, nil
	default:
		return c.refused(ctx, res, elapsed, waited, w)
	}
}

// nameUnkeyed names the record of a call whose key the caller could not
// take (Call.KeyErr) by call.Key, if set, in its decision.
func (c *callRun) nameUnkeyed() {
	if c.call.Key != "" {
		c.held.key = keys.Scoped(c.call.Scope, c.call.Key)
	}
}

// The cold paths of do are functions of their own. The compiler may
// inline them: forbidding it (//go:noinline, to keep do's frame small) did
// not pay in paired builds (scripts/paired.sh -m callgrind; see
// docs/dev/decisions.md).

// keyMissing decides a key that cannot be claimed; with Config.Shadow the
// work runs anyway.
func (c *callRun) keyMissing(ctx context.Context, err error, w worker) (ClaimResult, error) {
	if c.e.cfg.Shadow {
		return c.runShadow(ctx, Decision{Event: keyEvent(err), Key: c.held.key, Err: err}, w)
	}
	c.e.tell(&c.call, keyEvent(err), "", c.held.key, 0, err)
	return ClaimResult{}, err
}

// claim runs Store.Claim once admitted (see Engine.claims), within
// StoreTimeout; a context that ends while waiting for admission fails it.
//
// The keeper's claimedAt is the clock's reading once admitted, just before
// the request is sent: the lease certainly runs until claimedAt+lease (a
// wait for admission does not count against it), cut to end at the call's
// Deadline, if any, as it stands after that wait.
func (c *callRun) claim(ctx context.Context, lease time.Duration) (res ClaimResult, err error) {
	e := c.e
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
	if d := c.call.Deadline; !d.IsZero() && d.Sub(now) < lease {
		// The wait for admission took some of the time left.
		if lease = d.Sub(now); lease <= 0 {
			return ClaimResult{}, fmt.Errorf("%w while waiting for admission: %w", errCallDeadline, context.DeadlineExceeded)
		}
	}
	c.keeper.lease, c.keeper.claimedAt = lease, now
	op := c.nextClaimOp()
	sent := now // on the wall clock, the same reading
	if !e.wallClock {
		sent = time.Now()
	}
	op.start(c.work, c.work, e.cfg.StoreTimeout, sent)
	if e.cfg.InProgressWait > 0 {
		c.claimSentAt(sent)
	}
	res, err = e.cfg.Store.Claim(op, c.held.key, c.call.Fingerprint, lease)
	op.end()
	if e.timed {
		e.observeOp(ctx, "claim", time.Since(sent), err)
	}
	return res, err
}

// reportClaim decides a claim's outcome.
func (c *callRun) reportClaim(ev event.Event, res ClaimResult, elapsed, waited time.Duration) {
	if c.e.quiet && c.call.trace == nil {
		return
	}
	c.e.report(&c.call, Decision{Event: ev, Op: "claim", Key: c.held.key, Elapsed: elapsed, Waited: waited, Outcome: res.Outcome,
		Replayed: ev == event.SkipDuplicate && len(res.Result) > 0})
}

// claimFailed reports a claim that got no answer, and runs the work
// unclaimed with Config.FailOpen (or Shadow).
func (c *callRun) claimFailed(ctx context.Context, w worker, elapsed, waited time.Duration, err error) (ClaimResult, error) {
	e, call, key := c.e, &c.call, c.held.key
	err = &StoreError{Op: "claim", Key: key, Err: err}
	e.report(call, Decision{Event: event.StoreError, Op: "claim", Key: key, Elapsed: elapsed, Waited: waited, Err: err})
	if !(e.cfg.FailOpen || e.cfg.Shadow) || ctx.Err() != nil {
		return ClaimResult{}, err
	}
	e.tell(call, event.FailOpen, "claim", key, 0, err)
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
func (c *callRun) refused(ctx context.Context, res ClaimResult, elapsed, waited time.Duration, w worker) (ClaimResult, error) {
	e, call, key := c.e, &c.call, c.held.key
	dec := Decision{Op: "claim", Key: key, Elapsed: elapsed, Waited: waited, Outcome: res.Outcome}
	switch res.Outcome {
	case Duplicate:
		dec.Event = event.SkipDuplicate
	case InProgress:
		dec.Event, dec.Err = event.InProgress, fmt.Errorf("%w: %q", ErrInProgress, key)
		if c.wait != nil && c.wait.err != nil {
			dec.Err = fmt.Errorf("%w: %q; the wait for it ended on a store error: %w", ErrInProgress, key, c.wait.err)
		}
	default: // Conflict
		dec.Event, dec.Err = event.KeyReuse, fmt.Errorf("%w: %q", ErrKeyReuse, key)
	}
	if e.cfg.Shadow {
		return c.runShadow(ctx, dec, w)
	}
	e.report(call, dec)
	return res, dec.Err
}

// run does the work of an acquired claim and ends the claim exactly once.
func (c *callRun) run(ctx context.Context, claim Claim, w worker) (ClaimResult, error) {
	c.hold(claim)
	return c.runHeld(ctx, w, nil)
}

// hold starts keeping an acquired claim: the work's context carries it,
// and the lease keeper extends it (see leaseKeeper).
func (c *callRun) hold(claim Claim) {
	c.held.key, c.held.token, c.held.fence = claim.Key, claim.Token, claim.Fence
	c.held.keeper = c.keepLease()
}

// runHeld does the work of a held claim and ends the claim exactly once:
// at once, or, in a batch (b not nil), by handing its completion or
// release to the batch's sender.
func (c *callRun) runHeld(ctx context.Context, w worker, b *batchSlot) (ClaimResult, error) {
	claim := c.keeper.claim()
	acquired := ClaimResult{Outcome: Acquired, Claim: claim}
	if sb := c.call.StartBy; !sb.IsZero() && !c.e.cfg.Clock.Now().Before(sb) {
		// Won too late (after an InProgressWait, a slow claim, or, in a
		// batch, the turns of earlier calls): the work would not have the
		// time it needs.
		err := fmt.Errorf("%w: the call's StartBy (%s) has passed; the key %q is released unworked", ErrNotStarted, sb.Format(time.RFC3339Nano), claim.Key)
		if b != nil {
			b.release(err)
		} else {
			c.release(ctx, err)
		}
		return acquired, err
	}

	panicked := true
	defer func() {
		switch {
		case !panicked:
		case c.held.Completed():
			// The work completed the record itself (stores/postgres
			// RunInTx) before it panicked: nothing to release.
			c.completedInWork(claim)
		default:
			// The panic (or runtime.Goexit) goes on after this function
			// returns; the claim is released first so that a retry runs.
			c.release(ctx, errors.New("handler panicked"))
		}
	}()
	result, err := w.work(c.work)
	panicked = false

	switch {
	case c.held.Completed():
		// The work completed the record itself, in its own transaction
		// (stores/postgres RunInTx): an error after that (from a
		// middleware outside the transaction) cannot undo it, and a
		// release could only fail.
		if b != nil {
			b.settle()
		}
		c.completedInWork(claim)
		if err != nil {
			return acquired, err
		}
	case err != nil:
		if b != nil {
			b.release(err)
		} else {
			c.release(ctx, err)
		}
		return acquired, err
	case b != nil:
		b.complete(result)
	default:
		c.complete(ctx, result)
	}
	acquired.Result = result
	return acquired, nil
}

// newWorkContext makes the work's context: cancellable with a cause,
// carrying the call's claim.
func (c *callRun) newWorkContext(ctx context.Context) {
	c.nextWork().init(ctx, c)
}

// completedInWork ends a claim whose work completed the record itself.
func (c *callRun) completedInWork(claim Claim) {
	c.keeper.stop()
	if !c.e.listened(&c.call) {
		return
	}
	c.e.tell(&c.call, event.Completed, "complete", claim.Key, c.e.cfg.Clock.Now().Sub(c.keeper.claimedAt), nil)
}

// complete records the work as done, retrying store errors with backoff
// while the heartbeat keeps the lease alive.
func (c *callRun) complete(ctx context.Context, result []byte) {
	e, keeper := c.e, &c.keeper
	keeper.finish()
	defer keeper.stop() // also when the store or the Observer panics
	claim := keeper.claim()
	var err error
	backoff := e.cfg.CompleteBackoff
	for attempt := 0; ; attempt++ {
		err = c.finishOp(ctx, "complete", func(ctx context.Context) error {
			return e.cfg.Store.Complete(ctx, claim, result, e.cfg.Retention)
		})
		again, pause := c.completeAgain(err, &result, attempt)
		if !again {
			break
		}
		if pause {
			sleep(e.cfg.Clock, backoff)
			backoff *= 2
		}
	}
	c.completed(err)
}

// completeAgain decides on a Complete's answer err, the attempt-th (from
// 0): whether to send it again, and whether to pause first (a store
// error; not a result too large, sent again at once without it).
func (c *callRun) completeAgain(err error, result *[]byte, attempt int) (again, pause bool) {
	if errors.Is(err, ErrResultTooLarge) && *result != nil {
		// Record the effect without its result rather than leave the
		// key in progress (which would run the effect again after the
		// lease): the replay is lost, the effect is not repeated. Op is
		// empty: the claim is not over yet.
		c.e.tell(&c.call, event.StoreError, "", c.held.key, 0, fmt.Errorf("storing the result for replay (%d bytes); completing without it: %w", len(*result), err))
		*result = nil
		return true, false
	}
	if err == nil || errors.Is(err, ErrClaimLost) || errors.Is(err, ErrInvalidDuration) || attempt >= c.e.cfg.CompleteRetries {
		return false, false
	}
	return true, true
}

// completed stops the keeper and decides a completion's last answer err.
func (c *callRun) completed(err error) {
	e, call, keeper := c.e, &c.call, &c.keeper
	keeper.stop()
	if !e.listened(call) && (err == nil || !e.errorsLogged) {
		return // the clock is not read for nobody
	}
	claim := keeper.claim()
	elapsed := e.cfg.Clock.Now().Sub(keeper.claimedAt)
	switch {
	case err == nil || errors.Is(err, ErrAlreadyCompleted):
		// ErrAlreadyCompleted: an earlier attempt whose reply was lost
		// completed the record with this claim.
		e.tell(call, event.Completed, "complete", claim.Key, elapsed, nil)
	case errors.Is(err, ErrClaimLost):
		e.tell(call, event.ClaimLost, "complete", claim.Key, elapsed, fmt.Errorf("the work ran but the record was taken over before completing: %w", err))
	default:
		// Reported as success anyway: the record stays in progress until its
		// lease ends, then a retry (if any) would run the work again.
		e.tell(call, event.StoreError, "complete", claim.Key, elapsed, &StoreError{Op: "complete", Key: claim.Key, Err: err})
	}
}

// release releases the claim's record so that a retry can run the work again.
func (c *callRun) release(ctx context.Context, cause error) {
	e, keeper := c.e, &c.keeper
	keeper.finish()
	defer keeper.stop() // also when the store or the Observer panics
	claim := keeper.claim()
	err := c.finishOp(ctx, "release", func(ctx context.Context) error { return e.cfg.Store.Release(ctx, claim) })
	c.released(err, cause)
}

// released stops the keeper and decides a release's answer err.
func (c *callRun) released(err, cause error) {
	e, call, keeper := c.e, &c.call, &c.keeper
	keeper.stop()
	if !e.listened(call) && (err == nil || !e.errorsLogged) {
		return
	}
	claim := keeper.claim()
	elapsed := e.cfg.Clock.Now().Sub(keeper.claimedAt)
	switch {
	case err == nil:
		e.tell(call, event.Released, "release", claim.Key, elapsed, cause)
	case errors.Is(err, ErrClaimLost):
		e.tell(call, event.ClaimLost, "release", claim.Key, elapsed, fmt.Errorf("releasing after a failure (%v): %w", cause, err))
	default:
		// The record stays in progress until its lease ends; retries get
		// ErrInProgress until then.
		e.tell(call, event.StoreError, "release", claim.Key, elapsed, &StoreError{Op: "release", Key: claim.Key, Err: err})
	}
}

// finishOp runs a Complete or Release within StoreTimeout, detached from ctx:
// the record must be finished even when the message's or request's context
// was cancelled. The first attempt uses the run's own context; retries
// get one each. The context carries the claim (HeldClaimFromContext) and the call's
// Origin, as the claim's did: a store finds there what it noted at the
// claim (HeldClaim.SetNote).
func (c *callRun) finishOp(ctx context.Context, op string, do func(context.Context) error) error {
	oc := c.nextEndOp()
	start := time.Now()
	if c.work != nil { // the work's context has ctx as its parent
		oc.start((*detachedWork)(c), nil, c.e.cfg.StoreTimeout, start)
	} else {
		oc.start(context.WithoutCancel(ctx), nil, c.e.cfg.StoreTimeout, start)
	}
	err := do(oc)
	oc.end()
	if c.e.timed {
		c.e.observeOp(ctx, op, time.Since(start), err)
	}
	return err
}

// runShadow is Engine.runShadow for the call (Config.Shadow).
func (c *callRun) runShadow(ctx context.Context, dec Decision, w worker) (ClaimResult, error) {
	return c.e.runShadow(ctx, &c.call, dec, w.work)
}
