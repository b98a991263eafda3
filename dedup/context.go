package dedup

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// The contexts and timers of a callRun (lifecycle.go), behind
// callContexts: the work's context (workContext), the context of each
// store operation (opContext), the detached parent of Complete's and
// Release's (detachedWork) and the pooled timers behind them. They cost no allocation on the common path; the
// comment of each says what it saves, measured.

// callContexts are the contexts of one call: its work's and its store
// operations'. The first of each is made in place, in the callRun; a
// context is never reused, because a store may still hold it after its
// operation (net/http cancels a request's context from its read loop).
type callContexts struct {
	// work is the work's context. It is made before the claim, whose
	// request context is derived from it (see opContext): the claim
	// follows the caller's cancellation through it.
	work    *workContext // &ownWork, or a fresh one (a batch's copy of a running call)
	ownWork workContext
	// claimOp and endOp are the contexts of the claim and of the first
	// Complete or Release; later attempts get their own.
	claimOp, endOp opContext
}

// nextWork returns the work context to initialise: the one in place,
// else a fresh one (the first may still be in a store's hands).
func (cc *callContexts) nextWork() *workContext {
	if cc.work == nil {
		cc.work = &cc.ownWork
	} else {
		cc.work = &workContext{}
	}
	return cc.work
}

// nextClaimOp returns the context of a claim: the one in place, else (an
// earlier claim of the call: InProgressWait) a fresh one.
func (cc *callContexts) nextClaimOp() *opContext {
	if cc.claimOp.parent == nil {
		return &cc.claimOp
	}
	return &opContext{}
}

// nextEndOp returns the context of a Complete or Release: the one in
// place, else (a retry) a fresh one.
func (cc *callContexts) nextEndOp() *opContext {
	if cc.endOp.parent == nil {
		return &cc.endOp
	}
	return &opContext{}
}

// workContext is the work's context: cancellable with a cause (ErrClaimLost at
// the lease deadline), carrying the claim (HeldClaimFromContext) and the call's
// Origin, and ended with the caller's context. It is
// context.WithCancelCause(parent) with the claim as a value, made only
// when something needs it: when someone asks for its Done (the work, a
// child context, a claim that lasted past linkDelay: see opContext) or the
// work is cancelled.
// Until then Err, Deadline and Value (which context.Cause goes through)
// are the parent's, which is what the child would answer. A
// context.WithCancelCause registers itself with its parent: for a
// Watermill message (GoChannel gives each message a context of its own)
// that is a map and a channel per message, spared when nothing waits on
// the work's context.
//
// It pays in bytes more than in instructions: a plain WithCancelCause
// made for every call costs the router path several allocations per
// message (dedup-bench -alloc-messages), and a little in instructions
// (scripts/paired.sh -m callgrind); see docs/dev/decisions.md.
type workContext struct {
	parent context.Context
	run    *callRun // its held is the claim; its call the Origin

	mu    sync.Mutex
	inner atomic.Pointer[context.Context] // &made, once made
	made  context.Context                 // the WithCancelCause (set before inner)
	// cancel is made's cancel function; endedBeforeMade when the work was
	// cancelled before made was made (make then makes it cancelled). A
	// field of its own for that would take the callRun past its size class.
	cancel context.CancelCauseFunc
}

// endedBeforeMade marks a workContext cancelled before its context was made.
func endedBeforeMade(error) {}

func (w *workContext) init(parent context.Context, f *callRun) {
	w.parent, w.run = parent, f
}

// make returns inner, making it if needed.
func (w *workContext) make() context.Context {
	if c := w.inner.Load(); c != nil {
		return *c
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if c := w.inner.Load(); c != nil {
		return *c
	}
	c, cancel := context.WithCancelCause(w.parent)
	ended := w.cancel != nil // endedBeforeMade
	w.cancel = cancel
	if ended {
		cancel(nil)
	}
	w.made = c
	w.inner.Store(&w.made) // no copy of c on the heap
	return c
}

// end cancels the work with cause (nil: context.Canceled).
func (w *workContext) end(cause error) {
	if cause != nil {
		w.make()
	}
	w.mu.Lock()
	cancel := w.cancel
	if cancel == nil {
		w.cancel = endedBeforeMade
	}
	w.mu.Unlock()
	if cancel != nil {
		cancel(cause)
	}
}

func (w *workContext) Deadline() (time.Time, bool) { return w.parent.Deadline() }

func (w *workContext) Done() <-chan struct{} { return w.make().Done() }

func (w *workContext) Err() error {
	if c := w.inner.Load(); c != nil {
		return (*c).Err()
	}
	w.mu.Lock()
	ended := w.cancel != nil // endedBeforeMade: inner is not made
	w.mu.Unlock()
	if ended {
		return context.Canceled
	}
	return w.parent.Err()
}

func (w *workContext) Value(key any) any {
	if _, ok := key.(heldKey); ok {
		return &w.run.held
	}
	if _, ok := key.(originKey); ok && (w.run.call.MessageUUID != "" || w.run.call.MessageID != "") {
		// The claim's context answers OriginFromContext from the call,
		// without an allocation.
		return &w.run.call
	}
	if c := w.inner.Load(); c != nil {
		return (*c).Value(key)
	}
	return w.parent.Value(key)
}

// detachedWork is the parent of the context of a callRun's Complete and
// Release (finishOp): context.WithoutCancel of the caller's context, but
// answering the claim (HeldClaimFromContext) and the Origin as the work's context
// does, so that a store finds there what it noted at the claim. Made
// without an allocation: context.WithoutCancel costs one to make and one
// on every Value through it (its Value boxes its receiver), which a
// store's lookup of its note would pay per message.
type detachedWork callRun

func (p *detachedWork) Deadline() (time.Time, bool) { return time.Time{}, false }
func (p *detachedWork) Done() <-chan struct{}       { return nil }
func (p *detachedWork) Err() error                  { return nil }

func (p *detachedWork) Value(key any) any {
	if key == cancelCtxKey {
		// As WithoutCancel: context.Cause of a detached operation's
		// context is its own, not the caller's.
		return nil
	}
	return (*callRun)(p).work.Value(key)
}

// cancelCtxKey is the key that context.Cause asks a context's Value for
// (the context package's own, unexported), found once by asking Cause of
// a context that records the key it is asked for.
var cancelCtxKey = func() any {
	var s keySpy
	_ = context.Cause(&s)
	return s.key
}()

// keySpy is a cancelled context that records the last key of Value.
type keySpy struct{ key any }

func (s *keySpy) Deadline() (time.Time, bool) { return time.Time{}, false }
func (s *keySpy) Done() <-chan struct{}       { return nil }
func (s *keySpy) Err() error                  { return context.Canceled }
func (s *keySpy) Value(key any) any           { s.key = key; return nil }

// opContext is the context of one store operation, bounded by StoreTimeout. It
// behaves like context.WithTimeout(parent, StoreTimeout) (or, detached,
// like context.WithTimeout(context.WithoutCancel(parent), StoreTimeout)),
// ended by end when the operation returns, but costs no allocation and no
// timer unless the store asks for Done: stores that only read Deadline and
// Err (or never look) pay nothing for the bound; stores that ask for Done
// get a channel of the operation's own and a pooled timer.
//
// Attached (the claim), its parent is the call's work context: while the
// operation runs, Err and Value are the parent's, and the caller's
// cancellation ends it. Its channel learns of that cancellation lazily: a
// claim still running linkDelay after its store first asked for Done
// registers with the parent then (context.AfterFunc), so that the claims
// answered sooner, nearly all, never make the work's cancellable context
// (a node, a channel, the parent's channel and its map of children: about
// 590 bytes per message on Redis, whose client asks every command's
// context for Done before it takes a connection). A store waiting on Done
// sees the caller's cancellation up to linkDelay late; Err reports it at
// once, and the deadline is never late. The operation's end does not
// touch the work's context.
//
// Detached (Complete and Release, which must run after the caller's
// context ended), it ignores its parent's cancellation.
//
// A store should not use an operation's context after the operation
// returned: it is cancelled then (context.Canceled).
//
// It pays: paired builds with context.WithTimeout instead (of
// WithoutCancel for the detached ones) cost more instructions per message
// on every store (scripts/paired.sh -m callgrind; see
// docs/dev/decisions.md).
type opContext struct {
	// parent is, attached, the work's context (a *workContext).
	parent   context.Context
	deadline time.Duration // since opEpoch, on the monotonic clock

	mu       sync.Mutex
	done     chan struct{} // made on the first Done
	timer    *timerSlot
	more     *opLinks // made on the first AfterFunc or link
	ended    opEnd
	detached bool
	closed   bool // done is closed (or is made closed), the AfterFuncs ran
	linked   bool // attached: the link to the parent is made or being made
}

// opLinks are the registrations of an opContext, rarely made: the AfterFuncs
// of child contexts, and the link to an attached operation's parent.
type opLinks struct {
	afters []*afterFunc
	unlink func() bool
}

// linkDelay is how long an attached operation's Done channel may miss the
// caller's cancellation (see opContext).
const linkDelay = 10 * time.Millisecond

// opEpoch is the origin of opContext deadlines: a duration since it (on the
// monotonic clock) is 8 bytes where a time.Time is 24.
var opEpoch = time.Now()

// opEnd is how an operation's context ended.
type opEnd uint8

const (
	opRunning     opEnd = iota
	opCanceled          // the operation returned
	opTimedOut          // the deadline passed first
	opParentEnded       // attached: the parent ended first; Err is the parent's
)

// err is the context's error for e.
func (e opEnd) err() error {
	switch e {
	case opCanceled:
		return context.Canceled
	case opTimedOut:
		return context.DeadlineExceeded
	}
	return nil
}

// start readies a new c for an operation of at most timeout from now (a
// wall-clock reading, with its monotonic part): attached to the work's
// context w (parent is w), or detached from parent (w nil).
func (c *opContext) start(parent context.Context, w *workContext, timeout time.Duration, now time.Time) {
	c.parent, c.detached = parent, w == nil
	c.deadline = now.Sub(opEpoch) + timeout
}

// end ends the operation: the context is cancelled (context.Canceled) as
// the cancel function of context.WithTimeout would, and its timer, if any,
// goes back to the pool.
func (c *opContext) end() {
	c.mu.Lock()
	if c.timer != nil {
		c.timer.stop()
		c.timer = nil
	}
	if c.ended == opRunning {
		c.ended = c.endedAs(opCanceled)
	}
	unlink := c.closeLocked()
	c.mu.Unlock()
	if unlink != nil {
		unlink()
	}
}

// endedAs is how a running operation ends for reason e: an attached one
// whose parent has ended keeps the parent's error (Err does not change once
// it reported one).
func (c *opContext) endedAs(e opEnd) opEnd {
	if !c.detached && c.parent.Err() != nil {
		return opParentEnded
	}
	return e
}

// closeLocked closes the channel, if made, and runs the registered
// AfterFuncs, once; it returns the link to the parent to undo (after
// c.mu is released), if any. Called with c.mu held.
func (c *opContext) closeLocked() (unlink func() bool) {
	if c.closed {
		return nil
	}
	c.closed = true
	if c.done != nil {
		close(c.done)
	}
	if m := c.more; m != nil {
		for _, a := range m.afters {
			if !a.stopped {
				a.fired = true
				go a.f()
			}
		}
		m.afters, unlink, m.unlink = nil, m.unlink, nil
	}
	return unlink
}

// armLocked starts the timer, if it is not running: for the deadline, or, for
// an attached operation not yet linked to its parent, for linkDelay if
// that comes first. An attached operation whose parent has already ended
// is closed at once. Called with c.mu held.
func (c *opContext) armLocked() {
	if c.timer != nil || c.closed {
		return
	}
	d := c.deadline - time.Since(opEpoch)
	if !c.detached && !c.linked {
		if c.parent.Err() != nil {
			c.closeLocked() // nothing to undo: not linked
			return
		}
		d = min(d, linkDelay)
	}
	c.timer = newTimerSlot(c, d)
}

// timerFired is the deadline, or, before it, the time to link an attached
// operation to its parent.
func (c *opContext) timerFired() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	if left := c.deadline - time.Since(opEpoch); left > 0 {
		link := !c.detached && !c.linked
		c.linked = true
		if c.timer != nil {
			c.timer.reset(left)
		}
		c.mu.Unlock()
		if link {
			c.link()
		}
		return
	}
	c.ended = c.endedAs(opTimedOut)
	unlink := c.closeLocked()
	c.mu.Unlock()
	if unlink != nil {
		unlink()
	}
	if h := testHookOpTimedOut.Load(); h != nil && !c.detached {
		(*h)()
	}
}

// link registers an attached operation with its parent, so that the
// parent's end closes the operation's channel. A caller's context that
// cannot end needs no link: during a claim nothing else ends the work's.
func (c *opContext) link() {
	if w, ok := c.parent.(*workContext); ok && w.parent.Done() == nil {
		return
	}
	unlink := context.AfterFunc(c.parent, c.parentDone)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		unlink()
		return
	}
	c.linksLocked().unlink = unlink
	c.mu.Unlock()
}

// parentDone closes an attached operation whose parent ended: its Err is
// the parent's.
func (c *opContext) parentDone() {
	c.mu.Lock()
	unlink := c.closeLocked()
	c.mu.Unlock()
	if unlink != nil {
		unlink()
	}
}

func (c *opContext) linksLocked() *opLinks {
	if c.more == nil {
		c.more = new(opLinks)
	}
	return c.more
}

// testHookOpTimedOut, set by tests only, runs when an attached operation's
// deadline has passed, after its context ended.
// (Atomic: a timer left by an earlier test may fire while a test sets it.)
var testHookOpTimedOut atomic.Pointer[func()]

// Deadline is the operation's deadline, or the parent's if that is
// earlier (attached only).
func (c *opContext) Deadline() (time.Time, bool) {
	if !c.detached {
		if d, ok := c.parent.Deadline(); ok && d.Before(opEpoch.Add(c.deadline)) {
			return d, true
		}
	}
	return opEpoch.Add(c.deadline), true
}

// Done makes the channel and arms the timer on first use.
func (c *opContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.closed {
			close(c.done)
		}
	}
	c.armLocked()
	return c.done
}

func (c *opContext) Err() error {
	c.mu.Lock()
	err := c.ended.err()
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if !c.detached {
		if err := c.parent.Err(); err != nil {
			return err
		}
	}
	if time.Since(opEpoch) >= c.deadline {
		return context.DeadlineExceeded
	}
	return nil
}

// Value is the parent's, but for the key of context.Cause: the cause of an
// operation that ended by itself (or of a detached one) is its Err; of an
// attached one whose parent ended first, the parent's (the caller's cause).
func (c *opContext) Value(key any) any {
	if key == cancelCtxKey {
		if c.detached {
			return nil
		}
		c.mu.Lock()
		e := c.ended
		c.mu.Unlock()
		if e == opCanceled || e == opTimedOut {
			return nil
		}
		if e == opRunning && c.parent.Err() == nil && time.Since(opEpoch) >= c.deadline {
			return nil // past the deadline, its timer not yet fired
		}
	}
	return c.parent.Value(key)
}

// afterFunc is one AfterFunc registration on an opContext.
type afterFunc struct {
	f              func()
	stopped, fired bool
}

// AfterFunc lets a child context of an operation (context.WithCancel of
// it) be cancelled with it without a goroutine of its own.
func (c *opContext) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := &afterFunc{f: f}
	if c.closed {
		a.fired = true
		go f()
	} else {
		m := c.linksLocked()
		m.afters = append(m.afters, a)
	}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if a.fired || a.stopped {
			return false
		}
		a.stopped = true
		return true
	}
}

// timerSlot is a reusable wall-clock timer: its function calls whatever
// owner it serves at the moment, so that the timers of the lease keeper and
// of store operations cost no allocation once the pool is warm. A slot goes
// back to the pool only when stop prevented its function from running, so
// a late firing never reaches the next owner.
type timerSlot struct {
	t     *time.Timer
	mu    sync.Mutex
	owner timerOwner
}

type timerOwner interface{ timerFired() }

var timerSlots sync.Pool

// newTimerSlot calls owner.timerFired once d has passed, unless stopped.
func newTimerSlot(owner timerOwner, d time.Duration) *timerSlot {
	s, _ := timerSlots.Get().(*timerSlot)
	if s == nil {
		s = &timerSlot{owner: owner}
		s.t = time.AfterFunc(d, s.fire)
		return s
	}
	s.mu.Lock()
	s.owner = owner
	s.mu.Unlock()
	s.t.Reset(d)
	return s
}

func (s *timerSlot) fire() {
	s.mu.Lock()
	o := s.owner
	s.mu.Unlock()
	if o != nil {
		o.timerFired()
	}
}

// reset re-arms a slot whose function is running (from within it).
func (s *timerSlot) reset(d time.Duration) { s.t.Reset(d) }

// stop stops the timer and reports whether that prevented the call; the
// slot is then back in the pool and must not be used again.
func (s *timerSlot) stop() bool {
	if !s.t.Stop() {
		return false
	}
	s.mu.Lock()
	s.owner = nil
	s.mu.Unlock()
	timerSlots.Put(s)
	return true
}
