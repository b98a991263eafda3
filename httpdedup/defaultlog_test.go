package httpdedup_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/faultstore"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/slogcapture"
)

// TestNoLoggerWritesServerErrorsToSlog: with Dedup.Logger unset, a
// request the store fails (503) is written to slog's default logger at
// error level; a client's problems (a missing key, a key reused for
// another request: 400, 422) and requests that go well are not written.
// Not parallel: it sets slog's default logger.
func TestNoLoggerWritesServerErrorsToSlog(t *testing.T) {
	store := faultstore.New(memstore.New(nil))
	m, err := httpdedup.New(httpdedup.Config{Dedup: dedup.Config{Store: store}, Identity: httpdedup.StaticIdentity("acct")})
	if err != nil {
		t.Fatal(err)
	}
	rec := slogcapture.Capture(t)
	h := m.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	for _, step := range []struct {
		what       string
		key, body  string
		code       int
		fail       bool
		wantEvents int
	}{
		{"a fresh request", "k-1", `{"amount":150}`, http.StatusCreated, false, 0},
		{"its replay", "k-1", `{"amount":150}`, http.StatusCreated, false, 0},
		{"the key reused for another request", "k-1", `{"amount":90}`, http.StatusUnprocessableEntity, false, 0},
		{"no key", "", `{"amount":150}`, http.StatusBadRequest, false, 0},
		{"a store error", "k-2", `{"amount":150}`, http.StatusServiceUnavailable, true, 1},
	} {
		if step.fail {
			store.Inject("claim", errors.New("connection refused"))
		}
		var w *httptest.ResponseRecorder
		if step.key == "" {
			r := httptest.NewRequest(http.MethodPost, "/payments", nil)
			w = httptest.NewRecorder()
			h.ServeHTTP(w, r)
		} else {
			w = post(h, step.key, step.body)
		}
		if w.Code != step.code {
			t.Fatalf("%s: %d, want %d", step.what, w.Code, step.code)
		}
		var got []string
		for _, r := range rec.Take() {
			got = append(got, r.Level.String()+" "+slogcapture.Attr(r, "dedup_event"))
		}
		if len(got) != step.wantEvents || step.wantEvents == 1 && got[0] != "ERROR store_error" {
			t.Errorf("%s: slog records %q, want %d", step.what, got, step.wantEvents)
		}
	}
}
