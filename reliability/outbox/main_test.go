package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/pgtest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
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
		var (
			stop func()
			err  error
		)
		if dsn, stop, err = pgtest.Server(envDSN); err != nil {
			return nil, err
		}
		if pool, err = openPool(dsn, 12); err != nil {
			stop()
			return nil, err
		}
		return func() { pool.Close(); stop() }, nil
	})
}

// openPool connects a pool of at most maxConns connections to dsn.
func openPool(dsn string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		if err = p.Ping(ctx); err != nil {
			p.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", dsn, err)
	}
	return p, nil
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
	return pgtest.Schema(t, pool.Exec, "dedup_outboxtest_")
}
