package httpdedup

import (
	"errors"
	"strings"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// Sentinel errors. Key functions return the first two (as the Err of a
// *dedup.KeyError, or wrapped); the others reach the
// Logger and the Observer (dedup.Decision.Err) and are matched with
// errors.Is, never by their text.
var (
	// ErrKeyMissing: the request carries no idempotency key. A KeyFunc
	// returns it (wrapped) when its header, field or parameter is absent.
	// On a route wrapped with Require the client gets 400 (key-missing); on
	// a route wrapped with Optional the request passes through unclaimed.
	// It matches dedup.ErrNoKey.
	ErrKeyMissing error = &sentinel{"httpdedup: no idempotency key"}

	// ErrKeyInvalid: a key is present but malformed (empty, longer than
	// Config.Dedup.MaxKeyLength, not printable ASCII, a broken
	// structured-field string, the header sent twice). The client gets 400
	// (key-invalid), on every route: a client that sent a key wants
	// protection, so the request is never run without it. It matches
	// dedup.ErrNoKey.
	ErrKeyInvalid error = &sentinel{"httpdedup: malformed idempotency key"}

	// ErrBodyTooLarge: the request body is longer than Config.MaxBodyBytes.
	// The client gets 413 (body-too-large); nothing was claimed.
	ErrBodyTooLarge = errors.New("httpdedup: request body too large")

	// ErrNotStorable: the handler's response cannot be stored whole, so it
	// cannot be replayed byte for byte: the handler flushed (streaming),
	// hijacked the connection, or wrote more than Config.MaxResponseBytes.
	// The capturing ResponseWriter returns it from Flush (through
	// http.ResponseController), Hijack and Write. For a flush or a hijack
	// the middleware releases the claim and answers 500
	// (response-not-storable). For a body over MaxResponseBytes with a
	// status StoreResponse accepts, the handler's effect is recorded: the
	// record is completed without the response, and the client and every
	// retry get 409 (response-not-stored); with any other status the claim
	// is released and the client gets 500 (response-not-storable).
	ErrNotStorable = errors.New("httpdedup: response cannot be stored for replay")
)

// sentinel is a sentinel error that also matches dedup.ErrNoKey.
type sentinel struct{ msg string }

func (e *sentinel) Error() string { return e.msg }
func (e *sentinel) Unwrap() error { return dedup.ErrNoKey }

// keyError is the *dedup.KeyError of a request's key: HeaderKey, ParseKey,
// CheckKey and BodyKey return one, with Err = ErrKeyMissing or
// ErrKeyInvalid (wrapping the cause, if any), so that it matches that
// sentinel and dedup.ErrNoKey. Field names where the key was looked for
// ("Idempotency-Key header", "json:id"; "" for a key given as a value),
// Reason says what was wrong, in words fit for the client (see
// clientReason).
func keyError(sentinel error, field, reason string) *dedup.KeyError {
	return &dedup.KeyError{Field: field, Reason: reason, Err: sentinel}
}

// clientReason returns the client-facing words of a key error, for the
// detail of a 400 problem+json response, and whether there are any: only a
// *dedup.KeyError whose Err matches ErrKeyMissing or ErrKeyInvalid (as this
// package's key functions return) is shown; the text of any other error a
// KeyFunc returns, and of the engine's own key errors, is not. The words
// are Reason, preceded by Field unless Reason names it already: "no
// Idempotency-Key header", "Idempotency-Key header: empty value",
// "json:id: missing".
func clientReason(err error) (string, bool) {
	var ke *dedup.KeyError
	if !errors.As(err, &ke) || ke.Reason == "" || !(errors.Is(ke.Err, ErrKeyMissing) || errors.Is(ke.Err, ErrKeyInvalid)) {
		return "", false
	}
	if ke.Field == "" || strings.Contains(ke.Reason, ke.Field) {
		return ke.Reason, true
	}
	return ke.Field + ": " + ke.Reason, true
}
