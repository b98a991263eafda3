package routerbench_test

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dev/harness/routerbench"
)

// TestRunBatch runs the batch benchmark once, tiny, on the memory and
// Redis stores, so that `make test` proves `make bench-batch` still works:
// it checks what was printed (a row per store and size, per Redis batch of
// ten new keys 20 requests one record at a time, and with DoBatch one claim
// request and one or two completion requests), never how fast anything was.
func TestRunBatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := routerbench.RunBatch(ctx, routerbench.BatchOptions{
		Stores: []string{routerbench.StoreMemory, routerbench.StoreRedis}, Sizes: []int{1, 10}, Repetitions: 1, Out: &out,
	}); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"per-record/DoBatch", "raw floor", "/proc/loadavg at start"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	var redis10 string
	for _, line := range strings.Split(got, "\n") {
		if f := strings.Fields(line); len(f) > 6 && f[0] == "redis" && f[1] == "10" {
			redis10 = line
			if batched, err := strconv.ParseFloat(f[6], 64); f[5] != "20.0" || err != nil || batched < 2 || batched > 3 {
				t.Errorf("redis, batches of 10: requests %s per-record and %s DoBatch, want 20.0 and 2 to 3: %s", f[5], f[6], line)
			}
		}
	}
	if redis10 == "" || !strings.Contains(got, "memory      1") && !strings.Contains(got, "memory  1") {
		t.Errorf("missing rows:\n%s", got)
	}
}
