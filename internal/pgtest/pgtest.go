// Package pgtest connects tests to a PostgreSQL server and gives each test
// a schema of its own, so that tests sharing a server (the one on
// 127.0.0.1:5432 may be shared with other packages and people) never touch
// each other's tables.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-dedup/watermill-dedup/internal/testserver"
)

// Connect returns a pool of at most maxConns connections to a PostgreSQL
// server, its DSN and a function that closes both. The server is the one
// at the DSN in the environment variable envDSN when it is set (a child
// process of a crash test connects to its parent's server), else
// testserver.StartPostgres's. Call it from TestMain (testserver.Main).
func Connect(envDSN string, maxConns int32) (*pgxpool.Pool, string, func(), error) {
	closeServer := func() {}
	dsn := os.Getenv(envDSN)
	if dsn == "" {
		pg, err := testserver.StartPostgres()
		if err != nil {
			return nil, "", nil, err
		}
		dsn, closeServer = pg.DSN, func() { _ = pg.Close() }
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		closeServer()
		return nil, "", nil, err
	}
	cfg.MaxConns = maxConns
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		closeServer()
		return nil, "", nil, fmt.Errorf("connecting to %s: %w", dsn, err)
	}
	return pool, dsn, func() { pool.Close(); closeServer() }, nil
}

// Schema creates a schema named prefix plus random hex, and drops it (with
// everything in it) when the test ends.
func Schema(t testing.TB, pool *pgxpool.Pool, prefix string) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := prefix + hex.EncodeToString(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}
