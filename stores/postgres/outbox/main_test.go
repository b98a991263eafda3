package outbox_test

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

// envDSN, when set, is the PostgreSQL server of a child process (see
// crash_test.go): it connects to its parent's server instead of starting
// one.
const envDSN = "OUTBOX_TEST_DSN"

var (
	pool *pgxpool.Pool
	dsn  string
)

func TestMain(m *testing.M) {
	testserver.Main(m, func() (func(), error) {
		closeServer := func() {}
		dsn = os.Getenv(envDSN)
		if dsn == "" {
			pg, err := testserver.StartPostgres()
			if err != nil {
				return nil, err
			}
			dsn, closeServer = pg.DSN, func() { _ = pg.Close() }
		}
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			closeServer()
			return nil, err
		}
		cfg.MaxConns = 12
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pool, err = pgxpool.NewWithConfig(ctx, cfg)
		if err == nil {
			err = pool.Ping(ctx)
		}
		if err != nil {
			closeServer()
			return nil, fmt.Errorf("connecting to %s: %w", dsn, err)
		}
		return func() { pool.Close(); closeServer() }, nil
	})
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newSchema creates a schema of the test's own, dropped when the test ends.
func newSchema(t testing.TB) string {
	t.Helper()
	name := "dedup_outboxtest_" + randomHex(6)
	if _, err := pool.Exec(testCtx(t), "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
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
