package redis_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// BenchmarkClaimComplete runs Claim+Complete of fresh keys (a new message:
// SET NX PX GET, then the completing script) at 1 and 16 concurrent
// callers, every command alone, and reports ns/op, allocs/op and the CPU
// time per operation of this process and of redis-server. It is the paired
// measurement (two builds, alternated; docs/dev/redis-autopipeline.md) that
// replaced the store's own EVALSHA runner with go-redis' Script.Run:
//
//	go test -c -o /tmp/a.test ./stores/redis/   # one build, then the other
//	for i in 1 2 3 4 5 6 7 8 9; do for t in a b; do
//	  /tmp/$t.test -test.run '^$' -test.bench ClaimComplete -test.benchtime 20000x -test.benchmem
//	done; done
func BenchmarkClaimComplete(b *testing.B) {
	ctx := context.Background()
	client := goredis.NewClient(&goredis.Options{Addr: server.Addr, PoolSize: 64})
	b.Cleanup(func() { _ = client.Close() })
	store := newStore(b, client, redis.Config{KeyPrefix: "bench-cc:"})
	op := claimComplete(store)
	run := 0
	for _, c := range []int{1, 16} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			run++
			prefix := fmt.Sprintf("cc-%d-", run)
			b.ReportAllocs()
			s0, c0 := serverCPU(b, client), processCPU(b)
			b.ResetTimer()
			if err := runN(c, int64(b.N), func(i int64) error { return op(ctx, prefix+strconv.FormatInt(i, 10)) }); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			s1, c1 := serverCPU(b, client), processCPU(b)
			b.ReportMetric((c1-c0)/float64(b.N), "client-µs/op")
			b.ReportMetric((s1-s0)/float64(b.N), "server-µs/op")
		})
	}
}
