package dedup

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error the middleware and the stores return wraps one
// of these (or a store's own cause), so callers classify with errors.Is; the
// text is for humans and may change.
var (
	// ErrNoKey: the key function found no usable business key (missing
	// field, empty or blank value, malformed payload, invalid UTF-8, too
	// long). Permanent: redelivering the same bytes cannot fix it, so route
	// the message to a poison queue. Nothing was claimed.
	ErrNoKey = errors.New("dedup: no usable business key in message")

	// ErrTransportKey: the key function returned the message's transport id
	// (its Watermill UUID). Every redelivered copy gets a new id, so such a
	// key deduplicates nothing. Permanent; nothing was claimed.
	ErrTransportKey = errors.New("dedup: key equals the message's transport id")

	// ErrInProgress: another consumer holds a live claim on the key.
	// Retryable: the message is nacked, never acked, so that it is not lost
	// if that consumer crashes.
	ErrInProgress = errors.New("dedup: key is being processed by another consumer")

	// ErrKeyReuse: the key was already used for a message with a different
	// fingerprint. Permanent.
	ErrKeyReuse = errors.New("dedup: key reused with a different payload")

	// ErrClaimLost: the record no longer carries the claim's owner token (its
	// lease ended and another consumer took it over, or it was evicted).
	// Complete, Release and Extend return it without changing anything.
	ErrClaimLost = errors.New("dedup: claim lost")

	// ErrAlreadyCompleted: the record is completed and carries this very
	// claim's token: an earlier Complete of the same claim succeeded (its
	// reply may have been lost and the call retried). It matches
	// ErrClaimLost (the claim can no longer release, extend or complete the
	// record), but a Complete that returns it has nothing left to do: the
	// middleware counts the record as completed. Stores that can tell this
	// case apart wrap it; others return plain ErrClaimLost.
	ErrAlreadyCompleted = fmt.Errorf("%w: the record was already completed by this claim", ErrClaimLost)

	// ErrNoScope: the middleware has no scope for the message: Config.Scope
	// is empty and the message context carries no Watermill handler name
	// (the middleware runs outside a router). A configuration error: set
	// Config.Scope. Nothing was claimed; the message is nacked.
	ErrNoScope = errors.New("dedup: no scope: set Config.Scope (or Engine.Do's Call.Scope); the Watermill middleware inside a router defaults it to the handler's name")

	// ErrInvalidDuration: a lease, retention or interval of zero or less was
	// given. In Redis a zero TTL means "never expires", so it is refused
	// everywhere.
	ErrInvalidDuration = errors.New("dedup: invalid duration")

	// ErrResultTooLarge: Complete was given a result larger than the store
	// can hold (a DynamoDB item is at most 400 KB). Stores wrap it. The
	// middleware then completes the record without the result, so the
	// effect is still recorded, and logs the lost replay as an error.
	ErrResultTooLarge = errors.New("dedup: result too large for the store")

	// ErrNotStarted: the work was not started: the call's StartBy passed
	// (Call.StartBy: a Lambda invocation's time ran short), or an earlier
	// call of its group failed (BatchCall.Group; for every call left of a
	// batch, the work of another call panicked). Its claim, if won, was
	// released unworked. Retryable: the message comes back and runs with
	// more time or after the call before it. The error's text says which.
	ErrNotStarted = errors.New("dedup: the work was not started")

	// ErrCorruptResult: a stored result could not be decoded for replay.
	// Permanent: the effect already happened, but its output cannot be
	// reproduced; route the message to a poison queue for a human to look at.
	ErrCorruptResult = errors.New("dedup: stored result cannot be decoded")
)

// IsPermanent reports whether err is a permanent dedup error: retrying the
// same message cannot succeed (ErrNoKey, ErrTransportKey, ErrKeyReuse,
// ErrCorruptResult). Pass it to Watermill's middleware.PoisonQueueWithFilter
// and negate it in Retry.ShouldRetry. Every other error (ErrInProgress,
// store errors, handler errors) is worth retrying.
func IsPermanent(err error) bool {
	return errors.Is(err, ErrNoKey) ||
		errors.Is(err, ErrTransportKey) ||
		errors.Is(err, ErrKeyReuse) ||
		errors.Is(err, ErrCorruptResult)
}

// KeyError is returned when no usable key can be taken from a message. It
// matches ErrNoKey with errors.Is, and its cause (if any) with errors.Is/As.
type KeyError struct {
	// Field names what was looked for, e.g. `json:order.id` or
	// `metadata:order_id`.
	Field string
	// Reason says what was wrong: "missing", "empty", "null", "not JSON",
	// "wrong type: number with fraction", "too long", ...
	Reason string
	// MessageUUID is the transport id of the offending message, for logs.
	MessageUUID string
	// Err is the underlying cause, if any.
	Err error
}

func (e *KeyError) Error() string {
	s := "dedup: no usable business key"
	if e.Field != "" {
		s += " at " + e.Field
	}
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	if e.MessageUUID != "" {
		s += " (message " + e.MessageUUID + ")"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns ErrNoKey and the cause, so errors.Is matches both.
func (e *KeyError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrNoKey}
	}
	return []error{ErrNoKey, e.Err}
}

// StoreError wraps a store failure with the operation and scoped key. The
// operation's effect is unknown; the middleware nacks the message (fail
// closed). The cause is kept for errors.As (e.g. a network error or an SDK
// error type).
//
// A Store.Extend that panics (it runs on the lease keeper's timer goroutine,
// where no Watermill Recoverer can catch it) is a StoreError of Op
// "extend" whose Err carries the panic value and its stack (errors.Is and
// errors.As reach the value when it is an error): counted as an extension
// that failed, and the lease deadline cancels the work unless a later
// extension succeeds. Fix the store: a panicking store is a bug.
type StoreError struct {
	// Op is "claim", "complete", "release" or "extend".
	Op string
	// Key is the scoped key.
	Key string
	// Err is the store's error.
	Err error
}

func (e *StoreError) Error() string {
	return fmt.Sprintf("dedup: store %s %q: %v", e.Op, e.Key, e.Err)
}

// Unwrap returns the store's error.
func (e *StoreError) Unwrap() error { return e.Err }
