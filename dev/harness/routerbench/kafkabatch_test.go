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

// TestRunKafkaBatch runs the Kafka batch consumer benchmark once, tiny, so
// that `make test` proves `make bench` still runs it: it checks what was
// printed (a row per lane, the ratios, two requests per poll for the raw
// floor and at least one for each dedup lane), never how fast anything
// was.
func TestRunKafkaBatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := routerbench.RunKafkaBatch(ctx, routerbench.KafkaBatchOptions{Records: 300, Partitions: 4, Repetitions: 1, Out: &out}); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"300 records", "on 4 partitions", "requests/poll", "/proc/loadavg at start"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	// The last column is the requests per poll; a ratio is followed by
	// the lane it is of.
	rows := map[string][]string{}
	for _, line := range strings.Split(got, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "redis" {
			lane, _, _ := strings.Cut(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "redis")), "  ")
			rows[lane] = f
		}
	}
	for lane, want := range map[string]struct {
		ratioOf string // "" for none
		min     float64
	}{
		"consumer+dedup":         {"consumer", 1},
		"consumer":               {"", -1},
		"consumer+dedup (no-op)": {"raw floor (no-op)", 1},
		"raw floor (no-op)":      {"", 2},
	} {
		f, ok := rows[lane]
		if !ok {
			t.Errorf("no row for %q:\n%s", lane, got)
			continue
		}
		row := strings.Join(f, " ")
		if want.ratioOf != "" && !strings.Contains(row, " "+want.ratioOf+" ") {
			t.Errorf("%q: no ratio of %q: %s", lane, want.ratioOf, row)
		}
		reqs := f[len(f)-1]
		if want.min < 0 {
			if reqs != "-" {
				t.Errorf("%q: requests/poll %s, want -: %s", lane, reqs, row)
			}
			continue
		}
		n, err := strconv.ParseFloat(reqs, 64)
		switch {
		case err != nil || n < want.min:
			t.Errorf("%q: requests/poll %s, want at least %v: %s", lane, reqs, want.min, row)
		case lane == "raw floor (no-op)" && n != 2:
			t.Errorf("%q: requests/poll %s, want 2.0 (two pipelines): %s", lane, reqs, row)
		}
	}
}
