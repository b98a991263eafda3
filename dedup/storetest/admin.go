package storetest

import (
	"context"
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
	{"AdminProvenance", TestAdminProvenance},
	{"AdminProvenanceAcrossRelease", TestAdminProvenanceAcrossRelease},
	{"AdminProvenanceAcrossTakeover", TestAdminProvenanceAcrossTakeover},
	{"AdminResponseStatus", TestAdminResponseStatus},
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
	if !e.features.RecordDetails && r.ResponseStatus != 0 {
		e.t.Errorf("%s: record %.60q has ResponseStatus %d, but Features.RecordDetails is not set", op, r.Key, r.ResponseStatus)
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

func skipWithoutProvenance(t *testing.T, features Features) {
	t.Helper()
	skipWithoutAdmin(t, features)
	if !features.Provenance {
		t.Skip("storetest: Features.Provenance is not set: the store keeps no who-and-when fields")
	}
}

// Origins the provenance cases claim with: UUIDs as Watermill and SQS give
// them, and ids no store may garble.
var (
	originA = dedup.Origin{TransportID: "0b9f8e3c-4d1a-4e2b-9c3d-5e6f7a8b9c0d", MessageID: "73fca7ac-78e9-4ea4-a1bf-71a92e2fbda8"}
	originB = dedup.Origin{TransportID: "5f0c6a1e-2b3d-4c5e-8f90-a1b2c3d4e5f6", MessageID: "sqs-2"}
	originC = dedup.Origin{TransportID: "01ARZ3NDEKTSV4RRFFQ69G5FAV"}
)

// claimAs claims key as origin (dedup.WithOrigin) and requires Acquired.
func (e *env) claimAs(origin dedup.Origin, key, fingerprint string, lease time.Duration) dedup.Claim {
	e.t.Helper()
	res, err := e.store.Claim(dedup.WithOrigin(e.ctx, origin), key, fingerprint, lease)
	if err != nil {
		e.t.Fatalf("Claim(%.40q) as %+v: %v", key, origin, err)
	}
	if res.Outcome != dedup.Acquired {
		e.t.Fatalf("Claim(%.40q) as %+v = %v, want acquired", key, origin, res.Outcome)
	}
	return res.Claim
}

// inspect returns the live record under key.
func (e *env) inspect(key string) admin.Record {
	e.t.Helper()
	r, err := e.admin().Inspect(e.ctx, key)
	if err != nil {
		e.t.Fatalf("Inspect(%.60q): %v", key, err)
	}
	return r
}

// checkProvenance checks the who-and-when fields of r: the ids of origin
// (as OriginFromContext gives them to the store), claims, a claimed-at
// about now (any time on a controllable clock), and a completed-at exactly
// when r is completed, not before its claimed-at.
func (e *env) checkProvenance(op string, r admin.Record, origin dedup.Origin, claims int) {
	e.t.Helper()
	want, _ := dedup.OriginFromContext(dedup.WithOrigin(context.Background(), origin))
	if r.TransportID != want.TransportID || r.MessageID != want.MessageID {
		e.t.Errorf("%s: record %.60q has transport id %q and message id %q, want %q and %q", op, r.Key, r.TransportID, r.MessageID, want.TransportID, want.MessageID)
	}
	if r.Claims != claims {
		e.t.Errorf("%s: record %.60q took %d claims, want %d", op, r.Key, r.Claims, claims)
	}
	switch {
	case r.ClaimedAt.IsZero():
		e.t.Errorf("%s: record %.60q has no claimed-at", op, r.Key)
	case !e.features.ControllableClock && r.ClaimedAt.Sub(time.Now()).Abs() > time.Hour:
		// An hour either side only rules out a zero, garbled or wrongly
		// zoned time.
		e.t.Errorf("%s: record %.60q was claimed at %v, want about now", op, r.Key, r.ClaimedAt)
	}
	switch {
	case r.State == admin.StateCompleted && r.CompletedAt.Before(r.ClaimedAt):
		e.t.Errorf("%s: completed record %.60q has completed-at %v, before its claimed-at %v", op, r.Key, r.CompletedAt, r.ClaimedAt)
	case r.State != admin.StateCompleted && !r.CompletedAt.IsZero():
		e.t.Errorf("%s: in-progress record %.60q has completed-at %v", op, r.Key, r.CompletedAt)
	}
}

// TestAdminProvenance (needs Admin and Provenance): a record keeps its
// first claim's Origin (transport id and message id, UUIDs or any text
// as OriginFromContext cleans it, or none), when it was claimed and
// completed, and a claim count of 1; Inspect and List show them alike.
func TestAdminProvenance(t *testing.T, newStore Constructor, features Features) {
	skipWithoutProvenance(t, features)
	e := newEnv(t, "AdminProvenance", newStore, features)
	scope := e.prefix + "s"
	odd := dedup.Origin{
		TransportID: "7B2E1D3C-0000-4000-8000-00000000000A", // upper case: kept as text
		MessageID:   strings.Repeat("é", 60) + "\x00\xff\n" + "tail",
	}
	origins := map[string]dedup.Origin{
		"uuids": originA, "uuid-and-text": originB, "transport-only": originC, "none": {},
		"same-ids":     {TransportID: originA.MessageID, MessageID: originA.MessageID},
		"message-only": {MessageID: "sqs-only"}, "odd": odd,
	}
	claims := map[string]dedup.Claim{}
	for name, o := range origins {
		claims[name] = e.claimAs(o, admin.ScopedKey(scope, name), "", longLease)
	}
	for name, o := range origins {
		r := e.inspect(admin.ScopedKey(scope, name))
		e.checkProvenance("Inspect in progress "+name, r, o, 1)
	}
	first := e.inspect(admin.ScopedKey(scope, "uuids"))
	const elapsed = 10 * time.Second
	if e.features.ControllableClock {
		e.wait(elapsed)
	}
	for name, c := range claims {
		e.complete(c, []byte(name), longLease)
	}
	byKey := map[string]admin.Record{}
	prefix := admin.ScopePrefix(scope)
	for _, limit := range []int{3, admin.MaxListLimit} {
		cursor := ""
		for page := 0; page < 100; page++ {
			records, next, err := e.admin().List(e.ctx, prefix, cursor, limit)
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			for _, r := range records {
				byKey[r.Key] = r
			}
			if next == "" {
				break
			}
			cursor = next
		}
	}
	for name, o := range origins {
		key := admin.ScopedKey(scope, name)
		r := e.inspect(key)
		if r.State != admin.StateCompleted {
			t.Fatalf("Inspect(%q): state %s, want completed", key, r.State)
		}
		e.checkProvenance("Inspect completed "+name, r, o, 1)
		listed, ok := byKey[e.features.ListedKey(key)]
		if !ok {
			t.Fatalf("List(%q) did not list %q", prefix, key)
		}
		if listed.TransportID != r.TransportID || listed.MessageID != r.MessageID || listed.Claims != r.Claims ||
			!listed.ClaimedAt.Equal(r.ClaimedAt) || !listed.CompletedAt.Equal(r.CompletedAt) {
			t.Errorf("List shows %q as %+v, Inspect as %+v", key, listed, r)
		}
	}
	done := e.inspect(admin.ScopedKey(scope, "uuids"))
	if !done.ClaimedAt.Equal(first.ClaimedAt) {
		t.Errorf("claimed-at %v became %v on completion", first.ClaimedAt, done.ClaimedAt)
	}
	if e.features.ControllableClock && done.CompletedAt.Sub(done.ClaimedAt) != elapsed {
		t.Errorf("completed %v after the claim, want %v", done.CompletedAt.Sub(done.ClaimedAt), elapsed)
	}
}

// TestAdminProvenanceAcrossRelease (needs Admin and Provenance): a
// released record is absent for Inspect and List; the claims that follow
// keep the first claim's Origin and time and count themselves (3 claims
// after two releases), whatever their own Origin and fingerprint, up to
// and after completion.
func TestAdminProvenanceAcrossRelease(t *testing.T, newStore Constructor, features Features) {
	skipWithoutProvenance(t, features)
	e := newEnv(t, "AdminProvenanceAcrossRelease", newStore, features)
	scope := e.prefix + "s"
	key := admin.ScopedKey(scope, "ORDER-003")
	c := e.claimAs(originA, key, "fp-a", longLease)
	first := e.inspect(key)
	e.checkProvenance("first claim", first, originA, 1)
	if e.features.ControllableClock {
		e.wait(time.Second)
	}
	if err := e.store.Release(e.ctx, c); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := e.admin().Inspect(e.ctx, key); !errors.Is(err, admin.ErrNotFound) {
		t.Fatalf("Inspect of a released record: %v, want ErrNotFound", err)
	}
	if keys := e.listAll(admin.ScopePrefix(scope), admin.MaxListLimit, nil); len(keys) != 0 {
		t.Fatalf("List shows the released record: %q", keys)
	}
	c = e.claimAs(originB, key, "fp-b", longLease)
	r := e.inspect(key)
	e.checkProvenance("second claim", r, originA, 2)
	if !r.ClaimedAt.Equal(first.ClaimedAt) {
		t.Errorf("second claim: claimed-at %v, want the first claim's %v", r.ClaimedAt, first.ClaimedAt)
	}
	if err := e.store.Release(e.ctx, c); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	c = e.claimAs(originC, key, "", longLease)
	e.complete(c, []byte("charged"), longLease)
	r = e.inspect(key)
	e.checkProvenance("completed by the third claim", r, originA, 3)
	if !r.ClaimedAt.Equal(first.ClaimedAt) {
		t.Errorf("completed: claimed-at %v, want the first claim's %v", r.ClaimedAt, first.ClaimedAt)
	}
	if e.features.ControllableClock && r.CompletedAt.Sub(r.ClaimedAt) != time.Second {
		t.Errorf("completed %v after the first claim, want 1s", r.CompletedAt.Sub(r.ClaimedAt))
	}
}

// TestAdminProvenanceAcrossTakeover (needs Admin and Provenance): the
// claim that takes over an abandoned lease keeps the first claim's Origin
// and counts itself (Features.CountsTakeovers), or starts a count of its
// own; a claim after a completed record's retention always starts afresh.
func TestAdminProvenanceAcrossTakeover(t *testing.T, newStore Constructor, features Features) {
	skipWithoutProvenance(t, features)
	e := newEnv(t, "AdminProvenanceAcrossTakeover", newStore, features)
	short := e.features.ShortDuration
	scope := e.prefix + "s"
	abandoned, expired := admin.ScopedKey(scope, "abandoned"), admin.ScopedKey(scope, "expired")
	// Claimed with a long lease, inspected, then shortened by Extend: a
	// machine that stalls between the claim and the Inspect cannot let the
	// lease end before the record is read.
	held := e.claimAs(originA, abandoned, "", longLease)
	first := e.inspect(abandoned)
	if err := e.store.Extend(e.ctx, held, short); err != nil {
		t.Fatalf("Extend to a short lease: %v", err)
	}
	c := e.claimAs(originA, expired, "", longLease)
	e.complete(c, nil, short)
	e.wait(2 * short)

	e.claimAs(originB, abandoned, "", longLease)
	r := e.inspect(abandoned)
	if e.features.CountsTakeovers {
		e.checkProvenance("takeover of an abandoned lease", r, originA, 2)
		if !r.ClaimedAt.Equal(first.ClaimedAt) {
			t.Errorf("takeover: claimed-at %v, want the first claim's %v", r.ClaimedAt, first.ClaimedAt)
		}
	} else {
		e.checkProvenance("takeover of an abandoned lease", r, originB, 1)
	}

	e.claimAs(originB, expired, "", longLease)
	r = e.inspect(expired)
	e.checkProvenance("claim after the retention", r, originB, 1)
	if r.ClaimedAt.Before(first.ClaimedAt) || e.features.ControllableClock && !r.ClaimedAt.After(first.ClaimedAt) {
		t.Errorf("claim after the retention: claimed-at %v, want a new time after %v", r.ClaimedAt, first.ClaimedAt)
	}
}

// TestAdminResponseStatus (needs Admin): a record completed with
// dedup.RecordDetails in Complete's context (as httpdedup completes one)
// reports its ResponseStatus in Inspect and List alike where the store
// keeps it (Features.RecordDetails), 0 where it does not; a record
// completed without, one in progress, and one claimed again after the
// retention of a record completed with a status report 0.
func TestAdminResponseStatus(t *testing.T, newStore Constructor, features Features) {
	skipWithoutAdmin(t, features)
	e := newEnv(t, "AdminResponseStatus", newStore, features)
	short := e.features.ShortDuration
	scope := e.prefix + "s"
	created := 201
	if !e.features.RecordDetails {
		created = 0
	}
	withStatus := dedup.WithRecordDetails(e.ctx, &dedup.RecordDetails{ResponseStatus: 201})
	key := func(name string) string { return admin.ScopedKey(scope, name) }

	c := e.acquire(key("created"), "", longLease)
	if err := e.store.Complete(withStatus, c, []byte(`{"id":7}`), longLease); err != nil {
		t.Fatalf("Complete with RecordDetails: %v", err)
	}
	e.record(key("plain"), "", longLease, []byte("done"), longLease)
	e.acquire(key("held"), "", longLease)
	c = e.acquire(key("again"), "", longLease)
	if err := e.store.Complete(withStatus, c, nil, short); err != nil {
		t.Fatalf("Complete with RecordDetails: %v", err)
	}
	e.wait(2 * short)
	e.acquire(key("again"), "", longLease)

	want := map[string]int{key("created"): created, key("plain"): 0, key("held"): 0, key("again"): 0}
	for k, status := range want {
		if r := e.inspect(k); r.ResponseStatus != status {
			t.Errorf("Inspect(%.60q): ResponseStatus %d, want %d", k, r.ResponseStatus, status)
		}
	}
	listed := map[string]int{} // by the key List reports
	for k, status := range want {
		listed[e.features.ListedKey(k)] = status
	}
	seen := map[string]bool{}
	for cursor, page := "", 0; page == 0 || cursor != ""; page++ {
		records, next, err := e.admin().List(e.ctx, admin.ScopePrefix(scope), cursor, admin.MaxListLimit)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		for _, r := range records {
			if status, ok := listed[r.Key]; ok {
				seen[r.Key] = true
				if r.ResponseStatus != status {
					t.Errorf("List: %.60q has ResponseStatus %d, want %d", r.Key, r.ResponseStatus, status)
				}
			}
		}
		cursor = next
	}
	if len(seen) != len(want) {
		t.Errorf("List found %d of the case's %d records", len(seen), len(want))
	}
}
