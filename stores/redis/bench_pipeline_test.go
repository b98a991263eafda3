package redis_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"text/tabwriter"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// miniComplete stands for the Complete script in the comparison of
// auto-pipelining clients: compare the value, then SET with PX.
const miniComplete = `
local v = redis.call('GET', KEYS[1])
if v ~= ARGV[1] then return 2 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 0
`

// BenchmarkAutoPipeline compares ways of batching concurrent calls on the
// same pair of commands a new message costs (SET key token NX PX lease
// GET, then EVALSHA of a compare-and-set script), interleaved, against an
// unpipelined SET NX PX alone (the baseline):
//
//   - pair: the two commands unpipelined (go-redis Process);
//   - batcher: the store's Config.AutoPipeline batcher (go-redis pipelines);
//   - goredis-ap: go-redis' own AutoPipeliner (v9.23, blocking face);
//   - store-ap: the store's Claim+Complete with Config.AutoPipeline.
//
// It prints ops/s (pairs/s) at c=16 and 64 with the ratio to the baseline,
// and the CPU time per pair of redis-server and of this process at c=64
// (robust on a busy machine). Run it with
//
//	go test -run '^$' -bench AutoPipeline -benchtime 20000x ./stores/redis/
func BenchmarkAutoPipeline(b *testing.B) {
	ctx := context.Background()
	client := goredis.NewClient(&goredis.Options{Addr: server.Addr, PoolSize: 128})
	b.Cleanup(func() { _ = client.Close() })
	sha, err := client.ScriptLoad(ctx, miniComplete).Result()
	if err != nil {
		b.Fatal(err)
	}
	batcher := redis.NewBatcher(client)
	ap, err := client.AutoPipeline()
	if err != nil {
		b.Fatal(err)
	}
	store := newStore(b, client, redis.Config{KeyPrefix: "bench-ap:", AutoPipeline: true})

	const token, done = "0123456789abcdef0123", "1234567890"
	lease := strconv.FormatInt(benchLease.Milliseconds(), 10)
	pair := func(process func(context.Context, goredis.Cmder) error) func(ctx context.Context, key string) error {
		return func(ctx context.Context, key string) error {
			set := goredis.NewCmd(ctx, "set", key, token, "nx", "px", lease, "get")
			if err := process(ctx, set); err != nil && err != goredis.Nil {
				return err
			}
			eval := goredis.NewCmd(ctx, "evalsha", sha, 1, key, token, done, lease)
			_ = process(ctx, eval)
			if n, err := eval.Int64(); err != nil || n != 0 {
				return fmt.Errorf("compare-and-set of %q: %d %v", key, n, err)
			}
			return nil
		}
	}
	impls := []benchImpl{
		{"raw-set-nx-px", func(ctx context.Context, key string) error {
			return client.Do(ctx, "set", key, token, "nx", "px", lease).Err()
		}},
		{"pair", pair(client.Process)},
		{"batcher", pair(batcher.Process)},
		{"goredis-ap", pair(ap.Process)},
		{"store-ap", claimComplete(store)},
	}
	concurrencies := []int{16, 64}
	results := runAtConcurrencies(b, concurrencies, impls, "ap", func(b *testing.B) {
		if err := client.FlushDB(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		if err := client.ScriptLoad(ctx, miniComplete).Err(); err != nil {
			b.Fatal(err)
		}
	})
	if err := client.ScriptLoad(ctx, miniComplete).Err(); err != nil {
		b.Fatal(err)
	}
	// CPU per pair at c=64, rotating order, median of 9 samples.
	const samples, n = 9, 3000
	server, own := make([][]float64, len(impls)), make([][]float64, len(impls))
	for r := range samples {
		for k := range impls {
			j := (k + r) % len(impls)
			prefix := fmt.Sprintf("ap-cpu-%d-%s-", r, impls[j].name)
			s0, c0 := serverCPU(b, client), processCPU(b)
			if err := runN(64, n, func(i int64) error { return impls[j].op(ctx, prefix+strconv.FormatInt(i, 10)) }); err != nil {
				b.Fatal(err)
			}
			s1, c1 := serverCPU(b, client), processCPU(b)
			server[j] = append(server[j], (s1-s0)/n)
			own[j] = append(own[j], (c1-c0)/n)
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Printf("\nauto-pipelining, redis-server on loopback, GOMAXPROCS=%d, %s; loadavg %s", runtime.GOMAXPROCS(0), time.Now().Format(time.DateTime), load)
	fmt.Fprintf(w, "\t")
	for _, c := range concurrencies {
		fmt.Fprintf(w, "c=%d op/s\tratio\t", c)
	}
	fmt.Fprintf(w, "server CPU µs/op\tclient CPU µs/op\tCPU ratio\t\n")
	cost0 := median(server[0]) + median(own[0])
	for j, im := range impls {
		fmt.Fprintf(w, "%s\t", im.name)
		for _, c := range concurrencies {
			rates, ok := results[c]
			if !ok {
				fmt.Fprintf(w, "-\t-\t")
				continue
			}
			fmt.Fprintf(w, "%.0f\t%.2f\t", rates[j], rates[j]/rates[0])
		}
		sc, cc := median(server[j]), median(own[j])
		fmt.Fprintf(w, "%.1f\t%.1f\t%.2f\t\n", sc, cc, cost0/(sc+cc))
	}
	_ = w.Flush()
	fmt.Println("(op: one SET NX PX for the baseline, one pair (or Claim+Complete) for the others; CPU at c=64, median of 9 samples of 3000; CPU ratio: baseline CPU / op CPU)")
}
