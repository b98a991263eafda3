package httpdedup_test

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

func TestResponseEncodingRoundTrip(t *testing.T) {
	for name, resp := range map[string]httpdedup.Response{
		"empty": {Status: 204, Header: http.Header{}},
		"typical": {Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/pay_1"}},
			Body: []byte(`{"id":"pay_1"}`)},
		"multi-valued": {Status: 200, Header: http.Header{"Link": {"</a>", "</b>"}, "Vary": {"Accept"}}, Body: []byte{0, 1, 2, 255}},
		"999":          {Status: 999, Header: http.Header{"Content-Type": {""}}, Body: bytes.Repeat([]byte{0xff}, 70000)},
	} {
		t.Run(name, func(t *testing.T) {
			b := httpdedup.EncodeResponse(resp)
			got, err := httpdedup.DecodeResponse(b)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != resp.Status || !bytes.Equal(got.Body, resp.Body) || !reflect.DeepEqual(got.Header, resp.Header) {
				t.Fatalf("round trip: %+v, want %+v", got, resp)
			}
			if !bytes.Equal(httpdedup.EncodeResponse(got), b) {
				t.Fatal("encoding is not deterministic")
			}
		})
	}
}

func TestResponseEncodingLayout(t *testing.T) {
	b := httpdedup.EncodeResponse(httpdedup.Response{Status: 201, Header: http.Header{"Location": {"/p/1"}, "Content-Type": {"a/b"}}, Body: []byte("hi")})
	want := []byte("\x01\xc9\x01\x02\x0cContent-Type\x03a/b\x08Location\x04/p/1hi")
	if !bytes.Equal(b, want) {
		t.Fatalf("encoding %q, want %q", b, want)
	}
}

func TestDecodeResponseRejectsCorruptInput(t *testing.T) {
	good := httpdedup.EncodeResponse(httpdedup.Response{Status: 201, Header: http.Header{"Location": {"/p/1"}}, Body: []byte("hi")})
	cases := map[string][]byte{
		"empty":           nil,
		"unknown format":  append([]byte{2}, good[1:]...),
		"no status":       {1},
		"status 99":       {1, 99, 0},
		"status 1000":     {1, 0xe8, 0x07, 0},
		"no field count":  good[:3],
		"truncated name":  good[:6],
		"truncated value": good[:len(good)-5],
		"huge count":      {1, 0xc9, 0x01, 0xff, 0xff, 0xff, 0xff, 0x0f},
	}
	for name, b := range cases {
		if _, err := httpdedup.DecodeResponse(b); !errors.Is(err, dedup.ErrCorruptResult) {
			t.Errorf("%s: err %v, want ErrCorruptResult", name, err)
		}
	}
}

func FuzzDecodeResponse(f *testing.F) {
	f.Add(httpdedup.EncodeResponse(httpdedup.Response{Status: 201, Header: http.Header{"Location": {"/p/1"}}, Body: []byte("hi")}))
	f.Add([]byte{1, 0xc8, 0x01, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		resp, err := httpdedup.DecodeResponse(b)
		if err != nil {
			if !errors.Is(err, dedup.ErrCorruptResult) {
				t.Fatalf("error %v does not match ErrCorruptResult", err)
			}
			return
		}
		again, err := httpdedup.DecodeResponse(httpdedup.EncodeResponse(resp))
		if err != nil || again.Status != resp.Status || !bytes.Equal(again.Body, resp.Body) || len(again.Header) != len(resp.Header) {
			t.Fatalf("re-encoding %+v gave %+v, %v", resp, again, err)
		}
	})
}

func TestParseKey(t *testing.T) {
	for in, want := range map[string]string{
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`: "8e03978e-40d5-43e8-bc93-6894a57f9324",
		`8e03978e-40d5-43e8-bc93-6894a57f9324`:   "8e03978e-40d5-43e8-bc93-6894a57f9324",
		` "k" `:                                  "k",
		"\tk\t":                                  "k",
		`"a \"quoted\" \\ key"`:                  `a "quoted" \ key`,
		`bare "with" quotes`:                     `bare "with" quotes`,
		`"with spaces inside"`:                   "with spaces inside",
		`k;param=1`:                              "k;param=1", // bare values are taken verbatim
	} {
		got, err := httpdedup.ParseKey(in)
		if err != nil || got != want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", " ", `""`, `"`, `"abc`, `"abc"x`, `"abc";p=1`, `"a\b"`, `"a\`, "ké", "k\x7f", "\"k\x00\"", "k\n"} {
		if got, err := httpdedup.ParseKey(in); !errors.Is(err, httpdedup.ErrKeyInvalid) || !errors.Is(err, dedup.ErrNoKey) {
			t.Errorf("ParseKey(%q) = %q, %v; want ErrKeyInvalid", in, got, err)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`"k"`, "k", `"a\"b"`, `"`, ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		key, err := httpdedup.ParseKey(s)
		if err != nil {
			if !errors.Is(err, httpdedup.ErrKeyInvalid) {
				t.Fatalf("error %v does not match ErrKeyInvalid", err)
			}
			return
		}
		if key == "" {
			t.Fatal("empty key accepted")
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("key %q has byte 0x%02x", key, key[i])
			}
		}
		// The quoted form of a key parses back to it.
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		if again, err := httpdedup.ParseKey(quoted); err != nil || again != key {
			t.Fatalf("ParseKey(%q) = %q, %v; want %q", quoted, again, err, key)
		}
	})
}

func TestHeaderKeyMissing(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	if _, err := httpdedup.HeaderKey("Idempotency-Key")(r, nil); !errors.Is(err, httpdedup.ErrKeyMissing) || errors.Is(err, httpdedup.ErrKeyInvalid) {
		t.Fatalf("err %v, want ErrKeyMissing only", err)
	}
}

func TestDefaultRoute(t *testing.T) {
	mux := http.NewServeMux()
	var got []string
	record := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = append(got, httpdedup.DefaultRoute(r)) })
	mux.Handle("POST /payments/{id}/refunds", record)
	mux.Handle("/plain/", record)
	mux.Handle("POST api.test/hosted", record)
	for _, target := range []string{"/payments/p1/refunds", "/plain/x", "/hosted"} {
		mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "http://api.test"+target, nil))
	}
	record.ServeHTTP(nil, httptest.NewRequest(http.MethodPost, "/no%20mux/a%2Fb", nil))
	want := []string{"/payments/{id}/refunds", "/plain/", "api.test/hosted", "/no%20mux/a%2Fb"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("routes %q, want %q", got, want)
	}
}

func TestDefaultFingerprint(t *testing.T) {
	fp := func(method, target, body string) string {
		s, err := httpdedup.DefaultFingerprint(httptest.NewRequest(method, target, nil), []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	base := fp("POST", "/payments", "{}")
	if base != fp("POST", "/payments", "{}") || len(base) != 64 {
		t.Fatalf("not a stable sha256: %q", base)
	}
	for name, other := range map[string]string{
		"method": fp("PUT", "/payments", "{}"),
		"path":   fp("POST", "/payment", "{}"),
		"query":  fp("POST", "/payments?x=1", "{}"),
		"body":   fp("POST", "/payments", "{ }"),
		"shift":  fp("POST", "/payments{", "}"),
	} {
		if other == base {
			t.Errorf("a different %s gives the same fingerprint", name)
		}
	}
}

func TestScopeEscaping(t *testing.T) {
	if a, b := httpdedup.Scope("a b", "POST", "/x"), httpdedup.Scope("a", "b POST", "/x"); a == b {
		t.Fatalf("two scopes collide: %q", a)
	}
	if got := httpdedup.Scope("acct_42", "POST", "/payments"); got != "acct_42 POST /payments" {
		t.Fatalf("Scope = %q", got)
	}
	if got := httpdedup.Scope("100% a", "POST", "/p"); got != "100%25%20a POST /p" {
		t.Fatalf("Scope = %q", got)
	}
}

func TestConfigValidate(t *testing.T) {
	err := httpdedup.Config{
		Dedup:            dedup.Config{Lease: -time.Second, Retention: -1, MaxKeyLength: -1},
		RetryAfter:       -1,
		MaxBodyBytes:     -1,
		MaxResponseBytes: -1,
		StoredHeaders:    []string{"Content-Type", "Bad Header", "content-length"},
		ReplayedHeader:   "no:colons",
	}.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	if !errors.Is(err, dedup.ErrInvalidDuration) {
		t.Errorf("%v does not match ErrInvalidDuration", err)
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("not a joined error: %T", err)
	}
	// Store, Identity, 3 durations, 3 sizes, 2 stored headers, ReplayedHeader.
	if n := len(joined.Unwrap()); n != 11 {
		t.Errorf("%d problems reported, want 11:\n%v", n, err)
	}
	if _, err := httpdedup.New(httpdedup.Config{}); err == nil {
		t.Error("New accepted a config without Store and Identity")
	}

	err = httpdedup.Config{Dedup: dedup.Config{Store: memstore.New(nil), Lease: time.Second, Heartbeat: time.Second}, Identity: httpdedup.StaticIdentity("x")}.Validate()
	if !errors.Is(err, dedup.ErrInvalidDuration) {
		t.Errorf("Heartbeat == Lease: %v", err)
	}
	err = httpdedup.Config{Dedup: dedup.Config{Store: memstore.New(nil), Lease: 2}, Identity: httpdedup.StaticIdentity("x")}.Validate()
	if !errors.Is(err, dedup.ErrInvalidDuration) {
		t.Errorf("Lease of 2ns (a heartbeat of 0): %v", err)
	}
	both := httpdedup.Config{Dedup: dedup.Config{Store: memstore.New(nil), Lease: time.Second, Heartbeat: time.Second, DisableHeartbeat: true}, Identity: httpdedup.StaticIdentity("x")}
	if err := both.Validate(); !errors.Is(err, dedup.ErrInvalidDuration) {
		t.Errorf("Heartbeat with DisableHeartbeat: %v", err)
	}
}

func TestNewDoesNotWriteTheCallersConfig(t *testing.T) {
	headers := []string{"content-type", "location"}
	cfg := httpdedup.Config{Dedup: dedup.Config{Store: memstore.New(nil)}, Identity: httpdedup.StaticIdentity("x"), StoredHeaders: headers}
	if _, err := httpdedup.New(cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Dedup.Lease != 0 || cfg.Key != nil || headers[0] != "content-type" {
		t.Fatalf("New changed the caller's config: %+v %q", cfg, headers)
	}
}

func TestDefaultStoreResponse(t *testing.T) {
	for status := 100; status < 600; status++ {
		want := status >= 200 && status < 500
		switch status {
		case 408, 409, 423, 425, 429:
			want = false
		}
		if got := httpdedup.DefaultStoreResponse(status); got != want {
			t.Errorf("DefaultStoreResponse(%d) = %v", status, got)
		}
	}
}

// The key functions' errors are *dedup.KeyError: Field names the header (or
// the body field), Reason says what was wrong, and Err is ErrKeyMissing or
// ErrKeyInvalid, so errors.Is matches the sentinel and dedup.ErrNoKey.
func TestKeyErrorsAreDedupKeyErrors(t *testing.T) {
	keyOf := func(name string, h http.Header) error {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header = h
		_, err := httpdedup.HeaderKey(name)(r, nil)
		return err
	}
	bodyKey := func(body string) error {
		_, err := httpdedup.BodyKey(keyfuncs.JSON("id"))(httptest.NewRequest(http.MethodPost, "/", nil), func() ([]byte, error) { return []byte(body), nil })
		return err
	}
	parsed := func(v string) error { _, err := httpdedup.ParseKey(v); return err }
	for _, tc := range []struct {
		name          string
		err           error
		sentinel      error
		field, reason string
	}{
		{"no header", keyOf("Idempotency-Key", http.Header{}), httpdedup.ErrKeyMissing, "Idempotency-Key header", "no Idempotency-Key header"},
		{"another header", keyOf("x-request-key", http.Header{}), httpdedup.ErrKeyMissing, "X-Request-Key header", "no X-Request-Key header"},
		{"sent twice", keyOf("Idempotency-Key", http.Header{"Idempotency-Key": {"a", "b"}}), httpdedup.ErrKeyInvalid, "Idempotency-Key header", "Idempotency-Key header sent 2 times"},
		{"empty value", keyOf("Idempotency-Key", http.Header{"Idempotency-Key": {""}}), httpdedup.ErrKeyInvalid, "Idempotency-Key header", "empty value"},
		{"ParseKey", parsed(`"abc`), httpdedup.ErrKeyInvalid, "", "quoted string has no closing quote"},
		{"CheckKey", httpdedup.CheckKey(" k"), httpdedup.ErrKeyInvalid, "", `the header would carry "k", not the key itself (a space at either end, or a structured-field string)`},
		{"body field", bodyKey(`{"amount":1}`), httpdedup.ErrKeyMissing, "json:id", "missing"},
		{"body not JSON", bodyKey(`x`), httpdedup.ErrKeyMissing, "json:id", "payload is not valid JSON"},
	} {
		var ke *dedup.KeyError
		if !errors.As(tc.err, &ke) {
			t.Errorf("%s: %T %v is not a *dedup.KeyError", tc.name, tc.err, tc.err)
			continue
		}
		if ke.Field != tc.field || ke.Reason != tc.reason {
			t.Errorf("%s: Field %q, Reason %q; want %q, %q", tc.name, ke.Field, ke.Reason, tc.field, tc.reason)
		}
		if !errors.Is(tc.err, tc.sentinel) || !errors.Is(tc.err, dedup.ErrNoKey) {
			t.Errorf("%s: %v does not match %v and dedup.ErrNoKey", tc.name, tc.err, tc.sentinel)
		}
		if other := map[error]error{httpdedup.ErrKeyMissing: httpdedup.ErrKeyInvalid, httpdedup.ErrKeyInvalid: httpdedup.ErrKeyMissing}[tc.sentinel]; errors.Is(tc.err, other) {
			t.Errorf("%s: %v matches %v too", tc.name, tc.err, other)
		}
	}
	// BodyKey keeps the key function's own error.
	if err := bodyKey(`{"amount":1}`); !errors.Is(err, dedup.ErrNoKey) || !strings.Contains(err.Error(), "json:id") {
		t.Errorf("BodyKey error %v lost the key function's error", err)
	}
}

// The client sees the same details as before the key errors became
// *dedup.KeyError: the reason, preceded by the field unless the reason
// names it.
func TestKeyErrorDetails(t *testing.T) {
	header := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: memstore.New(nil)}}).Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Error("the handler ran") }))
	body := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: memstore.New(nil)}, Key: httpdedup.BodyKey(keyfuncs.JSON("id"))}).Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Error("the handler ran") }))
	for _, tc := range []struct {
		name    string
		h       http.Handler
		q       req
		problem string
		detail  string
	}{
		{"no header", header, req{body: "x"}, httpdedup.ProblemKeyMissing, "This operation requires an idempotency key: no Idempotency-Key header."},
		{"sent twice", header, req{header: http.Header{"Idempotency-Key": {"a", "b"}}}, httpdedup.ProblemKeyInvalid, "The idempotency key is malformed: Idempotency-Key header sent 2 times."},
		{"empty value", header, req{header: http.Header{"Idempotency-Key": {""}}}, httpdedup.ProblemKeyInvalid, "The idempotency key is malformed: Idempotency-Key header: empty value."},
		{"too long", header, req{key: strings.Repeat("k", 256)}, httpdedup.ProblemKeyInvalid, "The idempotency key is malformed: key is 256 bytes, longer than 255."},
		{"body field", body, req{body: `{"amount":1}`}, httpdedup.ProblemKeyMissing, "This operation requires an idempotency key: json:id: missing."},
	} {
		p := wantProblem(t, serve(t, tc.h, tc.q), http.StatusBadRequest, tc.problem)
		if p.Detail != tc.detail {
			t.Errorf("%s: detail %q, want %q", tc.name, p.Detail, tc.detail)
		}
	}
}
