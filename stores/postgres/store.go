package postgres

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

// Store is a dedup.Store in a PostgreSQL table (see Migrate and SchemaSQL
// for the schema). Create it with New; it is safe for concurrent use when
// its DB is a pool.
//
// Every operation is one SQL statement in one round trip (a claim that
// loses a race needs a second one), and every expiry is decided by the
// server's clock (clock_timestamp(), see the package documentation), never
// the client's, so clients with skewed clocks agree.
// Keys of any length are stored verbatim; uniqueness is enforced on their
// SHA-256, so the btree entry stays 32 bytes.
type Store struct {
	db  DB
	cfg Config

	table string // quoted, possibly schema-qualified
	sql   statements

	fallbacks atomic.Int64 // claims that needed claimLockedSQL, for tests and benchmarks

	// watch keeps the key watches of WatchKey (Config.Notify); nil: none.
	watch *storekit.WatchHub
}

type statements struct {
	claim, claimLocked, complete, release, extend, deleteExpired string
}

// Record states as stored in the state column.
const (
	stateInProgress = "in_progress"
	stateCompleted  = "completed"
)

// New validates config (ErrNoDB without Config.DB, and every other problem
// Validate reports), applies its defaults and returns a Store on
// Config.DB. It does not touch the database, so ctx is not used and New
// costs no round trip: call Migrate once, or create the table with
// SchemaSQL through your own migrations. Neither does it check the table:
// on a table of an earlier version not yet upgraded (Migrate, or the
// statements of SchemaSQL), claims fail with ErrNotMigrated and write
// nothing until it is. With Config.Notify it refuses a DB that is not a
// *pgxpool.Pool (ErrNotifyNeedsPool).
func New(ctx context.Context, config Config) (*Store, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config.setDefaults()
	db := config.DB
	s := &Store{db: db, cfg: config, table: quoteTable(config.Schema, config.Table)}
	s.sql = buildStatements(s.table, config.Notify)
	if config.Notify {
		listen, err := newListener(db)
		if err != nil {
			return nil, err
		}
		s.watch = storekit.NewWatchHub(listen.run, watchLinger)
	}
	return s, nil
}

func quoteTable(schema, table string) string {
	if schema == "" {
		return pgx.Identifier{table}.Sanitize()
	}
	return pgx.Identifier{schema, table}.Sanitize()
}

// Table returns the quoted, possibly schema-qualified table name the store
// uses, ready to put into SQL.
func (s *Store) Table() string { return s.table }

// claimSQL is the claim's first (and almost always only) statement. It
// writes nothing when the key has a live record, so a duplicate costs no row
// version, no lock and no WAL flush at commit:
//
//   - n reads the server's clock once; every branch uses that instant,
//     the fence too: the clock in microseconds since the epoch, as
//     storekit.NextFence takes it.
//   - ins creates the record, with that fence; the unique index
//     arbitrates concurrent inserts (DO NOTHING neither locks nor writes
//     on conflict).
//   - upd takes over an expired record. It locks the row and re-checks the
//     condition on the row's latest committed version, so two claims never
//     both take over one record. An in-progress record (released, or its
//     lease ended) keeps its provenance and counts one more claim; a
//     completed one starts afresh. Its fence is storekit.NextFence's: the
//     clock's, or the row's fence plus one when that is not larger (a row
//     without one, written before the fence column existed or by an
//     earlier version, reads as 0).
//   - otherwise the live record, as this statement's snapshot sees it, is
//     returned, with fence 0 (the fence belongs to its holder).
//
// Under READ COMMITTED, the snapshot is taken when the statement starts. If
// ins conflicted with a row committed after that (a concurrent first claim
// of the same key), or upd's re-check found the row taken over meanwhile,
// the snapshot has no live record to show and the statement returns no row:
// nothing was written, and Claim runs claimLockedSQL.
const claimSQL = `
WITH n AS MATERIALIZED (
  SELECT c.at, c.at + $5::bigint * interval '1 microsecond' AS deadline, (extract(epoch FROM c.at) * 1000000)::bigint AS fence
  FROM (SELECT clock_timestamp() AS at) AS c
),
ins AS (
  INSERT INTO {table} (key_hash, key, state, token, fingerprint, lease_until, expires_at, result, created_at, scope, business_key,
    claimed_at, transport_id, message_id, claims, fence)
  SELECT $1::bytea, $2::text, 'in_progress', $3::text, $4::text, n.deadline, n.deadline, NULL, n.at, $6::text, $7::text,
    n.at, $8::text, $9::text, 1, n.fence FROM n
  ON CONFLICT (key_hash) DO NOTHING
  RETURNING token, state, fingerprint, result, fence
),
upd AS (
  UPDATE {table} AS r SET key = $2::text, state = 'in_progress', token = $3::text, fingerprint = $4::text,
    lease_until = n.deadline, expires_at = n.deadline, result = NULL, created_at = n.at,
    scope = $6::text, business_key = $7::text, response_status = NULL, completed_at = NULL,
    claimed_at   = CASE WHEN r.state = 'completed' OR r.claimed_at IS NULL THEN n.at     ELSE r.claimed_at   END,
    transport_id = CASE WHEN r.state = 'completed' OR r.claimed_at IS NULL THEN $8::text ELSE r.transport_id END,
    message_id   = CASE WHEN r.state = 'completed' OR r.claimed_at IS NULL THEN $9::text ELSE r.message_id   END,
    claims       = CASE WHEN r.state = 'completed' THEN 1 ELSE coalesce(r.claims, 0) + 1 END,
    fence        = greatest(coalesce(r.fence, 0) + 1, n.fence)
  FROM n
  WHERE r.key_hash = $1::bytea AND r.expires_at <= n.at AND NOT EXISTS (SELECT FROM ins)
  RETURNING r.token, r.state, r.fingerprint, r.result, r.fence
)
SELECT token, state, fingerprint, result, fence FROM ins
UNION ALL
SELECT token, state, fingerprint, result, fence FROM upd
UNION ALL
SELECT r.token, r.state, r.fingerprint, r.result, 0::bigint FROM {table} AS r, n
WHERE r.key_hash = $1::bytea AND r.expires_at > n.at AND NOT EXISTS (SELECT FROM ins) AND NOT EXISTS (SELECT FROM upd)`

// claimLockedSQL is the fallback after claimSQL returned no row: it always
// returns one, since it always writes. It creates or takes over the record,
// or else rewrites the live record with its own values, which is what makes
// RETURNING report it (an ON CONFLICT … DO UPDATE … WHERE that fails returns
// no row at all). ON CONFLICT locks the row and judges it on its latest
// committed version, never on a stale snapshot. The clock is read once (the
// subquery n) and carried in EXCLUDED.created_at, so that every CASE takes
// the same decision. The caller tells Acquired from the rest by the
// returned token: only a created or taken-over record carries the new one,
// and only for it is the returned fence the claim's (claimSQL's fence).
const claimLockedSQL = `
INSERT INTO {table} AS r (key_hash, key, state, token, fingerprint, lease_until, expires_at, result, created_at, scope, business_key,
  claimed_at, transport_id, message_id, claims, fence)
SELECT $1::bytea, $2::text, 'in_progress', $3::text, $4::text,
       n.at + $5::bigint * interval '1 microsecond', n.at + $5::bigint * interval '1 microsecond', NULL, n.at, $6::text, $7::text,
       n.at, $8::text, $9::text, 1, (extract(epoch FROM n.at) * 1000000)::bigint
FROM (SELECT clock_timestamp() AS at) AS n
ON CONFLICT (key_hash) DO UPDATE SET
  fence           = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN greatest(coalesce(r.fence, 0) + 1, EXCLUDED.fence)
                         ELSE r.fence END,
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
RETURNING r.token, r.state, r.fingerprint, r.result, coalesce(r.fence, 0)`

// completeSQL, releaseSQL and extendSQL act only on a live in_progress
// record carrying the claim's token. A row that passes the WHERE is locked,
// and if it changed meanwhile the WHERE is evaluated again on its latest
// committed version, reading clock_timestamp() then, after the lock wait.
//
// completeSQL answers two booleans: whether it completed the record, and
// (when it did not) whether the statement's snapshot shows the record
// completed by this very token: a retried Complete whose first reply was
// lost (dedup.ErrAlreadyCompleted).
const completeSQL = `
WITH u AS (
  UPDATE {table} SET state = 'completed', lease_until = NULL, result = $3::bytea,
    expires_at = clock_timestamp() + $4::bigint * interval '1 microsecond',
    completed_at = clock_timestamp(), response_status = $5::smallint
  WHERE key_hash = $1 AND token = $2 AND state = 'in_progress' AND expires_at > clock_timestamp()
  RETURNING {announce}
)
SELECT EXISTS (SELECT FROM u),
       EXISTS (SELECT FROM {table} WHERE key_hash = $1 AND token = $2 AND state = 'completed' AND expires_at > clock_timestamp())`

// releaseSQL ends the lease now: the row stays, as a released record that
// every statement treats as expired, so that the next claim takes it over
// keeping its provenance and counting one more claim.
const releaseSQL = `
UPDATE {table} AS r SET lease_until = d.at, expires_at = d.at
FROM (SELECT clock_timestamp() AS at) AS d
WHERE r.key_hash = $1 AND r.token = $2 AND r.state = 'in_progress' AND r.expires_at > d.at
RETURNING {announce}`

const extendSQL = `
UPDATE {table} AS r SET lease_until = d.at, expires_at = d.at
FROM (SELECT clock_timestamp() + $3::bigint * interval '1 microsecond' AS at) AS d
WHERE r.key_hash = $1 AND r.token = $2 AND r.state = 'in_progress' AND r.expires_at > clock_timestamp()`

// deleteExpiredSQL deletes at most $1 expired records. SKIP LOCKED leaves
// alone the rows a concurrent claim is taking over right now; the outer
// condition is re-checked on the locked row.
const deleteExpiredSQL = `
DELETE FROM {table}
WHERE key_hash IN (
  SELECT key_hash FROM {table} WHERE expires_at <= clock_timestamp()
  LIMIT $1 FOR UPDATE SKIP LOCKED)
AND expires_at <= clock_timestamp()`

func buildStatements(table string, notify bool) statements {
	announce := "1"
	if notify {
		announce = announceSQL
	}
	r := strings.NewReplacer("{table}", table, "{announce}", announce)
	return statements{
		claim:         r.Replace(claimSQL),
		claimLocked:   r.Replace(claimLockedSQL),
		complete:      r.Replace(completeSQL),
		release:       r.Replace(releaseSQL),
		extend:        r.Replace(extendSQL),
		deleteExpired: r.Replace(deleteExpiredSQL),
	}
}

// keyHash is the record's primary key: the SHA-256 of the key's bytes (its
// UTF-8 encoding), i.e. sha256(convert_to(key, 'UTF8')) in SQL.
func keyHash(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// micros converts a positive duration to whole microseconds (PostgreSQL's
// timestamp resolution), rounding up so that a positive duration never
// becomes zero.
func micros(d time.Duration) int64 {
	if d > math.MaxInt64-time.Microsecond { // rounding up would overflow
		return int64(d / time.Microsecond)
	}
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// Claim implements dedup.Store.Claim: it creates the record, takes over an
// expired one, or reports the live one, atomically, deciding expiry on the
// server's clock. One round trip; a claim of a key whose record is live
// writes nothing (no lock, no row version, no WAL flush). Only a claim that
// races a concurrent first claim or takeover of the same key, committed
// while its statement ran, needs a second statement, which locks the row
// and always answers: at most two round trips. Errors are the driver's
// (e.g. *pgconn.PgError), wrapped; on a table without a column of this
// version they also match ErrNotMigrated.
//
// An Acquired claim carries its fence (dedup.Claim.Fence), computed by the
// same statement on the server's clock as storekit.NextFence computes it
// and kept in the record's fence column: larger than every earlier
// winner's while the row stays (through release, lease expiry, takeover
// and a completed record past its retention). Once the row is deleted
// (DeleteExpired, Evict), the next fence is the server's clock in
// microseconds: larger than the deleted row's as long as the server's
// clock has not gone back by more than the time since that row's last
// claim (a failover to a server whose clock is behind, a clock set back).
//
// Any fingerprint works, raw digest bytes included: one that the text
// column cannot hold (invalid UTF-8, a NUL byte) is stored as
// "\x01sha256:<hex>" of its bytes, every other one verbatim, as earlier
// versions did (see the README).
func (s *Store) Claim(ctx context.Context, key, fingerprint string, lease time.Duration) (dedup.ClaimResult, error) {
	if err := storekit.CheckDuration("lease", lease); err != nil {
		return dedup.ClaimResult{}, err
	}
	token := storekit.NewToken()
	fingerprint = storedFingerprint(fingerprint)
	scope, business := admin.SplitScopedKey(key)
	origin, _ := dedup.OriginFromContext(ctx)
	args := []any{keyHash(key), key, token, fingerprint, micros(lease), scope, business, nullText(origin.TransportID), nullText(origin.MessageID)}
	var got claimRow
	err := s.db.QueryRow(ctx, s.sql.claim, args...).Scan(got.dest()...)
	if errors.Is(err, pgx.ErrNoRows) { // lost a race; nothing was written
		s.fallbacks.Add(1)
		err = s.db.QueryRow(ctx, s.sql.claimLocked, args...).Scan(got.dest()...)
	}
	if err != nil {
		return dedup.ClaimResult{}, notMigrated(fmt.Errorf("postgres: claim: %w", err))
	}
	return claimOutcome(key, token, fingerprint, got)
}

// claimRow is what the claim statements return.
type claimRow struct {
	token, state, fingerprint string
	result                    []byte
	fence                     int64 // the claim's, when token is its
}

func (r *claimRow) dest() []any {
	return []any{&r.token, &r.state, &r.fingerprint, &r.result, &r.fence}
}

// Complete implements dedup.Store.Complete: one UPDATE conditioned on the
// token, a live lease and state in_progress (one round trip). It returns
// dedup.ErrClaimLost when no row matched, dedup.ErrAlreadyCompleted (which
// matches it) when the record is the one this claim completed (a retried
// Complete). The result is stored byte-exact in a bytea column; nil is
// stored as NULL. completed_at is set to the server's clock, and
// response_status to the HTTP status httpdedup reports for the response it
// stores (NULL for other entry points).
func (s *Store) Complete(ctx context.Context, claim dedup.Claim, result []byte, retention time.Duration) error {
	if err := storekit.CheckDuration("retention", retention); err != nil {
		return err
	}
	return s.complete(ctx, s.db, claim, result, retention, "complete")
}

// complete runs completeSQL through q (the pool, or a transaction).
func (s *Store) complete(ctx context.Context, q querier, claim dedup.Claim, result []byte, retention time.Duration, op string) error {
	var done, already bool
	err := q.QueryRow(ctx, s.sql.complete, keyHash(claim.Key), claim.Token, result, micros(retention), responseStatus(ctx)).Scan(&done, &already)
	switch {
	case err != nil:
		return fmt.Errorf("postgres: %s: %w", op, err)
	case already:
		return fmt.Errorf("postgres: %s %.64q: %w", op, claim.Key, dedup.ErrAlreadyCompleted)
	case !done:
		return fmt.Errorf("postgres: %s %.64q: %w", op, claim.Key, dedup.ErrClaimLost)
	}
	return nil
}

// querier is what complete needs of a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// nullText is NULL for an empty id, else the id.
func nullText(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// Release implements dedup.Store.Release: one UPDATE conditioned on the
// token, a live lease and state in_progress (one round trip) that ends the
// lease now (lease_until = expires_at = the server's clock): the row stays
// as a released record, which counts as expired for every statement, until
// the next claim takes it over (keeping claimed_at, transport_id and
// message_id and adding 1 to claims) or DeleteExpired deletes it.
// Otherwise dedup.ErrClaimLost and nothing changes.
func (s *Store) Release(ctx context.Context, claim dedup.Claim) error {
	return s.exec(ctx, "release", claim, s.sql.release, keyHash(claim.Key), claim.Token)
}

// Extend implements dedup.Store.Extend: one UPDATE that sets the lease
// deadline to the server's clock plus lease, conditioned on the token, a
// live lease and state in_progress (one round trip); otherwise
// dedup.ErrClaimLost.
func (s *Store) Extend(ctx context.Context, claim dedup.Claim, lease time.Duration) error {
	if err := storekit.CheckDuration("lease", lease); err != nil {
		return err
	}
	return s.exec(ctx, "extend", claim, s.sql.extend, keyHash(claim.Key), claim.Token, micros(lease))
}

// responseStatus is the response_status column's value for a completion
// within ctx: the status an entry point reported, or NULL.
func responseStatus(ctx context.Context) any {
	if info, ok := dedup.RecordDetailsFromContext(ctx); ok && info.ResponseStatus > 0 && info.ResponseStatus <= math.MaxInt16 {
		return int16(info.ResponseStatus)
	}
	return nil
}

func (s *Store) exec(ctx context.Context, op string, claim dedup.Claim, sql string, args ...any) error {
	tag, err := s.db.Exec(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("postgres: %s: %w", op, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("postgres: %s %.64q: %w", op, claim.Key, dedup.ErrClaimLost)
	}
	return nil
}

// DeleteExpired deletes at most limit records whose lease or retention has
// ended, and returns how many it deleted: one bounded DELETE (one round
// trip) that uses the expires_at index and skips rows a concurrent claim
// holds locked. Correctness never depends on it: a claim takes over an
// expired record in place. Schedule it to bound the table's size, calling it
// again while it returns limit. A limit below 1 is an error.
func (s *Store) DeleteExpired(ctx context.Context, limit int) (int64, error) {
	if limit < 1 {
		return 0, fmt.Errorf("postgres: DeleteExpired: limit must be positive, got %d", limit)
	}
	tag, err := s.db.Exec(ctx, s.sql.deleteExpired, limit)
	if err != nil {
		return 0, fmt.Errorf("postgres: delete expired: %w", err)
	}
	return tag.RowsAffected(), nil
}

var _ dedup.Store = (*Store)(nil)
