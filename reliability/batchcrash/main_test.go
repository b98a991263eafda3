package batchcrash

import (
	"os"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/crashtest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/pgtest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

// The servers the tests share, started by TestMain in the parent only: a
// child (crashtest) connects to its parent's, named in its environment.
var (
	redisAddr string
	pgDSN     string
)

// Environment of a child: its parent's servers, and the test's own
// namespace on them (a Redis key prefix, a PostgreSQL schema).
const (
	envRedis     = "BATCHCRASH_REDIS"
	envDSN       = "BATCHCRASH_DSN"
	envNamespace = "BATCHCRASH_NAMESPACE"
)

func TestMain(m *testing.M) {
	if crashtest.InChild() {
		os.Exit(m.Run())
	}
	testserver.Main(m, func() (func(), error) {
		r, err := testserver.StartRedis()
		if err != nil {
			return nil, err
		}
		dsn, stop, err := pgtest.Server(envDSN)
		if err != nil {
			_ = r.Close()
			return nil, err
		}
		redisAddr, pgDSN = r.Addr, dsn
		return func() {
			stop()
			_ = r.Close()
		}, nil
	})
}
