package redis_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// apReps is how many samples BenchmarkAutoPipeline takes of each way at
// each concurrency.
const apReps = 7

// apWay is one way of running Claim+Complete (or the floor) in
// BenchmarkAutoPipeline.
type apWay struct {
	name string
	op   func(ctx context.Context, key string) error
}

// BenchmarkAutoPipeline compares the ways of batching the commands of
// concurrent Claim+Complete calls (a new message: SET NX PX GET, then
// EVALSHA of the completing script) on a single server and on a 3-master
// Cluster, at 1, 16, 64 and 256 concurrent callers, against an unpipelined
// SET NX PX of a fresh key (the floor, one round trip):
//
//   - store: Claim+Complete, every command alone;
//   - store-ap-ours: Config.AutoPipeline with the store's own batcher;
//   - store-ap-goredis: the same store on go-redis' auto-pipeliner,
//     client.AutoPipeline() (blocking face, its defaults: one ordered batch
//     stream);
//   - store-ap-goredis-fd: go-redis' pipeliner with FullDuplex (a writer
//     and a reader goroutine on one held connection per node);
//   - store-ap-goredis-par2: go-redis' pipeliner with two batches in flight
//     (Unordered, MaxConcurrentBatches 2: what the store's batcher does).
//
// Each way runs b.N operations per sample, the ways in rotating order,
// apReps samples each; it prints the median rate, its spread (lowest and
// highest sample), the median of the per-sample ratios to the floor (taken
// in the same round), and the median CPU time per operation of this
// process plus the redis-server processes (INFO cpu). Run it with
//
//	go test -run '^$' -bench AutoPipeline -benchtime 3000x ./stores/redis/
func BenchmarkAutoPipeline(b *testing.B) {
	b.Run("single", func(b *testing.B) {
		if b.N == 1 {
			return // the framework's probing run
		}
		newClient := func(ap *goredis.AutoPipelineOptions) goredis.UniversalClient {
			return goredis.NewClient(&goredis.Options{Addr: server.Addr, PoolSize: 300, AutoPipelineOptions: ap})
		}
		benchAutoPipeline(b, "single", []string{server.Addr}, newClient)
	})
	b.Run("cluster", func(b *testing.B) {
		if b.N == 1 {
			return
		}
		cluster, err := testserver.StartRedisCluster(3)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cluster.Close() })
		newClient := func(ap *goredis.AutoPipelineOptions) goredis.UniversalClient {
			return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cluster.Addrs, PoolSize: 300, AutoPipelineOptions: ap})
		}
		benchAutoPipeline(b, "cluster", cluster.Addrs, newClient)
	})
}

func benchAutoPipeline(b *testing.B, topology string, addrs []string, newClient func(*goredis.AutoPipelineOptions) goredis.UniversalClient) {
	ctx := context.Background()
	client := newClient(nil)
	b.Cleanup(func() { _ = client.Close() })
	plain := newStore(b, client, redis.Config{KeyPrefix: "bench-ap:"})
	ours := newStore(b, client, redis.Config{KeyPrefix: "bench-ap:", AutoPipeline: true})
	// goRedis is the store on go-redis' auto-pipeliner with options opts
	// (go-redis keeps one pipeliner per client, configured by its first
	// caller: one client per configuration).
	goRedis := func(opts *goredis.AutoPipelineOptions) *redis.Store {
		c := newClient(opts)
		b.Cleanup(func() { _ = c.Close() })
		var (
			ap  *goredis.AutoPipeliner
			err error
		)
		switch c := c.(type) {
		case *goredis.Client:
			ap, err = c.AutoPipeline()
		case *goredis.ClusterClient:
			ap, err = c.AutoPipeline()
		}
		if err != nil {
			b.Fatal(err)
		}
		return redis.WithAutoPipeliner(newStore(b, c, redis.Config{KeyPrefix: "bench-ap:"}), ap)
	}
	fd := goredis.DefaultBlockingAutoPipelineOptions()
	fd.FullDuplex = true
	par2 := goredis.DefaultBlockingAutoPipelineOptions()
	par2.Unordered, par2.MaxConcurrentBatches = true, 2
	ways := []apWay{
		{"raw-set-nx-px", func(ctx context.Context, key string) error {
			return client.Do(ctx, "set", key, benchValue, "nx", "px", benchLease.Milliseconds()).Err()
		}},
		{"store", claimComplete(plain)},
		{"store-ap-ours", claimComplete(ours)},
		{"store-ap-goredis", claimComplete(goRedis(nil))},
		{"store-ap-goredis-fd", claimComplete(goRedis(fd))},
		{"store-ap-goredis-par2", claimComplete(goRedis(par2))},
	}
	nodes := make([]*goredis.Client, len(addrs))
	for i, addr := range addrs {
		nodes[i] = goredis.NewClient(&goredis.Options{Addr: addr})
		b.Cleanup(func() { _ = nodes[i].Close() })
	}
	serversCPU := func() float64 {
		var sum float64
		for _, n := range nodes {
			sum += serverCPU(b, n)
		}
		return sum
	}

	load0 := loadAvg()
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "%s, c\tway\top/s median\tlowest\thighest\tratio to floor\tCPU µs/op\t\n", topology)
	run := 0
	for _, c := range []int{1, 16, 64, 256} {
		rates := make([][]float64, len(ways))
		ratios := make([][]float64, len(ways))
		cpu := make([][]float64, len(ways))
		for r := range apReps {
			for _, n := range nodes {
				if err := n.FlushDB(ctx).Err(); err != nil {
					b.Fatal(err)
				}
			}
			round := make([]float64, len(ways))
			for k := range ways {
				j := (k + r) % len(ways)
				run++
				prefix := fmt.Sprintf("ap-%d-", run)
				s0, c0, t0 := serversCPU(), processCPU(b), time.Now()
				if err := runN(c, int64(b.N), func(i int64) error { return ways[j].op(ctx, prefix+strconv.FormatInt(i, 10)) }); err != nil {
					b.Fatal(err)
				}
				d := time.Since(t0)
				s1, c1 := serversCPU(), processCPU(b)
				round[j] = float64(b.N) / d.Seconds()
				rates[j] = append(rates[j], round[j])
				cpu[j] = append(cpu[j], (s1-s0+c1-c0)/float64(b.N))
			}
			for j := range ways {
				ratios[j] = append(ratios[j], round[j]/round[0])
			}
		}
		for j, way := range ways {
			fmt.Fprintf(w, "%d\t%s\t%.0f\t%.0f\t%.0f\t%.2f\t%.1f\t\n", c, way.name,
				median(slices.Clone(rates[j])), slices.Min(rates[j]), slices.Max(rates[j]),
				median(ratios[j]), median(cpu[j]))
		}
	}
	load1 := loadAvg()
	fmt.Printf("\nauto-pipelining, %s, redis-server on loopback, GOMAXPROCS=%d, %s, go-redis v9.23.0; %d samples of %d ops per way; loadavg before %s, after %s\n",
		topology, runtime.GOMAXPROCS(0), time.Now().Format(time.DateTime), apReps, b.N, load0, load1)
	_ = w.Flush()
	fmt.Println("(op: one SET NX PX for the floor, one Claim+Complete for the others; ratio: median of the per-round op/s ratios to the floor; CPU: this process plus redis-server, median)")
}

// loadAvg returns the 1, 5 and 15 minute load averages.
func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
