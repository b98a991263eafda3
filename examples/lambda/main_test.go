package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

// The README's local commands, on fauxqs: one charge with lambdadedup, ten
// without.
func TestLocalRun(t *testing.T) {
	fauxqs, err := testserver.StartFauxqs()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fauxqs.Close() })
	t.Setenv("AWS_ENDPOINT_URL", fauxqs.Endpoint)
	t.Setenv("DEDUP_TABLE", "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-local", "-batch-size", "1", "-queue", "b1"}, "1 charges for 10 messages"},
		{[]string{"-local", "-batch-size", "10", "-queue", "b10"}, "1 charges for 10 messages"},
		{[]string{"-local", "-idempotency=false", "-queue", "off"}, "10 charges for 10 messages"},
	} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), c.args, &out, &errOut); code != 0 {
			t.Fatalf("%v exited %d\n%s%s", c.args, code, out.String(), errOut.String())
		}
		if !strings.Contains(out.String(), c.want) {
			t.Errorf("%v: output lacks %q:\n%s", c.args, c.want, out.String())
		}
	}
}

func TestNeedsATableOutsideLocal(t *testing.T) {
	t.Setenv("DEDUP_TABLE", "")
	t.Setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
	if code := run(context.Background(), nil, &bytes.Buffer{}, &bytes.Buffer{}); code != 2 {
		t.Errorf("exit %d without DEDUP_TABLE, want 2", code)
	}
}
