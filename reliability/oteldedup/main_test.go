package oteldedup_test

import (
	"context"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// redisServer is a real redis-server on a free loopback port, shared by the
// package's tests; each test gets its own key prefix.
var redisServer *testserver.Redis

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

func newRedisStore(t *testing.T) dedup.Store {
	t.Helper()
	client := goredis.NewClient(&goredis.Options{Addr: redisServer.Addr})
	t.Cleanup(func() { _ = client.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	prefix := "oteldedup-test-" + strings.ReplaceAll(t.Name(), "/", "-") + "-" + storekit.NewToken()[:8] + ":"
	s, err := dedupredis.New(ctx, dedupredis.Config{Client: client, KeyPrefix: prefix})
	if err != nil {
		t.Fatalf("dedupredis.New: %v", err)
	}
	return s
}

// recv receives from ch within a minute, or fails the test naming what it
// awaited.
func recv[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("waited a minute for %s", what)
		panic("unreachable")
	}
}
