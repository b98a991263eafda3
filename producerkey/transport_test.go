package producerkey_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/producerkey"
)

// keyServer records the Idempotency-Key of every request it receives.
type keyServer struct {
	*httptest.Server
	mu   sync.Mutex
	keys []string
}

func newKeyServer(t *testing.T) *keyServer {
	s := &keyServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.keys = append(s.keys, r.Header.Get(producerkey.Header))
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *keyServer) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

func send(t *testing.T, client *http.Client, ctx context.Context, method, url string, header string) error {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if header != "" {
		req.Header.Set(producerkey.Header, header)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

func TestTransportKeys(t *testing.T) {
	s := newKeyServer(t)
	client := &http.Client{Transport: &producerkey.Transport{}}
	bg := context.Background()
	one := producerkey.NewIntent(bg)
	for _, step := range []struct {
		ctx            context.Context
		method, header string
	}{
		{one, http.MethodPost, ""},                                 // 0: intent one
		{one, http.MethodPost, ""},                                 // 1: its retry
		{producerkey.NewIntent(bg), http.MethodPost, ""},           // 2: another intent
		{bg, http.MethodPost, ""},                                  // 3: no intent: a key of its own
		{bg, http.MethodPost, ""},                                  // 4: and another
		{bg, http.MethodGet, ""},                                   // 5: GET: none
		{bg, http.MethodPatch, "caller-key"},                       // 6: the caller's header is kept
		{producerkey.WithKey(bg, "order-42"), http.MethodPost, ""}, // 7: the caller's key
	} {
		if err := send(t, client, step.ctx, step.method, s.URL+"/payments", step.header); err != nil {
			t.Fatal(err)
		}
	}
	k := s.seen()
	if k[0] == "" || k[0] != k[1] || len(k[0]) != 32 {
		t.Errorf("one intent, two attempts: keys %q, %q", k[0], k[1])
	}
	if k[2] == k[0] || k[3] == "" || k[3] == k[4] || k[3] == k[0] {
		t.Errorf("distinct intents share keys: %q", k[:5])
	}
	if k[5] != "" || k[6] != "caller-key" || k[7] != "order-42" {
		t.Errorf("GET %q, caller header %q, WithKey %q", k[5], k[6], k[7])
	}
	if got, ok := producerkey.KeyFromContext(one); !ok || got != k[0] {
		t.Errorf("KeyFromContext = %q, %v; want %q", got, ok, k[0])
	}
}

// One intent used for a second, different request is refused before
// anything is sent: the server would replay the first one's response.
func TestTransportRefusesAnIntentForTwoRequests(t *testing.T) {
	s := newKeyServer(t)
	client := &http.Client{Transport: &producerkey.Transport{}}
	ctx := producerkey.NewIntent(context.Background())
	if err := send(t, client, ctx, http.MethodPost, s.URL+"/payments", ""); err != nil {
		t.Fatal(err)
	}
	err := send(t, client, ctx, http.MethodPost, s.URL+"/refunds", "")
	if !errors.Is(err, producerkey.ErrIntentReused) {
		t.Fatalf("second request with one intent: %v, want ErrIntentReused", err)
	}
	if n := len(s.seen()); n != 1 {
		t.Errorf("%d requests reached the server, want 1", n)
	}
}

// recorder is the decorated publisher: it records what reaches it.
type recorder struct {
	mu        sync.Mutex
	published []*message.Message
}

func (r *recorder) Publish(_ string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.published = append(r.published, msgs...)
	return nil
}

func (r *recorder) Close() error { return nil }

func TestPublisherKeepsAKeyAndRefusesNoKey(t *testing.T) {
	inner := &recorder{}
	pub, err := producerkey.NewPublisher(inner, producerkey.PublisherConfig{Metadata: "order_key", Key: keyfuncs.JSON("order_id")})
	if err != nil {
		t.Fatal(err)
	}
	set := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"ORDER-1"}`))
	set.Metadata.Set("order_key", "chosen-by-caller")
	if err := pub.Publish("orders", set); err != nil {
		t.Fatal(err)
	}
	if got := set.Metadata.Get("order_key"); got != "chosen-by-caller" {
		t.Errorf("a key already set became %q", got)
	}
	good := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"ORDER-2"}`))
	bad := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":1}`))
	err = pub.Publish("orders", good, bad)
	if !errors.Is(err, dedup.ErrNoKey) {
		t.Fatalf("a message without a key: %v, want ErrNoKey", err)
	}
	if len(inner.published) != 1 || inner.published[0] != set {
		t.Errorf("%d messages reached the publisher, want only the first (a batch with a keyless message publishes nothing)", len(inner.published))
	}
	if _, err := producerkey.NewPublisher(nil, producerkey.PublisherConfig{}); err == nil {
		t.Error("NewPublisher(nil) succeeded")
	}
}

// A message built as a struct literal has no Metadata map: it is stamped,
// not a panic (assignment to a nil map); a nil message is an error.
func TestPublisherStampsMessageWithoutMetadata(t *testing.T) {
	inner := &recorder{}
	pub, err := producerkey.NewPublisher(inner, producerkey.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	msg := &message.Message{UUID: watermill.NewUUID(), Payload: []byte(`{}`)}
	if err := pub.Publish("orders", msg); err != nil {
		t.Fatal(err)
	}
	if msg.Metadata.Get(producerkey.DefaultMetadata) == "" {
		t.Errorf("no key stamped into a message without metadata")
	}
	if err := pub.Publish("orders", nil); err == nil {
		t.Errorf("a nil message was published")
	}
	if len(inner.published) != 1 {
		t.Errorf("%d messages reached the publisher, want 1", len(inner.published))
	}
}
