package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// A Config without a DB is refused at New with ErrNoDB, whether the DB is
// nil or a nil *pgxpool.Pool, and Validate says so too.
func TestNewNilDB(t *testing.T) {
	var nilPool *pgxpool.Pool
	for name, config := range map[string]postgres.Config{
		"nil":               {},
		"nil *pgxpool.Pool": {DB: nilPool},
		"with other errors": {FinishTimeout: -time.Second},
	} {
		store, err := postgres.New(context.Background(), config)
		if !errors.Is(err, postgres.ErrNoDB) || store != nil {
			t.Errorf("%s: New = %v, %v; want ErrNoDB", name, store, err)
		}
		if err := config.Validate(); !errors.Is(err, postgres.ErrNoDB) {
			t.Errorf("%s: Validate = %v; want ErrNoDB", name, err)
		}
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	if _, err := postgres.New(context.Background(), postgres.Config{}); err == nil {
		t.Fatal("New(nil DB) succeeded")
	}
	_, err := postgres.New(context.Background(), postgres.Config{DB: pool, FinishTimeout: -time.Second})
	if !errors.Is(err, dedup.ErrInvalidDuration) {
		t.Fatalf("negative FinishTimeout: got %v, want ErrInvalidDuration", err)
	}
	for _, cfg := range []postgres.Config{
		{Table: strings.Repeat("t", 64)},
		{Schema: strings.Repeat("s", 64)},
		{Table: "a\x00b"},
	} {
		cfg.DB = pool
		if _, err := postgres.New(context.Background(), cfg); err == nil {
			t.Fatalf("New(%+v) succeeded", cfg)
		}
	}
	if err := (postgres.Config{DB: pool, Table: strings.Repeat("t", 63)}).Validate(); err != nil {
		t.Fatalf("63-byte table name refused: %v", err)
	}
}

// TestTableNameIsQuoted: any table name works, including ones that need
// quoting, and two stores on two tables of one schema stay apart.
func TestTableNameIsQuoted(t *testing.T) {
	ctx := testCtx(t)
	schema := newSchema(t)
	a := newStore(t, postgres.Config{Schema: schema, Table: `Odd "name"; DROP TABLE x --`})
	b := newStore(t, postgres.Config{Schema: schema, Table: strings.Repeat("é", 31)}) // 62 bytes: the index name gets truncated
	if !strings.Contains(a.SchemaSQL(), `"Odd ""name""; DROP TABLE x --"`) {
		t.Fatalf("table name not quoted in:\n%s", a.SchemaSQL())
	}
	res, err := a.Claim(ctx, "k", "", time.Minute)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("claim on a: %v %v", res.Outcome, err)
	}
	if err := a.Complete(ctx, res.Claim, []byte("a"), time.Minute); err != nil {
		t.Fatalf("complete on a: %v", err)
	}
	if res, err := b.Claim(ctx, "k", "", time.Minute); err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("claim on b: %v %v (tables not separate)", res.Outcome, err)
	}
}

// TestMigrateIsIdempotentAndConcurrent: processes that start together all
// run Migrate; none fails and the table is created once.
func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	ctx := testCtx(t)
	schema := newSchema(t)
	s, err := postgres.New(ctx, postgres.Config{DB: pool, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Go(func() { errs[i] = s.Migrate(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent Migrate: %v", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	var tables, indexes int
	err = pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM pg_tables WHERE schemaname = $1),
		(SELECT count(*) FROM pg_indexes WHERE schemaname = $1)`, schema).Scan(&tables, &indexes)
	if err != nil {
		t.Fatal(err)
	}
	if tables != 1 || indexes != 3 { // primary key, expires_at, business_key
		t.Fatalf("schema has %d tables and %d indexes, want 1 and 3", tables, indexes)
	}
}

// TestRecordColumns checks the documented meaning of every column.
func TestRecordColumns(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t, postgres.Config{})
	key := admin.ScopedKey("charge", "ORDER-003 🚀")
	res, err := s.Claim(ctx, key, "fp", 10*time.Minute)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("claim: %v %v", res.Outcome, err)
	}
	r, ok := readRecord(t, s, key)
	if !ok {
		t.Fatal("no record after claim")
	}
	if !r.KeyHashOK || r.State != "in_progress" || r.Token != res.Claim.Token || r.Fingerprint != "fp" || !r.LeaseSet || r.LeaseSecs != 600 || r.Result != nil {
		t.Fatalf("claimed record: %+v", r)
	}
	if err := s.Extend(ctx, res.Claim, time.Hour); err != nil {
		t.Fatal(err)
	}
	if r, _ := readRecord(t, s, key); r.LeaseSecs < 3600 || !r.LeaseSet {
		t.Fatalf("extended record: %+v", r)
	}
	if err := s.Complete(ctx, res.Claim, []byte{0, 1, 2}, 48*time.Hour); err != nil {
		t.Fatal(err)
	}
	r, _ = readRecord(t, s, key)
	if r.State != "completed" || r.LeaseSet || r.LeaseSecs < 48*3600 || !bytes.Equal(r.Result, []byte{0, 1, 2}) || r.Token != res.Claim.Token {
		t.Fatalf("completed record: %+v", r)
	}
}

func TestDeleteExpired(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t, postgres.Config{})
	const expired, live = 25, 5
	for i := range expired + live {
		key := fmt.Sprint(i)
		res, err := s.Claim(ctx, key, "", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if err := s.Complete(ctx, res.Claim, []byte(key), time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		if i < expired {
			expire(t, s, key)
		}
	}
	for _, limit := range []int{0, -1} {
		if _, err := s.DeleteExpired(ctx, limit); err == nil {
			t.Fatalf("DeleteExpired(%d) succeeded", limit)
		}
	}

	// A row locked by a concurrent transaction (say, a claim taking it over)
	// is skipped, not waited for.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+s.Table()+" WHERE key = '0' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}

	var got []int64
	for {
		n, err := s.DeleteExpired(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, n)
		if n < 10 {
			break
		}
	}
	if fmt.Sprint(got) != "[10 10 4]" {
		t.Fatalf("DeleteExpired(10) returned %v, want [10 10 4]", got)
	}
	if _, ok := readRecord(t, s, "0"); !ok {
		t.Fatal("the locked row was deleted")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := s.DeleteExpired(ctx, 10); err != nil || n != 1 {
		t.Fatalf("after unlock: DeleteExpired = %d, %v; want 1", n, err)
	}
	if n := countRows(t, s.Table()); n != live {
		t.Fatalf("%d rows left, want the %d live ones", n, live)
	}
	for i := expired; i < expired+live; i++ {
		want := dedup.InProgress
		if i%2 == 0 {
			want = dedup.Duplicate
		}
		if res, err := s.Claim(ctx, fmt.Sprint(i), "", time.Hour); err != nil || res.Outcome != want {
			t.Fatalf("live key %d after sweep: %v %v, want %v", i, res.Outcome, err, want)
		}
	}
}

// TestStoreErrorsKeepTheirCause: a failing database is reported as an error
// that is not ErrClaimLost, with the driver's error reachable.
func TestStoreErrorsKeepTheirCause(t *testing.T) {
	ctx := testCtx(t)
	s, err := postgres.New(ctx, postgres.Config{DB: pool, Schema: newSchema(t)}) // not migrated: no table
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Claim(ctx, "k", "", time.Minute)
	if err == nil {
		t.Fatal("claim on a missing table succeeded")
	}
	var pgErr interface{ SQLState() string }
	if !errors.As(err, &pgErr) || pgErr.SQLState() != "42P01" { // undefined_table
		t.Fatalf("claim error %v does not carry the server's undefined_table error", err)
	}
	c := dedup.Claim{Key: "k", Token: storekit.NewToken()}
	for op, err := range map[string]error{
		"complete": s.Complete(ctx, c, nil, time.Minute),
		"release":  s.Release(ctx, c),
		"extend":   s.Extend(ctx, c, time.Minute),
	} {
		if err == nil || errors.Is(err, dedup.ErrClaimLost) {
			t.Fatalf("%s on a missing table: %v, want a store error", op, err)
		}
	}
}

// TestReadmeShowsTheSchema: the README's schema block is what Migrate runs
// for the default configuration.
func TestReadmeShowsTheSchema(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), "## Schema")
	if !ok {
		t.Fatal("README has no Schema section")
	}
	_, block, ok := strings.Cut(after, "```sql\n")
	if !ok {
		t.Fatal("README's Schema section has no sql block")
	}
	block, _, _ = strings.Cut(block, "```")
	s, err := postgres.New(context.Background(), postgres.Config{DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(block), s.SchemaSQL(); got != want {
		t.Fatalf("README schema:\n%s\n\nSchemaSQL():\n%s", got, want)
	}
}
