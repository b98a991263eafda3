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
	"github.com/watermill-dedup/watermill-dedup/internal/memstore"
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
		Lease:            -time.Second,
		Retention:        -1,
		RetryAfter:       -1,
		MaxBodyBytes:     -1,
		MaxResponseBytes: -1,
		MaxKeyLength:     -1,
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

	err = httpdedup.Config{Store: memstore.New(nil), Identity: httpdedup.StaticIdentity("x"), Lease: time.Second, Heartbeat: time.Second}.Validate()
	if !errors.Is(err, dedup.ErrInvalidDuration) {
		t.Errorf("Heartbeat == Lease: %v", err)
	}
	err = httpdedup.Config{Store: memstore.New(nil), Identity: httpdedup.StaticIdentity("x"), Lease: 2}.Validate()
	if !errors.Is(err, dedup.ErrInvalidDuration) {
		t.Errorf("Lease of 2ns (a heartbeat of 0): %v", err)
	}
	both := httpdedup.Config{Store: memstore.New(nil), Identity: httpdedup.StaticIdentity("x"), Lease: time.Second, Heartbeat: time.Second, DisableHeartbeat: true}
	if err := both.Validate(); !errors.Is(err, dedup.ErrInvalidDuration) {
		t.Errorf("Heartbeat with DisableHeartbeat: %v", err)
	}
}

func TestNewDoesNotWriteTheCallersConfig(t *testing.T) {
	headers := []string{"content-type", "location"}
	cfg := httpdedup.Config{Store: memstore.New(nil), Identity: httpdedup.StaticIdentity("x"), StoredHeaders: headers}
	if _, err := httpdedup.New(cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Lease != 0 || cfg.Key != nil || headers[0] != "content-type" {
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
