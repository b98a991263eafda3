package httpdedup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
)

// Middleware is the Idempotency-Key middleware. Create it with New and wrap
// each route with Require or Optional. It is safe for concurrent use.
type Middleware struct {
	cfg    Config
	engine *dedup.Engine
}

// New validates config, applies its defaults and returns a Middleware. A
// configuration problem fails here, not on the first request.
func New(config Config) (*Middleware, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config.setDefaults()
	engine, err := dedup.NewEngine(config.engineConfig())
	if err != nil {
		return nil, err
	}
	return &Middleware{cfg: config, engine: engine}, nil
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
//     handler that flushes or hijacks gets ErrNotStorable, the claim is
//     released and the client gets 500 (response-not-storable). One that
//     writes more than MaxResponseBytes gets ErrNotStorable from Write; its
//     effect is recorded (the record completed without the response) and
//     the client, and every retry, gets 409 (response-not-stored);
//   - key completed with the same fingerprint: the stored response is
//     replayed (status, stored headers, body byte for byte) with
//     Idempotent-Replayed: true, without calling next;
//   - key in flight: 409 (request-in-progress) with Retry-After; with
//     Config.Dedup.InProgressWait, first a wait for the request in flight
//     to finish, then its replay (or the handler runs, if it failed);
//   - key used with a different fingerprint: 422 (key-reused);
//   - store unreachable: 503 (store-unavailable) with Retry-After; next
//     does not run (fail closed). With Config.Dedup.FailOpen, next runs
//     unclaimed and its response is sent, not stored.
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

// decisionHandler is the Handler of a request's decisions, a label of
// metrics: the method and the ServeMux pattern that matched ("POST
// /payments/{id}"), or the method and "*" when none has matched yet (the
// middleware wraps a whole mux). Never the raw path, so that the number of
// series stays bounded whatever the requests; methods outside RFC 9110's
// are "OTHER".
func decisionHandler(r *http.Request) string {
	method := r.Method
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
	default:
		method = "OTHER"
	}
	if r.Pattern == "" {
		return method + " *"
	}
	return method + " " + DefaultRoute(r)
}

// requestInfo is what every decision about one request carries.
type requestInfo struct {
	handler string // "METHOD route"
	key     string // scoped key, "" before it is known
}

// request is one request on its way through the middleware.
type request struct {
	w    http.ResponseWriter
	r    *http.Request
	next http.Handler
	body *requestBody
	info requestInfo
	// overLimit: the handler's response passed MaxResponseBytes; the
	// record was completed without it (see errOverLimit).
	overLimit bool
}

// shadowed runs next for a request the middleware would refuse with dec
// (logged would_reject), when Config.Dedup.Shadow is on, and reports
// whether it did. With Config.InTransaction it runs as the engine's shadow
// runs do: in a transaction of its own, committed without completing
// anything, its response sent once the transaction is over.
func (m *Middleware) shadowed(req *request, dec dedup.Decision) bool {
	if !m.cfg.Dedup.Shadow {
		return false
	}
	dec.Event = event.WouldReject
	m.decide(req.info, dec)
	req.body.restore(req.r)
	if m.cfg.InTransaction == nil {
		req.next.ServeHTTP(req.w, req.r)
		return true
	}
	var resp Response
	_, err := m.cfg.InTransaction(dedup.WithUnclaimedRun(req.r.Context()), func(ctx context.Context) ([]byte, error) {
		var err error
		resp, err = m.runHandler(req.r.WithContext(ctx), req.next)
		if m.overLimit(req, err) {
			return nil, nil
		}
		return nil, err
	})
	// Outcome Acquired: the handler ran, so a failed COMMIT is answered
	// not-committed.
	m.respond(req, resp, dedup.ClaimResult{Outcome: dedup.Acquired}, err)
	return true
}

// serve handles one request: the key, then the call (caller, scope,
// fingerprint), then the engine, then the response for its outcome. Each
// step answers the client itself when it refuses the request.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler, required bool) {
	req := &request{w: w, r: r, next: next, body: &requestBody{w: w, r: r, limit: m.cfg.MaxBodyBytes}, info: requestInfo{handler: decisionHandler(r)}}
	key, err := m.cfg.Key(r, req.body.get)
	if err == nil {
		err = checkKey(key, m.cfg.Dedup.MaxKeyLength)
	}
	if errors.Is(err, ErrKeyMissing) && !required && !errors.Is(err, ErrBodyTooLarge) {
		req.body.restore(r)
		next.ServeHTTP(w, r)
		return
	}
	if err != nil {
		if !m.bodyProblem(req, err) && m.shadowed(req, dedup.Decision{Event: event.KeyMissing, Err: err}) {
			return
		}
		m.refuseKey(req, err)
		return
	}
	call, ok := m.call(req, key)
	if !ok {
		return
	}
	resp, res, err := m.run(req, call, next)
	m.respond(req, resp, res, err)
}

// bodyProblem reports whether the key could not be read because the body
// could not.
func (m *Middleware) bodyProblem(req *request, err error) bool {
	return errors.Is(err, ErrBodyTooLarge) || req.body.read && req.body.err != nil && errors.Is(err, req.body.err) && !errors.Is(err, ErrKeyMissing)
}

// refuseKey answers a request whose key could not be read.
func (m *Middleware) refuseKey(req *request, err error) {
	m.decide(req.info, dedup.Decision{Event: event.KeyMissing, Err: err})
	switch {
	case m.bodyProblem(req, err):
		m.refuseBody(req, err)
	case errors.Is(err, ErrKeyMissing):
		m.problem(req.w, http.StatusBadRequest, ProblemKeyMissing, "Idempotency key missing",
			"This operation requires an idempotency key"+keyReason(err)+".")
	default:
		m.problem(req.w, http.StatusBadRequest, ProblemKeyInvalid, "Idempotency key invalid",
			"The idempotency key is malformed"+keyReason(err)+".")
	}
}

// call identifies the caller, reads the body and fingerprints the request:
// the engine's call for key. It answers the client and returns false when
// one of them fails.
func (m *Middleware) call(req *request, key string) (dedup.Call, bool) {
	scope, ok := m.scope(req)
	if !ok {
		return dedup.Call{}, false
	}
	req.info.key = admin.ScopedKey(scope, key)
	b, ok := m.readBody(req)
	if !ok {
		return dedup.Call{}, false
	}
	fingerprint, err := m.cfg.Fingerprint(req.r, b)
	if err != nil {
		dec := dedup.Decision{Event: event.KeyMissing, Key: req.info.key, Err: fmt.Errorf("fingerprint: %w", err)}
		if m.shadowed(req, dec) {
			return dedup.Call{}, false
		}
		m.decide(req.info, dec)
		m.problem(req.w, http.StatusBadRequest, ProblemFingerprintFailed, "Request cannot be fingerprinted", err.Error()+".")
		return dedup.Call{}, false
	}
	return dedup.Call{Scope: scope, Key: key, Fingerprint: fingerprint, Handler: req.info.handler, Topic: "http"}, true
}

// scope is the request's scope: caller, method and route. It answers 401
// and returns false when the caller is not identified.
func (m *Middleware) scope(req *request) (string, bool) {
	identity, err := m.cfg.Identity(req.r)
	if err == nil && identity == "" {
		err = errors.New("httpdedup: Identity returned an empty identity")
	}
	if err != nil {
		dec := dedup.Decision{Event: event.KeyMissing, Err: fmt.Errorf("identifying the caller: %w", err)}
		if m.shadowed(req, dec) {
			return "", false
		}
		m.decide(req.info, dec)
		m.problem(req.w, http.StatusUnauthorized, ProblemUnidentifiedCaller, "Caller not identified",
			"Requests with an idempotency key must be authenticated.")
		return "", false
	}
	return Scope(identity, req.r.Method, m.cfg.Route(req.r)), true
}

// readBody reads the body (if the key function has not) and gives it back
// to the handler. It answers 413 or 400 and returns false when it cannot.
func (m *Middleware) readBody(req *request) ([]byte, bool) {
	b, err := req.body.get()
	if err != nil {
		m.decide(req.info, dedup.Decision{Event: event.KeyMissing, Key: req.info.key, Err: err})
		m.refuseBody(req, err)
		return nil, false
	}
	req.body.restore(req.r)
	return b, true
}

// refuseBody answers a request whose body could not be read: 413 when it
// is over MaxBodyBytes, else 400.
func (m *Middleware) refuseBody(req *request, err error) {
	if errors.Is(err, ErrBodyTooLarge) {
		m.problem(req.w, http.StatusRequestEntityTooLarge, ProblemBodyTooLarge, "Request body too large",
			fmt.Sprintf("The request body is longer than %d bytes.", m.cfg.MaxBodyBytes))
		return
	}
	m.problem(req.w, http.StatusBadRequest, ProblemBodyUnreadable, "Request body unreadable", "The request body could not be read.")
}

// run hands the call to the engine, whose work runs next with a buffering
// ResponseWriter (inside Config.InTransaction when set) and returns the
// response to store. resp is what next wrote, if it ran.
func (m *Middleware) run(req *request, call dedup.Call, next http.Handler) (resp Response, res dedup.ClaimResult, err error) {
	info := &dedup.RecordDetails{}
	work := func(ctx context.Context) ([]byte, error) {
		var err error
		resp, err = m.runHandler(req.r.WithContext(ctx), next)
		if m.overLimit(req, err) {
			return nil, nil // completed without the response: the effect is recorded
		}
		if err != nil {
			return nil, err
		}
		info.ResponseStatus = resp.Status
		return m.storedResponse(resp), nil
	}
	if m.cfg.InTransaction != nil {
		inner := work
		work = func(ctx context.Context) ([]byte, error) { return m.cfg.InTransaction(ctx, inner) }
	}
	ctx := dedup.WithRecordDetails(req.r.Context(), info)
	if id := m.cfg.RequestID(req.r); id != "" {
		ctx = dedup.WithOrigin(ctx, dedup.Origin{TransportID: id})
	}
	res, err = m.engine.Do(ctx, call, work)
	return resp, res, err
}

// respond answers the client for the engine's outcome.
func (m *Middleware) respond(req *request, resp Response, res dedup.ClaimResult, err error) {
	w := req.w
	var notStored *notStoredError
	switch {
	case req.overLimit && err == nil:
		m.problem(w, http.StatusConflict, ProblemResponseNotStored, "Request processed, response not stored",
			fmt.Sprintf("The request was processed, but its response is larger than the %d bytes the server keeps, so it can neither be sent nor replayed; do not retry: fetch the result another way.", m.cfg.MaxResponseBytes))
	case errors.As(err, &notStored) && notStored.sendAsIs:
		writeResponse(w, resp)
	case errors.As(err, &notStored):
		m.problem(w, http.StatusInternalServerError, ProblemResponseNotStorable, "Response not storable",
			"The response could not be stored for replay (streamed, hijacked or too large), so it was not sent; retry with the same key to run the request again.")
	case errors.Is(err, dedup.ErrInProgress):
		m.problem(w, http.StatusConflict, ProblemRequestInProgress, "Request in progress",
			"A request with this idempotency key is being processed; retry later to get its response.")
	case errors.Is(err, dedup.ErrKeyReuse):
		m.problem(w, http.StatusUnprocessableEntity, ProblemKeyReused, "Idempotency key reused",
			"This idempotency key was used with a different request; use a new key for a new request.")
	case errors.Is(err, dedup.ErrNoKey):
		m.problem(w, http.StatusBadRequest, ProblemKeyInvalid, "Idempotency key invalid",
			"The idempotency key is malformed"+keyReason(err)+".")
	case err != nil && res.Outcome == dedup.Acquired:
		// The handler ran but its work was not recorded: the transaction
		// of Config.InTransaction failed (its writes rolled back) and the
		// engine released the claim, logging the cause with the release.
		m.problem(w, http.StatusServiceUnavailable, ProblemNotCommitted, "Request not committed",
			"The request's work and its idempotency record could not be committed together; retry it with the same key: if the commit went through after all, the retry gets the stored response, otherwise it runs the request.")
	case err != nil:
		m.problem(w, http.StatusServiceUnavailable, ProblemStoreUnavailable, "Idempotency store unavailable",
			"The request was not processed; retry it with the same key.")
	case res.Outcome == dedup.Duplicate:
		m.replay(w, req.info, res.Result)
	default:
		writeResponse(w, resp)
	}
}

// replay sends a stored response, marked as replayed.
func (m *Middleware) replay(w http.ResponseWriter, info requestInfo, result []byte) {
	if len(result) == 0 {
		// The store could not hold the response (ErrResultTooLarge): the
		// effect is recorded, its response is not.
		m.problem(w, http.StatusConflict, ProblemResponseNotStored, "Request already processed",
			"A request with this idempotency key was processed, but its response was too large to store and cannot be replayed.")
		return
	}
	resp, err := DecodeResponse(result)
	if err != nil {
		m.decide(info, dedup.Decision{Event: event.StoreError, Op: "claim", Key: info.key, Err: fmt.Errorf("replaying %q: %w", info.key, err)})
		m.problem(w, http.StatusInternalServerError, ProblemStoredResponse, "Stored response unreadable",
			"The request was already processed, but its stored response cannot be decoded.")
		return
	}
	w.Header().Set(m.cfg.ReplayedHeader, "true")
	writeResponse(w, resp)
}

// errOverLimit marks a response whose body passed MaxResponseBytes, with
// a status StoreResponse accepts: the handler ran to its end, and its
// effect may have happened, so the record is completed without the
// response (as when the store cannot hold it) rather than released for a
// retry that would run the effect again.
var errOverLimit = errors.New("httpdedup: the response body exceeds MaxResponseBytes")

// overLimit reports whether err (from runHandler) is errOverLimit, and
// then marks the request and logs the lost response.
func (m *Middleware) overLimit(req *request, err error) bool {
	if !errors.Is(err, errOverLimit) {
		return false
	}
	req.overLimit = true
	m.decide(req.info, dedup.Decision{Event: event.StoreError, Key: req.info.key,
		Err: fmt.Errorf("completing the record without its response (over MaxResponseBytes, %d): %w", m.cfg.MaxResponseBytes, err)})
	return true
}

// notStoredError is what the work returns to have its claim released: the
// response is sent as is (a status StoreResponse refuses), or refused
// (ErrNotStorable: the client gets 500).
type notStoredError struct {
	sendAsIs bool
	err      error
}

func (e *notStoredError) Error() string { return e.err.Error() }
func (e *notStoredError) Unwrap() error { return e.err }

// runHandler runs next with a buffering ResponseWriter and returns what it
// wrote, or a *notStoredError when that must not be stored.
func (m *Middleware) runHandler(r *http.Request, next http.Handler) (Response, error) {
	cw := newCaptureWriter(m.cfg.MaxResponseBytes)
	next.ServeHTTP(cw, r)
	resp, err := cw.response()
	if err != nil && cw.overLimit && m.cfg.StoreResponse(cw.status) {
		return resp, fmt.Errorf("%w: %w", errOverLimit, err)
	}
	if err != nil {
		return resp, &notStoredError{err: err}
	}
	if !cw.wrote() {
		// Returned without writing (after the client hung up, say): the
		// effect may not have happened, so nothing is stored for replay.
		return resp, &notStoredError{sendAsIs: true, err: errors.New("the handler wrote no response")}
	}
	if !m.cfg.StoreResponse(resp.Status) {
		return resp, &notStoredError{sendAsIs: true, err: fmt.Errorf("status %d is not stored", resp.Status)}
	}
	return resp, nil
}

// storedResponse encodes what is kept of a response: status, body and the
// StoredHeaders.
func (m *Middleware) storedResponse(resp Response) []byte {
	stored := Response{Status: resp.Status, Header: http.Header{}, Body: resp.Body}
	for _, name := range m.cfg.StoredHeaders {
		if v, ok := resp.Header[name]; ok {
			stored.Header[name] = v
		}
	}
	return EncodeResponse(stored)
}

// keyReason is ": " and the client-facing reason of a key error of this
// package (see clientReason), or "" for other errors, whose text is not
// meant for clients.
func keyReason(err error) string {
	if reason, ok := clientReason(err); ok {
		return ": " + reason
	}
	return ""
}
