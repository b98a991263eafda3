package httpdedup

import (
	"errors"
	"fmt"

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
	ErrKeyMissing = fmt.Errorf("httpdedup: request carries no idempotency key: %w", dedup.ErrNoKey)

	// ErrKeyInvalid: a key is present but malformed (empty, longer than
	// Config.MaxKeyLength, not printable ASCII, a broken structured-field
	// string, the header sent twice). The client gets 400 (key-invalid),
	// on every route: a client that sent a key wants protection, so the
	// request is never run without it. It matches dedup.ErrNoKey.
	ErrKeyInvalid = fmt.Errorf("httpdedup: malformed idempotency key: %w", dedup.ErrNoKey)

	// ErrBodyTooLarge: the request body is longer than Config.MaxBodyBytes.
	// The client gets 413 (body-too-large); nothing was claimed.
	ErrBodyTooLarge = errors.New("httpdedup: request body too large")

	// ErrNotStorable: the handler's response cannot be stored whole, so it
	// cannot be replayed byte for byte: the handler flushed (streaming),
	// hijacked the connection, or wrote more than Config.MaxResponseBytes.
	// The capturing ResponseWriter returns it from Flush (through
	// http.ResponseController), Hijack and Write; the middleware then
	// releases the claim and answers 500 (response-not-storable).
	ErrNotStorable = errors.New("httpdedup: response cannot be stored for replay")
)
