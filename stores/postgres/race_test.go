package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// txDB lets a Store run inside a test's own transaction.
type txDB struct{ pgx.Tx }

func (d txDB) BeginTx(ctx context.Context, _ pgx.TxOptions) (pgx.Tx, error) { return d.Begin(ctx) }

// TestClaimRaceFallsBackToLockingStatement makes the race deterministic: a
// rival claim (a first claim of a fresh key, or a takeover of an expired
// record) is held uncommitted in a transaction while our claim starts and
// blocks on it. When the rival commits, our statement's snapshot predates
// the rival's row, so the first statement finds nothing to report and the
// claim must fall back to the locking statement, which sees the rival's
// record: InProgress. When the rival rolls back, our claim wins with its
// first statement.
func TestClaimRaceFallsBackToLockingStatement(t *testing.T) {
	for _, tc := range []struct {
		name     string
		expired  bool // the rival takes over an expired record instead of creating one
		commit   bool
		want     dedup.Outcome
		fallback int64
	}{
		{"fresh key, rival commits", false, true, dedup.InProgress, 1},
		{"fresh key, rival rolls back", false, false, dedup.Acquired, 0},
		{"expired record, rival commits", true, true, dedup.InProgress, 1},
		{"expired record, rival rolls back", true, false, dedup.Acquired, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			s := newStore(t, postgres.Config{})
			const key = "charge:ORDER-1"
			if tc.expired {
				res, err := s.Claim(ctx, key, "", time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Complete(ctx, res.Claim, []byte("old"), time.Hour); err != nil {
					t.Fatal(err)
				}
				expire(t, s, key)
			}

			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			var rivalPID uint32
			if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&rivalPID); err != nil {
				t.Fatal(err)
			}
			rival, err := postgres.New(ctx, postgres.Config{DB: txDB{tx}, Schema: schemaOf(t, s)})
			if err != nil {
				t.Fatal(err)
			}
			if res, err := rival.Claim(ctx, key, "", time.Hour); err != nil || res.Outcome != dedup.Acquired {
				t.Fatalf("rival claim: %v %v", res.Outcome, err)
			}

			before := postgres.Fallbacks(s)
			type answer struct {
				res dedup.ClaimResult
				err error
			}
			done := make(chan answer, 1)
			go func() {
				res, err := s.Claim(ctx, key, "", time.Hour)
				done <- answer{res, err}
			}()
			waitUntilBlockedBy(t, rivalPID)
			if tc.commit {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			var got answer
			select {
			case got = <-done:
			case <-time.After(time.Minute):
				t.Fatal("the racing claim did not return within a minute")
			}
			if got.err != nil || got.res.Outcome != tc.want {
				t.Fatalf("claim = %v, %v; want %v", got.res.Outcome, got.err, tc.want)
			}
			if n := postgres.Fallbacks(s) - before; n != tc.fallback {
				t.Fatalf("%d fallbacks to the locking statement, want %d", n, tc.fallback)
			}
		})
	}
}

// waitUntilBlockedBy waits until some backend waits for a lock held by the
// backend pid: our claim has started and is queued behind the rival.
func waitUntilBlockedBy(t *testing.T, pid uint32) {
	t.Helper()
	ctx := testCtx(t)
	for {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))`, int32(pid)).Scan(&n)
		if err != nil {
			t.Fatalf("waiting for the claim to block: %v", err)
		}
		if n > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("the claim never blocked on the rival")
		case <-time.After(5 * time.Millisecond): // polling interval, not a clock
		}
	}
}

func schemaOf(t testing.TB, s *postgres.Store) string {
	t.Helper()
	var schema string
	// Table() is "schema"."table"; let the server parse it.
	if err := pool.QueryRow(testCtx(t), "SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = $1::regclass", s.Table()).Scan(&schema); err != nil {
		t.Fatalf("schema of %s: %v", s.Table(), err)
	}
	return schema
}
