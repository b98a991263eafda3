package redis_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// benchLease is long enough that no benchmark key expires during a run.
const benchLease = time.Minute

// benchValue has the size of a typical in-progress record (19 bytes), so the
// baseline SET moves as many bytes as a claim.
var benchValue = strings.Repeat("v", 19)

// BenchmarkStore measures, in one run and at concurrency 1, 16 and 64:
//
//   - raw-set-nx-px: go-redis SET key value NX PX lease of distinct keys, the
//     baseline: one round trip, the least a claim can cost;
//   - claim: Store.Claim (SET NX PX GET);
//   - claim-lua: the same claim as a Lua script (the alternative measured to
//     choose between them);
//   - claim+complete: the store's two round trips for a new message, without
//     the middleware (Complete is an EVALSHA);
//   - happy-path: the middleware's full path for a new message: claim,
//     handler (no-op, heartbeat on), complete;
//   - happy-path-no-heartbeat: the same with Config.DisableHeartbeat, which
//     shows what starting and stopping the heartbeat goroutine costs.
//
// Each reports ops/s; at the end it prints a table with the ratio of each to
// the baseline of the same concurrency, and the memory a completed record
// takes in Redis. Run it with
//
//	go test -run '^$' -bench Store -benchtime 2s ./stores/redis/
func BenchmarkStore(b *testing.B) {
	ctx := context.Background()
	client := goredis.NewClient(&goredis.Options{Addr: server.Addr, PoolSize: 128})
	b.Cleanup(func() { _ = client.Close() })
	store := newStore(b, client, redis.Config{})
	lua := redis.LuaClaimStore{Store: store}
	middleware := func(disableHeartbeat bool) func(context.Context, string) error {
		d, err := dedup.New(dedup.Config{
			Store:            store,
			Key:              func(msg *message.Message) (string, error) { return msg.Metadata.Get("key"), nil },
			Scope:            "bench",
			DisableHeartbeat: disableHeartbeat,
		})
		if err != nil {
			b.Fatal(err)
		}
		h := d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
		return func(ctx context.Context, key string) error {
			msg := message.NewMessage("uuid-"+key, nil)
			msg.Metadata.Set("key", key)
			_, err := h(msg)
			return err
		}
	}

	claimWith := func(s dedup.Store) func(context.Context, string) error {
		return func(ctx context.Context, key string) error {
			res, err := s.Claim(ctx, key, "", benchLease)
			if err == nil && res.Outcome != dedup.Acquired {
				err = fmt.Errorf("claim of a fresh key %q: %v", key, res.Outcome)
			}
			return err
		}
	}
	impls := []benchImpl{
		{"raw-set-nx-px", func(ctx context.Context, key string) error {
			return client.Do(ctx, "set", "dedup:"+key, benchValue, "nx", "px", benchLease.Milliseconds()).Err()
		}},
		{"claim", claimWith(store)},
		{"claim-lua", claimWith(lua)},
		{"claim+complete", claimComplete(store)},
		{"happy-path", middleware(false)},
		{"happy-path-no-heartbeat", middleware(true)},
	}

	concurrencies := []int{1, 16, 64}
	results := runAtConcurrencies(b, concurrencies, impls, "bench", func(b *testing.B) {
		if err := client.FlushDB(ctx).Err(); err != nil { // our own server: start each from an empty data set
			b.Fatal(err)
		}
	})

	ops := make([]func(int64) error, len(impls))
	for j, im := range impls {
		prefix := fmt.Sprintf("bench-cost-%s-", im.name)
		ops[j] = func(i int64) error { return im.op(ctx, prefix+strconv.FormatInt(i, 10)) }
	}
	costs := measureCPU(b, client, ops)
	mem := measureMemory(b, client, store)
	version, _ := client.InfoMap(ctx, "server").Result()
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(os.Stdout, "\nRedis store, redis-server %s on loopback, GOMAXPROCS=%d, go-redis PoolSize 128\n",
		version["Server"]["redis_version"], runtime.GOMAXPROCS(0))
	fmt.Fprintf(w, "\t")
	for _, c := range concurrencies {
		fmt.Fprintf(w, "c=%d ops/s\tratio\t", c)
	}
	fmt.Fprintf(w, "server CPU µs/op\tclient CPU µs/op\tCPU ratio\t\n")
	for j, im := range impls {
		fmt.Fprintf(w, "%s\t", im.name)
		for _, c := range concurrencies {
			rates, ok := results[c]
			if !ok { // filtered out with -bench
				fmt.Fprintf(w, "-\t-\t")
				continue
			}
			fmt.Fprintf(w, "%.0f\t%.0f%%\t", rates[j], 100*rates[j]/rates[0])
		}
		c := costs[j]
		fmt.Fprintf(w, "%.1f\t%.1f\t%.0f%%\t\n", c.server, c.client, 100*(costs[0].server+costs[0].client)/(c.server+c.client))
	}
	_ = w.Flush()
	fmt.Println("(CPU µs/op: CPU time per operation of redis-server (INFO cpu) and of the benchmark process (getrusage), median of 9 samples of 2000 operations at concurrency 16; CPU ratio: baseline CPU / op CPU, the throughput ratio to expect when client and server share the CPUs)")
	fmt.Println(mem)
}

// claimComplete claims a fresh key on store and completes it.
func claimComplete(store dedup.Store) func(ctx context.Context, key string) error {
	return func(ctx context.Context, key string) error {
		res, err := store.Claim(ctx, key, "", benchLease)
		if err == nil && res.Outcome != dedup.Acquired {
			err = fmt.Errorf("claim of a fresh key %q: %v", key, res.Outcome)
		}
		if err != nil {
			return err
		}
		return store.Complete(ctx, res.Claim, nil, benchLease)
	}
}

// benchImpl is one way of doing an operation on a fresh key.
type benchImpl struct {
	name string
	op   func(ctx context.Context, key string) error
}

// runAtConcurrencies runs impls interleaved (runInterleaved) at each
// concurrency, one sub-benchmark each, after prepare, on keys unique to the
// run (tag, run number, impl name), reports each impl's ops/s and its ratio
// to the first, and returns the rates by concurrency (a filtered-out
// sub-benchmark has none).
func runAtConcurrencies(b *testing.B, concurrencies []int, impls []benchImpl, tag string, prepare func(b *testing.B)) map[int][]float64 {
	ctx := context.Background()
	results := map[int][]float64{}
	run := 0
	for _, c := range concurrencies {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			prepare(b)
			run++
			ops := make([]func(int64) error, len(impls))
			for j, im := range impls {
				prefix := fmt.Sprintf("%s-%d-%s-", tag, run, im.name)
				ops[j] = func(i int64) error { return im.op(ctx, prefix+strconv.FormatInt(i, 10)) }
			}
			rates := runInterleaved(b, c, ops)
			for j, im := range impls {
				b.ReportMetric(rates[j], im.name+"-ops/s")
				if j > 0 {
					b.ReportMetric(rates[j]/rates[0], im.name+"/baseline")
				}
			}
			results[c] = rates // the last (largest) run wins
		})
	}
	return results
}

// runInterleaved runs each of ops b.N times on c goroutines and returns
// each one's operations per second. The runs are cut into rounds that
// alternate between the ops (in a rotating order), so that load from other
// processes on the machine, which comes and goes, weighs on every op alike
// and the ratios stay meaningful on a busy machine. ns/op is the time for one
// operation of each.
func runInterleaved(b *testing.B, c int, ops []func(i int64) error) []float64 {
	const chunk = 256 // operations per op and round: a few milliseconds
	spent := make([]time.Duration, len(ops))
	done := make([]int64, len(ops))
	b.ResetTimer()
	for r := 0; done[0] < int64(b.N); r++ {
		n := min(chunk, int64(b.N)-done[0])
		for k := range ops {
			j := (k + r) % len(ops)
			base := done[j]
			start := time.Now()
			err := runN(c, n, func(i int64) error { return ops[j](base + i) })
			spent[j] += time.Since(start)
			done[j] += n
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	rates := make([]float64, len(ops))
	for j := range ops {
		rates[j] = float64(done[j]) / spent[j].Seconds()
	}
	return rates
}

// runN runs op n times, with keys 0..n-1, on c goroutines, and returns the
// first error (a failing worker stops).
func runN(c int, n int64, op func(i int64) error) error {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= n {
					return
				}
				if err := op(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("%d workers failed, first: %w", len(errs), errs[0])
	}
	return nil
}

// cpuCost is the CPU time one operation takes, in microseconds.
type cpuCost struct{ server, client float64 }

// measureCPU returns, for each op, the CPU time per operation of
// redis-server (INFO cpu: used_cpu_user + used_cpu_sys, network I/O
// included) and of this process (getrusage: go-redis, the store, the
// middleware, the garbage collector), at concurrency 16: the median of 9
// samples of 2000 operations, taken in rotating order. CPU time, unlike
// throughput, hardly depends on what else runs on the machine, and when
// client and server share the CPUs, throughput is roughly inversely
// proportional to their sum.
func measureCPU(b *testing.B, client *goredis.Client, ops []func(int64) error) []cpuCost {
	b.Helper()
	ctx := context.Background()
	const (
		samples = 9
		n       = 2000
	)
	if err := client.FlushDB(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	server := make([][]float64, len(ops))
	own := make([][]float64, len(ops))
	for r := range samples {
		for k := range ops {
			j := (k + r) % len(ops)
			base := int64(r) * n
			s0, c0 := serverCPU(b, client), processCPU(b)
			if err := runN(16, n, func(i int64) error { return ops[j](base + i) }); err != nil {
				b.Fatal(err)
			}
			s1, c1 := serverCPU(b, client), processCPU(b)
			server[j] = append(server[j], (s1-s0)/n)
			own[j] = append(own[j], (c1-c0)/n)
		}
	}
	costs := make([]cpuCost, len(ops))
	for j := range ops {
		costs[j] = cpuCost{server: median(server[j]), client: median(own[j])}
	}
	return costs
}

func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}

// serverCPU returns the CPU time redis-server has used, in microseconds.
func serverCPU(b *testing.B, client *goredis.Client) float64 {
	b.Helper()
	info, err := client.InfoMap(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, field := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(info["CPU"][field], 64)
		if err != nil {
			b.Fatalf("INFO cpu %s: %v", field, err)
		}
		total += v
	}
	return total * 1e6
}

// processCPU returns the CPU time this process has used, in microseconds.
func processCPU(b *testing.B) float64 {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e3
}

// measureMemory reports what a completed record costs in Redis: MEMORY
// USAGE of one typical key (as the issue asks), and the growth of
// used_memory (less the clients' buffers) per record over many records,
// which also counts the TTL entry and the hash table slots that MEMORY USAGE
// leaves out.
func measureMemory(b *testing.B, client *goredis.Client, store *redis.Store) string {
	b.Helper()
	ctx := context.Background()
	if err := client.FlushDB(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	usage := func(key, fingerprint string, result []byte) int64 {
		res, err := store.Claim(ctx, key, fingerprint, time.Hour)
		if err != nil || res.Outcome != dedup.Acquired {
			b.Fatalf("claim %q: %v %v", key, res.Outcome, err)
		}
		if err := store.Complete(ctx, res.Claim, result, 24*time.Hour); err != nil {
			b.Fatal(err)
		}
		n, err := client.MemoryUsage(ctx, store.RedisKey(key), 0).Result()
		if err != nil {
			b.Fatal(err)
		}
		return n
	}
	typical := admin.ScopedKey("charge-orders", "ORDER-000123")
	plain := usage(typical, "", nil)
	withFP := usage(admin.ScopedKey("charge-orders", "ORDER-000124"), "a-sha256-of-the-payload", nil)

	const records = 50_000
	if err := client.FlushDB(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	before := usedMemory(b, client)
	err := runN(32, records, func(i int64) error {
		key := admin.ScopedKey("charge-orders", fmt.Sprintf("ORDER-%06d", i))
		res, err := store.Claim(ctx, key, "", time.Hour)
		if err != nil {
			return err
		}
		return store.Complete(ctx, res.Claim, nil, 24*time.Hour)
	})
	if err != nil {
		b.Fatal(err)
	}
	after := usedMemory(b, client)
	return fmt.Sprintf("memory per completed record without result, key %q (%d bytes): MEMORY USAGE %d bytes (%d with a fingerprint); used_memory grows by %d bytes per record over %d records",
		store.RedisKey(typical), len(store.RedisKey(typical)), plain, withFP, (after-before)/records, records)
}

// usedMemory returns used_memory less the memory of client connections.
func usedMemory(b *testing.B, client *goredis.Client) int64 {
	b.Helper()
	info, err := client.InfoMap(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	var n [2]int64
	for i, field := range []string{"used_memory", "mem_clients_normal"} {
		if n[i], err = strconv.ParseInt(info["Memory"][field], 10, 64); err != nil {
			b.Fatalf("%s: %v", field, err)
		}
	}
	return n[0] - n[1]
}
