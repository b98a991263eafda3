package producerkey_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/producerkey"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// The tests below run against a real redis-server (the store, and the
// Redis Streams broker) on a free loopback port.
var redisAddr string

func TestMain(m *testing.M) {
	testserver.Main(m, func() (func(), error) {
		r, err := testserver.StartRedis()
		if err != nil {
			return nil, err
		}
		redisAddr = r.Addr
		return func() { _ = r.Close() }, nil
	})
}

// lossyLink is an in-process TCP proxy (toxiproxy as a library) to
// upstream that can drop replies: while the "drop-reply" toxic is in place,
// a connection on which the server answers is reset and the answer lost —
// the server has done the work, the client sees an error.
type lossyLink struct{ proxy *toxiproxy.Proxy }

func newLossyLink(t *testing.T, upstream string) *lossyLink {
	t.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(server, "lossy", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("toxiproxy: %v", err)
	}
	t.Cleanup(p.Stop)
	return &lossyLink{proxy: p}
}

func (l *lossyLink) dropReplies(t *testing.T) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"name": "drop-reply", "type": "reset_peer", "stream": "downstream", "attributes": map[string]any{"timeout": 0}})
	if _, err := l.proxy.Toxics.AddToxicJson(strings.NewReader(string(b))); err != nil {
		t.Fatal(err)
	}
}

func (l *lossyLink) heal(t *testing.T) {
	t.Helper()
	if err := l.proxy.Toxics.RemoveToxic(context.Background(), "drop-reply"); err != nil {
		t.Fatal(err)
	}
}

func newStore(t *testing.T) dedup.Store {
	t.Helper()
	client := goredis.NewClient(&goredis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = client.Close() })
	store, err := dedupredis.New(context.Background(), dedupredis.Config{Client: client, KeyPrefix: "producerkey-test-" + watermill.NewShortUUID() + ":"})
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// An HTTP client whose first attempt's reply is lost retries through a
// retrying wrapper above producerkey.Transport, with one intent on the
// request's context: the retry carries the first attempt's key, and
// httpdedup (on a real redis-server) replays the first response instead
// of charging again.
func TestLostHTTPReplyRetriedWithTheSameKey(t *testing.T) {
	for _, tc := range []struct {
		name     string
		intent   bool
		sameKey  bool
		charges  int64
		replayed string
	}{
		// The point: one intent on the context, one key, one charge.
		{"one intent", true, true, 1, "true"},
		// Without it, a wrapper retrying above the Transport makes every
		// attempt an intent of its own: two keys, two charges.
		{"no intent", false, false, 2, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			charges, keys, resp, attempts := lostHTTPReply(t, tc.intent)
			defer resp.Body.Close()
			t.Logf("attempts %q; keys received %q; charges %d; status %d, %s: %q",
				attempts, keys, charges, resp.StatusCode, httpdedup.DefaultReplayedHeader, resp.Header.Get(httpdedup.DefaultReplayedHeader))
			if len(attempts) != 2 || attempts[0] == "<nil>" {
				t.Fatalf("attempts %q: want the first to fail (reply dropped) and the second to succeed", attempts)
			}
			if len(keys) != 2 || keys[0] == "" || (keys[0] == keys[1]) != tc.sameKey {
				t.Errorf("keys received %q: same key %v, want %v", keys, keys[0] == keys[1], tc.sameKey)
			}
			if charges != tc.charges {
				t.Errorf("%d charges, want %d", charges, tc.charges)
			}
			if resp.StatusCode != http.StatusCreated || resp.Header.Get(httpdedup.DefaultReplayedHeader) != tc.replayed {
				t.Errorf("retry answered %d, replayed %q; want 201, %q", resp.StatusCode, resp.Header.Get(httpdedup.DefaultReplayedHeader), tc.replayed)
			}
		})
	}
}

// lostHTTPReply posts one payment through a link that drops the first
// reply, retrying once after the link heals, and returns the charges, the
// keys the server received, the final response and each attempt's error.
func lostHTTPReply(t *testing.T, withIntent bool) (int64, []string, *http.Response, []string) {
	m, err := httpdedup.New(httpdedup.Config{Dedup: dedup.Config{Store: newStore(t)}, Identity: httpdedup.StaticIdentity("shop")})
	if err != nil {
		t.Fatal(err)
	}
	var charges atomic.Int64
	var mu sync.Mutex
	var keys []string
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"payment":"pay_1"}`))
	})
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get(producerkey.Header))
		mu.Unlock()
		m.Require(charge).ServeHTTP(w, r)
	}))
	t.Cleanup(server.Close)
	link := newLossyLink(t, server.Listener.Addr().String())

	// Fresh connections: net/http only retries a request by itself on a
	// reused one.
	client := &http.Client{Timeout: 30 * time.Second, Transport: &producerkey.Transport{Base: &http.Transport{DisableKeepAlives: true}}}
	intent := context.Background()
	if withIntent {
		intent = producerkey.NewIntent(intent)
	}
	link.dropReplies(t)
	var attempts []string
	var resp *http.Response
	for attempt := 1; attempt <= 3 && resp == nil; attempt++ {
		req, err := http.NewRequestWithContext(intent, http.MethodPost, "http://"+link.proxy.Listen+"/payments", strings.NewReader(`{"amount":4200}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err = client.Do(req)
		attempts = append(attempts, fmt.Sprint(err))
		if err != nil && attempt == 1 {
			link.heal(t) // the network recovers before the retry
		}
	}
	if resp == nil {
		t.Fatalf("no response after 3 attempts: %q", attempts)
	}
	mu.Lock()
	defer mu.Unlock()
	return charges.Load(), append([]string(nil), keys...), resp, attempts
}

// A Publish whose acknowledgement is lost (Redis ran XADD, the reply was
// reset) is retried with the same message: the stream holds two copies with
// one key, and a consumer deduplicating on that key charges once.
func TestLostPublishAckRetriedWithTheSameKey(t *testing.T) {
	for _, tc := range []struct {
		name       string
		newMessage bool // the retry builds a new message (new UUID, no key yet)
		charges    int64
	}{
		// The point: the retry publishes the stamped message again.
		{"same message", false, 1},
		// A retry that rebuilds the message gets a new random key: two
		// charges (PublisherConfig.Key, a business key, avoids that).
		{"rebuilt message", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) { lostPublishAck(t, tc.newMessage, tc.charges) })
	}
}

func lostPublishAck(t *testing.T, newMessage bool, wantCharges int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	link := newLossyLink(t, redisAddr)
	// One connection, no retries inside go-redis: the test's loop is the
	// producer's retry.
	pubClient := goredis.NewClient(&goredis.Options{Addr: link.proxy.Listen, PoolSize: 1, MaxRetries: -1})
	raw, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: pubClient}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := producerkey.NewPublisher(raw, producerkey.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	if err := pubClient.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	stream := "producerkey-test-" + watermill.NewShortUUID()
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"ORDER-003","amount":150}`))
	link.dropReplies(t)
	var attempts []string
	var keys []string
	for attempt := 1; attempt <= 3; attempt++ {
		if newMessage && attempt > 1 {
			msg = message.NewMessage(watermill.NewUUID(), msg.Payload)
		}
		err := pub.Publish(stream, msg)
		keys = append(keys, msg.Metadata.Get(producerkey.DefaultMetadata))
		attempts = append(attempts, fmt.Sprint(err))
		if err == nil {
			break
		}
		if attempt == 1 {
			link.heal(t)
		}
	}
	direct := goredis.NewClient(&goredis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = direct.Del(context.Background(), stream).Err(); _ = direct.Close() })
	copies, err := direct.XLen(ctx, stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(attempts) != 2 || attempts[0] == "<nil>" || attempts[1] != "<nil>" || copies != 2 {
		t.Fatalf("attempts %q, %d copies in the stream: want a failed attempt that stored its copy, then a successful one", attempts, copies)
	}

	// The consumer: the key from the metadata the decorator stamped.
	var charges atomic.Int64
	outcomes := &outcomeCounter{counts: map[event.Event]int{}}
	d, err := dedup.New(dedup.Config{Store: newStore(t), Key: keyfuncs.Metadata(producerkey.DefaultMetadata), Scope: "charge-orders", Observer: outcomes})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client: goredis.NewClient(&goredis.Options{Addr: redisAddr}), ConsumerGroup: "charge-orders", DisableIndefiniteInitialBlock: true,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(d.Middleware)
	router.AddConsumerHandler("charge", stream, sub, func(*message.Message) error { charges.Add(1); return nil })
	go func() { _ = router.Run(ctx) }()
	t.Cleanup(func() { _ = router.Close() })
	for charges.Load()+int64(outcomes.get(event.SkipDuplicate)) < 2 {
		select {
		case <-ctx.Done():
			t.Fatalf("the consumer did not decide on both copies within 2 minutes: %v", outcomes.snapshot())
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Logf("attempts %q; %d copies in the stream, keys %q; consumer: %v, %d charge(s)",
		attempts, copies, keys, outcomes.snapshot(), charges.Load())
	if (keys[0] == keys[1]) == newMessage {
		t.Errorf("keys %q", keys)
	}
	if charges.Load() != wantCharges || outcomes.get(event.SkipDuplicate) != 2-int(wantCharges) {
		t.Errorf("%d charges, %v; want %d", charges.Load(), outcomes.snapshot(), wantCharges)
	}
}

type outcomeCounter struct {
	mu     sync.Mutex
	counts map[event.Event]int
}

func (o *outcomeCounter) ObserveDecision(d dedup.Decision) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.counts[d.Event]++
}

func (o *outcomeCounter) ObserveStoreOp(string, time.Duration, error) {}

func (o *outcomeCounter) get(e event.Event) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.counts[e]
}

func (o *outcomeCounter) snapshot() map[event.Event]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := map[event.Event]int{}
	for k, v := range o.counts {
		m[k] = v
	}
	return m
}
