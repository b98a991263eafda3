package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// The demo on an embedded Kafka: every order charged once, copies skipped
// as duplicates, ORDER-004's failed charge consumed again and charged,
// and every record committed (run only returns once they are).
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	if code := run(ctx, []string{"-timeout", "2m"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	want := `produced 8 records (4 orders) to orders-batch-demo
ORDER-001: charged 100 BRL
ORDER-003: charged 150 BRL
ORDER-003: duplicate, skipped
ORDER-003: duplicate, skipped
ORDER-004: card declined; partition 0 consumed again from offset 4
ORDER-004: charged 80 BRL
ORDER-005: charged 60 BRL
ORDER-004: duplicate, skipped
ORDER-005: duplicate, skipped
committed 8 records: 4 charges for 4 orders, 1 retried
`
	if got := out.String(); got != want {
		t.Fatalf("output:\n%s\nwant:\n%s", got, want)
	}
	if strings.Count(out.String(), "charged") != 4 {
		t.Fatal("an order was charged twice")
	}
}

// A batch of one record per poll: the same charges, one DoBatch per
// record.
func TestDemoOneRecordPerBatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	if code := run(ctx, []string{"-max-batch", "1"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if n := strings.Count(out.String(), ": charged"); n != 4 {
		t.Fatalf("%d charges, want 4:\n%s", n, out.String())
	}
	if !strings.Contains(out.String(), "committed 8 records") {
		t.Fatalf("not every record committed:\n%s", out.String())
	}
}
