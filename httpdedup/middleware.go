package httpdedup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// Middleware is the Idempotency-Key middleware. Create it with New and wrap
// each route with Require or Optional. It is safe for concurrent use.
type Middleware struct {
	cfg Config
}

// New validates config, applies its defaults and returns a Middleware. A
// configuration problem fails here, not on the first request.
func New(config Config) (*Middleware, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config.setDefaults()
	return &Middleware{cfg: config}, nil
}

// Require wraps a route on which every request must carry a key: a request
// without one gets 400 problem+json (key-missing) and next is not called.
// Otherwise it behaves as Optional.
func (m *Middleware) Require(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next, true) })
}

// Optional wraps a route on which the key is optional. A request without a
// key passes through to next, unclaimed and with its body unread (when the
// KeyFunc reads only headers). A request with a key:
//
//   - malformed key: 400 (key-invalid); caller not identified: 401
//     (unidentified-caller); body over MaxBodyBytes: 413 (body-too-large);
//   - first use of the key (in its scope): the key is claimed, next runs
//     with a buffering ResponseWriter while a heartbeat extends the lease;
//     a response that StoreResponse accepts is stored (Complete) and then
//     sent; any other response releases the claim and is sent as is, so a
//     retry runs next again. A panic releases the claim and goes on. A
//     handler that flushes, hijacks or writes more than MaxResponseBytes
//     gets ErrNotStorable, the claim is released and the client gets 500
//     (response-not-storable);
//   - key completed with the same fingerprint: the stored response is
//     replayed (status, stored headers, body byte for byte) with
//     Idempotent-Replayed: true, without calling next;
//   - key in flight: 409 (request-in-progress) with Retry-After;
//   - key used with a different fingerprint: 422 (key-reused);
//   - store unreachable: 503 (store-unavailable) with Retry-After; next
//     does not run (fail closed).
//
// Cost: two store round trips for a first request (claim, complete), one for
// a replay or a refusal, plus one per heartbeat interval while next runs. The
// request body (up to MaxBodyBytes) and the response (up to
// MaxResponseBytes) are held in memory.
func (m *Middleware) Optional(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next, false) })
}

// requestBody reads the body once, bounded, and hands it to the handler.
type requestBody struct {
	w     http.ResponseWriter
	r     *http.Request
	limit int64
	read  bool
	b     []byte
	err   error
}

func (rb *requestBody) get() ([]byte, error) {
	if rb.read {
		return rb.b, rb.err
	}
	rb.read = true
	if rb.r.Body == nil || rb.r.Body == http.NoBody {
		return nil, nil
	}
	b, err := io.ReadAll(http.MaxBytesReader(rb.w, rb.r.Body, rb.limit))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		rb.err = fmt.Errorf("%w: more than %d bytes", ErrBodyTooLarge, rb.limit)
	case err != nil:
		rb.err = fmt.Errorf("httpdedup: reading the request body: %w", err)
	default:
		rb.b = b
	}
	return rb.b, rb.err
}

// restore gives the handler the body that was read.
func (rb *requestBody) restore(r *http.Request) {
	if !rb.read || rb.err != nil || r.Body == nil || r.Body == http.NoBody {
		return
	}
	b := rb.b
	r.Body = io.NopCloser(bytes.NewReader(b))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

// requestInfo is what every decision about one request carries.
type requestInfo struct {
	handler string // "METHOD route"
	key     string // scoped key, "" before it is known
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler, required bool) {
	body := &requestBody{w: w, r: r, limit: m.cfg.MaxBodyBytes}
	route := m.cfg.Route(r)
	info := requestInfo{handler: r.Method + " " + route}

	key, err := m.cfg.Key(r, body.get)
	if err == nil {
		err = checkKey(key, m.cfg.MaxKeyLength)
	}
	if err != nil {
		switch {
		case errors.Is(err, ErrBodyTooLarge):
			m.decide(info, dedup.Decision{Event: dedup.EventKeyMissing, Err: err})
			m.problem(w, http.StatusRequestEntityTooLarge, ProblemBodyTooLarge, "Request body too large",
				fmt.Sprintf("The request body is longer than %d bytes.", m.cfg.MaxBodyBytes))
		case errors.Is(err, ErrKeyMissing) && !required:
			body.restore(r)
			next.ServeHTTP(w, r)
		case errors.Is(err, ErrKeyMissing):
			m.decide(info, dedup.Decision{Event: dedup.EventKeyMissing, Err: err})
			m.problem(w, http.StatusBadRequest, ProblemKeyMissing, "Idempotency key missing",
				"This operation requires an idempotency key"+keyReason(err)+".")
		case body.read && body.err != nil && errors.Is(err, body.err):
			m.decide(info, dedup.Decision{Event: dedup.EventKeyMissing, Err: err})
			m.problem(w, http.StatusBadRequest, ProblemBodyUnreadable, "Request body unreadable", "The request body could not be read.")
		default:
			m.decide(info, dedup.Decision{Event: dedup.EventKeyMissing, Err: err})
			m.problem(w, http.StatusBadRequest, ProblemKeyInvalid, "Idempotency key invalid",
				"The idempotency key is malformed"+keyReason(err)+".")
		}
		return
	}

	identity, err := m.cfg.Identity(r)
	if err == nil && identity == "" {
		err = errors.New("httpdedup: Identity returned an empty identity")
	}
	if err != nil {
		m.decide(info, dedup.Decision{Event: dedup.EventKeyMissing, Err: fmt.Errorf("identifying the caller: %w", err)})
		m.problem(w, http.StatusUnauthorized, ProblemUnidentifiedCaller, "Caller not identified",
			"Requests with an idempotency key must be authenticated.")
		return
	}
	info.key = dedup.ScopedKey(Scope(identity, r.Method, route), key)

	b, err := body.get()
	if err != nil {
		m.decide(info, dedup.Decision{Event: dedup.EventKeyMissing, Key: info.key, Err: err})
		if errors.Is(err, ErrBodyTooLarge) {
			m.problem(w, http.StatusRequestEntityTooLarge, ProblemBodyTooLarge, "Request body too large",
				fmt.Sprintf("The request body is longer than %d bytes.", m.cfg.MaxBodyBytes))
		} else {
			m.problem(w, http.StatusBadRequest, ProblemBodyUnreadable, "Request body unreadable", "The request body could not be read.")
		}
		return
	}
	body.restore(r)
	fingerprint, err := m.cfg.Fingerprint(r, b)
	if err != nil {
		m.decide(info, dedup.Decision{Event: dedup.EventKeyMissing, Key: info.key, Err: fmt.Errorf("fingerprint: %w", err)})
		m.problem(w, http.StatusBadRequest, ProblemFingerprintFailed, "Request cannot be fingerprinted", err.Error()+".")
		return
	}

	claimCtx, cancel := context.WithTimeout(r.Context(), m.cfg.StoreTimeout)
	start := time.Now()
	res, err := m.cfg.Store.Claim(claimCtx, info.key, fingerprint, m.cfg.Lease)
	elapsed := time.Since(start)
	cancel()
	m.observeOp("claim", elapsed, err)
	if err == nil && (res.Outcome < dedup.Acquired || res.Outcome > dedup.Conflict) {
		err = fmt.Errorf("unknown outcome %v", res.Outcome)
	}
	if err != nil {
		err = &dedup.StoreError{Op: "claim", Key: info.key, Err: err}
		m.decide(info, dedup.Decision{Event: dedup.EventStoreError, Op: "claim", Key: info.key, Elapsed: elapsed, Err: err})
		m.problem(w, http.StatusServiceUnavailable, ProblemStoreUnavailable, "Idempotency store unavailable",
			"The request was not processed; retry it with the same key.")
		return
	}

	switch res.Outcome {
	case dedup.Acquired:
		m.decide(info, dedup.Decision{Event: dedup.EventClaimWon, Op: "claim", Key: info.key, Elapsed: elapsed})
		m.run(w, r, next, res.Claim, info)
	case dedup.Duplicate:
		resp, err := DecodeResponse(res.Result)
		if err != nil {
			err = fmt.Errorf("replaying %q: %w", info.key, err)
			m.decide(info, dedup.Decision{Event: dedup.EventStoreError, Op: "claim", Key: info.key, Elapsed: elapsed, Err: err})
			m.problem(w, http.StatusInternalServerError, ProblemStoredResponse, "Stored response unreadable",
				"The request was already processed, but its stored response cannot be decoded.")
			return
		}
		m.decide(info, dedup.Decision{Event: dedup.EventSkipDuplicate, Op: "claim", Key: info.key, Elapsed: elapsed})
		w.Header().Set(m.cfg.ReplayedHeader, "true")
		writeResponse(w, resp)
	case dedup.InProgress:
		m.decide(info, dedup.Decision{Event: dedup.EventInProgress, Op: "claim", Key: info.key, Elapsed: elapsed,
			Err: fmt.Errorf("%w: %q", dedup.ErrInProgress, info.key)})
		m.problem(w, http.StatusConflict, ProblemRequestInProgress, "Request in progress",
			"A request with this idempotency key is being processed; retry later to get its response.")
	case dedup.Conflict:
		m.decide(info, dedup.Decision{Event: dedup.EventKeyReuse, Op: "claim", Key: info.key, Elapsed: elapsed,
			Err: fmt.Errorf("%w: %q", dedup.ErrKeyReuse, info.key)})
		m.problem(w, http.StatusUnprocessableEntity, ProblemKeyReused, "Idempotency key reused",
			"This idempotency key was used with a different request; use a new key for a new request.")
	}
}

// keyReason is ": " and the client-facing reason of a *KeyError, or ""
// for other errors, whose text is not meant for clients.
func keyReason(err error) string {
	var ke *KeyError
	if errors.As(err, &ke) && ke.Reason != "" {
		return ": " + ke.Reason
	}
	return ""
}

// cleanupContext is for Complete, Release and Extend: they run even when the
// client went away, but never hang.
func (m *Middleware) cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StoreTimeout)
}

func (m *Middleware) run(w http.ResponseWriter, r *http.Request, next http.Handler, claim dedup.Claim, info requestInfo) {
	ctx := r.Context()
	claimedAt := m.cfg.Clock.Now()
	handlerCtx, cancelHandler := context.WithCancelCause(ctx)
	defer cancelHandler(nil)
	var hb *dedup.Heartbeat
	if !m.cfg.DisableHeartbeat {
		hb = dedup.StartHeartbeat(ctx, dedup.HeartbeatConfig{
			Store: m.cfg.Store, Claim: claim, Lease: m.cfg.Lease, Interval: m.cfg.Heartbeat,
			ClaimedAt: claimedAt, Clock: m.cfg.Clock, StoreTimeout: m.cfg.StoreTimeout,
			Lost:      cancelHandler,
			Decide:    func(d dedup.Decision) { m.decide(info, d) },
			ObserveOp: m.observeOp,
		})
	}

	cw := newCaptureWriter(m.cfg.MaxResponseBytes)
	panicked := true
	defer func() {
		if panicked {
			// The panic (or runtime.Goexit) goes on after this function
			// returns; net/http then drops the connection. The claim is
			// released first so that the client's retry runs again.
			hb.Stop()
			m.release(ctx, claim, info, claimedAt, errors.New("handler panicked"))
		}
	}()
	next.ServeHTTP(cw, r.WithContext(handlerCtx))
	panicked = false
	hb.Stop()

	resp, err := cw.response()
	if err != nil {
		m.release(ctx, claim, info, claimedAt, err)
		m.problem(w, http.StatusInternalServerError, ProblemResponseNotStorable, "Response not storable",
			"The response could not be stored for replay (streamed, hijacked or too large), so it was not sent; retry with the same key to run the request again.")
		return
	}
	if !m.cfg.StoreResponse(resp.Status) {
		m.release(ctx, claim, info, claimedAt, fmt.Errorf("status %d is not stored", resp.Status))
		writeResponse(w, resp)
		return
	}
	stored := Response{Status: resp.Status, Header: http.Header{}, Body: resp.Body}
	for _, name := range m.cfg.StoredHeaders {
		if v, ok := resp.Header[name]; ok {
			stored.Header[name] = v
		}
	}
	m.complete(ctx, claim, info, claimedAt, EncodeResponse(stored))
	writeResponse(w, resp)
}

func (m *Middleware) release(ctx context.Context, claim dedup.Claim, info requestInfo, claimedAt time.Time, cause error) {
	rctx, cancel := m.cleanupContext(ctx)
	defer cancel()
	start := time.Now()
	err := m.cfg.Store.Release(rctx, claim)
	m.observeOp("release", time.Since(start), err)
	elapsed := m.cfg.Clock.Now().Sub(claimedAt)
	switch {
	case err == nil:
		m.decide(info, dedup.Decision{Event: dedup.EventReleased, Op: "release", Key: claim.Key, Elapsed: elapsed, Err: cause})
	case errors.Is(err, dedup.ErrClaimLost):
		m.decide(info, dedup.Decision{Event: dedup.EventClaimLost, Op: "release", Key: claim.Key, Elapsed: elapsed,
			Err: fmt.Errorf("releasing after %v: %w", cause, err)})
	default:
		// The record stays in progress until its lease ends; retries get 409
		// until then.
		m.decide(info, dedup.Decision{Event: dedup.EventStoreError, Op: "release", Key: claim.Key, Elapsed: elapsed,
			Err: &dedup.StoreError{Op: "release", Key: claim.Key, Err: err}})
	}
}

func (m *Middleware) complete(ctx context.Context, claim dedup.Claim, info requestInfo, claimedAt time.Time, result []byte) {
	var err error
	backoff := m.cfg.CompleteBackoff
	for attempt := 0; ; attempt++ {
		cctx, cancel := m.cleanupContext(ctx)
		start := time.Now()
		err = m.cfg.Store.Complete(cctx, claim, result, m.cfg.Retention)
		m.observeOp("complete", time.Since(start), err)
		cancel()
		if err == nil || errors.Is(err, dedup.ErrClaimLost) || errors.Is(err, dedup.ErrInvalidDuration) || attempt >= m.cfg.CompleteRetries {
			break
		}
		sleep(m.cfg.Clock, backoff, nil)
		backoff *= 2
	}
	elapsed := m.cfg.Clock.Now().Sub(claimedAt)
	switch {
	case err == nil:
		m.decide(info, dedup.Decision{Event: dedup.EventCompleted, Op: "complete", Key: claim.Key, Elapsed: elapsed})
	case errors.Is(err, dedup.ErrClaimLost):
		m.decide(info, dedup.Decision{Event: dedup.EventClaimLost, Op: "complete", Key: claim.Key, Elapsed: elapsed,
			Err: fmt.Errorf("the handler ran but the record was taken over before completing: %w", err)})
	default:
		// The response is sent anyway: the effect happened. The record stays
		// in progress until its lease ends.
		m.decide(info, dedup.Decision{Event: dedup.EventStoreError, Op: "complete", Key: claim.Key, Elapsed: elapsed,
			Err: &dedup.StoreError{Op: "complete", Key: claim.Key, Err: err}})
	}
}

// sleep waits d on clock, or returns early with false when quit closes.
func sleep(clock dedup.Clock, d time.Duration, quit <-chan struct{}) bool {
	t := clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-quit:
		return false
	}
}
