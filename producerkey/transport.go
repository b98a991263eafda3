package producerkey

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/watermill-dedup/watermill-dedup/httpdedup"
)

// Header is the request header Transport sets, from the IETF httpapi draft
// "The Idempotency-Key HTTP Header Field" (and Stripe's API).
const Header = "Idempotency-Key"

// ErrIntentReused is returned by Transport.RoundTrip when one intent (one
// context from NewIntent or WithKey) is used for two different requests:
// another method or URL than the first request made with it (a redirect
// that http.Client follows excepted: that is the same request). Sharing the
// key would make the server replay the first request's response for the
// second.
var ErrIntentReused = errors.New("producerkey: one intent used for two different requests")

// intent is the key of one intent, bound to the first request made with it.
type intent struct {
	mu     sync.Mutex
	key    string // "" until first use (NewIntent)
	given  bool   // the key is the caller's (WithKey)
	target string // method and URL of the first request; "" until then
}

type intentKey struct{}

// NewIntent returns a context marking one intent: every request made with
// it (and every retry, made with the same context) carries one random key,
// made when the first request goes out. Use a new one for each intent.
func NewIntent(ctx context.Context) context.Context {
	return context.WithValue(ctx, intentKey{}, &intent{})
}

// WithKey is NewIntent with a key of the caller's, typically derived from
// the business fact ("order-42-charge"), so that a process restarted
// between two attempts sends the same key again. A key httpdedup would
// refuse (the HTTP key rule of httpdedup.CheckKey: printable ASCII, up to
// 255 bytes, no space at either end) fails the request in
// Transport.RoundTrip with an error matching dedup.ErrNoKey and
// httpdedup.ErrKeyInvalid, before anything is sent: it is never replaced
// by a random key, which would not survive the restart.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, intentKey{}, &intent{key: key, given: true})
}

// KeyFromContext returns the key of the intent marked on ctx, once a
// request has been made with it (NewIntent) or at once (WithKey).
func KeyFromContext(ctx context.Context) (string, bool) {
	in, ok := ctx.Value(intentKey{}).(*intent)
	if !ok {
		return "", false
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.key, in.key != ""
}

// keyFor returns the intent's key for req, making it on first use, or
// ErrIntentReused when req is not the request the intent was first used
// for. A redirect that http.Client follows (req.Response set: a 307 or 308
// resends the POST elsewhere) is the same request and keeps the key.
func (in *intent) keyFor(req *http.Request) (string, error) {
	target := req.Method + " " + req.URL.String()
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.given {
		if err := httpdedup.CheckKey(in.key); err != nil {
			return "", fmt.Errorf("producerkey: the key given to WithKey: %w", err)
		}
	}
	switch {
	case in.target == "":
		in.target = target
	case in.target != target && req.Response == nil:
		return "", fmt.Errorf("%w: first %s, now %s", ErrIntentReused, in.target, target)
	}
	if in.key == "" {
		in.key = newKey()
	}
	return in.key, nil
}

// Transport is an http.RoundTripper that sets one Idempotency-Key per intent
// on POST and PATCH requests (the methods RFC 9110 does not call
// idempotent), and passes them to Base. The zero value is ready to use.
//
// The key comes, in this order, from: the request's own header (a key the
// caller set is kept); the intent marked on the request's context
// (NewIntent, WithKey), so a retrying client wrapper above the Transport
// resends the same key; else a new random key for this RoundTrip call,
// which is one intent, right when retries happen in Base. Other methods
// pass through unchanged. Cost: 16 bytes from crypto/rand per intent and a
// shallow clone of the request.
type Transport struct {
	// Base sends the requests. Defaults to http.DefaultTransport.
	Base http.RoundTripper
}

// RoundTrip implements http.RoundTripper. It does not modify req: the
// header is set on a clone. It returns ErrIntentReused (wrapped) without
// sending anything when the context's intent belongs to another request.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if (req.Method != http.MethodPost && req.Method != http.MethodPatch) || req.Header.Get(Header) != "" {
		return base.RoundTrip(req)
	}
	key := ""
	if in, ok := req.Context().Value(intentKey{}).(*intent); ok {
		var err error
		if key, err = in.keyFor(req); err != nil {
			if req.Body != nil {
				_ = req.Body.Close() // RoundTrip must close the body, even on errors
			}
			return nil, err
		}
	} else {
		key = newKey()
	}
	req = req.Clone(req.Context())
	req.Header.Set(Header, key)
	return base.RoundTrip(req)
}
