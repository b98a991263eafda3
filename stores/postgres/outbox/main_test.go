package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-dedup/watermill-dedup/internal/pgtest"
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
		var (
			closeAll func()
			err      error
		)
		pool, dsn, closeAll, err = pgtest.Connect(envDSN, 12)
		return closeAll, err
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
	return pgtest.Schema(t, pool, "dedup_outboxtest_")
}
