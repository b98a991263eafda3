// Package pgtest connects tests to a PostgreSQL server and gives each test
// a schema of its own, so that tests sharing a server (the one on
// 127.0.0.1:5432 may be shared with other packages and people) never touch
// each other's tables. It imports no driver: the caller opens its pool
// (pgx) on the DSN and passes the pool's Exec.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"os"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

// Server returns the DSN of a PostgreSQL server and a function that stops
// it. The server is the one at the DSN in the environment variable envDSN
// when it is set (a child process of a crash test connects to its
// parent's server), else testserver.StartPostgres's. Call it from
// TestMain (testserver.Main).
func Server(envDSN string) (dsn string, stop func(), err error) {
	if dsn := os.Getenv(envDSN); dsn != "" {
		return dsn, func() {}, nil
	}
	pg, err := testserver.StartPostgres()
	if err != nil {
		return "", nil, err
	}
	return pg.DSN, func() { _ = pg.Close() }, nil
}

// Schema creates a schema named prefix plus random hex with exec (a pool's
// Exec method), and drops it (with everything in it) when the test ends.
func Schema[T any](t testing.TB, exec func(context.Context, string, ...any) (T, error), prefix string) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := prefix + hex.EncodeToString(b)
	quoted := `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := exec(ctx, "CREATE SCHEMA "+quoted); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := exec(ctx, "DROP SCHEMA "+quoted+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}
