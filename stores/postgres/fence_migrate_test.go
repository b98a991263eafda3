package postgres_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// previousSchemaSQL is, verbatim, the DDL the previous version's Migrate
// ran on a database without the table (schema steps 1 to 3): the table
// before the fence column.
const previousSchemaSQL = `CREATE TABLE IF NOT EXISTS {table} (
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
CREATE INDEX IF NOT EXISTS {index:_expires_at_idx} ON {table} (expires_at);
ALTER TABLE {table}
	ADD COLUMN IF NOT EXISTS scope           text,
	ADD COLUMN IF NOT EXISTS business_key    text,
	ADD COLUMN IF NOT EXISTS response_status smallint,
	ADD COLUMN IF NOT EXISTS completed_at    timestamptz;
CREATE INDEX IF NOT EXISTS {index:_business_key_idx} ON {table} USING hash (business_key);
ALTER TABLE {table}
	ADD COLUMN IF NOT EXISTS claimed_at   timestamptz,
	ADD COLUMN IF NOT EXISTS transport_id text,
	ADD COLUMN IF NOT EXISTS message_id   text,
	ADD COLUMN IF NOT EXISTS claims       integer;`

// previousClaimSQL and previousClaimLockedSQL are, verbatim, the claim
// statements of the previous version: what a process of that version runs
// during a rollout, against the table this version migrated.
const previousClaimSQL = `
WITH n AS MATERIALIZED (
  SELECT c.at, c.at + $5::bigint * interval '1 microsecond' AS deadline FROM (SELECT clock_timestamp() AS at) AS c
),
ins AS (
  INSERT INTO {table} (key_hash, key, state, token, fingerprint, lease_until, expires_at, result, created_at, scope, business_key,
    claimed_at, transport_id, message_id, claims)
  SELECT $1::bytea, $2::text, 'in_progress', $3::text, $4::text, n.deadline, n.deadline, NULL, n.at, $6::text, $7::text,
    n.at, $8::text, $9::text, 1 FROM n
  ON CONFLICT (key_hash) DO NOTHING
  RETURNING token, state, fingerprint, result
),
upd AS (
  UPDATE {table} AS r SET key = $2::text, state = 'in_progress', token = $3::text, fingerprint = $4::text,
    lease_until = n.deadline, expires_at = n.deadline, result = NULL, created_at = n.at,
    scope = $6::text, business_key = $7::text, response_status = NULL, completed_at = NULL,
    claimed_at   = CASE WHEN r.state = 'completed' OR r.claimed_at IS NULL THEN n.at     ELSE r.claimed_at   END,
    transport_id = CASE WHEN r.state = 'completed' OR r.claimed_at IS NULL THEN $8::text ELSE r.transport_id END,
    message_id   = CASE WHEN r.state = 'completed' OR r.claimed_at IS NULL THEN $9::text ELSE r.message_id   END,
    claims       = CASE WHEN r.state = 'completed' THEN 1 ELSE coalesce(r.claims, 0) + 1 END
  FROM n
  WHERE r.key_hash = $1::bytea AND r.expires_at <= n.at AND NOT EXISTS (SELECT FROM ins)
  RETURNING r.token, r.state, r.fingerprint, r.result
)
SELECT token, state, fingerprint, result FROM ins
UNION ALL
SELECT token, state, fingerprint, result FROM upd
UNION ALL
SELECT r.token, r.state, r.fingerprint, r.result FROM {table} AS r, n
WHERE r.key_hash = $1::bytea AND r.expires_at > n.at AND NOT EXISTS (SELECT FROM ins) AND NOT EXISTS (SELECT FROM upd)`

const previousClaimLockedSQL = `
INSERT INTO {table} AS r (key_hash, key, state, token, fingerprint, lease_until, expires_at, result, created_at, scope, business_key,
  claimed_at, transport_id, message_id, claims)
SELECT $1::bytea, $2::text, 'in_progress', $3::text, $4::text,
       n.at + $5::bigint * interval '1 microsecond', n.at + $5::bigint * interval '1 microsecond', NULL, n.at, $6::text, $7::text,
       n.at, $8::text, $9::text, 1
FROM (SELECT clock_timestamp() AS at) AS n
ON CONFLICT (key_hash) DO UPDATE SET
  claimed_at      = CASE WHEN r.expires_at > EXCLUDED.created_at THEN r.claimed_at
                         WHEN r.state = 'completed' OR r.claimed_at IS NULL THEN EXCLUDED.claimed_at ELSE r.claimed_at END,
  transport_id    = CASE WHEN r.expires_at > EXCLUDED.created_at THEN r.transport_id
                         WHEN r.state = 'completed' OR r.claimed_at IS NULL THEN EXCLUDED.transport_id ELSE r.transport_id END,
  message_id      = CASE WHEN r.expires_at > EXCLUDED.created_at THEN r.message_id
                         WHEN r.state = 'completed' OR r.claimed_at IS NULL THEN EXCLUDED.message_id ELSE r.message_id END,
  claims          = CASE WHEN r.expires_at > EXCLUDED.created_at THEN r.claims
                         WHEN r.state = 'completed' THEN 1 ELSE coalesce(r.claims, 0) + 1 END,
  key             = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN EXCLUDED.key          ELSE r.key             END,
  state           = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN EXCLUDED.state        ELSE r.state           END,
  token           = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN EXCLUDED.token        ELSE r.token           END,
  fingerprint     = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN EXCLUDED.fingerprint  ELSE r.fingerprint     END,
  lease_until     = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN EXCLUDED.lease_until  ELSE r.lease_until     END,
  result          = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN NULL                  ELSE r.result          END,
  created_at      = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN EXCLUDED.created_at   ELSE r.created_at      END,
  scope           = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN EXCLUDED.scope        ELSE r.scope           END,
  business_key    = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN EXCLUDED.business_key ELSE r.business_key    END,
  response_status = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN NULL                  ELSE r.response_status END,
  completed_at    = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN NULL                  ELSE r.completed_at    END,
  expires_at      = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN EXCLUDED.expires_at   ELSE r.expires_at      END
RETURNING r.token, r.state, r.fingerprint, r.result`

// previousProcess is a process of the previous version: its claims run
// the previous statements on one connection of its own, which keeps them
// prepared across the migration.
type previousProcess struct {
	conn          *pgxpool.Conn
	claim, locked string
}

func newPreviousProcess(t *testing.T, table string) *previousProcess {
	t.Helper()
	conn, err := pool.Acquire(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	return &previousProcess{
		conn:   conn,
		claim:  strings.ReplaceAll(previousClaimSQL, "{table}", table),
		locked: strings.ReplaceAll(previousClaimLockedSQL, "{table}", table),
	}
}

// claimWith runs one of the previous statements as the previous Claim did
// and reports whether it acquired the key, and with which token.
func (p *previousProcess) claimWith(t *testing.T, sql, key string) (dedup.Claim, bool) {
	t.Helper()
	token := storekit.NewToken()
	scope, business := admin.SplitScopedKey(key)
	var gotToken, state, fingerprint string
	var result []byte
	err := p.conn.QueryRow(testCtx(t), sql, sha256Sum(key), key, token, "", time.Hour.Microseconds(), scope, business, nil, nil).
		Scan(&gotToken, &state, &fingerprint, &result)
	if errors.Is(err, pgx.ErrNoRows) { // lost a race, as the previous Claim handled it
		err = p.conn.QueryRow(testCtx(t), p.locked, sha256Sum(key), key, token, "", time.Hour.Microseconds(), scope, business, nil, nil).
			Scan(&gotToken, &state, &fingerprint, &result)
	}
	if err != nil {
		t.Fatalf("previous version's claim of %q: %v", key, err)
	}
	return dedup.Claim{Key: key, Token: token}, gotToken == token
}

func (p *previousProcess) acquire(t *testing.T, key string) dedup.Claim {
	t.Helper()
	c, ok := p.claimWith(t, p.claim, key)
	if !ok {
		t.Fatalf("the previous version's claim of %q did not acquire it", key)
	}
	return c
}

// fenceRow is a row's fence column, and its created_at and expires_at in
// microseconds since the epoch.
type fenceRow struct {
	Fence            *int64
	Created, Expires int64
}

func readFence(t *testing.T, table, key string) fenceRow {
	t.Helper()
	var r fenceRow
	err := pool.QueryRow(testCtx(t), `SELECT fence, (extract(epoch FROM created_at) * 1000000)::bigint,
		(extract(epoch FROM expires_at) * 1000000)::bigint FROM `+table+` WHERE key = $1`, key).Scan(&r.Fence, &r.Created, &r.Expires)
	if err != nil {
		t.Fatalf("reading the fence of %q: %v", key, err)
	}
	return r
}

// TestMigrateAddsFenceToPreviousTable: a table of the previous version
// (the previous DDL), with records written by the previous claim
// statement, in progress, completed, released and abandoned. Before it is
// migrated, this version's claims fail with ErrNotMigrated and write
// nothing. Migrate adds the fence column while those records are in
// progress and completed: they keep their meaning (the running claim
// completes with its old token, the completed one is a duplicate with its
// result), a takeover of an old row gets a fence from the clock reading of
// its lease, and the previous version's statements, prepared before the
// migration, keep working against the migrated table, its takeovers never
// making a later fence smaller.
func TestMigrateAddsFenceToPreviousTable(t *testing.T) {
	ctx := testCtx(t)
	schema := newSchema(t)
	table := pgx.Identifier{schema, "dedup_keys"}.Sanitize()
	ddl := strings.NewReplacer("{table}", table,
		"{index:_expires_at_idx}", pgx.Identifier{"dedup_keys_expires_at_idx"}.Sanitize(),
		"{index:_business_key_idx}", pgx.Identifier{"dedup_keys_business_key_idx"}.Sanitize()).Replace(previousSchemaSQL)
	if _, err := pool.Exec(ctx, ddl); err != nil {
		t.Fatalf("previous DDL: %v", err)
	}
	old := newPreviousProcess(t, table)
	s := newStoreIn(t, schema)
	key := func(k string) string { return admin.ScopedKey("charge", k) }

	// Records the previous version wrote.
	running := old.acquire(t, key("RUNNING"))
	done := old.acquire(t, key("DONE"))
	if err := s.Complete(ctx, done, []byte("charged"), time.Hour); err != nil {
		t.Fatalf("completing a previous claim: %v", err)
	}
	if err := s.Release(ctx, old.acquire(t, key("RELEASED"))); err != nil {
		t.Fatalf("releasing a previous claim: %v", err)
	}
	old.acquire(t, key("ABANDONED"))
	expire(t, s, key("ABANDONED"))

	// This version's claims on the table not migrated yet.
	rows := countRows(t, table)
	_, err := s.Claim(ctx, key("EARLY"), "", time.Minute)
	var pgErr *pgconn.PgError
	if !errors.Is(err, postgres.ErrNotMigrated) || !errors.As(err, &pgErr) || pgErr.Code != "42703" {
		t.Fatalf("claim on the previous table: %v, want ErrNotMigrated keeping the server's undefined_column", err)
	}
	_, errs := s.ClaimBatch(ctx, []dedup.ClaimRequest{{Key: key("EARLY"), Lease: time.Minute}})
	if !errors.Is(errs[0], postgres.ErrNotMigrated) {
		t.Fatalf("batch claim on the previous table: %v, want ErrNotMigrated", errs[0])
	}
	if n := countRows(t, table); n != rows {
		t.Fatalf("%d rows after the refused claims, want %d: they wrote", n, rows)
	}

	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate on the previous table: %v", err)
	}
	for _, k := range []string{"RUNNING", "DONE", "RELEASED", "ABANDONED"} {
		if f := readFence(t, table, key(k)); f.Fence != nil {
			t.Fatalf("%s: fence %d after the migration, want NULL (no rewrite)", k, *f.Fence)
		}
	}

	// The previous records keep their meaning.
	if res, err := s.Claim(ctx, running.Key, "", time.Minute); err != nil || res.Outcome != dedup.InProgress || res.Claim.Fence != 0 {
		t.Fatalf("claim of the running record: %v (fence %d) %v, want in progress without a fence", res.Outcome, res.Claim.Fence, err)
	}
	if err := s.Complete(ctx, running, nil, time.Hour); err != nil {
		t.Fatalf("completing the previous running claim after the migration: %v", err)
	}
	if res, err := s.Claim(ctx, done.Key, "", time.Minute); err != nil || res.Outcome != dedup.Duplicate || string(res.Result) != "charged" {
		t.Fatalf("claim of the completed record: %v %q %v, want a duplicate with its result", res.Outcome, res.Result, err)
	}

	// Takeovers of previous rows (fence NULL, read as 0) get a fence: the
	// server's clock reading that also stamped the lease.
	var before int64
	if err := pool.QueryRow(ctx, "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint").Scan(&before); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"RELEASED", "ABANDONED"} {
		res, err := s.Claim(ctx, key(k), "", time.Minute)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("takeover of the previous %s record: %v %v", k, res.Outcome, err)
		}
		row := readFence(t, table, key(k))
		if row.Fence == nil || uint64(*row.Fence) != res.Claim.Fence || *row.Fence != row.Created ||
			row.Expires-row.Created != time.Minute.Microseconds() || res.Claim.Fence < uint64(before) {
			t.Fatalf("takeover of the previous %s record: fence %d, row %+v (clock before it %d); want the row's created_at in µs, from the lease's clock reading",
				k, res.Claim.Fence, row, before)
		}
	}

	// The previous version's statements, prepared before the migration,
	// against the migrated table: a fresh key, and a takeover of a row this
	// version fenced.
	oldNew := old.acquire(t, key("PREVIOUS-AFTER"))
	if f := readFence(t, table, oldNew.Key); f.Fence != nil {
		t.Fatalf("a row the previous version created has fence %d, want NULL", *f.Fence)
	}
	if _, ok := old.claimWith(t, old.locked, key("PREVIOUS-LOCKED")); !ok {
		t.Fatal("the previous version's locking statement did not acquire a fresh key on the migrated table")
	}
	mixed := key("MIXED")
	first, err := s.Claim(ctx, mixed, "", time.Minute)
	if err != nil || first.Outcome != dedup.Acquired || first.Claim.Fence == 0 {
		t.Fatalf("claim: %v (fence %d) %v", first.Outcome, first.Claim.Fence, err)
	}
	if err := s.Release(ctx, first.Claim); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, old.acquire(t, mixed)); err != nil { // the previous version's takeover keeps the fence column
		t.Fatal(err)
	}
	next, err := s.Claim(ctx, mixed, "", time.Minute)
	if err != nil || next.Outcome != dedup.Acquired || next.Claim.Fence <= first.Claim.Fence {
		t.Fatalf("claim after the previous version's takeover: %v (fence %d) %v, want a fence above %d",
			next.Outcome, next.Claim.Fence, err, first.Claim.Fence)
	}
	expire(t, s, oldNew.Key)
	if res, err := s.Claim(ctx, oldNew.Key, "", time.Minute); err != nil || res.Outcome != dedup.Acquired || res.Claim.Fence == 0 {
		t.Fatalf("takeover of the previous version's new row: %v (fence %d) %v", res.Outcome, res.Claim.Fence, err)
	}
}

// TestFenceAfterDeletion: once DeleteExpired or Evict deleted a key's
// row, the next claim's fence is the server's clock, larger than the
// deleted row's (the clock moved on); while the row stays, a takeover
// within the same microsecond still gets a larger fence (the last plus
// one), as a row whose fence is ahead of the clock shows.
func TestFenceAfterDeletion(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t, postgres.Config{})
	const key = "charge:ORDER-1"
	claim := func() dedup.Claim {
		t.Helper()
		res, err := s.Claim(ctx, key, "", time.Minute)
		if err != nil || res.Outcome != dedup.Acquired || res.Claim.Fence == 0 {
			t.Fatalf("claim: %v (fence %d) %v", res.Outcome, res.Claim.Fence, err)
		}
		return res.Claim
	}
	first := claim()
	if evicted, err := s.Evict(ctx, key); err != nil || !evicted {
		t.Fatalf("Evict: %v %v", evicted, err)
	}
	afterEvict := claim()
	if afterEvict.Fence <= first.Fence {
		t.Fatalf("fence %d after Evict, not larger than %d", afterEvict.Fence, first.Fence)
	}
	expire(t, s, key)
	if n, err := s.DeleteExpired(ctx, 10); err != nil || n != 1 {
		t.Fatalf("DeleteExpired: %d %v", n, err)
	}
	afterSweep := claim()
	if afterSweep.Fence <= afterEvict.Fence {
		t.Fatalf("fence %d after DeleteExpired, not larger than %d", afterSweep.Fence, afterEvict.Fence)
	}

	// A fence an hour ahead of the clock: the takeover, and the locking
	// statement's, count on from it.
	ahead := afterSweep.Fence + uint64(time.Hour.Microseconds())
	if _, err := pool.Exec(ctx, "UPDATE "+s.Table()+" SET fence = $1 WHERE key = $2", int64(ahead), key); err != nil {
		t.Fatal(err)
	}
	expire(t, s, key)
	if c := claim(); c.Fence != ahead+1 {
		t.Fatalf("takeover of a row with fence %d: %d, want %d", ahead, c.Fence, ahead+1)
	}
	expire(t, s, key)
	res, err := pool.Query(ctx, postgres.ClaimLockedSQL(s), sha256Sum(key), key, "locked-token", "", int64(60e6), "charge", "ORDER-1", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		Token, State, Fingerprint string
		Result                    []byte
		Fence                     int64
	}
	got, err := pgx.CollectExactlyOneRow(res, pgx.RowToStructByPos[answer])
	if err != nil || got.Token != "locked-token" || uint64(got.Fence) != ahead+2 {
		t.Fatalf("the locking statement's takeover: %+v %v, want the token and fence %d", got, err, ahead+2)
	}
}
