package routerbench_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dev/harness/routerbench"
)

// TestRunMemory runs the whole harness once, tiny, on the memory store, so
// that `make test` proves `make bench` still works. It checks what was
// printed, never how fast anything was.
func TestRunMemory(t *testing.T) {
	got := tinyRun(t, 2*time.Minute, []string{routerbench.StoreMemory}, 1, 3)
	printed(t, got,
		"/proc/loadavg at start", "nproc ",
		"throughput:", "CPU time of this process", "ratios:", "allocations per message:",
		"router+dedup/raw", "dup/raw", "router/raw", "claim+complete/raw", "dedup/wm-dedup",
		"router+wm-dedup dup",
	)
	rows(t, got, 3, "memory  1  ", "memory  3  ")
	if strings.Contains(got, "CPU time of the Redis server") {
		t.Errorf("a run without Redis printed a Redis server CPU table:\n%s", got)
	}
}

// tinyRun runs the harness once on stores at concurrencies, for 20 ms a
// variant, with 50-message allocation samples and no used_memory steps,
// and returns what it printed.
func tinyRun(t *testing.T, timeout time.Duration, stores []string, concurrencies ...int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out bytes.Buffer
	err := routerbench.Run(ctx, routerbench.Options{
		Stores:           stores,
		Concurrency:      concurrencies,
		Repetitions:      1,
		Duration:         20 * time.Millisecond,
		Warmup:           -1,
		AllocMessages:    50,
		AllocConcurrency: 2,
		RedisRecords:     []int{},
		Out:              &out,
	})
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	return out.String()
}

// printed checks that got contains every one of wants.
func printed(t *testing.T, got string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}

// rows checks that each prefix starts want rows: 3 (throughput, CPU,
// ratios), 4 on Redis (and the server's CPU).
func rows(t *testing.T, got string, want int, prefixes ...string) {
	t.Helper()
	for _, p := range prefixes {
		if n := strings.Count(got, p); n != want {
			t.Errorf("%d rows start with %q, want %d:\n%s", n, p, want, got)
		}
	}
}

// TestRunFloors runs the harness once, tiny, on the stores that have a
// raw pair (the floor of claim+complete) and, on Redis, the router+raw pair
// and router+raw CAS pair lanes (the floors of router+dedup), with and
// without AutoPipeline, so that the floors' variants, ratios and
// allocation columns are printed. It checks what was printed, never how
// fast anything was.
func TestRunFloors(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server, dynalite and PostgreSQL")
	}
	got := tinyRun(t, 3*time.Minute, []string{routerbench.StoreRedis, routerbench.StoreRedisPipelined, routerbench.StoreDynamo, routerbench.StorePostgres}, 3)
	printed(t, got,
		"raw pair/raw", "claim+complete/raw pair", "router+raw pair/raw", "router+dedup/router+raw pair",
		"raw CAS pair/raw", "claim+complete/raw CAS pair", "router+dedup/router+raw CAS pair",
		"+raw pair allocs", "raw pair allocs", "raw CAS pair allocs", "+raw CAS pair allocs",
		"router+raw pair, router+raw CAS pair: the router, no middleware",
		"raw pair: SET key value NX PX 30000 then SET key value2 XX PX 86400000, unpipelined",
		"raw pair: SET key value NX PX 30000 then SET key value2 XX PX 86400000, through a pipeline shared",
		"raw CAS pair: the same SET NX PX then EVALSHA",
		"raw pair: the same PutItem then UpdateItem", "raw CAS pair: the same PutItem (with a state)",
		"raw pair: the same INSERT",
		"CPU time of the Redis server per message or op",
	)
	rows(t, got, 4, "redis  3  ", "redis-ap  3  ")
	rows(t, got, 3, "dynamo  3  ", "postgres  3  ")
}

func TestOptionsValidate(t *testing.T) {
	bad := routerbench.Options{
		Stores:         []string{"memory", "mongo"},
		Concurrency:    []int{0},
		Repetitions:    -1,
		Duration:       -time.Second,
		RedisRecords:   []int{0},
		ProfileVariant: "router+raw",
	}
	err := bad.Validate()
	if err == nil {
		t.Fatal("Validate accepted bad options")
	}
	for _, want := range []string{`"mongo"`, "concurrency", "repetitions", "duration", "record counts", `profile variant "router+raw"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error lacks %q: %v", want, err)
		}
	}
	if err := (routerbench.Options{}).Validate(); err != nil {
		t.Errorf("Validate of the zero Options (all defaults): %v", err)
	}
}

// TestFixedCountProfileVariant: -messages (and the profiles) run the lane
// ProfileVariant names, a floor as well as the middleware, and a store
// without that lane is an error naming both.
func TestFixedCountProfileVariant(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, v := range []string{"router+raw CAS pair", "router+dedup"} {
		var out bytes.Buffer
		err := routerbench.Run(ctx, routerbench.Options{
			Stores: []string{routerbench.StoreRedis}, ProfileStore: routerbench.StoreRedis, ProfileConcurrency: 2,
			ProfileVariant: v, Messages: 10, Out: &out,
		})
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		if !strings.HasPrefix(out.String(), "fixed\tredis\t2\t10\t") {
			t.Errorf("%s printed %q, want the fixed-count line", v, out.String())
		}
	}
	err := routerbench.Run(ctx, routerbench.Options{
		Stores: []string{routerbench.StoreMemory}, ProfileStore: routerbench.StoreMemory, ProfileConcurrency: 2,
		ProfileVariant: "router+raw CAS pair", Messages: 10, Out: &bytes.Buffer{},
	})
	if err == nil || !strings.Contains(err.Error(), `store memory has no "router+raw CAS pair" lane`) {
		t.Errorf("the memory store with a floor lane: %v, want an error naming the store and the lane", err)
	}
}

// TestTrace: Options.Trace writes a runtime execution trace of the lane
// (the file starts with the trace header) and says where it is.
func TestTrace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	path := filepath.Join(t.TempDir(), "router.trace")
	var out bytes.Buffer
	err := routerbench.Run(ctx, routerbench.Options{
		Stores: []string{routerbench.StoreMemory}, ProfileStore: routerbench.StoreMemory, ProfileConcurrency: 2,
		ProfileDuration: 100 * time.Millisecond, Trace: path, Out: &out, Progress: io.Discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("go 1.")) || !bytes.Contains(b[:min(len(b), 16)], []byte(" trace")) {
		t.Errorf("%s starts with %q, want a runtime trace header", path, b[:min(len(b), 16)])
	}
	if !strings.Contains(out.String(), "written to "+path) {
		t.Errorf("printed %q, want where the trace was written", out.String())
	}
}
