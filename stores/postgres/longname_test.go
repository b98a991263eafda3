package postgres_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// TestMigrateLongTableNameCreatesEveryIndex: table names of 61 to 63 bytes
// are accepted by Config.Validate, and Migrate creates the expires_at and
// business_key indexes for each. (At 62 bytes the two index names, cut to
// 63 bytes, were equal; at 63 both were the table's own name; CREATE INDEX
// IF NOT EXISTS skipped them with a NOTICE.)
func TestMigrateLongTableNameCreatesEveryIndex(t *testing.T) {
	for _, n := range []int{61, 62, 63} {
		t.Run(fmt.Sprint(n), func(t *testing.T) { migrateLongTableName(t, strings.Repeat("t", n)) })
	}
}

func migrateLongTableName(t *testing.T, table string) {
	ctx := testCtx(t)
	schema := newSchema(t)
	s, err := postgres.New(ctx, postgres.Config{DB: pool, Schema: schema, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	var indexes int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1`, schema).Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	if indexes != 3 { // primary key, expires_at, business_key
		t.Fatalf("schema has %d indexes, want 3 (primary key, expires_at, business_key)", indexes)
	}
}
