package dedup

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// awaitHolder claims the call's key again while another claim holds it
// (Config.InProgressWait): after InProgressPoll, then after pauses doubling
// up to maxInProgressPoll, until a claim finds something else than
// InProgress (the holder completed or released the key, or its lease
// ended), the wait's bound or the call's Deadline or StartBy is reached, ctx
// ends, or a claim fails (the wait then ends as InProgress, the error in
// f.wait.err; the claim before it made f.wait: see claimSentAt).
// The bound is checked by one last claim at the bound itself. It returns
// the last claim's answer (its lease and time are the keeper's, as claim
// sets them), its round trip (elapsed, the first claim's, when it made no
// claim), and how long the wait took on the clock.
// Cost: one claim round trip per pause; no store support beyond Claim is
// needed.
//
// With a store that wakes waiters (KeyWatcher), the key is watched
// before the next claim: a claim follows each wake (the first when the
// watch is in place, which covers a change between the first claim and the
// watch) and, as the safety net, every InProgressFallback without one; when
// the watch ends, the pauses start again from InProgressPoll.
func (c *callRun) awaitHolder(ctx context.Context, elapsed time.Duration) (res ClaimResult, _, waited time.Duration, err error) {
	e, call := c.e, &c.call
	clock := e.cfg.Clock
	start := clock.Now()
	pause := e.cfg.InProgressPoll
	wake, unwatch := c.watchHolder(ctx)
	defer func() { unwatch() }()
	if wake != nil {
		pause = e.cfg.InProgressFallback
	}
	res = ClaimResult{Outcome: InProgress}
	for {
		now := clock.Now()
		left := call.waitLeft(now, e.cfg.InProgressWait-now.Sub(start))
		if left <= 0 {
			return res, elapsed, clock.Now().Sub(start), nil
		}
		switch pauseOrWake(ctx, clock, min(pause, left), wake) {
		case pauseCancelled:
			return res, elapsed, clock.Now().Sub(start), nil
		case pauseUnwatched:
			unwatch()
			wake, unwatch, pause = nil, func() {}, 0 // InProgressPoll after this claim
		}
		lease, lerr := e.callLease(call)
		if lerr != nil {
			// The call's deadline is past: stop waiting, still in progress.
			return res, elapsed, clock.Now().Sub(start), nil
		}
		sent := time.Now()
		res, err = c.claim(ctx, lease)
		elapsed = time.Since(sent)
		if errors.Is(err, errCallDeadline) {
			// It passed while waiting for admission: still in progress.
			return ClaimResult{Outcome: InProgress}, elapsed, clock.Now().Sub(start), nil
		}
		if err != nil {
			// Another consumer is known to hold the key: the wait ends as
			// in progress, never as a failed claim (which FailOpen would run
			// the work on). The store's error goes with ErrInProgress.
			c.wait.err = err
			return ClaimResult{Outcome: InProgress}, elapsed, clock.Now().Sub(start), nil
		}
		if res.Outcome != InProgress {
			return res, elapsed, clock.Now().Sub(start), nil
		}
		switch {
		case wake != nil: // the fallback's pause stays
		case pause == 0:
			pause = e.cfg.InProgressPoll
		default:
			pause = min(2*pause, max(maxInProgressPoll, e.cfg.InProgressPoll))
		}
	}
}

// waitLeft bounds left, the time an InProgressWait has left at now, by
// the call's Deadline and StartBy (a wait that ends after StartBy could
// only win a claim to release unworked). Shared by Do's wait (awaitHolder)
// and a batch copy's (awaitFirst).
func (c *Call) waitLeft(now time.Time, left time.Duration) time.Duration {
	if !c.Deadline.IsZero() {
		left = min(left, c.Deadline.Sub(now))
	}
	if !c.StartBy.IsZero() {
		left = min(left, c.StartBy.Sub(now))
	}
	return left
}

// InProgressAtInfo wraps the logger of a Watermill router (message.NewRouter)
// so that a handler error matching ErrInProgress, which the router logs as
// "Handler returned error" at error level before nacking the message, is
// logged at info level instead, with its error in the field "err". Nothing
// else changes: the message is still nacked and redelivered, and every
// other error is still an error. A copy that finds its key held by another
// consumer is the normal course of at-least-once delivery, not a fault;
// Config.InProgressWait makes such nacks rare, this keeps the rest out of
// error alerts. Cost: an errors.Is per error logged.
func InProgressAtInfo(logger watermill.LoggerAdapter) watermill.LoggerAdapter {
	return inProgressAtInfo{logger}
}

type inProgressAtInfo struct{ watermill.LoggerAdapter }

func (l inProgressAtInfo) Error(msg string, err error, fields watermill.LogFields) {
	if errors.Is(err, ErrInProgress) {
		l.LoggerAdapter.Info(msg, fields.Add(watermill.LogFields{"err": err.Error()}))
		return
	}
	l.LoggerAdapter.Error(msg, err, fields)
}

func (l inProgressAtInfo) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return inProgressAtInfo{l.LoggerAdapter.With(fields)}
}
