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
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/producerkey"
)

// TestTransportIntentFollowsRedirect: http.Client follows a 307/308
// redirect of a POST with the same method, body and context. The redirected
// request is the same logical request (the same intent) and carries its
// key. (The Transport refused it with ErrIntentReused, the intent being
// bound to the first URL: a POST to an endpoint that redirected could never
// succeed with an intent.)
func TestTransportIntentFollowsRedirect(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	mux := http.NewServeMux()
	mux.HandleFunc("POST /old", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/new", http.StatusPermanentRedirect)
	})
	mux.HandleFunc("POST /new", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get(producerkey.Header))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	client := &http.Client{Transport: &producerkey.Transport{}}
	ctx := producerkey.NewIntent(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/old", strings.NewReader(`{"amount":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if errors.Is(err, producerkey.ErrIntentReused) {
		t.Fatalf("a 308 redirect of the intent's own request is refused: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	key, _ := producerkey.KeyFromContext(ctx)
	if resp.StatusCode != http.StatusCreated || len(keys) != 1 || keys[0] != key {
		t.Fatalf("status %d, keys at /new %q, intent key %q", resp.StatusCode, keys, key)
	}
}

// TestWithKeyEmptyIsRefused: WithKey(ctx, "") (a key derived from a
// missing business fact) is refused with ErrNoKey. It silently became a
// random key per context, so a process restarted between two attempts sent
// a different key: the very case WithKey exists for.
func TestWithKeyEmptyIsRefused(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	client := &http.Client{Transport: &producerkey.Transport{}}
	var sent []string
	for attempt := 0; attempt < 2; attempt++ { // two processes: two contexts from the same (empty) business key
		ctx := producerkey.WithKey(context.Background(), "")
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/payments", strings.NewReader("{}"))
		resp, err := client.Do(req)
		if err != nil {
			if !errors.Is(err, dedup.ErrNoKey) {
				t.Fatalf("WithKey(\"\") refused with %v, want an error matching dedup.ErrNoKey", err)
			}
			return
		}
		_ = resp.Body.Close()
		k, _ := producerkey.KeyFromContext(ctx)
		sent = append(sent, k)
	}
	t.Fatalf("WithKey(\"\") accepted; the two attempts of one business fact sent keys %q", sent)
}

// TestPublisherRefusesKeysTheConsumerRefuses: the consumer's dedup refuses
// blank keys and keys with control characters (ErrNoKey, permanent: the
// poison queue), so Publisher refuses them too, while the producer can
// still fix the message. (It stamped any non-empty key: with keyfuncs.JSON
// a payload {"order_id":"A\nB"} was published, and then never processed.)
func TestPublisherRefusesKeysTheConsumerRefuses(t *testing.T) {
	for _, c := range []struct {
		name string
		key  keyfuncs.Func
		body string
	}{
		{"control character via keyfuncs.JSON", keyfuncs.JSON("order_id"), `{"order_id":"A\nB"}`},
		{"blank key of a custom KeyFunc", func(*message.Message) (string, error) { return " \t", nil }, `{}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			inner := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
			pub, err := producerkey.NewPublisher(inner, producerkey.PublisherConfig{Key: c.key})
			if err != nil {
				t.Fatal(err)
			}
			msg := message.NewMessage(watermill.NewUUID(), []byte(c.body))
			err = pub.Publish("orders", msg)
			if !errors.Is(err, dedup.ErrNoKey) {
				t.Fatalf("Publish = %v, want ErrNoKey; published with key %q, which the consumer refuses",
					err, msg.Metadata.Get(producerkey.DefaultMetadata))
			}
		})
	}
}
