package reliability_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

func TestTmpReset(t *testing.T) {
	proxy := newFaultProxy(t, redisServer.Addr)
	client := goredis.NewClient(&goredis.Options{Addr: proxy.Addr(), MaxRetries: -1, PoolSize: 1})
	ctx := context.Background()
	s := newRedisStore(t, client, "tmp:")
	w, _ := s.Claim(ctx, "w", "", time.Minute)
	t.Log("warm", s.Complete(ctx, w.Claim, nil, time.Minute))
	res, err := s.Claim(ctx, "k", "", time.Minute)
	t.Log(res, err)
	proxy.add(t, "r", "reset_peer", "downstream", map[string]any{"timeout": 0})
	t.Log("complete", s.Complete(ctx, res.Claim, nil, time.Minute))
	time.Sleep(100*time.Millisecond)
	t.Logf("raw after first complete %q", redisRaw(t, "tmp:k"))
	proxy.remove(t, "r")
	t.Log("complete2", s.Complete(ctx, res.Claim, nil, time.Minute))
}

func redisRaw(t *testing.T, k string) string {
	c := goredis.NewClient(&goredis.Options{Addr: redisServer.Addr})
	defer c.Close()
	return c.Get(context.Background(), k).Val()
}
