package routerbench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/internal/testserver"
	redisstore "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// memPoint is the used_memory growth per completed record after records
// records.
type memPoint struct {
	records   int
	perRecord float64
	took      time.Duration // to write the records added since the last point
}

// redisMemory completes records through the Redis store on a redis-server
// of its own (so nothing else is in it and nothing needs flushing), up to
// each count in counts, and reports the growth of used_memory (less the
// client buffers) per record since the start.
func redisMemory(ctx context.Context, id string, counts []int) ([]memPoint, string, error) {
	srv, err := testserver.StartRedis()
	if err != nil {
		return nil, "", err
	}
	defer func() { _ = srv.Close() }()
	client := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: 64})
	defer func() { _ = client.Close() }()
	store, err := redisstore.New(ctx, client, redisstore.Config{KeyPrefix: "dedup-bench-mem-" + id + ":"})
	if err != nil {
		return nil, "", err
	}
	version := "?"
	if info, err := client.InfoMap(ctx, "server").Result(); err == nil {
		version = info["Server"]["redis_version"]
	}
	keyOf := func(i int64) string { return admin.ScopedKey(scope, fmt.Sprintf("ORDER-%08d", i)) }
	describe := fmt.Sprintf("fresh redis-server %s, Store.Claim+Complete, no result, no fingerprint, keys like %q (%d bytes); used_memory less mem_clients_normal",
		version, store.RedisKey(keyOf(1)), len(store.RedisKey(keyOf(1))))

	before, err := usedMemory(ctx, client)
	if err != nil {
		return nil, "", err
	}
	var (
		points []memPoint
		done   int64
	)
	counts = slices.Sorted(slices.Values(counts))
	for _, n := range counts {
		start := time.Now()
		from := done
		var next atomic.Int64
		next.Store(from)
		_, _, err := drive(ctx, 32, 0, int64(n)-from, func(ctx context.Context, _ int) error {
			i := next.Add(1)
			res, err := store.Claim(ctx, keyOf(i), "", time.Hour)
			if err != nil {
				return err
			}
			if res.Outcome != dedup.Acquired {
				return fmt.Errorf("routerbench: claim of a fresh key: %v", res.Outcome)
			}
			return store.Complete(ctx, res.Claim, nil, 24*time.Hour)
		})
		if err != nil {
			return nil, "", fmt.Errorf("routerbench: Redis memory at %d records: %w", n, err)
		}
		done = int64(n)
		after, err := usedMemory(ctx, client)
		if err != nil {
			return nil, "", err
		}
		points = append(points, memPoint{records: n, perRecord: float64(after-before) / float64(n), took: time.Since(start)})
	}
	return points, describe, nil
}

// usedMemory returns used_memory less the memory of client connections.
func usedMemory(ctx context.Context, client *goredis.Client) (int64, error) {
	info, err := client.InfoMap(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	var n [2]int64
	for i, field := range []string{"used_memory", "mem_clients_normal"} {
		if n[i], err = strconv.ParseInt(info["Memory"][field], 10, 64); err != nil {
			return 0, fmt.Errorf("routerbench: INFO memory %s: %w", field, err)
		}
	}
	return n[0] - n[1], nil
}
