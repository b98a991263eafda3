package testserver

import (
	"net/url"
	"strings"
	"testing"
)

func TestCrashablePostgres(t *testing.T) {
	t.Parallel()
	pg := timed(t, "postgres (StartCrashablePostgres)", StartCrashablePostgres)
	defer pg.Close()
	u, _ := url.Parse(pg.DSN)
	if u.Port() == "5432" {
		t.Fatalf("a crashable server on 5432: %s", pg.DSN)
	}
	assertLoopbackOnly(t, portOf(t, u.Host))
	if err := probeDSN(t, pg.DSN); err != nil {
		t.Fatal(err)
	}
	if err := pg.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if err := probeDSN(t, pg.DSN); err == nil {
		t.Fatal("the server still answers after StopImmediate")
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	if err := probeDSN(t, pg.DSN); err != nil {
		t.Fatal(err)
	}
	// The immediate stop skipped the shutdown checkpoint: the restarted
	// server recovered from its WAL.
	if out := pg.Output(); !strings.Contains(out, "automatic recovery in progress") {
		t.Fatalf("the restarted server did not run crash recovery; its output:\n%s", out)
	}
	if err := pg.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pg.Start(); err == nil {
		t.Fatal("Start after Close succeeded")
	}
}
