package httpdedup_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// TestHandlerReadsTheFence: the handler of a request whose key was claimed
// reads the claim's fence from the request's context, and a later claim of
// the same key (after a failed response released it) reads a larger one.
func TestHandlerReadsTheFence(t *testing.T) {
	m, err := httpdedup.New(httpdedup.Config{Dedup: dedup.Config{Store: memstore.New(nil), Lease: time.Minute, Retention: time.Hour},
		Identity: httpdedup.StaticIdentity("acct")})
	if err != nil {
		t.Fatal(err)
	}
	var fences []uint64
	h := m.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := dedup.FenceFromContext(r.Context())
		if !ok {
			t.Error("the handler reads no fence")
		}
		fences = append(fences, f)
		if len(fences) == 1 {
			w.WriteHeader(http.StatusInternalServerError) // released: the retry claims again
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/payments", nil)
		req.Header.Set("Idempotency-Key", "pay-1")
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	if len(fences) != 2 || fences[0] == 0 || fences[1] <= fences[0] {
		t.Fatalf("fences %v: want two, the second larger", fences)
	}
}
