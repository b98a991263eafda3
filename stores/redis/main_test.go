package redis_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// server is the standalone redis-server that most tests and the benchmarks
// share; it is started on a free loopback port by TestMain and stopped after
// the run. Tests that restart a server or need a cluster start their own.
var server *testserver.Redis

func TestMain(m *testing.M) {
	testserver.Main(m, func() (func(), error) {
		r, err := testserver.StartRedis()
		if err != nil {
			return nil, err
		}
		server = r
		return func() { _ = r.Close() }, nil
	})
}

// anyClient fills Config.Client for Validate, which sends nothing: it is
// never used to reach a server.
var anyClient goredis.UniversalClient = goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})

// newClient returns a client of the shared server, closed after the test.
func newClient(t testing.TB) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: server.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newStore returns a store on the shared server.
func newStore(t testing.TB, client goredis.UniversalClient, config redis.Config) *redis.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	config.Client = client
	s, err := redis.New(ctx, config)
	if err != nil {
		t.Fatalf("redis.New: %v", err)
	}
	// Closed after the test, also one that failed before its own Close:
	// its watch goroutines would otherwise outlive it, and a later test
	// that counts them (watchGoroutines) would count them too.
	t.Cleanup(func() { _ = s.Close() })
	return s
}
