package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
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

func TestAdminInspect(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t, postgres.Config{})
	held, done := admin.ScopedKey("charge", "ORDER-1 🚀"), admin.ScopedKey("charge", "ORDER-2")
	claimKey(t, s, held, "fp-1", time.Hour, nil, 0)
	claimKey(t, s, done, "", time.Hour, []byte("12345"), 24*time.Hour)
	var serverNow time.Time
	if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&serverNow); err != nil {
		t.Fatal(err)
	}

	got, err := s.Inspect(ctx, held)
	if err != nil || got.Key != held || got.State != admin.StateInProgress || got.Fingerprint != "fp-1" || got.ResultSize != 0 || got.Problem != "" {
		t.Errorf("Inspect in progress = %+v, %v", got, err)
	}
	if got.Created.IsZero() || got.Created.After(serverNow) {
		t.Errorf("Created = %v, want a time before %v", got.Created, serverNow)
	}
	if got.Remaining <= 0 || got.Remaining > time.Hour {
		t.Errorf("remaining lease %v, want in (0, 1h]", got.Remaining)
	}
	got, err = s.Inspect(ctx, done)
	if err != nil || got.State != admin.StateCompleted || got.ResultSize != 5 || got.Fingerprint != "" {
		t.Errorf("Inspect completed = %+v, %v", got, err)
	}
	if got.Remaining <= time.Hour || got.Remaining > 24*time.Hour {
		t.Errorf("remaining retention %v, want in (1h, 24h]", got.Remaining)
	}
	if _, err := s.Inspect(ctx, "charge:ORDER-3"); !errors.Is(err, admin.ErrNotFound) {
		t.Errorf("Inspect missing: %v, want ErrNotFound", err)
	}
	// An expired row that is still in the table is no record.
	expire(t, s, held)
	if _, err := s.Inspect(ctx, held); !errors.Is(err, admin.ErrNotFound) {
		t.Errorf("Inspect expired: %v, want ErrNotFound", err)
	}
	if n := countRows(t, s.Table()); n != 2 {
		t.Fatalf("%d rows, want the expired one kept", n)
	}
}

func TestAdminEvict(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t, postgres.Config{})
	held := claimKey(t, s, "s:held", "", time.Hour, nil, 0)
	claimKey(t, s, "s:done", "", time.Hour, []byte("r"), time.Hour)
	for _, key := range []string{"s:held", "s:done"} {
		if ok, err := s.Evict(ctx, key); !ok || err != nil {
			t.Fatalf("Evict %q = %v, %v; want true", key, ok, err)
		}
		if ok, err := s.Evict(ctx, key); ok || err != nil {
			t.Fatalf("second Evict %q = %v, %v; want false", key, ok, err)
		}
	}
	if n := countRows(t, s.Table()); n != 0 {
		t.Fatalf("%d rows left", n)
	}
	if err := s.Complete(ctx, held, nil, time.Hour); !errors.Is(err, dedup.ErrClaimLost) {
		t.Errorf("Complete of an evicted claim: %v, want ErrClaimLost", err)
	}
	claimKey(t, s, "s:held", "", time.Hour, nil, 0)

	claimKey(t, s, "s:old", "", time.Hour, nil, 0)
	expire(t, s, "s:old")
	if ok, err := s.Evict(ctx, "s:old"); ok || err != nil {
		t.Errorf("Evict expired = %v, %v; want false", ok, err)
	}
	if n := countRows(t, s.Table()); n != 1 {
		t.Errorf("%d rows, want only s:held (the expired row deleted)", n)
	}
}

func listAll(t *testing.T, a admin.Interface, prefix string, limit int) (keys []string, pages int) {
	t.Helper()
	cursor := ""
	for {
		pages++
		if pages > 1000 {
			t.Fatal("List does not end")
		}
		recs, next, err := a.List(testCtx(t), prefix, cursor, limit)
		if err != nil {
			t.Fatalf("List page %d: %v", pages, err)
		}
		if len(recs) > limit {
			t.Fatalf("List page %d has %d records, limit %d", pages, len(recs), limit)
		}
		for _, r := range recs {
			if !strings.HasPrefix(r.Key, prefix) || r.Remaining <= 0 || r.Created.IsZero() ||
				r.State != admin.StateCompleted && r.State != admin.StateInProgress {
				t.Errorf("List record %+v", r)
			}
			keys = append(keys, r.Key)
		}
		if next == "" {
			return keys, pages
		}
		cursor = next
	}
}

func TestAdminList(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t, postgres.Config{})
	// LIKE's wildcards and escape character in the scope are literal.
	scope := `charge_%\orders`
	var want []string
	for i := range 23 {
		key := admin.ScopedKey(scope, fmt.Sprintf("ORDER-%02d é", i))
		claimKey(t, s, key, "", time.Hour, []byte{}, time.Hour)
		want = append(want, key)
	}
	claimKey(t, s, admin.ScopedKey(scope, "Z-expired"), "", time.Hour, nil, 0)
	expire(t, s, admin.ScopedKey(scope, "Z-expired"))
	// Keys the unescaped pattern would match, and another scope.
	for _, other := range []string{`chargeX%\orders`, `charge_%\ordersX`, `charge_ab\orders`, scope + ":eu"} {
		claimKey(t, s, admin.ScopedKey(other, "ORDER-00 é"), "", time.Hour, nil, 0)
	}
	sort.Strings(want) // byte order, as COLLATE "C"

	prefix := admin.ScopePrefix(scope)
	for _, limit := range []int{1, 7, 23, 1000} {
		got, pages := listAll(t, s, prefix, limit)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("limit %d: List = %q, want %q", limit, got, want)
		}
		if wantPages := (len(want) + limit - 1) / limit; pages != wantPages {
			t.Errorf("limit %d: %d pages, want %d (no empty last page)", limit, pages, wantPages)
		}
	}
	if all, _ := listAll(t, s, "", 1000); len(all) != len(want)+4 {
		t.Errorf("List everything: %d records, want %d", len(all), len(want)+4)
	}

	_, cursor, err := s.List(ctx, prefix, "", 5)
	if err != nil || cursor == "" {
		t.Fatalf("first page: %q, %v", cursor, err)
	}
	if _, _, err := s.List(ctx, "another:", cursor, 5); !errors.Is(err, admin.ErrInvalidCursor) {
		t.Errorf("cursor of another prefix: %v, want ErrInvalidCursor", err)
	}
	if _, _, err := s.List(ctx, prefix, "garbage!", 5); !errors.Is(err, admin.ErrInvalidCursor) {
		t.Errorf("garbage cursor: %v, want ErrInvalidCursor", err)
	}
	if _, _, err := s.List(ctx, prefix, "", admin.MaxListLimit+1); err == nil {
		t.Error("limit above MaxListLimit: no error")
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
