package memory_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/storekit"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

func TestScopePrefix(t *testing.T) {
	for _, tc := range []struct {
		scope, key string
	}{
		{"charge-orders", "ORDER-003"},
		{"a:b", "c"},
		{"50%", "x:y"},
		{"", "k"},
	} {
		p := admin.ScopePrefix(tc.scope)
		if got := admin.ScopedKey(tc.scope, tc.key); !strings.HasPrefix(got, p) {
			t.Errorf("ScopedKey(%q, %q) = %q does not start with ScopePrefix = %q", tc.scope, tc.key, got, p)
		}
	}
	// The keys of scope "a:b" do not start with the prefix of scope "a".
	if k := admin.ScopedKey("a:b", "c"); strings.HasPrefix(k, admin.ScopePrefix("a")) {
		t.Errorf("%q starts with the prefix of scope a, %q", k, admin.ScopePrefix("a"))
	}
	if got := admin.ScopePrefix("charge-orders"); got != "charge-orders:" {
		t.Errorf("ScopePrefix(charge-orders) = %q", got)
	}
}

func TestCheckListLimit(t *testing.T) {
	for limit, ok := range map[int]bool{-1: false, 0: false, 1: true, admin.MaxListLimit: true, admin.MaxListLimit + 1: false} {
		if err := storekit.CheckListLimit(limit); (err == nil) != ok {
			t.Errorf("CheckListLimit(%d) = %v", limit, err)
		}
	}
}

// claim claims key and, when result is non-nil, completes it.
func claim(t *testing.T, s dedup.Store, key, fp string, lease time.Duration, result []byte, retention time.Duration) dedup.Claim {
	t.Helper()
	ctx := context.Background()
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

func TestMemoryAdminInspect(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(epoch)
	s := memory.New(clock)

	claim(t, s, "orders:1", "fp-1", time.Minute, nil, 0)
	claim(t, s, "orders:2", "", time.Minute, []byte("12345"), time.Hour)
	clock.Advance(10 * time.Second)

	got, err := s.Inspect(ctx, "orders:1")
	want := admin.Record{Key: "orders:1", State: admin.StateInProgress, Fingerprint: "fp-1", Remaining: 50 * time.Second}
	if err != nil || got != want {
		t.Errorf("Inspect in progress = %+v, %v; want %+v", got, err, want)
	}
	got, err = s.Inspect(ctx, "orders:2")
	want = admin.Record{Key: "orders:2", State: admin.StateCompleted, ResultSize: 5, Remaining: time.Hour - 10*time.Second}
	if err != nil || got != want {
		t.Errorf("Inspect completed = %+v, %v; want %+v", got, err, want)
	}
	if _, err := s.Inspect(ctx, "orders:3"); !errors.Is(err, admin.ErrNotFound) {
		t.Errorf("Inspect missing: %v, want ErrNotFound", err)
	}
	clock.Advance(50 * time.Second) // the lease of orders:1 ends
	if _, err := s.Inspect(ctx, "orders:1"); !errors.Is(err, admin.ErrNotFound) {
		t.Errorf("Inspect expired: %v, want ErrNotFound", err)
	}
}

// Evict deletes a record whatever its token; the owner then loses its
// claim, and the next claim runs again.
func TestMemoryAdminEvict(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(epoch)
	s := memory.New(clock)

	c := claim(t, s, "k:held", "", time.Minute, nil, 0)
	claim(t, s, "k:done", "", time.Minute, []byte("r"), time.Hour)
	for _, key := range []string{"k:held", "k:done"} {
		if ok, err := s.Evict(ctx, key); !ok || err != nil {
			t.Fatalf("Evict %q = %v, %v; want true", key, ok, err)
		}
		if ok, err := s.Evict(ctx, key); ok || err != nil {
			t.Fatalf("second Evict %q = %v, %v; want false", key, ok, err)
		}
	}
	if err := s.Complete(ctx, c, nil, time.Hour); !errors.Is(err, dedup.ErrClaimLost) {
		t.Errorf("Complete of an evicted claim: %v, want ErrClaimLost", err)
	}
	res, err := s.Claim(ctx, "k:done", "", time.Minute)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Errorf("Claim after Evict = %v, %v; want acquired", res.Outcome, err)
	}
	// An expired record is not live: Evict reports false.
	claim(t, s, "k:old", "", time.Second, nil, 0)
	clock.Advance(time.Second)
	if ok, err := s.Evict(ctx, "k:old"); ok || err != nil {
		t.Errorf("Evict expired = %v, %v; want false", ok, err)
	}
}

func TestMemoryAdminList(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(epoch)
	s := memory.New(clock)
	var want []string
	for i := range 7 {
		key := admin.ScopedKey("charge", fmt.Sprintf("ORDER-%02d", i))
		claim(t, s, key, "", time.Minute, []byte{}, time.Hour)
		want = append(want, key)
	}
	claim(t, s, admin.ScopedKey("charge:eu", "ORDER-00"), "", time.Minute, nil, 0) // another scope
	claim(t, s, admin.ScopedKey("charge", "short-lived"), "", time.Second, nil, 0)
	clock.Advance(time.Second) // short-lived expires

	got := listAll(t, s, admin.ScopePrefix("charge"), 3)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("List = %v, want %v", got, want)
	}
	if all := listAll(t, s, "", admin.MaxListLimit); len(all) != 8 {
		t.Errorf("List everything = %v, want 8 keys", all)
	}
	if _, _, err := s.List(ctx, "", "not hex", 10); !errors.Is(err, admin.ErrInvalidCursor) {
		t.Errorf("List with a bad cursor: %v, want ErrInvalidCursor", err)
	}
	if _, _, err := s.List(ctx, "", "", 0); err == nil {
		t.Error("List with limit 0: no error")
	}
}

// listAll pages through List and checks the pages' sizes and records.
func listAll(t *testing.T, a admin.Interface, prefix string, limit int) []string {
	t.Helper()
	var keys []string
	cursor := ""
	for page := 0; ; page++ {
		if page > 100 {
			t.Fatal("List does not end")
		}
		recs, next, err := a.List(context.Background(), prefix, cursor, limit)
		if err != nil {
			t.Fatalf("List page %d: %v", page, err)
		}
		if len(recs) > limit {
			t.Fatalf("List page %d has %d records, limit %d", page, len(recs), limit)
		}
		for _, r := range recs {
			if !strings.HasPrefix(r.Key, prefix) || r.Remaining <= 0 || r.State != admin.StateCompleted && r.State != admin.StateInProgress {
				t.Errorf("List record %+v", r)
			}
			keys = append(keys, r.Key)
		}
		if next == "" {
			return keys
		}
		cursor = next
	}
}
