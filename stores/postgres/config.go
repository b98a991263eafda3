package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

// DB is what the store needs from PostgreSQL: the method set of
// *pgxpool.Pool, which is what callers normally pass. A *pgx.Conn also
// satisfies it but is not safe for concurrent use; pass a pool whenever
// more than one goroutine uses the store.
type DB interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

// ErrNoDB: New was given a Config without a DB (nil, or a nil
// *pgxpool.Pool). Validate reports it too.
var ErrNoDB = errors.New("postgres: Config.DB is required")

// Defaults applied by New to zero fields of Config.
const (
	DefaultTable         = "dedup_keys"
	DefaultFinishTimeout = 5 * time.Second
)

// maxIdentifierLength is PostgreSQL's NAMEDATALEN-1: longer names are
// silently truncated by the server, which would make two configured tables
// the same table.
const maxIdentifierLength = 63

// Config configures a Store. It is passed by value; New never writes to the
// caller's copy.
type Config struct {
	// DB is the database that holds the records, normally a
	// *pgxpool.Pool (see DB). Required: New refuses a nil DB (or a nil
	// *pgxpool.Pool) with ErrNoDB. The store never closes it.
	DB DB

	// Table is the table holding the records, created by Migrate. Defaults
	// to "dedup_keys". At most 63 bytes; quoted, so any characters work.
	Table string

	// Schema is the PostgreSQL schema of Table. Defaults to "": the table is
	// resolved through the connection's search_path. Migrate does not create
	// the schema.
	Schema string

	// TxOptions are the options of the transactions TxMiddleware begins.
	// Defaults to the zero value: the server's default isolation level
	// (READ COMMITTED unless configured otherwise), read-write. Under
	// REPEATABLE READ or SERIALIZABLE, a lease extension by the dedup
	// middleware's heartbeat committed after the transaction's first
	// statement makes the completion fail with a serialization error
	// (SQLSTATE 40001): nothing is committed, the key is released and the
	// message redelivered, so a handler that always runs longer than the
	// heartbeat interval never completes. Prefer READ COMMITTED.
	TxOptions pgx.TxOptions

	// FinishTimeout bounds what TxMiddleware does after the handler
	// returned: the completion UPDATE and COMMIT, or the ROLLBACK. They run
	// even when the message's context was cancelled meanwhile, since the
	// token check under the row lock keeps them safe. Defaults to 5s.
	FinishTimeout time.Duration

	// Notify makes the store wake the copies that wait for a held key
	// (dedup.Config.InProgressWait) instead of letting them poll: the
	// completing and releasing statements (Complete, Release, and the
	// completion in TxMiddleware's and RunInTx's transaction, delivered at
	// its commit) call pg_notify on a channel derived from the key, and
	// Store.WatchKey listens on one connection per store of its own
	// (LISTEN, opened with the pool's configuration, not taken from the
	// pool). Set it on every process that shares the table: a completion
	// by a process without it is seen by the waiters' fallback poll
	// (dedup.Config.InProgressFallback, 1s) only.
	//
	// Cost: PostgreSQL serializes the commits of every transaction that
	// notified, database-wide, on one lock held until the commit is
	// flushed: with synchronous_commit on, completions then commit one
	// WAL flush after another instead of sharing flushes. Measure it at
	// your completion rate (docs/waiting.md has the figure measured here).
	// New refuses it with a DB that is not a *pgxpool.Pool. Defaults to
	// false: waiters poll.
	Notify bool
}

func (c *Config) setDefaults() {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.FinishTimeout == 0 {
		c.FinishTimeout = DefaultFinishTimeout
	}
}

// Validate reports every problem in the configuration at once (joined with
// errors.Join), after applying defaults to a copy. Zero values are not
// problems: they take their defaults.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if storekit.IsNil(c.DB) {
		errs = append(errs, fmt.Errorf("%w (a *pgxpool.Pool)", ErrNoDB))
	}
	for _, id := range []struct{ field, name string }{{"Table", c.Table}, {"Schema", c.Schema}} {
		if len(id.name) > maxIdentifierLength {
			errs = append(errs, fmt.Errorf("postgres: Config.%s is %d bytes, PostgreSQL identifiers are at most %d", id.field, len(id.name), maxIdentifierLength))
		}
		if strings.ContainsRune(id.name, 0) {
			errs = append(errs, fmt.Errorf("postgres: Config.%s contains a NUL byte", id.field))
		}
	}
	if c.FinishTimeout < 0 {
		errs = append(errs, fmt.Errorf("%w: Config.FinishTimeout must not be negative, got %v", dedup.ErrInvalidDuration, c.FinishTimeout))
	}
	return errors.Join(errs...)
}
