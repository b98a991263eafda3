package dedup

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// HeldClaim is the claim a call's work runs under, as the Engine holds it:
// the context the work gets answers HeldClaimFromContext with it, and so do
// the contexts the Engine gives the store's Claim, Complete and Release of
// that claim. It is what a store needs to complete the record inside the
// work's own transaction (see dedup/storekit.RunInTx, which does it for a
// store) and to remember, from its Claim, something for that claim's
// Complete (SetNote). Its methods are safe for concurrent use.
type HeldClaim struct {
	key, token string
	fence      uint64
	// replay tells whether the handler's output messages are stored
	// (Config.Replay of the Watermill middleware).
	replay bool

	// state holds heldCompleted and heldInTx.
	state atomic.Uint32
	// keeper is the call's lease keeper, once the claim is held. (The
	// retention is asked of it, not kept here, so that the engine's
	// allocation per message stays in its size class:
	// TestDeliverySizeClass.)
	keeper *leaseKeeper
	// note is what the store kept of the claim for its Complete (SetNote).
	note string
}

const (
	heldCompleted uint32 = 1 << iota
	heldInTx
)

// heldKey is the context key of the held claim; the engine's own contexts
// answer it without a context.WithValue.
type heldKey struct{}

// unclaimedRun marks the context of work that runs without a claim; its
// value is the Outcome the claim found (0: none, or no key).
type unclaimedRun Outcome

// HeldClaimFromContext returns the claim the work whose context ctx is runs
// under, when the Engine runs it after winning the claim (Engine.Do,
// DoBatch, the Watermill middleware and every entry point built on them).
// The contexts the Engine gives a store's Claim, Complete and Release of
// that claim answer it too. A context marked by WithUnclaimedRun, or one
// of work the Engine runs without a claim (Config.Shadow, Config.FailOpen),
// answers nil, false even inside an enclosing claimed call. Cost: one
// context lookup.
func HeldClaimFromContext(ctx context.Context) (*HeldClaim, bool) {
	c, ok := ctx.Value(heldKey{}).(*HeldClaim)
	return c, ok && c != nil
}

// RunsUnclaimed reports whether ctx is the context of work that runs
// without a claim on purpose: Config.Shadow let it through, Config.FailOpen
// ran it while the store could not be reached, or an entry point marked it
// with WithUnclaimedRun. A store's transaction helper then writes the
// work's writes alone and completes nothing. Cost: one context lookup.
func RunsUnclaimed(ctx context.Context) bool {
	_, ok := ctx.Value(heldKey{}).(unclaimedRun)
	return ok
}

// WithUnclaimedRun returns ctx marked as the context of work that runs
// without a claim, as the Engine marks shadow and fail-open runs: it hides
// the claim of an enclosing call (HeldClaimFromContext answers nil, false;
// OutcomeFromContext 0, false), and a store's transaction helper commits
// the work's writes without completing anything. For an entry point that
// runs work outside the Engine in shadow mode (httpdedup does). Cost: one
// context.WithValue.
func WithUnclaimedRun(ctx context.Context) context.Context {
	return withUnclaimedRun(ctx, 0)
}

func withUnclaimedRun(ctx context.Context, found Outcome) context.Context {
	return context.WithValue(ctx, heldKey{}, unclaimedRun(found))
}

// Claim returns the claim's key, token and fence, as Store.Claim answered
// them.
func (c *HeldClaim) Claim() Claim { return Claim{Key: c.key, Token: c.token, Fence: c.fence} }

// FenceFromContext returns the fencing number of the claim the work whose
// context ctx is runs under (see Claim.Fence), and whether there is one:
// false when the work runs without a claim, or when the store does not
// fence. Pass it to the system the work writes to, which keeps the largest
// fence it accepted per key and refuses a smaller one (docs/fencing.md).
// Cost: one context lookup.
func FenceFromContext(ctx context.Context) (uint64, bool) {
	c, ok := HeldClaimFromContext(ctx)
	if !ok || c.fence == 0 {
		return 0, false
	}
	return c.fence, true
}

// Replay reports whether the work's output is kept for replay: a
// transaction helper of the Watermill middleware then returns the
// handler's output messages encoded as the middleware stores them.
func (c *HeldClaim) Replay() bool { return c.replay }

// Retention is the retention the record must be completed with
// (Config.Retention); zero before the claim is held.
func (c *HeldClaim) Retention() time.Duration {
	if c.keeper == nil {
		return 0
	}
	return c.keeper.Retention()
}

// StopHeartbeat stops the lease extensions of the claim and waits until
// none is in flight. A store that completes the record inside the work
// calls it just before completing, so that an extension queued behind the
// completion cannot report the claim lost afterwards. The lease then runs
// its normal course: the completion must happen within it. Safe to call
// more than once.
func (c *HeldClaim) StopHeartbeat() {
	if c.keeper != nil {
		c.keeper.StopHeartbeat()
	}
}

// MarkCompleted tells the Engine that the record was completed (with
// Store.Complete's semantics) as part of the work itself, so that it does
// not complete it again. Call it only once the completion is durable
// (after the commit).
func (c *HeldClaim) MarkCompleted() { c.state.Or(heldCompleted) }

// Completed reports whether MarkCompleted was called.
func (c *HeldClaim) Completed() bool { return c.state.Load()&heldCompleted != 0 }

// ErrNestedTx is returned by a store's RunInTx (and so by its
// TxMiddleware) called while another RunInTx of the same claim runs, or
// after one completed the record: a helper that opens its own transaction,
// called from a handler that TxMiddleware already wraps. The inner one
// would complete the record first, and the outer one, finding it completed
// by its own token, could only drop its writes. Nothing of the inner work
// runs or is written; use the enclosing transaction instead.
var ErrNestedTx = errors.New("dedup: a transaction of this claim is already open or has completed the record; use the enclosing transaction (the store's TxFromContext) instead of a nested RunInTx")

// ErrNoClaim is returned by a store's RunInTx for a context without a
// claim of the Engine (and not marked as an unclaimed run): its
// TxMiddleware was added before (outside) the dedup middleware, or RunInTx
// was called outside the work of Engine.Do. Nothing was run. A
// configuration error: every call fails the same way until the wiring is
// fixed.
var ErrNoClaim = errors.New("dedup: no dedup claim in the context; add the store's TxMiddleware after the dedup middleware, or call RunInTx inside Engine.Do's work")

// BeginTx marks that a transaction of this claim is open (a store's
// RunInTx), and reports whether it may: false when one is open already or
// the record was completed, the case of ErrNestedTx. EndTx ends the mark.
// dedup/storekit.RunInTx calls both.
func (c *HeldClaim) BeginTx() bool {
	for {
		s := c.state.Load()
		if s&(heldInTx|heldCompleted) != 0 {
			return false
		}
		if c.state.CompareAndSwap(s, s|heldInTx) {
			return true
		}
	}
}

// EndTx ends what BeginTx marked.
func (c *HeldClaim) EndTx() { c.state.And(^heldInTx) }

// SetNote keeps what a store wants to remember of this claim until its
// Complete (the key in the store's own form, say), which finds it with
// HeldClaimFromContext on Complete's context. A store calls it from Claim,
// on the claim's context, only while the claim's Token is empty (the claim
// is not held yet: the context is not that of work running under another
// claim), and trusts the note in Complete only when the held claim's Key
// and Token are the completed claim's.
func (c *HeldClaim) SetNote(note string) { c.note = note }

// Note returns what SetNote kept.
func (c *HeldClaim) Note() string { return c.note }
