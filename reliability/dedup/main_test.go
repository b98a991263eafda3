// The engine's tests that run on a real Redis as well as on the memory
// store: they need the Redis store's module, which the root module's own
// tests do not import.
package dedup_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/faultstore"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// redisServer is a real redis-server on a free loopback port, shared by the
// package's tests; each test gets its own key prefix.
var redisServer *testserver.Redis

// eachAutoPipeline runs test twice, as subtests: on a Redis store without
// Config.AutoPipeline and with it.
func eachAutoPipeline(t *testing.T, test func(t *testing.T, autoPipeline bool)) {
	for _, autoPipeline := range []bool{false, true} {
		t.Run(fmt.Sprintf("AutoPipeline=%v", autoPipeline), func(t *testing.T) { test(t, autoPipeline) })
	}
}

func TestMain(m *testing.M) {
	testserver.Main(m, func() (func(), error) {
		r, err := testserver.StartRedis()
		if err != nil {
			return nil, err
		}
		redisServer = r
		return func() { _ = r.Close() }, nil
	})
}

// newRedisStore returns a Redis store on the package's redis-server under
// a key prefix of the test's own, with or without Config.AutoPipeline.
func newRedisStore(t *testing.T, autoPipeline bool) dedup.Store {
	t.Helper()
	client := goredis.NewClient(&goredis.Options{Addr: redisServer.Addr})
	t.Cleanup(func() { _ = client.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	prefix := "dedup-test-" + strings.NewReplacer(":", "-", "/", "-").Replace(t.Name()) + "-" + storekit.NewToken()[:8] + ":"
	s, err := dedupredis.New(ctx, dedupredis.Config{Client: client, KeyPrefix: prefix, AutoPipeline: autoPipeline})
	if err != nil {
		t.Fatalf("dedupredis.New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// forEachStore runs test on the memory store (on clock) and on a real
// Redis, without and with Config.AutoPipeline, in parallel subtests.
func forEachStore(t *testing.T, clock dedup.Clock, test func(t *testing.T, store dedup.Store)) {
	t.Helper()
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		test(t, memstore.New(clock))
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		test(t, newRedisStore(t, false))
	})
	t.Run("redis-autopipeline", func(t *testing.T) {
		t.Parallel()
		test(t, newRedisStore(t, true))
	})
}

// decisions records the decisions an Engine reports.
type decisions struct {
	mu  sync.Mutex
	all []dedup.Decision
}

func newDecisions() *decisions { return &decisions{} }

func (d *decisions) ObserveDecision(dec dedup.Decision) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.all = append(d.all, dec)
}

func (d *decisions) ObserveStoreOp(string, time.Duration, error) {}

// of returns the decisions of one event.
func (d *decisions) of(e event.Event) []dedup.Decision {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []dedup.Decision
	for _, dec := range d.all {
		if dec.Event == e {
			out = append(out, dec)
		}
	}
	return out
}

func newDedup(t *testing.T, cfg dedup.Config) *dedup.Deduplicator {
	t.Helper()
	if cfg.Key == nil {
		cfg.Key = keyfuncs.JSON("order_id")
	}
	if cfg.Scope == "" {
		cfg.Scope = "charge"
	}
	d, err := dedup.New(cfg)
	if err != nil {
		t.Fatalf("dedup.New: %v", err)
	}
	return d
}

// recv returns the next value of ch, failing the test after a minute.
func recv[T any](t testing.TB, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("waited a minute for %s", what)
		panic("unreachable")
	}
}

func order(id string) *message.Message {
	return message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"`+id+`","amount":150}`))
}

var epoch = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// faultStore wraps a store and injects errors per operation (see
// internal/testsupport/faultstore).
type faultStore = faultstore.Store

func newFaultStore(s dedup.Store) *faultStore { return faultstore.New(s) }

// hasEvent reports whether logs hold the event at the level.
func hasEvent(logs *watermill.CaptureLoggerAdapter, level watermill.LogLevel, e event.Event) bool {
	for _, m := range logs.Captured()[level] {
		if m.Fields["dedup_event"] == string(e) {
			return true
		}
	}
	return false
}
