package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// schemaSQL is the table and its index. {table} is the quoted, possibly
// schema-qualified table name, {index} the quoted name of the index.
//
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
const schemaSQL = `CREATE TABLE IF NOT EXISTS {table} (
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

// SchemaSQL returns the DDL Migrate runs: CREATE TABLE IF NOT EXISTS and
// CREATE INDEX IF NOT EXISTS for the configured table, as two statements
// separated by a semicolon. Copy it into your own migrations if you prefer
// them to Migrate. It makes no round trip.
func (s *Store) SchemaSQL() string {
	index := pgx.Identifier{truncateIdentifier(s.cfg.Table + "_expires_at_idx")}.Sanitize()
	return strings.NewReplacer("{table}", s.table, "{index}", index).Replace(schemaSQL)
}

// truncateIdentifier cuts a name to 63 bytes on a UTF-8 boundary, as the
// server would (with a NOTICE) if we did not.
func truncateIdentifier(name string) string {
	if len(name) <= maxIdentifierLength {
		return name
	}
	cut := maxIdentifierLength
	for cut > 0 && name[cut]&0xC0 == 0x80 { // continuation byte
		cut--
	}
	return name[:cut]
}

// Migrate creates the table and its index if they do not exist (see
// SchemaSQL). It is idempotent and safe to run from several processes at
// once: it runs in one transaction holding a transaction-scoped advisory
// lock derived from the table name (four round trips). It never alters or
// drops an existing table; the schema named in Config.Schema must exist.
func (s *Store) Migrate(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", "watermill-dedup "+s.table); err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	// No arguments: pgx sends it with the simple protocol, which allows the
	// two statements in one round trip.
	if _, err := tx.Exec(ctx, s.SchemaSQL()); err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	return nil
}
