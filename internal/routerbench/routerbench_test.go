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
