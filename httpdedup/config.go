package httpdedup

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// IdentityFunc returns who is calling: the authenticated account, API key
// id or tenant. It is the first part of every record's scope, so two callers
// that happen to send the same key never see each other's responses. It
// must not return an empty string; it returns an error when the caller is
// not authenticated, and the middleware then answers 401 (unidentified-caller)
// without claiming anything. Run authentication before the middleware and
// read its result from the request's context.
type IdentityFunc func(r *http.Request) (string, error)

// StaticIdentity returns an IdentityFunc that gives every request the same
// identity. Use it only where a single party calls the route, such as a
// webhook receiver for one provider ("stripe"): on a route shared by several
// clients it would let one client's key replay another client's response.
func StaticIdentity(identity string) IdentityFunc {
	return func(*http.Request) (string, error) {
		if identity == "" {
			return "", errors.New("httpdedup: StaticIdentity: empty identity")
		}
		return identity, nil
	}
}

// RouteFunc names the operation a request addresses, the last part of the
// scope. Requests for different routes never share a record.
type RouteFunc func(r *http.Request) string

// BodyFunc returns the request body, read once (at most Config.MaxBodyBytes
// bytes) and cached: every call returns the same bytes. Past the limit it
// returns an error matching ErrBodyTooLarge.
type BodyFunc func() ([]byte, error)

// KeyFunc returns the idempotency key of a request. It returns an error
// matching ErrKeyMissing when the request carries no key, any other error
// (preferably matching ErrKeyInvalid) when the key is malformed. body reads
// the request body; a KeyFunc that looks only at headers never calls it, so
// requests without a key on Optional routes pass through with their body
// unread. The middleware checks every key it returns by the rule of
// CheckKey (printable ASCII, at most Config.Dedup.MaxKeyLength bytes). The
// client's 400 names what was wrong only for a *dedup.KeyError whose Err
// is ErrKeyMissing or ErrKeyInvalid (its Field and Reason, as HeaderKey's);
// the text of any other error stays in the logs.
type KeyFunc func(r *http.Request, body BodyFunc) (string, error)

// FingerprintFunc returns a digest of what the request asks for. A key
// already recorded with a different fingerprint gets 422 (key-reused)
// instead of a replay. It is computed once per request, after the key.
// Returning "" disables the check for that request. An error answers 400
// (fingerprint-failed).
type FingerprintFunc func(r *http.Request, body []byte) (string, error)

// Defaults applied by New to zero fields of Config.
const (
	// DefaultHeader is the request header of the IETF httpapi draft "The
	// Idempotency-Key HTTP Header Field", also used by Stripe.
	DefaultHeader = "Idempotency-Key"
	// DefaultReplayedHeader is the response header marking a replay
	// (Stripe's name); its value is "true".
	DefaultReplayedHeader = "Idempotent-Replayed"
	// DefaultMaxKeyLength bounds keys (Config.Dedup.MaxKeyLength): 255
	// bytes (Stripe's bound); a UUID takes 36.
	DefaultMaxKeyLength = 255
	// DefaultMaxBodyBytes bounds the request body read for the key and the
	// fingerprint: 1 MiB.
	DefaultMaxBodyBytes = 1 << 20
	// DefaultMaxResponseBytes bounds a stored response body: 256 KiB. With
	// large stored headers a record can still exceed what a store holds (a
	// DynamoDB item is 400 KB): the record is then completed without the
	// response, and a retry gets 409 response-not-stored.
	DefaultMaxResponseBytes = 256 << 10
	// DefaultRetryAfter is the Retry-After of 409 (request-in-progress) and
	// 503 (store-unavailable): 1s.
	DefaultRetryAfter = time.Second
	// DefaultProblemTypeBase prefixes the problem type names (key-missing,
	// request-in-progress, ...) to form the "type" URI of problem+json
	// bodies: the README section of each problem.
	DefaultProblemTypeBase = "https://github.com/watermill-dedup/watermill-dedup/blob/main/httpdedup/README.md#"
)

// DefaultRequestID is the default Config.RequestID: the request's
// X-Request-Id header (set by many proxies and clients), "" when absent.
func DefaultRequestID(r *http.Request) string { return r.Header.Get("X-Request-Id") }

// DefaultStoredHeaders are the response headers stored and replayed when
// Config.StoredHeaders is nil. They describe the representation (its type,
// encoding, language, validators, caching and links) or the created resource
// (Location, Content-Location), so the replay means what the original meant.
// Headers tied to one attempt are left out: Set-Cookie (a session must not be
// handed out again), Date, request ids and tracing headers; Content-Length is
// recomputed.
var DefaultStoredHeaders = []string{
	"Cache-Control",
	"Content-Encoding",
	"Content-Language",
	"Content-Location",
	"Content-Type",
	"ETag",
	"Last-Modified",
	"Link",
	"Location",
	"Vary",
}

// DefaultStoreResponse stores every final response below 500 except those
// whose status says "try again later": 408 Request Timeout, 409 Conflict,
// 423 Locked, 425 Too Early and 429 Too Many Requests.
//
// 2xx is the effect the key protects. 4xx are stored too (as Stripe does):
// the handler ran and decided, and a retry with the same key must get the
// same answer (a 400 validation error stays a 400) rather than run again
// with possibly different state; a client that fixes its request sends a new
// key. 3xx are final answers as well. 5xx are never stored: the claim is
// released so that the client's retry runs the operation again.
func DefaultStoreResponse(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusLocked,
		http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status >= 200 && status < 500
}

// Config configures a Middleware. It is passed by value; New never writes
// to the caller's copy. Its claim configuration is a dedup.Config (Dedup),
// as lambdadedup's is; the other fields are HTTP's. Zero values take their
// defaults; negative durations are configuration errors, never "forever".
type Config struct {
	// Dedup is the claim configuration, the same as the Watermill
	// middleware's and lambdadedup's: the engine's own fields, defaults and
	// rules (see dedup.Config; New checks it with dedup.NewEngine). Store is
	// required: share it (and its key prefix) with every replica of the
	// API; the same store can serve message consumers too, scopes keep them
	// apart. Lease is how long a crashed instance's claim holds a key before
	// a retry may run the handler again, Retention how long a completed key
	// is replayed; Complete, Release and Extend run within StoreTimeout even
	// after the client went away, and when Complete still fails after
	// CompleteRetries the response is sent anyway and the record stays in
	// progress until its lease ends (retries get 409). Decisions go to
	// Logger (a client's key reuse at info level, not as an error) and
	// Observer with Handler "METHOD route" and Topic "http". Logger left
	// nil is dedup.DefaultLogger(): what is logged at error level (the
	// server's problems: store_error, claim_lost, fail_open) reaches
	// log/slog's default logger (slog.Default(), so slog.SetDefault
	// applies) at slog.LevelError, and nothing else: a client's problems
	// (no key, a key reused: 400, 422) are at info level and not written;
	// watermill.NopLogger{} logs nothing at all. Tracer's spans
	// are parented by the request's span when otelhttp runs first. For HTTP:
	//
	//   - Scope must be empty (New refuses one): the scope of each record
	//     is its request's caller, method and route (see Scope).
	//   - Key, Fingerprint and TransportIDs take a message's key; New
	//     refuses them: a request's are Config.Key (BodyKey adapts a
	//     message key function) and Config.Fingerprint. Replay is not used:
	//     a completed key's response is always stored and replayed.
	//   - MaxKeyLength defaults to 255 (DefaultMaxKeyLength), not 1024:
	//     a longer key gets 400 (key-invalid), as does one outside the
	//     rule of CheckKey.
	//   - InProgressWait makes a request whose key is in flight wait for
	//     the first request instead of getting 409 at once: it then gets
	//     that request's stored response (a replay), or runs the handler
	//     itself if the first request's claim was released (its handler
	//     failed); after the wait, or when the client goes away, 409. The
	//     waiting request holds its connection. See docs/waiting.md.
	//   - Shadow runs the handler for every request, as if the middleware
	//     were not there, while claiming, completing and releasing records
	//     as usual: a team turns Idempotency-Key on in production and sees
	//     what it would do (would_skip, would_reject decisions) before
	//     clients see it. A retry of a completed key runs the handler again
	//     and gets its fresh response (never a replay); a request the
	//     middleware would refuse (key missing on a Require route, key
	//     malformed, caller not identified, fingerprint failed, key in
	//     flight or reused) runs too. A body over MaxBodyBytes (or
	//     unreadable) is still refused, and a response the middleware
	//     cannot buffer (streamed, hijacked, over MaxResponseBytes) still
	//     fails.
	//   - FailOpen runs the handler unclaimed when the store cannot be
	//     reached for the claim: its response is sent and nothing is
	//     stored, where the request would get 503 (store-unavailable).
	Dedup dedup.Config

	// Identity says who is calling. Required; see IdentityFunc and
	// StaticIdentity.
	Identity IdentityFunc

	// InTransaction, when set, runs each claimed request's handler inside a
	// database transaction in which the middleware also stores the response
	// and completes the key, so that the handler's rows, the stored response
	// and the completed key commit together or not at all: a crash before
	// COMMIT leaves neither (the retry runs the handler once the lease
	// ends), and a response that is not stored (5xx, a status StoreResponse
	// refuses, too large, streamed) rolls the handler's rows back with the
	// released key. Pass the method of the PostgreSQL store given as
	// Dedup.Store: InTransaction: store.RunInTx (stores/postgres); the
	// handler finds the transaction with postgres.TxFromContext(r.Context())
	// and writes through it. If the transaction cannot be committed the
	// client gets 503 (not-committed) and the key is released; when
	// COMMIT's outcome is unknown (the connection broke during it) and it
	// went through, the key is completed and the client's retry gets the
	// stored response. With Dedup.Shadow, a request the middleware would
	// refuse (no key, caller not identified) also runs in a transaction,
	// committed without completing anything. Cost: one pooled connection
	// held while the handler runs, and BEGIN and COMMIT around the
	// completion. Defaults to nil: the response is stored by a separate
	// Complete after the handler, and a crash between the handler's effect
	// and that Complete lets the retry run the effect again.
	InTransaction func(ctx context.Context, work func(ctx context.Context) ([]byte, error)) ([]byte, error)

	// Key takes the idempotency key out of the request. Defaults to
	// HeaderKey(DefaultHeader): the Idempotency-Key header, quoted (IETF
	// draft) or not (Stripe). Webhook receivers use the provider's event id:
	// HeaderKey("Webhook-Id") or BodyKey(keyfuncs.JSON("id")).
	Key KeyFunc

	// Route names the operation. Defaults to DefaultRoute: the ServeMux
	// pattern without its method ("/payments/{id}/refunds") when the
	// middleware wraps a single route, else the request's escaped path.
	Route RouteFunc

	// Fingerprint hashes the request. Defaults to DefaultFingerprint
	// (method, path and query, body). NoFingerprint disables the check.
	Fingerprint FingerprintFunc

	// StoreResponse decides from the handler's status whether the response
	// is stored (and replayed to later requests with the same key) or the
	// claim released (so that a retry runs the handler again). Defaults to
	// DefaultStoreResponse: every status below 500 except 408, 409, 423, 425
	// and 429.
	StoreResponse func(status int) bool

	// StoredHeaders names the response headers stored and replayed with
	// status and body. Defaults to DefaultStoredHeaders; an empty non-nil
	// slice stores none. The original response carries every header the
	// handler set.
	StoredHeaders []string

	// ReplayedHeader is set to "true" on replayed responses. Defaults to
	// "Idempotent-Replayed".
	ReplayedHeader string

	// MaxBodyBytes bounds the request body, read into memory once for the
	// key and the fingerprint and handed to the handler from there. A
	// longer body gets 413 (body-too-large). Defaults to 1 MiB.
	MaxBodyBytes int64

	// MaxResponseBytes bounds the response body, buffered in memory until
	// the handler returns. A handler writing more gets ErrNotStorable from
	// Write; its effect is recorded (the record completed without the
	// response, as when the store cannot hold it), and the client and every
	// retry get 409 (response-not-stored): the handler does not run again.
	// Defaults to 256 KiB; stay below what the store holds per record
	// (DynamoDB: 400 KB).
	MaxResponseBytes int

	// RetryAfter is the Retry-After sent with 409 (request-in-progress) and
	// 503 (store-unavailable), rounded up to whole seconds. Defaults to 1s.
	RetryAfter time.Duration

	// RequestID names the request for its record: the record of a key
	// keeps its first claim's request id (dedup.Origin.TransportID) beside
	// when it was claimed and completed (dedupctl inspect shows them). It
	// is never part of the key. "" for none. Defaults to DefaultRequestID:
	// the X-Request-Id header.
	RequestID func(r *http.Request) string

	// ProblemTypeBase prefixes the problem names to form the "type" member
	// of problem+json bodies. Defaults to DefaultProblemTypeBase.
	ProblemTypeBase string
}

func (c *Config) setDefaults() {
	if c.Dedup.MaxKeyLength == 0 {
		c.Dedup.MaxKeyLength = DefaultMaxKeyLength // HTTP's bound, not the engine's 1024
	}
	if c.Dedup.Logger == nil {
		c.Dedup.Logger = dedup.DefaultLogger() // the middleware logs decisions of its own
	}
	if c.Key == nil {
		c.Key = HeaderKey(DefaultHeader)
	}
	if c.Route == nil {
		c.Route = DefaultRoute
	}
	if c.Fingerprint == nil {
		c.Fingerprint = DefaultFingerprint
	}
	if c.StoreResponse == nil {
		c.StoreResponse = DefaultStoreResponse
	}
	if c.StoredHeaders == nil {
		c.StoredHeaders = DefaultStoredHeaders
	}
	canonical := make([]string, len(c.StoredHeaders)) // never write to the caller's slice
	for i, h := range c.StoredHeaders {
		canonical[i] = textproto.CanonicalMIMEHeaderKey(h)
	}
	c.StoredHeaders = canonical
	if c.ReplayedHeader == "" {
		c.ReplayedHeader = DefaultReplayedHeader
	}
	c.ReplayedHeader = textproto.CanonicalMIMEHeaderKey(c.ReplayedHeader)
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	if c.RequestID == nil {
		c.RequestID = DefaultRequestID
	}
	if c.ProblemTypeBase == "" {
		c.ProblemTypeBase = DefaultProblemTypeBase
	}
}

// Validate reports every problem in the configuration at once (joined with
// errors.Join), after applying defaults to a copy. Zero values are not
// problems: they take their defaults.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	// The claim's rules (Store, Lease, Retention, Heartbeat and the other
	// durations) are the engine's, stated once in package dedup.
	if _, err := dedup.NewEngine(c.engineConfig()); err != nil {
		if joined, ok := err.(interface{ Unwrap() []error }); ok {
			errs = append(errs, joined.Unwrap()...) // one list of problems
		} else {
			errs = append(errs, err)
		}
	}
	if c.Dedup.Scope != "" {
		errs = append(errs, fmt.Errorf("httpdedup: Config.Dedup.Scope must be empty, got %q: the scope of each record is its request's caller, method and route (httpdedup.Scope)", c.Dedup.Scope))
	}
	for _, f := range []struct {
		name, instead string
		set           bool
	}{
		{"Key", "Config.Key, a KeyFunc (HeaderKey; BodyKey adapts a message key function)", c.Dedup.Key != nil},
		{"Fingerprint", "Config.Fingerprint, a FingerprintFunc", c.Dedup.Fingerprint != nil},
		{"TransportIDs", "Config.RequestID to name the request in its record (a request id is never part of the key)", c.Dedup.TransportIDs != nil},
	} {
		if f.set {
			errs = append(errs, fmt.Errorf("httpdedup: Config.Dedup.%s takes a message's key and is not used for requests: leave it nil and set %s", f.name, f.instead))
		}
	}
	if c.Identity == nil {
		errs = append(errs, errors.New("httpdedup: Config.Identity is required (StaticIdentity for a single caller)"))
	}
	if c.RetryAfter < 0 {
		errs = append(errs, fmt.Errorf("%w: Config.RetryAfter must not be negative, got %v", dedup.ErrInvalidDuration, c.RetryAfter))
	}
	for _, n := range []struct {
		name string
		v    int64
	}{
		{"MaxBodyBytes", c.MaxBodyBytes}, {"MaxResponseBytes", int64(c.MaxResponseBytes)},
	} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("httpdedup: Config.%s must not be negative, got %d", n.name, n.v))
		}
	}
	for _, h := range c.StoredHeaders {
		if !validHeaderName(h) {
			errs = append(errs, fmt.Errorf("httpdedup: Config.StoredHeaders: %q is not a valid header name", h))
		}
		if h == "Content-Length" || h == "Transfer-Encoding" {
			errs = append(errs, fmt.Errorf("httpdedup: Config.StoredHeaders: %s is computed for each response and cannot be stored", h))
		}
	}
	if !validHeaderName(c.ReplayedHeader) {
		errs = append(errs, fmt.Errorf("httpdedup: Config.ReplayedHeader: %q is not a valid header name", c.ReplayedHeader))
	}
	return errors.Join(errs...)
}

// engineConfig is the configuration of the middleware's engine (after
// setDefaults): Dedup, with a Logger that logs a client's key reuse at
// info level.
func (c Config) engineConfig() dedup.Config {
	ec := c.Dedup
	ec.Logger = engineLogger(c.Dedup.Logger)
	return ec
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
