// Package claimctx carries the claim a handler runs under in its context,
// for stores that complete the record inside the handler's own
// transaction (stores/postgres TxMiddleware): no window remains between the
// effect and its record.
package claimctx

import (
	"context"
	"sync/atomic"
	"time"
)

// Claim is the claim under which a handler runs.
type Claim struct {
	// Key and Token identify the ownership (dedup.Claim).
	Key, Token string
	// Replay tells whether the handler's output messages are stored.
	Replay bool

	// state holds stateCompleted and stateInTx.
	state  atomic.Uint32
	keeper Keeper
	// note is what the store kept of the claim for its Complete (SetNote).
	note string
}

// Keeper is the engine's lease keeper of a held claim: it stops the
// claim's lease extensions and waits until none is in flight, and knows
// the retention Complete must be given. (The retention is asked of it,
// not kept in Claim, so that the engine's allocation per message stays
// in its size class.)
type Keeper interface {
	StopHeartbeat()
	Retention() time.Duration
}

type key struct{}

// IsKey reports whether k is the context key of this package: a context
// type that carries a claim itself answers it with the claim.
func IsKey(k any) bool {
	_, ok := k.(key)
	return ok
}

// SetKeeper sets what StopHeartbeat and Retention ask.
func (c *Claim) SetKeeper(k Keeper) { c.keeper = k }

// Retention is what Complete must be given; zero before the claim is held.
func (c *Claim) Retention() time.Duration {
	if c.keeper == nil {
		return 0
	}
	return c.keeper.Retention()
}

// From returns the claim the current handler runs under, if the handler was
// called by the dedup engine after winning the claim. The contexts the
// engine gives the store's Claim, Complete and Release of that claim
// answer it too.
func From(ctx context.Context) (*Claim, bool) {
	c, ok := ctx.Value(key{}).(*Claim)
	return c, ok
}

// SetNote keeps what a store wants to remember of this claim until its
// Complete (the key in the store's own form, say), which finds it with
// From on Complete's context. A store calls it from Claim, on the claim's
// context, only while Token is empty (the claim is not held yet: the
// context is not that of a handler running under another claim), and
// trusts the note in Complete only when Key and Token are the claim's.
func (c *Claim) SetNote(note string) { c.note = note }

// Note returns what SetNote kept.
func (c *Claim) Note() string { return c.note }

// MarkCompleted tells the engine that the record was completed (with
// Store.Complete semantics) as part of the handler's own work, so it must
// not call Complete again. Call it only after the completion is durable
// (after the commit).
func (c *Claim) MarkCompleted() { c.state.Or(stateCompleted) }

// Completed reports whether MarkCompleted was called.
func (c *Claim) Completed() bool { return c.state.Load()&stateCompleted != 0 }

const (
	stateCompleted uint32 = 1 << iota
	stateInTx
)

// BeginTx marks that a store's RunInTx runs for this claim, and reports
// false (marking nothing) when one already runs or the record was
// completed (MarkCompleted): a RunInTx nested in another of the same claim
// would complete the record by itself, and the outer one, finding it
// completed by this claim's token, would take that for its own earlier
// attempt and drop its writes. The store refuses the call before writing
// anything; EndTx ends the mark when its RunInTx returns.
func (c *Claim) BeginTx() bool {
	for {
		s := c.state.Load()
		if s&(stateInTx|stateCompleted) != 0 {
			return false
		}
		if c.state.CompareAndSwap(s, s|stateInTx) {
			return true
		}
	}
}

// EndTx ends what BeginTx marked.
func (c *Claim) EndTx() { c.state.And(^stateInTx) }

// StopHeartbeat stops the lease extensions of this claim and waits until no
// extension is in flight. A store that completes the record inside the
// handler calls it just before completing, so that an extension queued
// behind the completion cannot report the claim lost afterwards. The lease
// then runs its normal course: the completion must happen within it. Safe
// to call more than once.
func (c *Claim) StopHeartbeat() {
	if c.keeper != nil {
		c.keeper.StopHeartbeat()
	}
}

// shadow marks a run without a claim that Config.Shadow let through; its
// value is the dedup.Outcome the claim found (0: no key).
type shadow int

// WithShadow returns ctx marking a shadow run (see dedup.OutcomeFromContext)
// under the same key as a claim, so that the innermost run wins: a shadow
// run hides the claim of an enclosing run (it must not complete it).
func WithShadow(ctx context.Context, outcome int) context.Context {
	return context.WithValue(ctx, key{}, shadow(outcome))
}

// ShadowFrom returns the outcome of the shadow run ctx marks, if it is one.
func ShadowFrom(ctx context.Context) (int, bool) {
	s, ok := ctx.Value(key{}).(shadow)
	return int(s), ok
}
