package fencing

import (
	"errors"
	"os"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/crashtest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/pgtest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

// The servers the tests share, started by TestMain in the parent only: a
// child (crashtest) connects to its parent's, named in its environment.
var (
	redisAddr    string
	motoEndpoint string
	motoSkip     error // moto_server is not installed
	pgDSN        string
)

// Environment of a child: the store it claims in, its parent's servers
// and the test's own namespace on them, and how the downstream writes.
const (
	envStore     = "FENCING_STORE"     // redis, dynamo or postgres
	envAddr      = "FENCING_ADDR"      // the store's server: host:port, endpoint or DSN
	envNamespace = "FENCING_NAMESPACE" // Redis key prefix, DynamoDB table, PostgreSQL schema
	envDSN       = "FENCING_DSN"       // the downstream's PostgreSQL
	envCharges   = "FENCING_CHARGES"   // the downstream's table, schema-qualified and quoted
	envChecked   = "FENCING_CHECKED"   // "1": the downstream refuses a smaller fence
)

func TestMain(m *testing.M) {
	if crashtest.InChild() {
		os.Exit(m.Run())
	}
	testserver.Main(m, func() (func(), error) {
		// Redis as the store's guide asks for it: AOF, every write fsynced.
		r, err := testserver.StartRedisWithArgs("--appendonly", "yes", "--appendfsync", "always")
		if err != nil {
			return nil, err
		}
		closers := []func(){func() { _ = r.Close() }}
		closeAll := func() {
			for _, f := range closers {
				f()
			}
		}
		dsn, stop, err := pgtest.Server(envDSN)
		if err != nil {
			closeAll()
			return nil, err
		}
		closers = append(closers, stop)
		mo, err := testserver.StartMoto()
		switch {
		case errors.Is(err, testserver.ErrMotoMissing):
			motoSkip = err
		case err != nil:
			closeAll()
			return nil, err
		default:
			motoEndpoint = mo.Endpoint
			closers = append(closers, func() { _ = mo.Close() })
		}
		redisAddr, pgDSN = r.Addr, dsn
		return closeAll, nil
	})
}
