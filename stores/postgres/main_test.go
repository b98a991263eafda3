package postgres_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/pgtest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// Environment of a child test process (see TestCrashBeforeCommit): it
// connects to the parent's server instead of starting one.
const (
	envChildDSN    = "PGDEDUP_TEST_CHILD_DSN"
	envChildSchema = "PGDEDUP_TEST_CHILD_SCHEMA"
)

var (
	pool *pgxpool.Pool
	dsn  string
)

// maxConns keeps this package well below the max_connections of a server
// that other test packages may share.
const maxConns = 12

func TestMain(m *testing.M) {
	testserver.Main(m, func() (func(), error) {
		var (
			stop func()
			err  error
		)
		if dsn, stop, err = pgtest.Server(envChildDSN); err != nil {
			return nil, err
		}
		if pool, err = openPool(dsn, maxConns); err != nil {
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

// testCtx bounds a test's (or a benchmark's) database calls.
func testCtx(t testing.TB) context.Context {
	limit := 2 * time.Minute
	if _, ok := t.(*testing.B); ok {
		limit = 15 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	return ctx
}

// newSchema creates a schema of the test's own, dropped when the test ends.
// The server may be shared: nothing outside this schema is touched.
func newSchema(t testing.TB) string {
	t.Helper()
	return pgtest.Schema(t, pool.Exec, "dedup_pgtest_")
}

// newStore returns a migrated store in a fresh schema.
func newStore(t testing.TB, cfg postgres.Config) *postgres.Store {
	t.Helper()
	if cfg.Schema == "" {
		cfg.Schema = newSchema(t)
	}
	cfg.DB = pool
	s, err := postgres.New(testCtx(t), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.Migrate(testCtx(t)); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

// expire ends the lease or retention of key's record now, as if its time had
// passed: the test's way of advancing the server's clock for one record.
func expire(t testing.TB, s *postgres.Store, key string) {
	t.Helper()
	tag, err := pool.Exec(testCtx(t), `
		UPDATE `+s.Table()+` AS r
		SET expires_at = p.at,
		    lease_until = CASE WHEN r.state = 'in_progress' THEN p.at END
		FROM (SELECT clock_timestamp() - interval '1 second' AS at) AS p
		WHERE r.key = $1`, key)
	if err != nil {
		t.Fatalf("expire %q: %v", key, err)
	}
	if tag.RowsAffected() != 1 {
		t.Fatalf("expire %q: %d rows", key, tag.RowsAffected())
	}
}

type record struct {
	KeyHashOK   bool
	State       string
	Token       string
	Fingerprint string
	LeaseSet    bool
	LeaseSecs   float64 // expires_at - created_at, in seconds
	Result      []byte
}

func readRecord(t testing.TB, s *postgres.Store, key string) (record, bool) {
	t.Helper()
	var r record
	err := pool.QueryRow(testCtx(t), `
		SELECT key_hash = sha256(convert_to(key, 'UTF8')), state, token, fingerprint,
		       lease_until IS NOT NULL,
		       extract(epoch FROM expires_at - created_at)::float8, result
		FROM `+s.Table()+` WHERE key = $1`, key).
		Scan(&r.KeyHashOK, &r.State, &r.Token, &r.Fingerprint, &r.LeaseSet, &r.LeaseSecs, &r.Result)
	if errors.Is(err, pgx.ErrNoRows) {
		return record{}, false
	}
	if err != nil {
		t.Fatalf("read record %q: %v", key, err)
	}
	return r, true
}

func countRows(t testing.TB, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(testCtx(t), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

func sha256Sum(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

type atomicCounter = atomic.Int64
