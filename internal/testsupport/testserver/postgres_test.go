package testserver

import (
	"net/url"
	"os"
	"testing"
	"time"
)

func probeDSN(t *testing.T, dsn string) error {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return pgProbe(u.Host, u.User.Username(), u.Path[1:])
}

func TestStartPostgres(t *testing.T) {
	t.Parallel()
	pg := timed(t, "postgres (StartPostgres)", StartPostgres)
	defer pg.Close()
	t.Logf("DSN %s, shared %v", pg.DSN, pg.Shared)
	if err := probeDSN(t, pg.DSN); err != nil {
		t.Fatal(err)
	}
	if pg.Shared && pg.proc != nil {
		t.Fatal("a shared server has a process")
	}
}

func TestOwnPostgres(t *testing.T) {
	t.Parallel()
	pg := timed(t, "postgres (own cluster: initdb + start)", startOwnPostgres)
	defer pg.Close()
	if pg.Shared {
		t.Fatal("own server marked Shared")
	}
	u, _ := url.Parse(pg.DSN)
	if u.Port() == "5432" {
		t.Fatalf("own server on 5432: %s", pg.DSN)
	}
	assertLoopbackOnly(t, portOf(t, u.Host))
	if err := probeDSN(t, pg.DSN); err != nil {
		t.Fatal(err)
	}
	pid := pg.proc.cmd.Process.Pid
	dir := pg.dir
	t0 := time.Now()
	if err := pg.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("own postgres stopped in %d ms", time.Since(t0).Milliseconds())
	waitDead(t, pid, time.Second)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s still there: %v", dir, err)
	}
	if err := probeDSN(t, pg.DSN); err == nil {
		t.Fatal("server still answers after Close")
	}
	if err := pg.Close(); err != nil {
		t.Fatal(err)
	}
}
