package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A schema step is one additive, idempotent change of the table, in the
// order they were introduced. Migrate applies the steps whose objects are
// missing; a table created by an earlier version is upgraded in place by the
// later steps. A new step is one more entry at the end of schemaSteps: only
// ADD COLUMN IF NOT EXISTS (nullable, or with a constant default: no table
// rewrite) and CREATE INDEX IF NOT EXISTS, so that processes running the
// previous version keep working against the upgraded table.
type schemaStep struct {
	ddl string // {table}: quoted table name; {index:suffix}: quoted index name
	// What the step creates, to tell whether it is applied without running
	// it: DDL on an existing table takes a lock that conflicts with every
	// claim, so Migrate runs a step only when something is missing.
	table   bool     // the step creates the table
	columns []string // the step adds these columns
	indexes []string // the step creates these indexes (suffixes)
}

// schemaSteps is the table's history.
//
// Step 1 (round 1), the record:
//   - key_hash: sha256 of the key's UTF-8 bytes; the primary key, so the
//     btree entry is 32 bytes whatever the key's length.
//   - key: the scoped key verbatim ("<scope>:<business key>").
//   - state: in_progress or completed.
//   - token: owner token of the claim that created the record.
//   - fingerprint: the empty string when none was given.
//   - lease_until: lease deadline while in_progress; NULL once completed.
//   - expires_at: when the record stops counting: the lease deadline while
//     in_progress, the end of the retention once completed. Claims and the
//     sweep compare only this column.
//   - result: what Complete stored, byte-exact; NULL for none.
//   - created_at: when the claim that created (or took over) it ran.
//
// Step 2, columns an operator reads in plain SQL:
//   - scope, business_key: the two parts of key, unescaped (NULL on rows
//     written by round 1 until Migrate fills them).
//   - response_status: the HTTP status of the stored response (httpdedup);
//     NULL for message consumers.
//   - completed_at: when the record was completed; NULL while in progress.
//   - a hash index on business_key: WHERE business_key = '…' without a
//     sequential scan, for keys of any length (a btree entry is limited to
//     about 2.7 KB).
//
// Step 3, who and when (see dedup.Store.Claim), as seed 003's table keeps
// them; NULL on rows written before it until their key is claimed afresh:
//   - claimed_at: when the record's first claim ran (server clock). Kept
//     when a claim takes over a released row or one whose lease ended,
//     unlike created_at, which is the time of the claim that holds (or
//     last held) the row.
//   - transport_id, message_id: the first claim's dedup.Origin (NULL when
//     empty).
//   - claims: how many claims acquired the record (1, plus one per retry
//     after a release and per takeover of an abandoned lease).
//
// Step 4, fencing (see dedup.Claim.Fence):
//   - fence: the fence of the claim that created or last took over the
//     record (microseconds since the epoch on the server's clock, or the
//     previous fence plus one). NULL on rows written before it, and on
//     rows a process of an earlier version creates after it; a claim
//     reads NULL as 0, older than any fence. An earlier version's takeover
//     leaves the column as it was: the next fence is still larger.
var schemaSteps = []schemaStep{
	{
		ddl: `CREATE TABLE IF NOT EXISTS {table} (
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
CREATE INDEX IF NOT EXISTS {index:_expires_at_idx} ON {table} (expires_at);`,
		table:   true,
		indexes: []string{"_expires_at_idx"},
	},
	{
		ddl: `ALTER TABLE {table}
	ADD COLUMN IF NOT EXISTS scope           text,
	ADD COLUMN IF NOT EXISTS business_key    text,
	ADD COLUMN IF NOT EXISTS response_status smallint,
	ADD COLUMN IF NOT EXISTS completed_at    timestamptz;
CREATE INDEX IF NOT EXISTS {index:_business_key_idx} ON {table} USING hash (business_key);`,
		columns: []string{"scope", "business_key", "response_status", "completed_at"},
		indexes: []string{"_business_key_idx"},
	},
	{
		ddl: `ALTER TABLE {table}
	ADD COLUMN IF NOT EXISTS claimed_at   timestamptz,
	ADD COLUMN IF NOT EXISTS transport_id text,
	ADD COLUMN IF NOT EXISTS message_id   text,
	ADD COLUMN IF NOT EXISTS claims       integer;`,
		columns: []string{"claimed_at", "transport_id", "message_id", "claims"},
	},
	{
		ddl: `ALTER TABLE {table}
	ADD COLUMN IF NOT EXISTS fence bigint;`,
		columns: []string{"fence"},
	},
}

// stepSQL is one step's DDL for this store's table.
func (s *Store) stepSQL(step schemaStep) string {
	sql := strings.ReplaceAll(step.ddl, "{table}", s.table)
	for _, suffix := range step.indexes {
		sql = strings.ReplaceAll(sql, "{index:"+suffix+"}", s.indexName(suffix, true))
	}
	return sql
}

// indexName is the name of the table's index with suffix, quoted for SQL
// or schema-qualified and quoted for to_regclass.
//
// The name is table+suffix cut to 63 bytes, which keeps the indexes'
// names apart from each other and from the table's while the table's name
// is at most 61 bytes (the suffixes differ in their second byte). A name of
// 62 or 63 bytes would make them collide (CREATE INDEX IF NOT EXISTS then
// skipped them with a NOTICE): the table's part is cut instead, keeping
// the whole suffix, as the server names its own indexes.
func (s *Store) indexName(suffix string, bare bool) string {
	name := truncateIdentifier(s.cfg.Table + suffix)
	if len(s.cfg.Table) > maxIdentifierLength-2 {
		name = cutUTF8(s.cfg.Table, maxIdentifierLength-len(suffix)) + suffix
	}
	if bare || s.cfg.Schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{s.cfg.Schema, name}.Sanitize()
}

// SchemaSQL returns the DDL Migrate runs on a database without the table:
// every schema step in order (CREATE TABLE and CREATE INDEX IF NOT EXISTS,
// then the ALTER TABLE … ADD COLUMN IF NOT EXISTS of later versions),
// separated by semicolons. Each statement is idempotent, so the whole text
// also upgrades a table created by an earlier version; copy it into your
// own migrations if you prefer them to Migrate. It makes no round trip.
func (s *Store) SchemaSQL() string {
	parts := make([]string, len(schemaSteps))
	for i, step := range schemaSteps {
		parts[i] = s.stepSQL(step)
	}
	return strings.Join(parts, "\n")
}

// truncateIdentifier cuts a name to 63 bytes on a UTF-8 boundary, as the
// server would (with a NOTICE) if we did not.
func truncateIdentifier(name string) string {
	return cutUTF8(name, maxIdentifierLength)
}

// cutUTF8 cuts name to at most n bytes on a UTF-8 boundary.
func cutUTF8(name string, n int) string {
	if len(name) <= n {
		return name
	}
	cut := n
	for cut > 0 && name[cut]&0xC0 == 0x80 { // continuation byte
		cut--
	}
	return name[:cut]
}

// catalogSQL lists what exists of the table: whether it exists, its
// columns, and which of the given indexes exist. It takes no lock.
const catalogSQL = `
SELECT to_regclass($1) IS NOT NULL,
       coalesce((SELECT array_agg(attname::text) FROM pg_attribute
                 WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped), '{}'),
       coalesce((SELECT array_agg(i) FROM unnest($2::text[]) AS i WHERE to_regclass(i) IS NOT NULL), '{}')`

// backfillSQL fills the readable columns of at most $1 rows written before
// they existed, from key: the scope is the part before the first ":",
// unescaped ("%3A" is ":", "%25" is "%"), the business key the rest. Rows
// locked by a claim right now are skipped (the claim writes them itself).
const backfillSQL = `
UPDATE {table} SET
  scope = CASE WHEN strpos(key, ':') > 0 THEN replace(replace(split_part(key, ':', 1), '%3A', ':'), '%25', '%') ELSE '' END,
  business_key = CASE WHEN strpos(key, ':') > 0 THEN substr(key, strpos(key, ':') + 1) ELSE key END
WHERE key_hash IN (SELECT key_hash FROM {table} WHERE business_key IS NULL LIMIT $1 FOR UPDATE SKIP LOCKED)`

// backfillBatch bounds each backfill statement, so that it holds row locks
// briefly.
const backfillBatch = 1000

// Migrate creates the table and its indexes if they do not exist, and
// upgrades a table created by an earlier version in place (see SchemaSQL):
// it adds the missing columns (nullable: no table rewrite) and indexes, and
// when it added scope and business_key it fills them on the rows already
// there, in batches of 1000 rows, one statement each. Rows that a process
// of the earlier version writes after the upgrade keep them NULL until the
// key is claimed again or its record expires.
//
// It is idempotent and safe to run from several processes at once: the
// changes run in one transaction holding a transaction-scoped advisory lock
// derived from the table name. It reads the catalog first and runs DDL only
// for what is missing, so on an up-to-date table it takes no table lock
// (about four round trips). An upgrade takes the ACCESS EXCLUSIVE lock of
// ALTER TABLE, waiting for running transactions on the table, and holds it
// until its transaction commits, which includes building a missing index
// (not CONCURRENTLY): on a large table claims wait for the whole index
// build. Upgrade such a table at a quiet time, or run the statements of
// SchemaSQL yourself beforehand with CREATE INDEX CONCURRENTLY. It never
// drops or rewrites anything; the schema named in Config.Schema must
// exist.
func (s *Store) Migrate(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", "watermill-dedup "+s.table); err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	var indexes []string
	for _, step := range schemaSteps {
		for _, suffix := range step.indexes {
			indexes = append(indexes, s.indexName(suffix, false))
		}
	}
	var (
		exists                 bool
		columns, existingIndex []string
	)
	if err := tx.QueryRow(ctx, catalogSQL, s.table, indexes).Scan(&exists, &columns, &existingIndex); err != nil {
		return fmt.Errorf("postgres: migrate: reading the catalog: %w", err)
	}
	backfill := false
	for i, step := range schemaSteps {
		missing := step.table && !exists
		for _, c := range step.columns {
			missing = missing || !slices.Contains(columns, c)
		}
		for _, suffix := range step.indexes {
			missing = missing || !slices.Contains(existingIndex, s.indexName(suffix, false))
		}
		if !missing {
			continue
		}
		// No arguments: pgx sends it with the simple protocol, which allows
		// several statements in one round trip.
		if _, err := tx.Exec(ctx, s.stepSQL(step)); err != nil {
			return fmt.Errorf("postgres: migrate: step %d: %w", i+1, err)
		}
		backfill = backfill || (exists && slices.Contains(step.columns, "business_key"))
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	if !backfill {
		return nil
	}
	fill := strings.ReplaceAll(backfillSQL, "{table}", s.table)
	for {
		tag, err := s.db.Exec(ctx, fill, backfillBatch)
		if err != nil {
			return fmt.Errorf("postgres: migrate: filling scope and business_key: %w", err)
		}
		if tag.RowsAffected() < backfillBatch {
			return nil
		}
	}
}

// ErrNotMigrated: a claim found the table without a column this version
// writes (SQLSTATE 42703): the table was created, or last upgraded, by an
// earlier version, and nothing was written. New does not look at the
// table; run Migrate at start-up, or the statements of SchemaSQL (each is
// idempotent) before deploying this version. The error also keeps the
// driver's *pgconn.PgError.
var ErrNotMigrated = errors.New("postgres: the table lacks a column of this version: run Migrate, or the statements of SchemaSQL")

// notMigrated adds ErrNotMigrated to a claim's error when the server
// reported an undefined column.
func notMigrated(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42703" { // undefined_column
		return fmt.Errorf("%w: %w", ErrNotMigrated, err)
	}
	return err
}
