package storetest

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
)

// adminCases are the cases RunAdmin runs, in order.
var adminCases = []suiteCase{
	{"AdminInspect", TestAdminInspect},
	{"AdminEvict", TestAdminEvict},
	{"AdminList", TestAdminList},
	{"AdminListCursorAndLimit", TestAdminListCursorAndLimit},
}

// RunAdmin runs every case of the operator's contract (admin.Interface:
// Inspect, Evict, List, with ErrNotFound, ErrInvalidCursor, MaxListLimit,
// pagination and scope prefixes) in parallel. The store must implement
// admin.Interface and declare Features.Admin; without it every case is
// skipped with the reason.
func RunAdmin(t *testing.T, newStore Constructor, features Features) {
	t.Helper()
	runAll(t, adminCases, newStore, features)
}

func skipWithoutAdmin(t *testing.T, features Features) {
	t.Helper()
	if !features.Admin {
		t.Skip("storetest: Features.Admin is not set: the store does not implement admin.Interface")
	}
}

func (e *env) admin() admin.Interface { return e.store.(admin.Interface) }

// checkRecord checks what every live record shows, whatever its state.
func (e *env) checkRecord(op string, r admin.Record) {
	e.t.Helper()
	if r.State != admin.StateInProgress && r.State != admin.StateCompleted {
		e.t.Errorf("%s: record %.60q has state %q (problem %q), want in_progress or completed", op, r.Key, r.State, r.Problem)
	}
	if r.Remaining <= 0 {
		e.t.Errorf("%s: live record %.60q has Remaining %v, want it positive", op, r.Key, r.Remaining)
	}
	if r.Problem != "" {
		e.t.Errorf("%s: record %.60q has a problem: %s", op, r.Key, r.Problem)
	}
	if e.features.RecordsCreated {
		// The store's clock is the server's; an hour either side only rules
		// out a zero, garbled or wrongly zoned time.
		if r.Created.IsZero() || r.Created.Sub(time.Now()).Abs() > time.Hour {
			e.t.Errorf("%s: record %.60q was created at %v, want about now", op, r.Key, r.Created)
		}
	} else if !r.Created.IsZero() {
		e.t.Errorf("%s: record %.60q has Created %v, but Features.RecordsCreated is not set", op, r.Key, r.Created)
	}
}

// listAll pages through List under prefix with limit and returns the keys
// it found, sorted and each once (Redis SCAN may list a key twice). It
// checks every page's size and record; check, if set, sees every page.
func (e *env) listAll(prefix string, limit int, check func(page int, records []admin.Record, next string)) []string {
	e.t.Helper()
	seen := map[string]bool{}
	var keys []string
	cursor := ""
	for page := 1; page <= 10_000; page++ {
		records, next, err := e.admin().List(e.ctx, prefix, cursor, limit)
		if err != nil {
			e.t.Fatalf("List(prefix %.60q, limit %d) page %d: %v", prefix, limit, page, err)
		}
		if len(records) > limit {
			e.t.Fatalf("List(prefix %.60q) page %d has %d records, limit %d", prefix, page, len(records), limit)
		}
		for _, r := range records {
			if !strings.HasPrefix(r.Key, prefix) {
				e.t.Fatalf("List(prefix %.60q) returned key %.60q outside the prefix", prefix, r.Key)
			}
			if strings.HasPrefix(r.Key, e.prefix) { // records of other tests may be anything
				e.checkRecord("List", r)
			}
			if !seen[r.Key] {
				seen[r.Key] = true
				keys = append(keys, r.Key)
			}
		}
		if check != nil {
			check(page, records, next)
		}
		if next == "" {
			sort.Strings(keys)
			return keys
		}
		cursor = next
	}
	e.t.Fatalf("List(prefix %.60q) did not end after 10000 pages", prefix)
	return nil
}

// TestAdminInspect (needs Admin): Inspect shows the state, fingerprint,
// result size and what is left of the lease or retention of a live record,
// finds long keys, answers ErrNotFound for a missing or expired record, and
// changes nothing.
func TestAdminInspect(t *testing.T, newStore Constructor, features Features) {
	skipWithoutAdmin(t, features)
	e := newEnv(t, "AdminInspect", newStore, features)
	adm := e.admin()
	const lease, retention = time.Hour, 24 * time.Hour
	scope := e.prefix + "charge"
	held, done := admin.ScopedKey(scope, "ORDER-1 🚀"), admin.ScopedKey(scope, "ORDER-2")
	long := admin.ScopedKey(scope, strings.Repeat("x", 700))
	e.record(held, "fp-1", lease, nil, 0)
	e.record(done, "", lease, []byte("12345"), retention)
	e.record(long, "", lease, nil, 0)
	var elapsed time.Duration
	if e.features.ControllableClock {
		elapsed = 10 * time.Second
		e.wait(elapsed)
	}

	got, err := adm.Inspect(e.ctx, held)
	if err != nil {
		t.Fatalf("Inspect in progress: %v", err)
	}
	e.checkRecord("Inspect", got)
	if got.Key != held || got.State != admin.StateInProgress || got.ResultSize != 0 || got.Fingerprint == "" {
		t.Errorf("Inspect in progress = %+v, want key %q, in progress, a fingerprint, no result", got, held)
	}
	if f := e.features.AdminFingerprint; f != nil && got.Fingerprint != f("fp-1") {
		t.Errorf("Inspect in progress: fingerprint %q, want %q", got.Fingerprint, f("fp-1"))
	}
	switch {
	case e.features.ControllableClock && got.Remaining != lease-elapsed:
		t.Errorf("Inspect in progress: remaining %v, want %v", got.Remaining, lease-elapsed)
	case got.Remaining > lease:
		t.Errorf("Inspect in progress: remaining %v, more than the lease %v", got.Remaining, lease)
	}

	got, err = adm.Inspect(e.ctx, done)
	if err != nil {
		t.Fatalf("Inspect completed: %v", err)
	}
	e.checkRecord("Inspect", got)
	if got.Key != done || got.State != admin.StateCompleted || got.ResultSize != 5 || got.Fingerprint != "" {
		t.Errorf("Inspect completed = %+v, want key %q, completed, 5 bytes, no fingerprint", got, done)
	}
	switch {
	case e.features.ControllableClock && got.Remaining != retention-elapsed:
		t.Errorf("Inspect completed: remaining %v, want %v", got.Remaining, retention-elapsed)
	case got.Remaining <= lease || got.Remaining > retention: // the retention, not the lease
		t.Errorf("Inspect completed: remaining %v, want in (%v, %v]", got.Remaining, lease, retention)
	}

	if got, err := adm.Inspect(e.ctx, long); err != nil || got.Key != long || got.State != admin.StateInProgress {
		t.Errorf("Inspect of a %d-byte key = %.80q %s, %v; want the same key, in progress", len(long), got.Key, got.State, err)
	}
	if _, err := adm.Inspect(e.ctx, admin.ScopedKey(scope, "ORDER-3")); !errors.Is(err, admin.ErrNotFound) {
		t.Errorf("Inspect of a missing key: %v, want ErrNotFound", err)
	}

	// Inspect changed nothing.
	e.expect(held, "fp-1", dedup.InProgress)
	if res := e.expect(done, "", dedup.Duplicate); string(res.Result) != "12345" {
		t.Errorf("after Inspect the result is %q", res.Result)
	}

	// Past its lease the record is gone, even while the store still holds it.
	expired := admin.ScopedKey(scope, "short-lived")
	e.record(expired, "", e.features.ShortDuration, nil, 0)
	e.wait(2 * e.features.ShortDuration)
	if _, err := adm.Inspect(e.ctx, expired); !errors.Is(err, admin.ErrNotFound) {
		t.Errorf("Inspect of an expired record: %v, want ErrNotFound", err)
	}
}

// TestAdminEvict (needs Admin): Evict deletes a record whatever its state
// and owner and reports it once; the owner's claim is lost and the key can
// be claimed again; an expired or missing record is reported as none.
func TestAdminEvict(t *testing.T, newStore Constructor, features Features) {
	skipWithoutAdmin(t, features)
	e := newEnv(t, "AdminEvict", newStore, features)
	adm := e.admin()
	scope := e.prefix + "s"
	held := e.record(admin.ScopedKey(scope, "held"), "fp", time.Hour, nil, 0)
	done := admin.ScopedKey(scope, "done")
	e.record(done, "", time.Hour, []byte("r"), time.Hour)
	long := admin.ScopedKey(scope, strings.Repeat("y", 700))
	e.record(long, "", time.Hour, nil, 0)
	for _, key := range []string{held.Key, done, long} {
		if ok, err := adm.Evict(e.ctx, key); !ok || err != nil {
			t.Fatalf("Evict(%.60q) = %v, %v; want true", key, ok, err)
		}
		if ok, err := adm.Evict(e.ctx, key); ok || err != nil {
			t.Fatalf("second Evict(%.60q) = %v, %v; want false", key, ok, err)
		}
		if _, err := adm.Inspect(e.ctx, key); !errors.Is(err, admin.ErrNotFound) {
			t.Fatalf("Inspect after Evict(%.60q): %v, want ErrNotFound", key, err)
		}
	}
	expectClaimLost(t, "Complete of an evicted claim", e.store.Complete(e.ctx, held, nil, time.Hour))
	expectClaimLost(t, "Extend of an evicted claim", e.store.Extend(e.ctx, held, time.Hour))
	e.acquire(done, "", time.Hour) // the duplicate runs again: what Evict is for
	e.acquire(held.Key, "other-fp", time.Hour)

	if ok, err := adm.Evict(e.ctx, admin.ScopedKey(scope, "never")); ok || err != nil {
		t.Errorf("Evict of a key never claimed = %v, %v; want false", ok, err)
	}
	old := admin.ScopedKey(scope, "old")
	e.record(old, "", e.features.ShortDuration, nil, 0)
	e.wait(2 * e.features.ShortDuration)
	if ok, err := adm.Evict(e.ctx, old); ok || err != nil {
		t.Errorf("Evict of an expired record = %v, %v; want false", ok, err)
	}
	e.acquire(old, "", time.Hour)
}

// TestAdminList (needs Admin): List under a scope's prefix returns every
// live record of that scope exactly (in progress and completed), at every
// page size, and nothing of an expired record, a nested scope, or a scope
// that the prefix would match if its glob or LIKE characters ('*' '?' '['
// ']' '_' '%' '\\') were not taken literally; List of "" includes them all.
func TestAdminList(t *testing.T, newStore Constructor, features Features) {
	skipWithoutAdmin(t, features)
	e := newEnv(t, "AdminList", newStore, features)
	scope := e.prefix + `charge*[orders]?_%\`
	var want []string
	for i := range 23 {
		var result []byte
		if i%2 == 0 {
			result = []byte{}
		}
		key := admin.ScopedKey(scope, fmt.Sprintf("ORDER-%02d é", i))
		e.record(key, "", time.Hour, result, time.Hour)
		want = append(want, key)
	}
	long := admin.ScopedKey(scope, strings.Repeat("z", 600))
	e.record(long, "", time.Hour, nil, 0)
	want = append(want, e.features.ListedKey(long))
	sort.Strings(want)
	decoys := []string{
		scope + ":eu",                          // a nested scope: its escaped name continues past the prefix
		e.prefix + `chargeANYoZ_%\`,            // what the prefix matches as a glob
		e.prefix + `charge*[orders]?Yab25\`,    // what the escaped prefix matches as a LIKE pattern
		e.prefix + `charge*[orders]?_%`,        // the scope without its last character
		e.prefix + `charge*[orders]?_%\` + `x`, // and with one more
	}
	for _, d := range decoys {
		e.record(admin.ScopedKey(d, "ORDER-00 é"), "", time.Hour, nil, 0)
	}
	expired := admin.ScopedKey(scope, "short-lived")
	e.record(expired, "", e.features.ShortDuration, nil, 0)
	e.wait(2 * e.features.ShortDuration)

	prefix := admin.ScopePrefix(scope)
	for _, limit := range []int{1, 7, len(want), admin.MaxListLimit} {
		pages := 0
		got := e.listAll(prefix, limit, func(page int, records []admin.Record, next string) {
			pages = page
			if e.features.ListFillsPages && next != "" && len(records) != limit {
				t.Errorf("limit %d: page %d holds %d records while more follow, want full pages", limit, page, len(records))
			}
		})
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("limit %d: List(%.60q) =\n%q\nwant\n%q", limit, prefix, got, want)
		}
		if wantPages := (len(want) + limit - 1) / limit; e.features.ListFillsPages && pages != wantPages {
			t.Errorf("limit %d: %d pages, want %d (no empty last page)", limit, pages, wantPages)
		}
	}

	// Everything, over every other record in the store: this case's
	// records are all there, the expired one is not.
	n := 0
	for _, k := range e.listAll("", admin.MaxListLimit, nil) {
		if k == expired {
			t.Errorf("List everything returned the expired record %q", k)
		}
		if strings.HasPrefix(k, e.prefix) {
			n++
		}
	}
	if n != len(want)+len(decoys) {
		t.Errorf("List everything: %d records of this case, want %d", n, len(want)+len(decoys))
	}
}

// TestAdminListCursorAndLimit (needs Admin): List refuses a cursor it did
// not issue, or issued for another prefix, with ErrInvalidCursor, and a
// limit outside 1..MaxListLimit with an error.
func TestAdminListCursorAndLimit(t *testing.T, newStore Constructor, features Features) {
	skipWithoutAdmin(t, features)
	e := newEnv(t, "AdminListCursorAndLimit", newStore, features)
	adm := e.admin()
	scope := e.prefix + "charge"
	for i := range 12 {
		e.record(admin.ScopedKey(scope, fmt.Sprint(i)), "", time.Hour, []byte("r"), time.Hour)
	}
	prefix := admin.ScopePrefix(scope)
	_, cursor, err := adm.List(e.ctx, prefix, "", 5)
	if err != nil || cursor == "" {
		t.Fatalf("List of 12 records with limit 5 = cursor %q, %v; want a cursor", cursor, err)
	}
	if _, _, err := adm.List(e.ctx, prefix, cursor, 5); err != nil {
		t.Errorf("List with its own cursor: %v", err)
	}
	if _, _, err := adm.List(e.ctx, e.prefix+"another:", cursor, 5); !errors.Is(err, admin.ErrInvalidCursor) {
		t.Errorf("List with the cursor of another prefix: %v, want ErrInvalidCursor", err)
	}
	for _, bad := range []string{"garbage!", "not hex", "\x00\xff", strings.Repeat("A", 64)} {
		if _, _, err := adm.List(e.ctx, prefix, bad, 5); !errors.Is(err, admin.ErrInvalidCursor) {
			t.Errorf("List with cursor %q: %v, want ErrInvalidCursor", bad, err)
		}
	}
	for _, limit := range []int{0, -1, admin.MaxListLimit + 1} {
		if _, _, err := adm.List(e.ctx, prefix, "", limit); err == nil {
			t.Errorf("List with limit %d: no error", limit)
		}
	}
}
