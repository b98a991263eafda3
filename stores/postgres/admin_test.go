package postgres_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// claimKey claims key and, unless result is nil, completes it.
func claimKey(t *testing.T, s dedup.Store, key, fp string, lease time.Duration, result []byte, retention time.Duration) dedup.Claim {
	t.Helper()
	ctx := testCtx(t)
	res, err := s.Claim(ctx, key, fp, lease)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("Claim %q: %v %v", key, res.Outcome, err)
	}
	if result != nil {
		if err := s.Complete(ctx, res.Claim, result, retention); err != nil {
			t.Fatalf("Complete %q: %v", key, err)
		}
	}
	return res.Claim
}

// What only PostgreSQL shows: Created is the server's time of the claim;
// an expired row stays in the table (Inspect: not found) until Evict or
// DeleteExpired deletes it, and Evict reports it as no record; Evict of a
// live record deletes its row. The rest of
// the admin contract is storetest.RunAdmin (TestAdmin).
func TestAdminRows(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t, postgres.Config{})
	held := admin.ScopedKey("charge", "ORDER-1 🚀")
	claimKey(t, s, held, "fp-1", time.Hour, nil, 0)
	var serverNow time.Time
	if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&serverNow); err != nil {
		t.Fatal(err)
	}
	got, err := s.Inspect(ctx, held)
	if err != nil || got.Created.IsZero() || got.Created.After(serverNow) {
		t.Errorf("Inspect = %+v, %v; want Created before the server's %v", got, err, serverNow)
	}

	old := admin.ScopedKey("charge", "ORDER-2")
	claimKey(t, s, old, "", time.Hour, []byte("r"), time.Hour)
	expire(t, s, held)
	expire(t, s, old)
	if _, err := s.Inspect(ctx, held); !errors.Is(err, admin.ErrNotFound) {
		t.Errorf("Inspect expired: %v, want ErrNotFound", err)
	}
	if n := countRows(t, s.Table()); n != 2 {
		t.Fatalf("%d rows, want the expired ones kept", n)
	}
	if ok, err := s.Evict(ctx, old); ok || err != nil {
		t.Errorf("Evict expired = %v, %v; want false", ok, err)
	}
	if n := countRows(t, s.Table()); n != 1 {
		t.Errorf("%d rows, want the evicted expired row deleted", n)
	}
	live := admin.ScopedKey("charge", "ORDER-3")
	claimKey(t, s, live, "", time.Hour, nil, 0)
	if ok, err := s.Evict(ctx, live); !ok || err != nil {
		t.Errorf("Evict live = %v, %v; want true", ok, err)
	}
	if n := countRows(t, s.Table()); n != 1 {
		t.Errorf("%d rows, want the evicted live row deleted", n)
	}
}

// The schema has no index on key, so a page is a sequential scan; the
// index the documentation suggests turns it into an index scan.
func TestAdminListPlan(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t, postgres.Config{})
	plan := func() string {
		t.Helper()
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		// Rule out the sequential scan whenever another plan exists.
		if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, "EXPLAIN "+postgres.ListSQL(s), "charge:%", "", 11)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(lines, "\n")
	}
	// Without it every live row is read (by a sequential scan, or through
	// the expires_at index) and the prefix is a filter on each.
	if p := plan(); !regexp.MustCompile(`Filter: .*key.* ~~ 'charge:%'`).MatchString(p) || strings.Contains(p, "Index Cond: (((r.key)") {
		t.Errorf("without an index on key the plan is\n%s\nwant the prefix as a filter on every row", p)
	}
	if _, err := pool.Exec(ctx, `CREATE INDEX admin_key_c_idx ON `+s.Table()+` (key COLLATE "C")`); err != nil {
		t.Fatal(err)
	}
	if p := plan(); !regexp.MustCompile(`(Index Scan using|Bitmap Index Scan on) admin_key_c_idx[^\n]*\n\s*Index Cond: [^\n]*key[^\n]* >= 'charge:'`).MatchString(p) {
		t.Errorf("with an index on key COLLATE \"C\" the plan is\n%s\nwant an index range scan on the prefix", p)
	}
}
