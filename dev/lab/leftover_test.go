package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

// TestLabCommandHelpExitsZero: -h prints the usage and exits 0 (it exited
// 2, as for a bad flag).
func TestLabCommandHelpExitsZero(t *testing.T) {
	for _, arg := range []string{"-h", "-help", "--help"} {
		var out, errOut bytes.Buffer
		if code := run([]string{arg}, &out, &errOut); code != 0 {
			t.Errorf("dedup-lab %s exited %d, want 0", arg, code)
		}
		if !strings.Contains(out.String()+errOut.String(), "usage: dedup-lab") {
			t.Errorf("dedup-lab %s printed no usage:\n%s%s", arg, out.String(), errOut.String())
		}
	}
}

// TestLabCommandSaysWhatItLeavesInARealStore: on a real Redis the lab says
// which records it leaves (their keys, how many, their retention) and how
// to list them; the embedded store and the memory store leave nothing.
func TestLabCommandSaysWhatItLeavesInARealStore(t *testing.T) {
	r, err := testserver.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	out := runLab(t, []string{"-idempotency", "on", "-store", "redis", "-redis-addr", r.Addr, "-orders", "5", "-copies", "3", "-effect-time", "1ms"})
	re := regexp.MustCompile(`(?m)^left in the store: 6 records, keys dedup-lab:charge-orders-(\S+):ORDER-…, each kept for its retention \(24h0m0s\) unless evicted: ` +
		`dedupctl -redis-addr ` + regexp.QuoteMeta(r.Addr) + ` -redis-prefix dedup-lab: list -scope charge-orders-(\S+)$`)
	if m := re.FindStringSubmatch(out); m == nil || m[1] != m[2] {
		t.Errorf("the output does not say what the run left in Redis (%v):\n%s", re, out)
	}
	for _, args := range [][]string{{"-idempotency", "on", "-store", "redis"}, {"-idempotency", "on"}} {
		if out := runLab(t, append(args, "-orders", "5", "-effect-time", "1ms")); strings.Contains(out, "left in the store") {
			t.Errorf("%v: an in-process store leaves nothing:\n%s", args, out)
		}
	}
}
