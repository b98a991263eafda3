package dedup

import (
	"context"
	"fmt"
	"time"
)

// Outcome is what a [Store.Claim] found.
type Outcome int

const (
	// Acquired: there was no live record; the claim created one in state
	// in_progress with a fresh owner token. The caller now owns the key until
	// the lease ends.
	Acquired Outcome = iota + 1
	// Duplicate: a completed record within its retention exists; the effect
	// already happened. The stored result, if any, comes with it.
	Duplicate
	// InProgress: another claim holds the key and its lease has not ended.
	InProgress
	// Conflict: a live record exists whose fingerprint differs from the
	// claim's: the same key was used for a different payload.
	Conflict
)

// String returns the outcome's name as used in logs and metrics.
func (o Outcome) String() string {
	switch o {
	case Acquired:
		return "acquired"
	case Duplicate:
		return "duplicate"
	case InProgress:
		return "in_progress"
	case Conflict:
		return "conflict"
	default:
		return fmt.Sprintf("outcome(%d)", int(o))
	}
}

// Claim identifies one ownership of a key: the scoped key and the owner token
// that the claim wrote. It is the capability passed to Complete, Release and
// Extend; a store acts on the record only while it still carries Token.
type Claim struct {
	// Key is the scoped key as given to Store.Claim (without any prefix the
	// store adds).
	Key string
	// Token is the random owner token written by the claim.
	Token string
	// Fence is the claim's fencing number: for one scoped key, larger
	// than the fence of every claim that won before it, also after the
	// record was released, its lease ended, another claim took it over or
	// it was deleted (see docs/fencing.md for what each store's guarantee
	// rests on). Give it to any system that can refuse a number smaller
	// than the largest it has accepted for the key, so that a holder that
	// paused past its lease is refused there once its successor has
	// written. Zero when the store does not fence. Complete, Release and
	// Extend do not read it.
	Fence uint64
}

// ClaimResult is the answer of [Store.Claim].
type ClaimResult struct {
	// Outcome says what the claim found. Always set when err is nil.
	Outcome Outcome
	// Claim is the new ownership, with its Fence where the store fences.
	// Set only when Outcome is Acquired.
	Claim Claim
	// Result is the result stored by Complete. Set only when Outcome is
	// Duplicate; nil when none was stored. Stores do not distinguish an empty
	// result from no result: compare with bytes.Equal.
	Result []byte
}

// Store keeps one record per scoped key and arbitrates claims atomically.
// Every implementation must pass the conformance suite in dedup/storetest.
//
// Durations of zero or less are configuration errors: a store returns an
// error (wrapping [ErrInvalidDuration]) rather than treating them as
// "forever" or "now". Errors other than [ErrClaimLost] mean the store could
// not be reached or could not answer; the caller does not know whether the
// operation took effect and must treat the message as unprocessed.
//
// The engine calls each method with a context bounded by
// Config.StoreTimeout and cancelled when the method returns; do not keep it
// beyond that. Claim's context also ends with the caller's: its Err reports
// the caller's cancellation at once, its Done channel up to 10ms later (the
// engine registers with the caller's context only for a claim that lasts
// that long, sparing the registration's allocations on every other one).
// The contexts of Complete and Release do not follow the caller's
// cancellation: the record must be finished after the message's context
// ended. Extend's does not either; the engine cancels it when it stops
// keeping the lease.
type Store interface {
	// Claim atomically creates an in_progress record for key with a fresh
	// owner token and the given lease, unless a live record exists, in which
	// case it reports that record's state without changing it. A record whose
	// fingerprint differs from a non-empty fingerprint yields Conflict,
	// whatever its state; an empty fingerprint on either side skips the
	// check. A released record counts as no record. One round trip (or one
	// atomic statement) for a fresh key and for a live record; a claim that
	// takes over a released or abandoned record may need a second.
	//
	// A store that fences gives every Acquired claim a Fence (see Claim)
	// in the same round trip, and keeps the fence with the record.
	//
	// Who and when: a record created for a fresh key keeps the Origin that
	// OriginFromContext(ctx) returns (none: empty ids), the time of the
	// claim and a claim count of 1. A claim that takes over a released
	// record, or an in-progress one whose lease ended, keeps its Origin and
	// time and adds 1 to its count, where the store still holds that
	// record; a claim after a completed record's retention starts afresh.
	Claim(ctx context.Context, key, fingerprint string, lease time.Duration) (ClaimResult, error)

	// Complete turns the claim's record into a completed record holding
	// result for the retention window, only if it still carries the claim's
	// token; otherwise it returns ErrClaimLost and changes nothing. result
	// is stored byte-exact and may be nil.
	Complete(ctx context.Context, claim Claim, result []byte, retention time.Duration) error

	// Release marks the claim's record released only if it still carries
	// the claim's in_progress token (compare-and-set), so that a retry can
	// claim the key again: every operation treats a released record as no
	// record, except that the next Claim keeps its who-and-when fields
	// and counts one more claim (see Claim). A store may keep it no longer
	// than what was left of the lease, or delete it (a store that keeps no
	// count). If the record is gone, expired, released or owned by another
	// claim it returns ErrClaimLost and changes nothing.
	Release(ctx context.Context, claim Claim) error

	// Extend pushes the lease deadline of the claim's in_progress record to
	// now+lease, only if it still carries the claim's token; otherwise
	// ErrClaimLost.
	Extend(ctx context.Context, claim Claim, lease time.Duration) error
}
