package redis_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// benchWaitRun numbers the benchmark's invocations, so that every one
// claims keys of its own.
var benchWaitRun atomic.Int64

// BenchmarkWaitReplicas measures what Config.WaitReplicas costs: Claim +
// Complete of distinct keys with WaitReplicas 1 against the same without,
// on a master with one replica (both on loopback), through one client. The
// two are interleaved in rounds (see runInterleaved), five times at
// concurrency 1 and at 16; it prints and reports the median ratio of
// throughput with the option to without. Run it with
//
//	go test -run '^$' -bench WaitReplicas -benchtime 2000x ./stores/redis/
func BenchmarkWaitReplicas(b *testing.B) {
	master, err := testserver.StartRedisWithArgs("--repl-diskless-sync-delay", "0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = master.Close() })
	replica, err := testserver.StartRedisReplica(master)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = replica.Close() })
	client := goredis.NewClient(&goredis.Options{Addr: master.Addr, PoolSize: 64})
	b.Cleanup(func() { _ = client.Close() })
	off := newStore(b, client, redis.Config{KeyPrefix: "bench-off:"})
	on := newStore(b, client, redis.Config{KeyPrefix: "bench-on:", WaitReplicas: 1, WaitTimeout: time.Second})
	ctx := context.Background()
	claimComplete := func(s *redis.Store, run, rep int64) func(int64) error {
		return func(i int64) error {
			res, err := s.Claim(ctx, fmt.Sprintf("%d-%d-%d", run, rep, i), "", benchLease)
			if err != nil {
				return err
			}
			if res.Outcome != dedup.Acquired {
				return fmt.Errorf("claim %d-%d-%d: %v, want Acquired", run, rep, i, res.Outcome)
			}
			return s.Complete(ctx, res.Claim, nil, benchLease)
		}
	}
	run := benchWaitRun.Add(1)
	const reps = 5
	for _, c := range []int{1, 16} {
		var ratios, offRates, onRates []float64
		for rep := int64(0); rep < reps; rep++ {
			rates := runInterleaved(b, c, []func(int64) error{claimComplete(off, run, int64(c)*100+rep), claimComplete(on, run, int64(c)*100+rep)})
			offRates, onRates = append(offRates, rates[0]), append(onRates, rates[1])
			ratios = append(ratios, rates[1]/rates[0])
		}
		b.ReportMetric(median(ratios), fmt.Sprintf("on/off-c%d", c))
		if b.N >= 1000 {
			fmt.Printf("concurrency %d, N=%d: Claim+Complete/s without WaitReplicas %.0f, with WaitReplicas=1 %.0f: ratio %.2f (median of %d interleaved runs)\n",
				c, b.N, median(offRates), median(onRates), median(ratios), reps)
		}
	}
}
