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
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// memPoint is the used_memory growth per completed record after records
// records, for the records the store writes today and for records with
// extraFieldBytes more bytes of fields.
type memPoint struct {
	records         int
	perRecord       float64
	perRecordFields float64
	took            time.Duration // to write the records added since the last point
}

// extraFieldBytes is the size of the field the "with fields" records carry:
// about what the first claim's transport id, claimed-at, completed-at and a
// claim counter will take (issue 18), so that their memory cost is known.
const extraFieldBytes = 30

// redisMemory completes records through the Redis store on a redis-server
// of its own (so nothing else is in it and nothing needs flushing; the
// store's default prefix "dedup:"), up to each count in counts, and reports
// the growth of used_memory (less the client buffers) per record since the
// start. A second redis-server gets the same number of version 2 completed
// records carrying one extraFieldBytes field (written with SET PX, as the
// Complete script would write them), for the budget of later fields.
func redisMemory(ctx context.Context, counts []int) ([]memPoint, string, error) {
	counts = slices.Sorted(slices.Values(counts))
	keyOf := func(i int64) string { return admin.ScopedKey(scope, fmt.Sprintf("ORDER-%08d", i)) }
	var (
		points   []memPoint
		describe string
	)
	err := withRedis(ctx, func(client *goredis.Client, version string) error {
		store, err := dedupredis.New(ctx, dedupredis.Config{Client: client})
		if err != nil {
			return err
		}
		describe = fmt.Sprintf("fresh redis-server %s, Store.Claim+Complete, no result, no fingerprint, keys like %q (%d bytes); used_memory less mem_clients_normal",
			version, store.RedisKey(keyOf(1)), len(store.RedisKey(keyOf(1))))
		return grow(ctx, client, counts, func(n int, perRecord float64, took time.Duration) {
			points = append(points, memPoint{records: n, perRecord: perRecord, took: took})
		}, func(ctx context.Context, i int64) error {
			res, err := store.Claim(ctx, keyOf(i), "", time.Hour)
			if err != nil {
				return err
			}
			if res.Outcome != dedup.Acquired {
				return fmt.Errorf("routerbench: claim of a fresh key: %v", res.Outcome)
			}
			return store.Complete(ctx, res.Claim, nil, 24*time.Hour)
		})
	})
	if err != nil {
		return nil, "", err
	}
	err = withRedis(ctx, func(client *goredis.Client, _ string) error {
		k := 0
		return grow(ctx, client, counts, func(n int, perRecord float64, _ time.Duration) {
			points[k].perRecordFields = perRecord
			k++
		}, func(ctx context.Context, i int64) error {
			return client.Set(ctx, "dedup:"+keyOf(i), recordWithField(i), 24*time.Hour).Err()
		})
	})
	return points, describe, err
}

// recordWithField is a version 2 completed record (see stores/redis
// record.go) with one field of extraFieldBytes bytes, no result.
func recordWithField(i int64) []byte {
	v := make([]byte, 0, 11+2+extraFieldBytes)
	v = append(v, 2, 'C')
	v = strconv.AppendInt(v, 1e7+i, 10)[:10] // 8 token bytes
	v = append(v, byte(2+extraFieldBytes), 9, extraFieldBytes)
	for j := range extraFieldBytes {
		v = append(v, byte('a'+j%26))
	}
	return v
}

// withRedis runs f on a fresh redis-server of its own.
func withRedis(ctx context.Context, f func(client *goredis.Client, version string) error) error {
	srv, err := testserver.StartRedis()
	if err != nil {
		return err
	}
	defer func() { _ = srv.Close() }()
	client := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: 64})
	defer func() { _ = client.Close() }()
	version := "?"
	if info, err := client.InfoMap(ctx, "server").Result(); err == nil {
		version = info["Server"]["redis_version"]
	}
	return f(client, version)
}

// grow calls write for record numbers 1, 2, … up to each count, and
// reports the used_memory growth per record since the start at each.
func grow(ctx context.Context, client *goredis.Client, counts []int, report func(n int, perRecord float64, took time.Duration),
	write func(ctx context.Context, i int64) error) error {
	before, err := usedMemory(ctx, client)
	if err != nil {
		return err
	}
	var done int64
	for _, n := range counts {
		start := time.Now()
		var next atomic.Int64
		next.Store(done)
		if _, _, err := drive(ctx, 32, 0, int64(n)-done, func(ctx context.Context, _ int) error { return write(ctx, next.Add(1)) }); err != nil {
			return fmt.Errorf("routerbench: Redis memory at %d records: %w", n, err)
		}
		done = int64(n)
		after, err := usedMemory(ctx, client)
		if err != nil {
			return err
		}
		report(n, float64(after-before)/float64(n), time.Since(start))
	}
	return nil
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
