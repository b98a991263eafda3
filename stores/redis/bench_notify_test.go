package redis_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/waitbench"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// BenchmarkWaitNotify compares, for 1, 10 and 100 copies waiting on one
// held key, polling (dedup.Config.InProgressPoll's doubling pauses) with
// being woken by the completing script's announcement (Store.WatchKey):
// the time from the holder's Complete to each copy's answer (median, p99)
// and the claims per wait, rounds of the two interleaved. Run it with
//
//	go test -run '^$' -bench WaitNotify -benchtime 1x ./stores/redis/
func BenchmarkWaitNotify(b *testing.B) {
	client := goredis.NewClient(&goredis.Options{Addr: server.Addr, PoolSize: 128})
	b.Cleanup(func() { _ = client.Close() })
	store := newStore(b, client, redis.Config{KeyPrefix: watchPrefix("bench-wait")})
	b.Cleanup(func() { _ = store.Close() })
	for range b.N {
		fmt.Fprintln(os.Stdout, "\nRedis store, redis-server on loopback:")
		if err := waitbench.Run(context.Background(), os.Stdout, waitbench.Config{Store: store, Prefix: fmt.Sprint("w", watchRuns.Add(1), "-")}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAnnounceCost measures what the announcement (SPUBLISH in the
// completing script, to a channel nobody listens on) costs a new message:
// Claim + Complete of distinct keys with it against without, at
// concurrency 1 and 16, in alternating chunks of 256 (which goes first
// alternates too), five times; it prints the median ratio of throughput
// with to without. Run it with
//
//	go test -run '^$' -bench AnnounceCost -benchtime 20000x ./stores/redis/
func BenchmarkAnnounceCost(b *testing.B) {
	client := goredis.NewClient(&goredis.Options{Addr: server.Addr, PoolSize: 64})
	b.Cleanup(func() { _ = client.Close() })
	store := newStore(b, client, redis.Config{KeyPrefix: watchPrefix("bench-ann")})
	defer redis.SetAnnounce(true)
	ctx := context.Background()
	op := claimComplete(store)
	run := watchRuns.Add(1)
	for _, c := range []int{1, 16} {
		var ratios, rates [2][]float64
		for rep := range 5 {
			var spent [2]time.Duration
			var done [2]int64
			for r := 0; done[0] < int64(b.N); r++ {
				n := min(256, int64(b.N)-done[0])
				for k := range 2 {
					mode := (k + r) % 2 // 0: without, 1: with
					redis.SetAnnounce(mode == 1)
					base := done[mode]
					start := time.Now()
					err := runN(c, n, func(i int64) error {
						return op(ctx, fmt.Sprintf("%d-%d-%d-%d-%d", run, c, rep, mode, base+i))
					})
					spent[mode] += time.Since(start)
					done[mode] += n
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			for m := range 2 {
				rates[m] = append(rates[m], float64(done[m])/spent[m].Seconds())
			}
			ratios[0] = append(ratios[0], rates[1][rep]/rates[0][rep])
		}
		b.ReportMetric(median(ratios[0]), fmt.Sprintf("with/without-c%d", c))
		fmt.Printf("concurrency %d, N=%d: Claim+Complete/s without the announcement %.0f, with %.0f: ratio %.3f (median of 5 interleaved runs)\n",
			c, b.N, median(rates[0]), median(rates[1]), median(ratios[0]))
	}
}
