package soak

import (
	"fmt"
	"os"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/pgtest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

// pgDSN is the PostgreSQL server of the effects table (and of the
// PostgreSQL store's records).
var pgDSN string

func TestMain(m *testing.M) {
	if os.Getenv(envRole) == "consumer" {
		if err := runConsumer(); err != nil {
			fmt.Fprintln(os.Stderr, "consumer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goredis.SetLogger(quietLog{})
	testserver.Main(m, func() (func(), error) {
		dsn, stop, err := pgtest.Server("SOAK_PARENT_DSN")
		if err != nil {
			return nil, err
		}
		pgDSN = dsn
		return stop, nil
	})
}
