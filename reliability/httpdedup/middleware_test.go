package httpdedup_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
)

// api is POST /payments (key required) and POST /notes (key optional),
// both served by one payments handler behind one middleware.
type api struct {
	srv *httptest.Server
	h   http.Handler // the mux, for in-process requests
	pay *payments
}

func newAPI(t *testing.T, store dedup.Store, cfg httpdedup.Config) *api {
	t.Helper()
	cfg.Dedup.Store = store
	m := newMiddleware(t, cfg)
	a := &api{pay: &payments{}}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", m.Require(a.pay))
	mux.Handle("POST /notes", m.Optional(a.pay))
	mux.Handle("POST /refunds", m.Require(a.pay))
	a.h = mux
	a.srv = httptest.NewServer(mux)
	t.Cleanup(a.srv.Close)
	return a
}

func TestFirstRequestRunsThenReplays(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		a := newAPI(t, store, httpdedup.Config{})
		q := req{key: `"8e03978e-40d5-43e8-bc93-6894a57f9324"`, body: `{"amount":4200}`}

		first := mustSend(t, a.srv, q)
		if first.status != http.StatusCreated {
			t.Fatalf("first: status %d, body %s", first.status, first.body)
		}
		if first.header.Get("Idempotent-Replayed") != "" {
			t.Fatal("first response marked as replayed")
		}
		if first.header.Get("Set-Cookie") == "" || first.header.Get("X-Run") != "pay_1" {
			t.Fatalf("the first response lost the handler's headers: %v", first.header)
		}
		if !bytes.Contains(first.body, []byte(`"request":"{\"amount\":4200}"`)) {
			t.Fatalf("the handler did not get the request body: %s", first.body)
		}

		second := mustSend(t, a.srv, q)
		if got := a.pay.runs.Load(); got != 1 {
			t.Fatalf("handler ran %d times, want 1", got)
		}
		if second.status != first.status || !bytes.Equal(second.body, first.body) {
			t.Fatalf("replay %d %q, want %d %q", second.status, second.body, first.status, first.body)
		}
		if got := second.header.Get("Idempotent-Replayed"); got != "true" {
			t.Fatalf("Idempotent-Replayed = %q, want true", got)
		}
		for _, h := range []string{"Content-Type", "Location", "Content-Length"} {
			if second.header.Get(h) != first.header.Get(h) {
				t.Errorf("replayed %s = %q, first %q", h, second.header.Get(h), first.header.Get(h))
			}
		}
		for _, h := range []string{"Set-Cookie", "X-Run"} {
			if v := second.header.Get(h); v != "" {
				t.Errorf("replay carries %s: %q (not a stored header)", h, v)
			}
		}
	})
}

func TestQuotedAndBareKeysAreTheSameKey(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		a := newAPI(t, store, httpdedup.Config{})
		first := mustSend(t, a.srv, req{key: `"k-1"`, body: "x"})
		second := mustSend(t, a.srv, req{key: `k-1`, body: "x"})
		third := mustSend(t, a.srv, req{key: "  \"k-1\"\t", body: "x"})
		if a.pay.runs.Load() != 1 {
			t.Fatalf("handler ran %d times, want 1", a.pay.runs.Load())
		}
		for _, r := range []response{second, third} {
			if r.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.body, first.body) {
				t.Fatalf("not a replay of the first response: %d %s", r.status, r.body)
			}
		}
	})
}

func TestInFlightKeyGets409ThenReplay(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		pay := &payments{}
		blocking := newBlockingHandler(pay)
		m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store}})
		srv := httptest.NewServer(m.Require(blocking))
		t.Cleanup(srv.Close)
		t.Cleanup(blocking.unblock)
		q := req{key: "k-inflight", body: `{"amount":1}`}

		firstDone := make(chan response, 1)
		firstErr := make(chan error, 1)
		firstReq := q.build(t, srv.URL)
		go func() {
			r, err := send(srv, firstReq)
			firstErr <- err
			firstDone <- r
		}()
		recv(t, "the blocked handler to start", blocking.started)

		second := mustSend(t, srv, q)
		wantProblem(t, second, http.StatusConflict, httpdedup.ProblemRequestInProgress)
		if got := second.header.Get("Retry-After"); got != "1" {
			t.Fatalf("Retry-After = %q, want 1", got)
		}

		blocking.unblock()
		if err := recv(t, "the first request to end", firstErr); err != nil {
			t.Fatal(err)
		}
		first := recv(t, "the first response", firstDone)
		if first.status != http.StatusCreated {
			t.Fatalf("first: %d %s", first.status, first.body)
		}
		third := mustSend(t, srv, q)
		if third.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(third.body, first.body) {
			t.Fatalf("retry after completion: %d %s, want the replay of %s", third.status, third.body, first.body)
		}
		if blocking.runs.Load() != 1 {
			t.Fatalf("handler ran %d times, want 1", blocking.runs.Load())
		}
	})
}

func TestKeyReusedWithAnotherRequestGets422(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		a := newAPI(t, store, httpdedup.Config{})
		mustSend(t, a.srv, req{key: "k-reuse", body: `{"amount":1}`})

		for name, q := range map[string]req{
			"other body":  {key: "k-reuse", body: `{"amount":2}`},
			"other query": {key: "k-reuse", body: `{"amount":1}`, path: "/payments?capture=false"},
		} {
			t.Run(name, func(t *testing.T) {
				wantProblem(t, mustSend(t, a.srv, q), http.StatusUnprocessableEntity, httpdedup.ProblemKeyReused)
			})
		}
		if a.pay.runs.Load() != 1 {
			t.Fatalf("handler ran %d times, want 1", a.pay.runs.Load())
		}
	})
}

func TestKeyReusedWhileInFlightGets422(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		blocking := newBlockingHandler(&payments{})
		m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store}})
		srv := httptest.NewServer(m.Require(blocking))
		t.Cleanup(srv.Close)
		t.Cleanup(blocking.unblock)

		done := make(chan error, 1)
		firstReq := req{key: "k", body: "a"}.build(t, srv.URL)
		go func() {
			_, err := send(srv, firstReq)
			done <- err
		}()
		recv(t, "the blocked handler to start", blocking.started)
		wantProblem(t, mustSend(t, srv, req{key: "k", body: "b"}), http.StatusUnprocessableEntity, httpdedup.ProblemKeyReused)
		blocking.unblock()
		if err := recv(t, "the request to end", done); err != nil {
			t.Fatal(err)
		}
	})
}

func TestNoFingerprintReplaysWhateverTheBody(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		a := newAPI(t, store, httpdedup.Config{Fingerprint: httpdedup.NoFingerprint})
		first := mustSend(t, a.srv, req{key: "k", body: "a"})
		second := mustSend(t, a.srv, req{key: "k", body: "b"})
		if second.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(second.body, first.body) {
			t.Fatalf("got %d %s, want the replay", second.status, second.body)
		}
	})
}

func TestMissingKey(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		a := newAPI(t, store, httpdedup.Config{})
		t.Run("required: 400", func(t *testing.T) {
			p := wantProblem(t, mustSend(t, a.srv, req{body: "x"}), http.StatusBadRequest, httpdedup.ProblemKeyMissing)
			if !strings.Contains(p.Detail, "Idempotency-Key") {
				t.Fatalf("detail does not name the header: %q", p.Detail)
			}
			if a.pay.runs.Load() != 0 {
				t.Fatal("the handler ran")
			}
		})
		t.Run("optional: passes through every time", func(t *testing.T) {
			for i := 0; i < 2; i++ {
				r := mustSend(t, a.srv, req{path: "/notes", account: "-", body: "note"})
				if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
					t.Fatalf("pass-through %d: %d %s", i, r.status, r.body)
				}
				if !bytes.Contains(r.body, []byte(`"request":"note"`)) {
					t.Fatalf("the handler did not get the body: %s", r.body)
				}
			}
			if got := a.pay.runs.Load(); got != 2 {
				t.Fatalf("handler ran %d times, want 2", got)
			}
		})
		t.Run("optional with a key: deduplicated", func(t *testing.T) {
			before := a.pay.runs.Load()
			mustSend(t, a.srv, req{path: "/notes", key: "n-1", body: "note"})
			r := mustSend(t, a.srv, req{path: "/notes", key: "n-1", body: "note"})
			if r.header.Get("Idempotent-Replayed") != "true" || a.pay.runs.Load() != before+1 {
				t.Fatalf("not deduplicated: runs %d, replayed %q", a.pay.runs.Load()-before, r.header.Get("Idempotent-Replayed"))
			}
		})
	})
}

func TestInvalidKeysGet400(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		a := newAPI(t, store, httpdedup.Config{})
		cases := map[string]http.Header{
			"empty":             {"Idempotency-Key": {""}},
			"blank":             {"Idempotency-Key": {"   "}},
			"empty quoted":      {"Idempotency-Key": {`""`}},
			"too long":          {"Idempotency-Key": {strings.Repeat("k", 256)}},
			"too long quoted":   {"Idempotency-Key": {`"` + strings.Repeat("k", 256) + `"`}},
			"not ASCII":         {"Idempotency-Key": {"clé"}},
			"control character": {"Idempotency-Key": {"k\x01"}},
			"unterminated":      {"Idempotency-Key": {`"abc`}},
			"parameter":         {"Idempotency-Key": {`"abc";p=1`}},
			"bad escape":        {"Idempotency-Key": {`"a\b"`}},
			"sent twice":        {"Idempotency-Key": {"a", "b"}},
		}
		for name, h := range cases {
			for _, path := range []string{"/payments", "/notes"} { // refused on optional routes too
				r := serve(t, a.h, req{path: path, header: h, body: "x"})
				if r.status != http.StatusBadRequest {
					t.Fatalf("%s on %s: status %d, body %s", name, path, r.status, r.body)
				}
				p := r.problem(t)
				if !strings.HasSuffix(p.Type, "#"+httpdedup.ProblemKeyInvalid) {
					t.Fatalf("%s on %s: type %q", name, path, p.Type)
				}
				if !strings.HasPrefix(p.Detail, "The idempotency key is malformed: ") || len(p.Detail) < 40 {
					t.Fatalf("%s: detail %q does not say why", name, p.Detail)
				}
			}
		}
		if a.pay.runs.Load() != 0 {
			t.Fatalf("the handler ran %d times", a.pay.runs.Load())
		}
		// The longest accepted key.
		if r := serve(t, a.h, req{key: strings.Repeat("k", 255), body: "x"}); r.status != http.StatusCreated {
			t.Fatalf("255-byte key: %d %s", r.status, r.body)
		}
	})
}

func TestResponsesStoredOrReleasedByStatus(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		var runs = map[int]int{}
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var status int
			_, _ = fmt.Sscan(r.URL.Query().Get("status"), &status)
			runs[status]++ // requests here run one after the other
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(status)
			fmt.Fprintf(w, "status %d, run %d", status, runs[status])
		})
		m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store}})
		handler := m.Require(h)
		for _, c := range []struct {
			status int
			stored bool
		}{
			{200, true}, {201, true}, {204, true}, {303, true},
			{400, true}, {404, true}, {422, true},
			{408, false}, {409, false}, {423, false}, {425, false}, {429, false},
			{500, false}, {502, false}, {503, false},
		} {
			q := req{key: fmt.Sprint("k-", c.status), path: fmt.Sprint("/payments?status=", c.status)}
			first := serve(t, handler, q)
			second := serve(t, handler, q)
			if first.status != c.status || second.status != c.status {
				t.Fatalf("%d: got %d then %d", c.status, first.status, second.status)
			}
			replayed := second.header.Get("Idempotent-Replayed") == "true"
			if c.stored {
				if !replayed || runs[c.status] != 1 || !bytes.Equal(first.body, second.body) {
					t.Errorf("%d: want stored and replayed; replayed %v, runs %d, bodies %q %q", c.status, replayed, runs[c.status], first.body, second.body)
				}
			} else if replayed || runs[c.status] != 2 {
				t.Errorf("%d: want released (the retry runs again); replayed %v, runs %d", c.status, replayed, runs[c.status])
			}
		}
	})
}

func TestStoreResponseIsConfigurable(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		runs := 0
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			http.Error(w, "invalid amount", http.StatusBadRequest)
		})
		m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store}, StoreResponse: func(status int) bool { return status < 300 }})
		serve(t, m.Require(h), req{key: "k"})
		r := serve(t, m.Require(h), req{key: "k"})
		if r.status != http.StatusBadRequest || runs != 2 {
			t.Fatalf("status %d, runs %d: a 400 must not be stored", r.status, runs)
		}
	})
}

func TestPanicReleasesAndPanicsOn(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		runs := 0
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			if runs == 1 {
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte("half"))
				panic("boom")
			}
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte("done"))
		})
		m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store}})
		handler := m.Require(h)

		rec := httptest.NewRecorder()
		var recovered any
		func() {
			defer func() { recovered = recover() }()
			handler.ServeHTTP(rec, req{key: "k-panic"}.build(t, "http://api.test"))
		}()
		if recovered != "boom" {
			t.Fatalf("recovered %v, want the handler's panic value", recovered)
		}
		if rec.Body.Len() != 0 || rec.Code != http.StatusOK && rec.Flushed {
			t.Fatalf("part of the panicking handler's response was sent: %q", rec.Body.String())
		}
		r := serve(t, handler, req{key: "k-panic"})
		if r.status != http.StatusCreated || string(r.body) != "done" || runs != 2 {
			t.Fatalf("retry after panic: %d %q, runs %d; want the handler to run again", r.status, r.body, runs)
		}
	})
}

func TestStreamingAndHijackAreRefused(t *testing.T) {
	cases := map[string]func(w http.ResponseWriter) error{
		"ResponseController.Flush": func(w http.ResponseWriter) error {
			return http.NewResponseController(w).Flush()
		},
		"http.Flusher": func(w http.ResponseWriter) error {
			f, ok := w.(http.Flusher)
			if !ok {
				return errors.New("not a Flusher")
			}
			f.Flush()
			// Flush has no error: the next write says it.
			_, err := w.Write([]byte("more"))
			return err
		},
		"ResponseController.Hijack": func(w http.ResponseWriter) error {
			conn, _, err := http.NewResponseController(w).Hijack()
			if conn != nil {
				conn.Close()
			}
			return err
		},
		"http.Hijacker": func(w http.ResponseWriter) error {
			_, _, err := w.(http.Hijacker).Hijack()
			return err
		},
		// A body over MaxResponseBytes completes the record without it:
		// TestResponseOverMaxResponseBytesCompletesWithoutIt.
	}
	for name, act := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			forEachStore(t, func(t *testing.T, store dedup.Store) {
				var handlerErr error
				runs := 0
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs++
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = w.Write([]byte("data: partial\n\n"))
					if runs == 1 {
						handlerErr = act(w)
					}
				})
				m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store}, MaxResponseBytes: 64})
				srv := httptest.NewServer(m.Require(h))
				t.Cleanup(srv.Close)

				r := mustSend(t, srv, req{key: "k-stream"})
				wantProblem(t, r, http.StatusInternalServerError, httpdedup.ProblemResponseNotStorable)
				if bytes.Contains(r.body, []byte("partial")) {
					t.Fatalf("the partial response reached the client: %q", r.body)
				}
				if !errors.Is(handlerErr, httpdedup.ErrNotStorable) {
					t.Fatalf("the handler got %v, want ErrNotStorable", handlerErr)
				}
				// Released: the retry runs the handler again.
				r = mustSend(t, srv, req{key: "k-stream"})
				if r.status != http.StatusOK || runs != 2 {
					t.Fatalf("retry: %d %q after %d runs; want the handler to run again", r.status, r.body, runs)
				}
			})
		})
	}
}

func TestSwitchingProtocolsIsRefused(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		var writeErr error
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Upgrade", "websocket")
			w.WriteHeader(http.StatusSwitchingProtocols)
			_, writeErr = w.Write([]byte("frames"))
		})
		m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store}})
		wantProblem(t, serve(t, m.Require(h), req{key: "k-101"}), http.StatusInternalServerError, httpdedup.ProblemResponseNotStorable)
		if !errors.Is(writeErr, httpdedup.ErrNotStorable) {
			t.Fatalf("Write after 101: %v, want ErrNotStorable", writeErr)
		}
	})
}

func TestInformationalStatusesAreNotStored(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusAccepted)
			_, _ = w.Write([]byte("accepted"))
			w.Header().Set("X-Late", "ignored") // after WriteHeader: not part of the response
		})
		m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store}})
		first := serve(t, m.Require(h), req{key: "k-103"})
		second := serve(t, m.Require(h), req{key: "k-103"})
		for _, r := range []response{first, second} {
			if r.status != http.StatusAccepted || string(r.body) != "accepted" || r.header.Get("X-Late") != "" {
				t.Fatalf("got %d %q %v", r.status, r.body, r.header)
			}
		}
		if second.header.Get("Idempotent-Replayed") != "true" || second.header.Get("Link") != "</style.css>; rel=preload" {
			t.Fatalf("replay: %v", second.header)
		}
	})
}

func TestBodyTooLargeGets413AndClaimsNothing(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		a := newAPI(t, store, httpdedup.Config{MaxBodyBytes: 16})
		wantProblem(t, mustSend(t, a.srv, req{key: "k-big", body: strings.Repeat("x", 17)}), http.StatusRequestEntityTooLarge, httpdedup.ProblemBodyTooLarge)
		if a.pay.runs.Load() != 0 {
			t.Fatal("the handler ran")
		}
		// Nothing was claimed: the same key with an acceptable body runs.
		if r := mustSend(t, a.srv, req{key: "k-big", body: strings.Repeat("x", 16)}); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("after 413: %d %s", r.status, r.body)
		}
		// Without a key on an optional route the body is not read by the
		// middleware, so its limit does not apply.
		if r := mustSend(t, a.srv, req{path: "/notes", body: strings.Repeat("x", 100)}); r.status != http.StatusCreated {
			t.Fatalf("pass-through with a large body: %d %s", r.status, r.body)
		}
	})
}

func TestCallersAreIsolated(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		a := newAPI(t, store, httpdedup.Config{})
		q1 := req{key: "shared-key", account: "acct_1", body: "same"}
		q2 := req{key: "shared-key", account: "acct_2", body: "same"}
		r1 := mustSend(t, a.srv, q1)
		r2 := mustSend(t, a.srv, q2)
		if r1.header.Get("Idempotent-Replayed") != "" || r2.header.Get("Idempotent-Replayed") != "" || a.pay.runs.Load() != 2 {
			t.Fatalf("a key shared by two callers ran %d times", a.pay.runs.Load())
		}
		if !bytes.Contains(r2.body, []byte(`"account":"acct_2"`)) {
			t.Fatalf("acct_2 got %s", r2.body)
		}
		for _, c := range []struct {
			q    req
			want response
		}{{q1, r1}, {q2, r2}} {
			got := mustSend(t, a.srv, c.q)
			if !bytes.Equal(got.body, c.want.body) || got.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("%s got %s, want the replay of its own %s", c.q.account, got.body, c.want.body)
			}
		}
	})
}

func TestRoutesAndMethodsAreIsolated(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		a := newAPI(t, store, httpdedup.Config{})
		mustSend(t, a.srv, req{key: "k", body: "b"})
		r := mustSend(t, a.srv, req{key: "k", path: "/refunds", body: "b"})
		if r.header.Get("Idempotent-Replayed") != "" || a.pay.runs.Load() != 2 {
			t.Fatalf("the same key on another route was replayed")
		}

		m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store}})
		h := m.Require(a.pay)
		serve(t, h, req{method: http.MethodPut, path: "/things/1", key: "k2"})
		r = serve(t, h, req{method: http.MethodPatch, path: "/things/1", key: "k2"})
		if r.header.Get("Idempotent-Replayed") != "" || a.pay.runs.Load() != 4 {
			t.Fatalf("the same key with another method was replayed")
		}
	})
}

func TestIdenticalConcurrentRequestsRunOnce(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		for round := 0; round < 10; round++ {
			var runs int
			release := make(chan struct{})
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs++ // a second run would race with the first: -race reports it
				if runs == 1 {
					<-release
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "run %d", runs)
			})
			m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store}})
			srv := httptest.NewServer(m.Require(h))

			q := req{key: fmt.Sprint("k-concurrent-", round), body: "pay"}
			type result struct {
				r   response
				err error
			}
			results := make(chan result, 2)
			start := make(chan struct{})
			for i := 0; i < 2; i++ {
				r := q.build(t, srv.URL)
				go func() {
					<-start
					res, err := send(srv, r)
					results <- result{res, err}
				}()
			}
			close(start)
			// The handler cannot finish before release, so the first answer
			// must be the refused duplicate.
			first := recv(t, "the first answer (the refused duplicate)", results)
			if first.err != nil {
				t.Fatal(first.err)
			}
			wantProblem(t, first.r, http.StatusConflict, httpdedup.ProblemRequestInProgress)
			close(release)
			second := recv(t, "the winner's answer", results)
			if second.err != nil {
				t.Fatal(second.err)
			}
			if second.r.status != http.StatusCreated || string(second.r.body) != "run 1" {
				t.Fatalf("the winner got %d %q", second.r.status, second.r.body)
			}
			if runs != 1 {
				t.Fatalf("round %d: handler ran %d times", round, runs)
			}
			srv.Close()
		}
	})
}

func TestRetryAfterDroppedResponseGetsReplay(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		pay := &payments{}
		m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store}})
		served := make(chan struct{}, 1)
		gotClientGone := make(chan bool, 1)
		entered := make(chan struct{})
		inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-r.Context().Done() // the client hung up before the effect finished
			gotClientGone <- true
			pay.ServeHTTP(w, r)
		})
		wrapped := m.Require(inner)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			wrapped.ServeHTTP(w, r)
			served <- struct{}{}
		}))
		t.Cleanup(srv.Close)

		// The first attempt: the request is sent, then the connection drops
		// before the response can be read.
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		body := `{"amount":4200}`
		fmt.Fprintf(conn, "POST /payments HTTP/1.1\r\nHost: api.test\r\nX-Account: acct_1\r\nIdempotency-Key: k-dropped\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		// Hang up once the key is claimed and the handler runs (hanging up
		// earlier is a different case: the claim itself is cancelled).
		recv(t, "the handler of the first attempt to run", entered)
		conn.Close()
		recv(t, "the first attempt's handler to return", served)
		select {
		case <-gotClientGone:
		default:
			t.Fatal("the handler did not run for the first attempt")
		}

		// The client's retry gets the stored response.
		r := mustSend(t, srv, req{key: "k-dropped", body: body})
		if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || pay.runs.Load() != 1 {
			t.Fatalf("retry: %d replayed=%q runs=%d %s", r.status, r.header.Get("Idempotent-Replayed"), pay.runs.Load(), r.body)
		}
	})
}
