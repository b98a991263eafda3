package producerkey_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/producerkey"
)

// TestWithKeyRefusesWhatHTTPDedupRefuses: a WithKey key that httpdedup
// would answer 400 on every attempt (over 255 bytes, not printable ASCII,
// a quote that reads as a broken structured-field string, blanks around
// it) fails RoundTrip before anything is sent, with an error matching
// dedup.ErrNoKey and httpdedup.ErrKeyInvalid. (A 300-byte or accented
// key was sent, and every attempt got 400.) A key httpdedup accepts
// reaches it whole.
func TestWithKeyRefusesWhatHTTPDedupRefuses(t *testing.T) {
	m, err := httpdedup.New(httpdedup.Config{Dedup: dedup.Config{Store: memstore.New(nil)}, Identity: httpdedup.StaticIdentity("shop")})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	srv := httptest.NewServer(m.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get(producerkey.Header))
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	client := &http.Client{Transport: &producerkey.Transport{}}
	send := func(key string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(producerkey.WithKey(context.Background(), key), http.MethodPost, srv.URL, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if resp != nil {
			resp.Body.Close()
		}
		return resp, err
	}
	for name, key := range map[string]string{
		"300 bytes":     strings.Repeat("k", 300),
		"accented":      "commande-é-42",
		"quote":         `"order-42`,
		"leading blank": " order-42",
		"tab":           "order\t42",
	} {
		resp, err := send(key)
		if !errors.Is(err, dedup.ErrNoKey) || !errors.Is(err, httpdedup.ErrKeyInvalid) {
			t.Errorf("%s: %v (response %v); want an error matching dedup.ErrNoKey and httpdedup.ErrKeyInvalid", name, err, resp)
		}
		if err := httpdedup.CheckKey(key); !errors.Is(err, httpdedup.ErrKeyInvalid) {
			t.Errorf("%s: httpdedup.CheckKey = %v", name, err)
		}
	}
	if len(got) != 0 {
		t.Errorf("sent %d requests with refused keys: %q", len(got), got)
	}
	for _, key := range []string{strings.Repeat("k", httpdedup.DefaultMaxKeyLength), "order 42 charge", `a"b\c`} {
		resp, err := send(key)
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Errorf("key %.20q…: %v %v, want 201", key, resp, err)
		}
	}
	if len(got) != 3 || got[2] != `a"b\c` {
		t.Errorf("the server saw keys %q", got)
	}
}
