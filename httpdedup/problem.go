package httpdedup

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Problem names: appended to Config.ProblemTypeBase they form the "type"
// member of the problem+json (RFC 9457) bodies the middleware sends. The
// README has a section for each.
const (
	ProblemKeyMissing          = "key-missing"             // 400
	ProblemKeyInvalid          = "key-invalid"             // 400
	ProblemBodyUnreadable      = "body-unreadable"         // 400
	ProblemFingerprintFailed   = "fingerprint-failed"      // 400
	ProblemUnidentifiedCaller  = "unidentified-caller"     // 401
	ProblemRequestInProgress   = "request-in-progress"     // 409
	ProblemBodyTooLarge        = "body-too-large"          // 413
	ProblemKeyReused           = "key-reused"              // 422
	ProblemResponseNotStorable = "response-not-storable"   // 500
	ProblemStoredResponse      = "stored-response-corrupt" // 500
	ProblemResponseNotStored   = "response-not-stored"     // 409, no Retry-After
	ProblemStoreUnavailable    = "store-unavailable"       // 503
	ProblemNotCommitted        = "not-committed"           // 503
)

// Problem is an RFC 9457 problem details object, as the middleware sends it
// with Content-Type application/problem+json.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// ProblemContentType is the media type of problem details (RFC 9457).
const ProblemContentType = "application/problem+json"

func (m *Middleware) problem(w http.ResponseWriter, status int, name, title, detail string) {
	body, _ := json.Marshal(Problem{Type: m.cfg.ProblemTypeBase + name, Title: title, Status: status, Detail: detail})
	h := w.Header()
	h.Set("Content-Type", ProblemContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	h.Set("Cache-Control", "no-store")
	if name == ProblemRequestInProgress || name == ProblemStoreUnavailable || name == ProblemNotCommitted {
		h.Set("Retry-After", strconv.FormatInt(int64((m.cfg.RetryAfter+time.Second-1)/time.Second), 10))
	}
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
