package dedup

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/watermill-dedup/dedup/event"
)

// leaseKeeper holds one acquired claim while its work runs and until its
// Complete is acknowledged: it extends the lease every heartbeat interval,
// and cancels the work's context at the lease deadline when no extension
// has succeeded by then: at the deadline itself, not at the next tick, so
// that the work of a consumer cut off from the store stops before another
// consumer can take the key over.
//
// It is one clock timer at a time (the next extension or the deadline,
// whichever comes first; the deadline while an extension is in flight), not
// a goroutine: work shorter than the interval costs one timer, and a
// goroutine exists only while an extension runs. An extension's request is
// bounded by the deadline too.
//
// On the wall clock the timer is a pooled timerSlot: it pays in bytes
// (allocations per message of the router path, dedup-bench
// -alloc-messages), not in instructions (scripts/paired.sh -m callgrind).
//
// Its timers run on goroutines of their own, where no Watermill Recoverer
// catches a panic: a panicking Store.Extend is an extension that failed (see
// extensionPanic), and a panicking Observer, CallTrace or Logger told of
// the lease is recovered and logged (see recoverObserver), so that neither
// crashes the process nor leaves the lease half-kept.
type leaseKeeper struct {
	run       *callRun // the call, the claim (run.held), the work's cancel func
	lease     time.Duration
	claimedAt time.Time

	mu         sync.Mutex
	stopped    bool
	expired    bool           // the deadline passed without an extension, or an extension found the claim lost: the work was cancelled
	lostSaid   bool           // the keeper decided claim_lost
	finishing  bool           // Complete is running: a claim_lost from Extend may be its own doing
	slot       *timerSlot     // the pending timer (wall clock: a pooled timer)
	stopTimer  func() bool    // the pending timer (any other Clock)
	stopExpiry func() bool    // the deadline's own timer while an extension is in flight
	stopEnd    func() bool    // the lease's end, after the deadline passed (see expire)
	cancelExt  func()         // cancels the extension in flight, if any
	leaseEnd   time.Time      // the lease certainly holds until then
	lastBeat   time.Time      // when the last extension was sent (or the claim)
	extensions sync.WaitGroup // an extension or an expire in flight
}

// deadlineMargin is how long before the lease's end the work's context is
// cancelled: a tenth of the lease, at most one second. It covers the
// difference between this process's clock and the store's, and the time a
// cancelled handler takes to notice.
func deadlineMargin(lease time.Duration) time.Duration {
	return min(lease/10, time.Second)
}

// keepLease starts keeping the call's claim, of the keeper's lease,
// acquired at its claimedAt (read before the Claim request was sent; both
// set by claim).
func (c *callRun) keepLease() *leaseKeeper {
	k := &c.keeper
	k.run = c
	k.leaseEnd, k.lastBeat = k.claimedAt.Add(k.lease), k.claimedAt
	k.mu.Lock()
	k.arm()
	k.mu.Unlock()
	return k
}

// keepLeaseFrom starts keeping a claim that another callRun of the same
// batch kept until now (see batchSlot.takeOver), of the keeper's lease and
// claimedAt, as that keeper left it: its lease ends at leaseEnd, its last
// extension was sent at lastBeat, and expired when its deadline passed (the
// work's context is then cancelled at once, and nothing more is kept).
func (c *callRun) keepLeaseFrom(leaseEnd, lastBeat time.Time, expired bool) {
	k := &c.keeper
	k.run = c
	k.leaseEnd, k.lastBeat = leaseEnd, lastBeat
	c.held.keeper = k
	k.mu.Lock()
	if expired {
		k.expired = true
		k.mu.Unlock()
		c.work.end(fmt.Errorf("%w: the lease of %q ends at %s and no extension succeeded", ErrClaimLost, c.held.key, leaseEnd.Format(time.RFC3339Nano)))
		return
	}
	k.arm()
	k.mu.Unlock()
}

// claim is the claim kept.
func (k *leaseKeeper) claim() Claim {
	return Claim{Key: k.run.held.key, Token: k.run.held.token, Fence: k.run.held.fence}
}

// deadline is when the work's context is cancelled unless an extension
// succeeds first. Called with k.mu held.
func (k *leaseKeeper) deadline() time.Time { return k.leaseEnd.Add(-deadlineMargin(k.lease)) }

// arm sets the timer for the next extension or the deadline, whichever is
// first. Called with k.mu held.
func (k *leaseKeeper) arm() {
	at := k.deadline()
	if !k.run.e.cfg.DisableHeartbeat && k.extensible() {
		if beat := k.lastBeat.Add(k.run.e.heartbeat(k.lease)); beat.Before(at) {
			at = beat
		}
	}
	d := at.Sub(k.run.e.cfg.Clock.Now())
	switch {
	case k.slot != nil: // re-armed from its own firing
		k.slot.reset(d)
	case k.run.e.wallClock:
		k.slot = newTimerSlot(k, d)
	default:
		k.stopTimer = k.run.e.cfg.Clock.AfterFunc(d, k.fire)
	}
}

// extensible reports whether an extension could still move the lease's
// end: not once it ends at the call's Deadline (a lease cut to it at the
// claim, or by an extension), which no extension may pass; the deadline's
// timer alone is left. Called with k.mu held.
func (k *leaseKeeper) extensible() bool {
	d := k.run.call.Deadline
	return d.IsZero() || k.leaseEnd.Before(d)
}

// timerFired is the pending timer (wall clock).
func (k *leaseKeeper) timerFired() { k.fire() }

// finish marks the start of Complete: extensions go on until stop (the
// lease must not end while the completion waits), but an extension that
// finds the claim gone may have been overtaken by the completion itself
// and is not reported. Without a heartbeat nothing is left to do: the
// keeper stops.
func (k *leaseKeeper) finish() {
	if k.run.e.cfg.DisableHeartbeat {
		k.stop()
		return
	}
	k.mu.Lock()
	k.finishing = true
	k.mu.Unlock()
}

// StopHeartbeat is stop, for HeldClaim.StopHeartbeat.
func (k *leaseKeeper) StopHeartbeat() { k.stop() }

// Retention is the engine's Config.Retention, for HeldClaim.Retention.
func (k *leaseKeeper) Retention() time.Duration { return k.run.e.cfg.Retention }

// stop ends the keeper and waits until no extension is in flight and no
// expire is deciding: once it returned, the keeper decides nothing more.
// Safe to call more than once.
func (k *leaseKeeper) stop() {
	k.mu.Lock()
	k.stopped = true
	k.stopTimers()
	if k.cancelExt != nil {
		k.cancelExt() // its outcome no longer matters
	}
	k.mu.Unlock()
	k.extensions.Wait()
}

// stopTimers stops every pending timer. Called with k.mu held.
func (k *leaseKeeper) stopTimers() {
	if k.slot != nil {
		k.slot.stop() // back in the pool, unless it is firing now
		k.slot = nil
	}
	if k.stopTimer != nil {
		k.stopTimer()
		k.stopTimer = nil
	}
	if k.stopExpiry != nil {
		k.stopExpiry()
		k.stopExpiry = nil
	}
	if k.stopEnd != nil {
		k.stopEnd()
		k.stopEnd = nil
	}
}

// fire runs when the timer is due: it cancels the work at the deadline, or
// extends the lease and arms the timer again.
func (k *leaseKeeper) fire() {
	k.mu.Lock()
	if k.stopped || k.expired {
		k.mu.Unlock()
		return
	}
	if !k.run.e.cfg.Clock.Now().Before(k.deadline()) {
		k.mu.Unlock()
		k.expire()
		return
	}
	k.extensions.Add(1) // under the lock: stop cannot be waiting yet
	// While the extension is in flight, the deadline has a timer of its
	// own: a store that ignores the request's context (go-redis without
	// ContextTimeoutEnabled waits for its ReadTimeout) must not delay the
	// cancellation.
	k.stopExpiry = k.run.e.cfg.Clock.AfterFunc(k.deadline().Sub(k.run.e.cfg.Clock.Now()), k.expire)
	k.mu.Unlock()
	defer k.extensions.Done()

	held := k.extend()
	k.mu.Lock()
	if k.stopExpiry != nil {
		k.stopExpiry()
		k.stopExpiry = nil
	}
	k.mu.Unlock()
	if !held {
		return
	}
	k.mu.Lock()
	expired := !k.stopped && !k.expired && !k.run.e.cfg.Clock.Now().Before(k.deadline())
	if !k.stopped && !k.expired && !expired {
		k.arm()
	}
	k.mu.Unlock()
	if expired {
		k.expire()
	}
}

// expire cancels the work at the deadline, unless the work is over (its
// completion then decides). It runs on a timer's goroutine (or fire's).
//
// The deadline comes a margin before the lease's end: the claim is not
// lost yet, and a work that stops at once may still complete its record.
// claim_lost is decided at the lease's end (see leaseEnded), if the work
// has not reached its Complete or Release by then; otherwise that
// operation's answer is the call's one outcome (completed, or claim_lost
// when the store says so), never both.
func (k *leaseKeeper) expire() {
	k.mu.Lock()
	if k.finishing || k.expired || k.stopped {
		k.mu.Unlock()
		return
	}
	k.expired = true
	end := k.leaseEnd
	if k.cancelExt != nil {
		k.cancelExt() // a hung extension must not hold up the release
	}
	clock := k.run.e.cfg.Clock
	k.stopEnd = clock.AfterFunc(end.Sub(clock.Now()), func() { k.leaseEnded(end) })
	k.mu.Unlock()
	k.run.work.end(fmt.Errorf("%w: the lease of %q ends at %s and no extension succeeded", ErrClaimLost, k.run.held.key, end.Format(time.RFC3339Nano)))
}

// leaseEnded decides claim_lost at the end of a lease whose deadline
// passed without an extension, unless the work's Complete or Release has
// started (it decides) or the keeper stopped. It runs within the
// extensions WaitGroup: stop waits for its decision, so that none reaches
// the Observer or the CallTrace after Do returned.
func (k *leaseKeeper) leaseEnded(end time.Time) {
	k.mu.Lock()
	if k.finishing || k.stopped || k.lostSaid {
		k.mu.Unlock()
		return
	}
	k.lostSaid = true
	k.extensions.Add(1) // under the lock, not stopped: stop cannot be waiting yet
	k.mu.Unlock()
	defer k.extensions.Done()
	err := fmt.Errorf("%w: the lease of %q ended at %s and no extension succeeded", ErrClaimLost, k.run.held.key, end.Format(time.RFC3339Nano))
	k.event(event.ClaimLost, k.run.e.cfg.Clock.Now().Sub(k.claimedAt), err)
}

// extend extends the lease once, within StoreTimeout and before the
// deadline; it reports whether the claim may still be held.
func (k *leaseKeeper) extend() bool {
	e, claim := k.run.e, k.claim()
	sent := e.cfg.Clock.Now()
	k.mu.Lock()
	k.lastBeat = sent
	left := k.deadline().Sub(sent)
	k.mu.Unlock()
	lease := k.lease
	if d := k.run.call.Deadline; !d.IsZero() && d.Sub(sent) < lease {
		// The lease must not reach past the call's deadline.
		if lease = d.Sub(sent); lease <= 0 {
			return true // nothing to extend; the deadline timer decides
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), left)
	k.mu.Lock()
	k.cancelExt = cancel
	k.mu.Unlock()
	octx, ocancel := context.WithTimeout(ctx, e.cfg.StoreTimeout)
	start := time.Now()
	err := k.storeExtend(octx, claim, lease)
	elapsed := time.Since(start)
	ocancel()
	cancelled := errors.Is(ctx.Err(), context.Canceled) // by stop or expire (cancelExt)
	cancel()
	k.mu.Lock()
	k.cancelExt = nil
	finishing, over := k.finishing, k.stopped || k.expired
	if err == nil && sent.Add(lease).After(k.leaseEnd) {
		k.leaseEnd = sent.Add(lease)
	}
	k.mu.Unlock()
	if err != nil && cancelled && over {
		// stop (the work is over) or expire (which reports) cancelled
		// it: its outcome no longer matters, and it is no store failure.
		return false
	}
	k.observeExtend(ctx, elapsed, err)
	switch {
	case err == nil:
		return true
	case errors.Is(err, ErrClaimLost):
		if finishing {
			return false // the completion got there first; it reports
		}
		k.mu.Lock()
		reported := k.lostSaid || k.stopped // reported already, or the work is over
		k.lostSaid, k.expired = true, true  // neither expire nor leaseEnded reports it again
		k.mu.Unlock()
		if reported {
			return false
		}
		err = fmt.Errorf("extending the lease of %q: %w", claim.Key, err)
		k.event(event.ClaimLost, sent.Sub(k.claimedAt), err)
		k.run.work.end(err)
		return false
	default:
		// The deadline cancels the work if the lease ends before an
		// extension succeeds; until then, keep trying.
		k.event(event.StoreError, sent.Sub(k.claimedAt), &StoreError{Op: "extend", Key: claim.Key, Err: err})
		return true
	}
}

// storeExtend is Store.Extend, with a panic turned into the extension's
// error (an *extensionPanic): the extension runs on a timer's goroutine,
// where a panic would end the process. It counts as an extension that
// failed: reported as a store_error, and the lease deadline cancels the
// work unless a later extension succeeds.
func (k *leaseKeeper) storeExtend(ctx context.Context, claim Claim, lease time.Duration) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &extensionPanic{value: p, stack: debug.Stack()}
		}
	}()
	return k.run.e.cfg.Store.Extend(ctx, claim, lease)
}

// extensionPanic is the error of a Store.Extend that panicked (the Err of
// the *StoreError of op "extend" that reports it): it carries the panic
// value (which errors.Is and errors.As reach when it is an error) and the
// stack where it was recovered.
type extensionPanic struct {
	value any
	stack []byte
}

func (p *extensionPanic) Error() string {
	return fmt.Sprintf("Store.Extend panicked: %v\n%s", p.value, p.stack)
}

// Unwrap returns the panic value when it is an error.
func (p *extensionPanic) Unwrap() error {
	err, _ := p.value.(error)
	return err
}

// event decides an event of the lease (op "extend") from the keeper's
// goroutine: a panic of the Observer, the CallTrace or the Logger is
// recovered (see recoverObserver), so that the lease goes on as if it had
// returned (expire still cancels the work).
func (k *leaseKeeper) event(ev event.Event, elapsed time.Duration, err error) {
	defer k.recoverObserver("a decision")
	k.run.e.tell(&k.run.call, ev, "extend", k.run.held.key, elapsed, err)
}

// observeExtend is Engine.observeOp of an extension, with a panic of the
// Observer recovered as in event.
func (k *leaseKeeper) observeExtend(ctx context.Context, elapsed time.Duration, err error) {
	defer k.recoverObserver("an extension")
	k.run.e.observeOp(ctx, "extend", elapsed, err)
}

// recoverObserver, deferred, recovers a panic of what was told of the
// lease on the keeper's goroutine (the Observer, the CallTrace, the
// Logger), where it would end the process, and logs it to the Logger at
// error level. The Observer is not told of it: that could only panic
// again. A Logger that panics again is ignored.
func (k *leaseKeeper) recoverObserver(what string) {
	p := recover()
	if p == nil {
		return
	}
	stack := debug.Stack()
	defer func() { _ = recover() }() // the Logger may be what panicked
	call := &k.run.call
	k.run.e.cfg.Logger.Error("dedup: panic recovered while telling the Observer of "+what+" of the lease",
		fmt.Errorf("%v\n%s", p, stack),
		watermill.LogFields{"key": k.run.held.key, "handler": call.Handler, "topic": call.Topic, "message_uuid": call.MessageUUID})
}
