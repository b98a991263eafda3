package postgres_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// TestHTTPShadowRunsRefusedRequestsInTransaction: with Config.Shadow and
// Config.InTransaction every shadow run gets a transaction, as RunInTx
// promises: one the engine refuses (a duplicate) and one httpdedup itself
// refuses (no key on a Require route, a malformed key). (The latter ran
// next directly, outside InTransaction: a handler written for it,
// tx, _ := postgres.TxFromContext(ctx), found no transaction.)
func TestHTTPShadowRunsRefusedRequestsInTransaction(t *testing.T) {
	o := newOrders(t)
	idem, err := httpdedup.New(httpdedup.Config{
		Dedup:         dedup.Config{Store: o.store, Shadow: true},
		InTransaction: o.store.RunInTx,
		Identity:      httpdedup.StaticIdentity(paymentsScopeIdentity),
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	hadTx := map[string]bool{}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, ok := postgres.TxFromContext(r.Context())
		mu.Lock()
		hadTx[r.Header.Get("X-Case")] = ok
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, c := range []struct{ name, key string }{
		{"first", "k1"}, {"duplicate", "k1"}, {"no-key", ""}, {"malformed-key", strings.Repeat("k", 300)},
	} {
		req, _ := http.NewRequestWithContext(testCtx(t), http.MethodPost, srv.URL+"/payments", strings.NewReader(`{}`))
		req.Header.Set("X-Case", c.name)
		if c.key != "" {
			req.Header["Idempotency-Key"] = []string{c.key}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	for _, name := range []string{"first", "duplicate", "no-key", "malformed-key"} {
		if !hadTx[name] {
			t.Errorf("%s: the shadow run's handler had no transaction (cases: %v)", name, hadTx)
		}
	}
}
