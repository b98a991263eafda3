package httpdedup

import (
	"errors"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// Sentinel errors. Key functions return the first two; the others reach the
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
	// Config.MaxKeyLength, not printable ASCII, a broken structured-field
	// string, the header sent twice). The client gets 400 (key-invalid),
	// on every route: a client that sent a key wants protection, so the
	// request is never run without it. It matches dedup.ErrNoKey.
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

// KeyError says what is wrong with a request's key, in words fit for the
// client: the middleware puts Reason in the detail of its 400 problem+json
// responses (the text of other errors a KeyFunc returns is not shown to the
// client). HeaderKey, ParseKey and BodyKey return it. It matches
// ErrKeyMissing or ErrKeyInvalid, and Err, with errors.Is.
type KeyError struct {
	// Missing is true when the request carries no key (ErrKeyMissing),
	// false when the key is malformed (ErrKeyInvalid).
	Missing bool
	// Reason says what was wrong: "no Idempotency-Key header",
	// "Idempotency-Key header: empty value", "json:id: missing".
	Reason string
	// Err is the underlying cause, if any.
	Err error
}

func (e *KeyError) Error() string {
	return e.sentinel().Error() + ": " + e.Reason
}

func (e *KeyError) sentinel() error {
	if e.Missing {
		return ErrKeyMissing
	}
	return ErrKeyInvalid
}

// Unwrap returns ErrKeyMissing or ErrKeyInvalid, and the cause.
func (e *KeyError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.sentinel()}
	}
	return []error{e.sentinel(), e.Err}
}
