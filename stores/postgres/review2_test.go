package postgres_test

import (
	"strings"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// TestMigrateLongTableNameCreatesEveryIndex: a table name of 63 bytes is
// accepted by Config.Validate; Migrate must then create the expires_at and
// business_key indexes (their names are truncated to 63 bytes: with such a
// table name both become the table's own name, and CREATE INDEX IF NOT
// EXISTS skips them with a NOTICE).
func TestMigrateLongTableNameCreatesEveryIndex(t *testing.T) {
	ctx := testCtx(t)
	schema := newSchema(t)
	table := strings.Repeat("t", 63)
	s, err := postgres.New(pool, postgres.Config{Schema: schema, Table: table})
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
