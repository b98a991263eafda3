package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// readable is what an operator reads in plain SQL.
type readable struct {
	Scope, BusinessKey, State string
	ResponseStatus            *int16
	Created                   time.Time
	Completed                 *time.Time
	Live                      bool // expires_at is ahead: not expired, not released
}

// released reports whether the rows of a business key show it released:
// no row, or an in-progress row whose lease ended (at the release).
func released(rows []readable) bool {
	return len(rows) == 0 || len(rows) == 1 && rows[0].State == "in_progress" && !rows[0].Live
}

// readReadable runs the operator's query, by business key.
func readReadable(t testing.TB, s *postgres.Store, businessKey string) []readable {
	t.Helper()
	rows, err := pool.Query(testCtx(t), `
		SELECT scope, business_key, state, response_status, created_at, completed_at, expires_at > clock_timestamp()
		FROM `+s.Table()+` WHERE business_key = $1 ORDER BY scope`, businessKey)
	if err != nil {
		t.Fatalf("operator query: %v", err)
	}
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (readable, error) {
		var r readable
		err := row.Scan(&r.Scope, &r.BusinessKey, &r.State, &r.ResponseStatus, &r.Created, &r.Completed, &r.Live)
		return r, err
	})
	if err != nil {
		t.Fatalf("operator query: %v", err)
	}
	return got
}

// TestReadableColumns: scope and business key are readable columns
// (unescaped: a scope may contain ":" and "%"), completed_at is set by the
// completion and cleared by a takeover, and WHERE business_key = … uses the
// hash index.
func TestReadableColumns(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t, postgres.Config{})
	const scopeName, business = "acct:42 100% POST /pay", "ORDER:003 🚀"
	key := admin.ScopedKey(scopeName, business)
	other := admin.ScopedKey("refunds", business)
	res, err := s.Claim(ctx, key, "", time.Minute)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("claim: %v %v", res.Outcome, err)
	}
	if _, err := s.Claim(ctx, other, "", time.Minute); err != nil {
		t.Fatal(err)
	}
	got := readReadable(t, s, business)
	if len(got) != 2 || got[0].Scope != scopeName || got[1].Scope != "refunds" || got[0].BusinessKey != business ||
		got[0].State != "in_progress" || got[0].Completed != nil || got[0].ResponseStatus != nil {
		t.Fatalf("after claims: %+v", got)
	}
	if err := s.Complete(ctx, res.Claim, nil, time.Minute); err != nil {
		t.Fatal(err)
	}
	got = readReadable(t, s, business)
	if got[0].State != "completed" || got[0].Completed == nil || got[0].Completed.Before(got[0].Created) || got[0].ResponseStatus != nil {
		t.Fatalf("after complete: %+v", got[0])
	}

	expire(t, s, key) // retention over: the next claim takes the record over
	if res, err := s.Claim(ctx, key, "", time.Minute); err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("takeover: %v %v", res.Outcome, err)
	}
	if got := readReadable(t, s, business); got[0].State != "in_progress" || got[0].Completed != nil {
		t.Fatalf("after takeover: %+v", got[0])
	}

	// A key without ":" (a store used directly, not through the engine).
	if _, err := s.Claim(ctx, "bare-key", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := readReadable(t, s, "bare-key"); len(got) != 1 || got[0].Scope != "" {
		t.Fatalf("bare key: %+v", got)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	var plan strings.Builder
	rows, err := tx.Query(ctx, "EXPLAIN SELECT * FROM "+s.Table()+" WHERE business_key = $1", business)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	plan.WriteString(strings.Join(lines, "\n"))
	if !strings.Contains(plan.String(), "dedup_keys_business_key_idx") {
		t.Fatalf("the lookup by business key does not use the index:\n%s", plan.String())
	}
}

// round1SchemaSQL is, verbatim, the DDL that the first version's Migrate
// ran (schema "{schema}" substituted): the table this version must upgrade.
const round1SchemaSQL = `CREATE TABLE IF NOT EXISTS {table} (
	key_hash    bytea       NOT NULL PRIMARY KEY CHECK (octet_length(key_hash) = 32),
	key         text        NOT NULL,
	state       text        NOT NULL,
	token       text        NOT NULL,
	fingerprint text        NOT NULL DEFAULT '',
	lease_until timestamptz,
	expires_at  timestamptz NOT NULL,
	result      bytea,
	created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
	CHECK ((state = 'in_progress' AND lease_until = expires_at)
	    OR (state = 'completed' AND lease_until IS NULL))
);
CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at);`

// TestMigrateUpgradesRound1Table: a table created by the first version's
// DDL, holding 1500 completed records, one in progress and one with an
// escaped scope, is upgraded in place by Migrate: the readable columns are
// added and filled, the old records keep working (duplicate, in progress,
// completion by the old claim's token), and new records fill every column.
// A second Migrate changes nothing and takes no table lock: it finishes
// while another transaction holds a row lock on the table.
func TestMigrateUpgradesRound1Table(t *testing.T) {
	ctx := testCtx(t)
	schema := newSchema(t)
	table := pgx.Identifier{schema, "dedup_keys"}.Sanitize()
	ddl := strings.NewReplacer("{table}", table, "{index}", pgx.Identifier{"dedup_keys_expires_at_idx"}.Sanitize()).Replace(round1SchemaSQL)
	if _, err := pool.Exec(ctx, ddl); err != nil {
		t.Fatalf("round-1 DDL: %v", err)
	}
	// Rows as round 1 wrote them: 1500 completed orders, an order in
	// progress, and a record whose scope has an escaped ":".
	if _, err := pool.Exec(ctx, `
		INSERT INTO `+table+` (key_hash, key, state, token, fingerprint, lease_until, expires_at, result)
		SELECT sha256(convert_to('charge:ORDER-' || i, 'UTF8')), 'charge:ORDER-' || i, 'completed', 'old-token', '',
		       NULL, now() + interval '1 hour', 'charged'::bytea
		FROM generate_series(1, 1500) AS i;
		INSERT INTO `+table+` (key_hash, key, state, token, fingerprint, lease_until, expires_at, result) VALUES
		  (sha256(convert_to('charge:ORDER-RUNNING', 'UTF8')), 'charge:ORDER-RUNNING', 'in_progress', 'running-token', '',
		   now() + interval '1 hour', now() + interval '1 hour', NULL),
		  (sha256(convert_to('acct%3A42 100%25 POST /pay:key-1', 'UTF8')), 'acct%3A42 100%25 POST /pay:key-1', 'completed', 'x', '',
		   NULL, now() + interval '1 hour', NULL)`); err != nil {
		t.Fatalf("round-1 rows: %v", err)
	}

	s := newStoreIn(t, schema)
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate on the round-1 table: %v", err)
	}
	var unfilled int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE scope IS NULL OR business_key IS NULL").Scan(&unfilled); err != nil {
		t.Fatal(err)
	}
	if unfilled != 0 {
		t.Fatalf("%d rows without scope or business_key after Migrate", unfilled)
	}
	if got := readReadable(t, s, "ORDER-1500"); len(got) != 1 || got[0].Scope != "charge" || got[0].State != "completed" || got[0].Completed != nil {
		t.Fatalf("old completed row: %+v", got)
	}
	if got := readReadable(t, s, "key-1"); len(got) != 1 || got[0].Scope != "acct:42 100% POST /pay" {
		t.Fatalf("old row with an escaped scope: %+v", got)
	}

	// Old records keep their meaning.
	res, err := s.Claim(ctx, admin.ScopedKey("charge", "ORDER-7"), "", time.Minute)
	if err != nil || res.Outcome != dedup.Duplicate || string(res.Result) != "charged" {
		t.Fatalf("claim of an old completed record: %v %q %v, want duplicate with its result", res.Outcome, res.Result, err)
	}
	running := dedup.Claim{Key: admin.ScopedKey("charge", "ORDER-RUNNING"), Token: "running-token"}
	if res, err := s.Claim(ctx, running.Key, "", time.Minute); err != nil || res.Outcome != dedup.InProgress {
		t.Fatalf("claim of an old in-progress record: %v %v", res.Outcome, err)
	}
	if err := s.Complete(ctx, running, nil, time.Hour); err != nil {
		t.Fatalf("completing the old claim: %v", err)
	}
	if got := readReadable(t, s, "ORDER-RUNNING"); got[0].State != "completed" || got[0].Completed == nil {
		t.Fatalf("old claim completed: %+v", got)
	}
	// New records fill every column.
	res, err = s.Claim(ctx, admin.ScopedKey("charge", "ORDER-NEW"), "", time.Minute)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("new claim: %v %v", res.Outcome, err)
	}
	if got := readReadable(t, s, "ORDER-NEW"); len(got) != 1 || got[0].Scope != "charge" || got[0].State != "in_progress" {
		t.Fatalf("new record: %+v", got)
	}

	// Migrate on an up-to-date table takes no lock that a writer holds.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "UPDATE "+table+" SET fingerprint = fingerprint WHERE key = 'charge:ORDER-1'"); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := s.Migrate(mctx); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatal("Migrate on an up-to-date table waited 20s for a writer's transaction: it took a table lock")
		}
		t.Fatalf("Migrate again: %v", err)
	}
}

// newStoreIn returns a store on the default table of schema, not migrated.
func newStoreIn(t testing.TB, schema string) *postgres.Store {
	t.Helper()
	s, err := postgres.New(context.Background(), postgres.Config{DB: pool, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
