package postgres_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storetest"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// features: expiry is decided by the server's clock, so the suite waits in
// real time. Leases the suite lets expire: expiry resolution is a
// microsecond, but the machine is shared and -race is slow, so a claim and
// the Extend that follows it must fit well within them.
var features = storetest.Features{
	ShortDuration:    time.Second,
	Admin:            true,
	RecordsCreated:   true,
	ListFillsPages:   true,
	AlreadyCompleted: true,
	Provenance:       true,
	CountsTakeovers:  true,
	RecordDetails:    true,
	// The claim statements compute the fence on the server's clock and
	// keep it in the fence column (schema step 4).
	Fencing: true,
	// As stored: verbatim when it is text, else its digest.
	AdminFingerprint: func(fp string) string {
		if fp == "" || utf8.ValidString(fp) && !strings.ContainsRune(fp, 0) && !strings.HasPrefix(fp, "\x01") {
			return fp
		}
		sum := sha256.Sum256([]byte(fp))
		return "\x01sha256:" + hex.EncodeToString(sum[:])
	},
}

// sharedStore returns a constructor that gives every case the same store,
// migrated in a schema of its own, and that schema.
func sharedStore(t *testing.T) (*postgres.Store, string, storetest.Constructor) {
	schema := newSchema(t)
	s := newStore(t, postgres.Config{Schema: schema})
	return s, schema, func(*testing.T) (dedup.Store, func(time.Duration)) { return s, nil }
}

func TestConformance(t *testing.T) {
	_, _, newStore := sharedStore(t)
	storetest.Run(t, newStore, features)
}

func TestAdmin(t *testing.T) {
	_, _, newStore := sharedStore(t)
	storetest.RunAdmin(t, newStore, features)
}

// The watch cases on a store with Config.Notify (WatchKey; the
// completing and releasing statements pg_notify), shared by every case,
// and the fence cases, whose releases run Notify's statements.
func TestConformanceNotify(t *testing.T) {
	s := notifyStore(t)
	f := features
	f.Watch = true
	f.Batch, f.BatchRequestSize = true, postgres.BatchRequestSize
	shared := func(*testing.T) (dedup.Store, func(time.Duration)) { return s, nil }
	t.Run("WatchAfterChange", func(t *testing.T) { t.Parallel(); storetest.TestWatchAfterChange(t, shared, f) })
	t.Run("WatchWakesWaiters", func(t *testing.T) { t.Parallel(); storetest.TestWatchWakesWaiters(t, shared, f) })
	t.Run("FenceIncreases", func(t *testing.T) { t.Parallel(); storetest.TestFenceIncreases(t, shared, f) })
	t.Run("FencesOfContendersIncrease", func(t *testing.T) { t.Parallel(); storetest.TestFencesOfContendersIncrease(t, shared, f) })
	t.Run("BatchFences", func(t *testing.T) { t.Parallel(); storetest.TestBatchFences(t, shared, f) })
}

// The middleware through a router, and the effect in the handler's own
// transaction (TxMiddleware): an effect written by a handler that then
// fails rolls back with its claim's release.
func TestRouter(t *testing.T) {
	s, schema, newStore := sharedStore(t)
	effects := pgx.Identifier{schema, "effects"}.Sanitize()
	if _, err := pool.Exec(testCtx(t), "CREATE TABLE "+effects+" (key text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	f := features
	f.Transactions = &storetest.Transactions{
		Middleware: s.TxMiddleware,
		Effect: func(msg *message.Message, key string) error {
			tx, ok := postgres.TxFromContext(msg.Context())
			if !ok {
				return errors.New("no transaction in the handler's context")
			}
			_, err := tx.Exec(msg.Context(), "INSERT INTO "+effects+" (key) VALUES ($1)", key)
			return err
		},
		Effects: func(ctx context.Context, key string) (int, error) {
			var n int
			err := pool.QueryRow(ctx, "SELECT count(*) FROM "+effects+" WHERE key = $1", key).Scan(&n)
			return n, err
		},
	}
	storetest.RunRouter(t, newStore, f)
}
