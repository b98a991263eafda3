package routerbench_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/internal/routerbench"
)

// TestRunMemory runs the whole harness once, tiny, on the memory store, so
// that `make test` proves `make bench` still works. It checks what was
// printed, never how fast anything was.
func TestRunMemory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := routerbench.Run(ctx, routerbench.Options{
		Stores:           []string{routerbench.StoreMemory},
		Concurrency:      []int{1, 3},
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
	got := out.String()
	for _, want := range []string{
		"/proc/loadavg at start", "nproc ",
		"throughput:", "CPU time of this process", "ratios:", "allocations per message:",
		"router+dedup/raw", "dup/raw", "router/raw", "claim+complete/raw", "dedup/wm-dedup",
		"router+wm-dedup dup",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	// One row per concurrency in each of the four per-c tables.
	for _, c := range []string{"memory  1  ", "memory  3  "} {
		if n := strings.Count(got, c); n != 3 {
			t.Errorf("%d rows start with %q, want 3 (throughput, CPU, ratios):\n%s", n, c, got)
		}
	}
}

// TestRunFloors runs the harness once, tiny, on the stores that have a
// raw pair (the floor of claim+complete) and, on Redis, a router+raw pair
// lane (the floor of router+dedup), with and without AutoPipeline, so
// that the floors' variants, ratios and allocation columns are printed. It
// checks what was printed, never how fast anything was.
func TestRunFloors(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server, dynalite and PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := routerbench.Run(ctx, routerbench.Options{
		Stores:           []string{routerbench.StoreRedis, routerbench.StoreRedisPipelined, routerbench.StoreDynamo, routerbench.StorePostgres},
		Concurrency:      []int{3},
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
	got := out.String()
	for _, want := range []string{
		"raw pair/raw", "claim+complete/raw pair", "router+raw pair/raw", "router+dedup/router+raw pair",
		"+raw pair allocs", "raw pair allocs",
		"raw pair: SET key value NX PX 30000 then SET key value2 XX PX 86400000, unpipelined",
		"raw pair: SET key value NX PX 30000 then SET key value2 XX PX 86400000, through a pipeline shared",
		"raw pair: the same PutItem then UpdateItem", "raw pair: the same INSERT",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	// Each store's row in the throughput, CPU and ratio tables.
	for _, row := range []string{"redis  3  ", "redis-ap  3  ", "dynamo  3  ", "postgres  3  "} {
		if n := strings.Count(got, row); n != 3 {
			t.Errorf("%d rows start with %q, want 3:\n%s", n, row, got)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	bad := routerbench.Options{
		Stores:       []string{"memory", "mongo"},
		Concurrency:  []int{0},
		Repetitions:  -1,
		Duration:     -time.Second,
		RedisRecords: []int{0},
	}
	err := bad.Validate()
	if err == nil {
		t.Fatal("Validate accepted bad options")
	}
	for _, want := range []string{`"mongo"`, "concurrency", "repetitions", "duration", "record counts"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error lacks %q: %v", want, err)
		}
	}
	if err := (routerbench.Options{}).Validate(); err != nil {
		t.Errorf("Validate of the zero Options (all defaults): %v", err)
	}
}
