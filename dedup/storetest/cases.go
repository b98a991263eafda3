package storetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

// storeCases are the cases Run runs, in order.
var storeCases = []suiteCase{
	{"Acquire", TestAcquire},
	{"DuplicateAfterComplete", TestDuplicateAfterComplete},
	{"InProgressWhileClaimed", TestInProgressWhileClaimed},
	{"ConflictOnFingerprintMismatch", TestConflictOnFingerprintMismatch},
	{"EmptyFingerprintSkipsCheck", TestEmptyFingerprintSkipsCheck},
	{"TakeoverAfterLeaseExpiry", TestTakeoverAfterLeaseExpiry},
	{"ReclaimAfterRetentionExpiry", TestReclaimAfterRetentionExpiry},
	{"OneWinnerTakesOverExpiredRecord", TestOneWinnerTakesOverExpiredRecord},
	{"LeaseEndsAtItsDeadline", TestLeaseEndsAtItsDeadline},
	{"SubMillisecondDurations", TestSubMillisecondDurations},
	{"StaleTokenChangesNothing", TestStaleTokenChangesNothing},
	{"CompletedRecordIsFinal", TestCompletedRecordIsFinal},
	{"AlreadyCompleted", TestAlreadyCompleted},
	{"ReleaseThenReacquire", TestReleaseThenReacquire},
	{"ReleasedRecordIsAbsent", TestReleasedRecordIsAbsent},
	{"ExtendKeepsClaimAlive", TestExtendKeepsClaimAlive},
	{"ExtendAfterExpiryIsLost", TestExtendAfterExpiryIsLost},
	{"OneWinnerAmongContenders", TestOneWinnerAmongContenders},
	{"ManyDistinctKeysConcurrently", TestManyDistinctKeysConcurrently},
	{"LongAndUnicodeKeys", TestLongAndUnicodeKeys},
	{"ScopesNeverCollide", TestScopesNeverCollide},
	{"AnyFingerprintBytes", TestAnyFingerprintBytes},
	{"AnyAcceptedKey", TestAnyAcceptedKey},
	{"LargeResult", TestLargeResult},
	{"ResultTooLarge", TestResultTooLarge},
	{"InvalidDurationsRefused", TestInvalidDurationsRefused},
	{"CancelledContext", TestCancelledContext},
	{"ClaimIsOneRequest", TestClaimIsOneRequest},
	{"WatchAfterChange", TestWatchAfterChange},
	{"WatchWakesWaiters", TestWatchWakesWaiters},
	{"FenceIncreases", TestFenceIncreases},
	{"FencesOfContendersIncrease", TestFencesOfContendersIncrease},
	{"NoFenceWithoutFencing", TestNoFenceWithoutFencing},
}

// Run runs every case of the store contract (Claim, Complete, Release,
// Extend; see dedup.Store), and of the key watches of a store that has
// them (dedup.KeyWatcher, Features.Watch), in parallel, each with a store
// from newStore and keys of its own. Cases a store's Features rule out
// are skipped with the reason.
func Run(t *testing.T, newStore Constructor, features Features) {
	t.Helper()
	runAll(t, storeCases, newStore, features)
}

// TestAcquire: a fresh key is acquired with a token of its own.
func TestAcquire(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "Acquire", newStore, features)
	a := e.acquire(e.key("k"), "", longLease)
	b := e.acquire(e.key("other"), "", longLease)
	if a.Token == b.Token {
		t.Fatalf("two claims got the same token %q", a.Token)
	}
}

// TestDuplicateAfterComplete: a completed key is a Duplicate carrying the
// stored result byte for byte (nil, empty, text, binary, zeros, 10 KB), and a
// duplicate claim does not consume the record.
func TestDuplicateAfterComplete(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "DuplicateAfterComplete", newStore, features)
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	large := bytes.Repeat([]byte("0123456789\x00\xff"), 10*1024/12)
	results := map[string][]byte{
		"nil":    nil,
		"empty":  {},
		"text":   []byte(`{"charged":150}`),
		"binary": binary,
		"zeros":  make([]byte, 32),
		"large":  large,
	}
	for name, result := range results {
		key := e.key(name)
		c := e.acquire(key, "", longLease)
		e.complete(c, result, longLease)
		for range 2 { // a duplicate does not consume the record
			res := e.expect(key, "", dedup.Duplicate)
			if !bytes.Equal(res.Result, result) {
				t.Fatalf("%s: duplicate returned result of %d bytes %.32q, want %d bytes %.32q", name, len(res.Result), res.Result, len(result), result)
			}
			if res.Claim.Token != "" {
				t.Fatalf("%s: duplicate returned a claim token", name)
			}
		}
	}
}

// TestInProgressWhileClaimed: while a claim holds the key, every other claim
// is InProgress, without a token or a result.
func TestInProgressWhileClaimed(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "InProgressWhileClaimed", newStore, features)
	key := e.key("k")
	c := e.acquire(key, "fp", longLease)
	for range 3 {
		res := e.expect(key, "fp", dedup.InProgress)
		if res.Claim.Token != "" || res.Result != nil {
			t.Fatalf("in-progress result carries a claim or a result: %+v", res)
		}
	}
	e.complete(c, []byte("done"), longLease)
	e.expect(key, "fp", dedup.Duplicate)
}

// TestConflictOnFingerprintMismatch: another fingerprint is a Conflict in
// either state, changes nothing, and never sees the stored result.
func TestConflictOnFingerprintMismatch(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "ConflictOnFingerprintMismatch", newStore, features)
	inProgress, completed := e.key("in-progress"), e.key("completed")
	e.acquire(inProgress, "fp-a", longLease)
	e.expect(inProgress, "fp-b", dedup.Conflict)
	e.expect(inProgress, "fp-a", dedup.InProgress) // the conflict changed nothing

	c := e.acquire(completed, "fp-a", longLease)
	e.complete(c, []byte("r"), longLease)
	res := e.expect(completed, "fp-b", dedup.Conflict)
	if res.Result != nil {
		t.Fatalf("a conflict returned the stored result %q to a different payload", res.Result)
	}
	e.expect(completed, "fp-a", dedup.Duplicate)
}

// TestEmptyFingerprintSkipsCheck: an empty fingerprint on either side skips
// the comparison, so fingerprints can be switched on gradually.
func TestEmptyFingerprintSkipsCheck(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "EmptyFingerprintSkipsCheck", newStore, features)
	a, b := e.key("recorded-without"), e.key("claimed-without")
	e.acquire(a, "", longLease)
	e.expect(a, "fp", dedup.InProgress)
	c := e.acquire(b, "fp", longLease)
	e.complete(c, nil, longLease)
	e.expect(b, "", dedup.Duplicate)
}

// TestTakeoverAfterLeaseExpiry: past its lease an in-progress record is
// taken over with a new token; the old claim can no longer complete,
// release or extend, and the new owner's record survives its attempts.
func TestTakeoverAfterLeaseExpiry(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "TakeoverAfterLeaseExpiry", newStore, features)
	short := e.features.ShortDuration
	key := e.key("k")
	old := e.acquire(key, "fp", short)
	e.wait(2 * short)
	taken := e.acquire(key, "fp", longLease)
	if taken.Token == old.Token {
		t.Fatalf("takeover reused the old token")
	}
	expectClaimLost(t, "Complete with the expired claim", e.store.Complete(e.ctx, old, []byte("late"), longLease))
	expectClaimLost(t, "Release with the expired claim", e.store.Release(e.ctx, old))
	expectClaimLost(t, "Extend with the expired claim", e.store.Extend(e.ctx, old, longLease))
	e.expect(key, "fp", dedup.InProgress) // the new owner's record survived
	e.complete(taken, []byte("new"), longLease)
	if res := e.expect(key, "fp", dedup.Duplicate); string(res.Result) != "new" {
		t.Fatalf("result = %q, want the new owner's", res.Result)
	}
}

// TestReclaimAfterRetentionExpiry: past its retention a completed record
// counts as none: no duplicate, and no conflict either.
func TestReclaimAfterRetentionExpiry(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "ReclaimAfterRetentionExpiry", newStore, features)
	short := e.features.ShortDuration
	key := e.key("k")
	c := e.acquire(key, "fp-a", longLease)
	// Not checked to be a duplicate before it expires (TestDuplicateAfterComplete
	// does that): on the wall clock a stalled machine may let the short
	// retention pass before the check.
	e.complete(c, []byte("old"), short)
	e.wait(2 * short)
	again := e.acquire(key, "fp-b", longLease)
	expectClaimLost(t, "Release with the first claim", e.store.Release(e.ctx, c))
	e.expect(key, "fp-b", dedup.InProgress)
	e.complete(again, nil, longLease)
	e.expect(key, "fp-b", dedup.Duplicate)
}

// TestOneWinnerTakesOverExpiredRecord: many claims race for one expired
// record, abandoned in progress or completed; exactly one takes it over
// and the others find it in progress.
func TestOneWinnerTakesOverExpiredRecord(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "OneWinnerTakesOverExpiredRecord", newStore, features)
	short := e.features.ShortDuration
	abandoned, completed := e.key("abandoned"), e.key("completed")
	oldAbandoned := e.acquire(abandoned, "fp", short)
	oldCompleted := e.acquire(completed, "fp", longLease)
	e.complete(oldCompleted, []byte("old"), short)
	e.wait(2 * short)
	for key, old := range map[string]dedup.Claim{abandoned: oldAbandoned, completed: oldCompleted} {
		e.race(key, min(e.features.Contenders, 100))
		expectClaimLost(t, "Release by the expired owner", e.store.Release(e.ctx, old))
	}
}

// race lets n goroutines claim key at once and requires exactly one winner.
func (e *env) race(key string, n int) {
	e.t.Helper()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		outcomes = map[dedup.Outcome]int{}
		errs     []error
		start    = make(chan struct{})
	)
	for range n {
		wg.Go(func() {
			<-start
			res, err := e.store.Claim(e.ctx, key, "fp", longLease)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			outcomes[res.Outcome]++
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		e.t.Fatalf("%d of %d claims failed, first: %v", len(errs), n, errs[0])
	}
	if outcomes[dedup.Acquired] != 1 || outcomes[dedup.InProgress] != n-1 {
		e.t.Fatalf("outcomes of %d concurrent claims of %.60q: %v, want exactly 1 acquired and %d in progress", n, key, outcomes, n-1)
	}
}

// TestLeaseEndsAtItsDeadline (needs ControllableClock): the owner keeps its
// claim until its deadline, to the millisecond, and loses it at the
// deadline; a completed record is a duplicate until its retention ends.
func TestLeaseEndsAtItsDeadline(t *testing.T, newStore Constructor, features Features) {
	if !features.ControllableClock {
		t.Skip("storetest: Features.ControllableClock is not set: exact deadlines need a clock the test moves")
	}
	e := newEnv(t, "LeaseEndsAtItsDeadline", newStore, features)
	const lease, retention = 10 * time.Second, time.Minute
	key := e.key("k")
	c := e.acquire(key, "", lease)
	e.wait(lease - time.Millisecond)
	if err := e.store.Extend(e.ctx, c, lease); err != nil {
		t.Fatalf("Extend 1ms before the deadline: %v", err)
	}
	e.wait(lease - time.Millisecond)
	e.expect(key, "", dedup.InProgress)
	e.wait(time.Millisecond)
	expectClaimLost(t, "Extend at the deadline", e.store.Extend(e.ctx, c, lease))
	expectClaimLost(t, "Complete at the deadline", e.store.Complete(e.ctx, c, nil, retention))
	e.wait(2 * e.features.ShortDuration) // past any clock-skew margin of the store
	c = e.acquire(key, "", lease)

	e.complete(c, []byte("r"), retention)
	e.wait(retention - time.Millisecond)
	e.expect(key, "", dedup.Duplicate)
	e.wait(time.Millisecond + 2*e.features.ShortDuration)
	e.acquire(key, "", lease)
}

// TestSubMillisecondDurations: leases and retentions below a millisecond
// are valid durations (not ErrInvalidDuration) and expire like any other;
// they are never stored as "no expiry".
func TestSubMillisecondDurations(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "SubMillisecondDurations", newStore, features)
	short := e.features.ShortDuration
	lease, retention := e.key("lease"), e.key("retention")
	e.acquire(lease, "", 300*time.Microsecond)
	c := e.acquire(retention, "", longLease)
	e.complete(c, []byte("r"), 300*time.Microsecond)
	e.wait(2 * short)
	e.acquire(lease, "", longLease)
	e.acquire(retention, "", longLease)
}

// TestStaleTokenChangesNothing: Complete, Release and Extend with a token
// that never owned the record fail with ErrClaimLost (never
// ErrAlreadyCompleted), delete nothing, complete nothing and create nothing.
func TestStaleTokenChangesNothing(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "StaleTokenChangesNothing", newStore, features)
	key := e.key("k")
	c := e.acquire(key, "", longLease)
	stale := dedup.Claim{Key: key, Token: storekit.NewToken()}
	err := e.store.Complete(e.ctx, stale, []byte("x"), longLease)
	expectClaimLost(t, "Complete with a foreign token", err)
	if errors.Is(err, dedup.ErrAlreadyCompleted) {
		t.Fatalf("Complete with a foreign token reported ErrAlreadyCompleted")
	}
	expectClaimLost(t, "Release with a foreign token", e.store.Release(e.ctx, stale))
	expectClaimLost(t, "Extend with a foreign token", e.store.Extend(e.ctx, stale, longLease))
	e.expect(key, "", dedup.InProgress) // nothing deleted, nothing completed
	e.complete(c, []byte("owner"), longLease)
	if res := e.expect(key, "", dedup.Duplicate); string(res.Result) != "owner" {
		t.Fatalf("result = %q, want the owner's", res.Result)
	}
	err = e.store.Complete(e.ctx, stale, []byte("x"), longLease)
	expectClaimLost(t, "Complete of a completed record with a foreign token", err)
	if errors.Is(err, dedup.ErrAlreadyCompleted) {
		t.Fatalf("Complete with a foreign token of a record completed by another claim reported ErrAlreadyCompleted")
	}
	for _, token := range []string{"not-a-token-of-this-store", ""} {
		odd := dedup.Claim{Key: key, Token: token}
		expectClaimLost(t, fmt.Sprintf("Release with token %q", token), e.store.Release(e.ctx, odd))
		expectClaimLost(t, fmt.Sprintf("Extend with token %q", token), e.store.Extend(e.ctx, odd, longLease))
	}

	missing := dedup.Claim{Key: e.key("never-claimed"), Token: storekit.NewToken()}
	expectClaimLost(t, "Complete of a key never claimed", e.store.Complete(e.ctx, missing, nil, longLease))
	expectClaimLost(t, "Release of a key never claimed", e.store.Release(e.ctx, missing))
	expectClaimLost(t, "Extend of a key never claimed", e.store.Extend(e.ctx, missing, longLease))
	e.acquire(missing.Key, "", longLease) // and they created nothing
}

// TestCompletedRecordIsFinal: once completed, the owner's token no longer
// lets it release, extend (which would shorten the retention to a lease) or
// complete again; the first result stays.
func TestCompletedRecordIsFinal(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "CompletedRecordIsFinal", newStore, features)
	short := e.features.ShortDuration
	key := e.key("k")
	c := e.acquire(key, "", longLease)
	e.complete(c, []byte("first"), longLease)
	expectClaimLost(t, "Release after Complete", e.store.Release(e.ctx, c))
	expectClaimLost(t, "Extend after Complete", e.store.Extend(e.ctx, c, short))
	expectClaimLost(t, "Complete after Complete", e.store.Complete(e.ctx, c, []byte("second"), short))
	// A store may say why (TestAlreadyCompleted); it must not claim that for
	// a record it never completed (TestStaleTokenChangesNothing).
	e.wait(2 * short)
	if res := e.expect(key, "", dedup.Duplicate); string(res.Result) != "first" {
		t.Fatalf("result = %q, want %q", res.Result, "first")
	}
}

// TestAlreadyCompleted (needs AlreadyCompleted): a Complete retried by the
// claim that completed the record (its first reply was lost) returns an
// error matching dedup.ErrAlreadyCompleted and dedup.ErrClaimLost, and
// changes nothing; the engine counts it as completed.
func TestAlreadyCompleted(t *testing.T, newStore Constructor, features Features) {
	if !features.AlreadyCompleted {
		t.Skip("storetest: Features.AlreadyCompleted is not set: the store answers a retried Complete with plain ErrClaimLost")
	}
	e := newEnv(t, "AlreadyCompleted", newStore, features)
	key := e.key("k")
	c := e.acquire(key, "fp", longLease)
	e.complete(c, []byte("first"), longLease)
	for range 2 {
		err := e.store.Complete(e.ctx, c, []byte("second"), longLease)
		if !errors.Is(err, dedup.ErrAlreadyCompleted) || !errors.Is(err, dedup.ErrClaimLost) {
			t.Fatalf("Complete retried by the claim that completed the record: %v, want ErrAlreadyCompleted (matching ErrClaimLost)", err)
		}
	}
	if res := e.expect(key, "fp", dedup.Duplicate); string(res.Result) != "first" {
		t.Fatalf("result = %q, want %q", res.Result, "first")
	}
}

// TestReleaseThenReacquire: a released key is claimed again with a new
// token; the released claim is lost for good.
func TestReleaseThenReacquire(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "ReleaseThenReacquire", newStore, features)
	key := e.key("k")
	c := e.acquire(key, "fp", longLease)
	if err := e.store.Release(e.ctx, c); err != nil {
		t.Fatalf("Release: %v", err)
	}
	expectClaimLost(t, "second Release", e.store.Release(e.ctx, c))
	expectClaimLost(t, "Complete after Release", e.store.Complete(e.ctx, c, nil, longLease))
	again := e.acquire(key, "fp", longLease)
	if again.Token == c.Token {
		t.Fatalf("re-acquire reused the released token")
	}
	e.complete(again, nil, longLease)
	e.expect(key, "fp", dedup.Duplicate)
}

// TestReleasedRecordIsAbsent: a released record (which a store may keep,
// for the next claim to count) is no record for any operation: the
// released claim cannot complete, extend or release it, a claim with
// another fingerprint acquires the key (no Conflict), and so does a claim
// racing many others, exactly once.
func TestReleasedRecordIsAbsent(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "ReleasedRecordIsAbsent", newStore, features)
	key, raced := e.key("k"), e.key("raced")
	c := e.acquire(key, "fp-a", longLease)
	if err := e.store.Release(e.ctx, c); err != nil {
		t.Fatalf("Release: %v", err)
	}
	expectClaimLost(t, "Extend after Release", e.store.Extend(e.ctx, c, longLease))
	expectClaimLost(t, "Complete after Release", e.store.Complete(e.ctx, c, []byte("late"), longLease))
	expectClaimLost(t, "Release after Release", e.store.Release(e.ctx, c))
	again := e.acquire(key, "fp-b", longLease)
	e.expect(key, "fp-a", dedup.Conflict) // the new claim's fingerprint counts now
	e.complete(again, []byte("b"), longLease)
	if res := e.expect(key, "fp-b", dedup.Duplicate); string(res.Result) != "b" {
		t.Fatalf("result = %q, want the new claim's", res.Result)
	}

	r := e.acquire(raced, "fp", longLease)
	if err := e.store.Release(e.ctx, r); err != nil {
		t.Fatalf("Release: %v", err)
	}
	e.race(raced, min(e.features.Contenders, 100))
}

// TestExtendKeepsClaimAlive: an extended claim outlives its first lease.
func TestExtendKeepsClaimAlive(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "ExtendKeepsClaimAlive", newStore, features)
	var (
		key string
		c   dedup.Claim
	)
	short := e.features.ShortDuration
	for attempt := 1; ; attempt++ {
		key = e.key(fmt.Sprint("k", attempt))
		start := time.Now()
		c = e.acquire(key, "", short)
		err := e.store.Extend(e.ctx, c, longLease)
		if err == nil {
			break
		}
		// On the wall clock a machine that stalls for longer than the lease
		// between the two calls makes the Extend fail rightly: that proves
		// nothing, so the case runs again with a longer lease.
		if stalled := time.Since(start); e.advance == nil && stalled >= short && attempt < 4 {
			t.Logf("%v passed between Claim and Extend, more than the %v lease: again with %v", stalled, short, 2*short)
			short *= 2
			continue
		}
		t.Fatalf("Extend: %v", err)
	}
	e.wait(3 * short) // well past the original lease
	e.expect(key, "", dedup.InProgress)
	if err := e.store.Extend(e.ctx, c, longLease); err != nil {
		t.Fatalf("second Extend: %v", err)
	}
	e.complete(c, []byte("r"), longLease)
	e.expect(key, "", dedup.Duplicate)
}

// TestExtendAfterExpiryIsLost: an expired lease cannot be revived.
func TestExtendAfterExpiryIsLost(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "ExtendAfterExpiryIsLost", newStore, features)
	short := e.features.ShortDuration
	key := e.key("k")
	c := e.acquire(key, "", short)
	e.wait(2 * short)
	expectClaimLost(t, "Extend after the lease ended", e.store.Extend(e.ctx, c, longLease))
	e.acquire(key, "", longLease) // Extend did not revive the record
}

// TestOneWinnerAmongContenders: Features.Contenders goroutines claim one
// fresh key at once; exactly one acquires it.
func TestOneWinnerAmongContenders(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "OneWinnerAmongContenders", newStore, features)
	e.race(e.key("k"), e.features.Contenders)
}

// TestManyDistinctKeysConcurrently: Features.DistinctKeys keys claimed and
// completed by 16 workers keep their own records and results.
func TestManyDistinctKeysConcurrently(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "ManyDistinctKeysConcurrently", newStore, features)
	n := e.features.DistinctKeys
	const workers = 16
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		keys = make(chan int)
	)
	for range workers {
		wg.Go(func() {
			for i := range keys {
				key := e.key(fmt.Sprint(i))
				err := func() error {
					res, err := e.store.Claim(e.ctx, key, "", longLease)
					if err != nil {
						return err
					}
					if res.Outcome != dedup.Acquired {
						return fmt.Errorf("claim of fresh key %s: %v", key, res.Outcome)
					}
					return e.store.Complete(e.ctx, res.Claim, []byte(key), longLease)
				}()
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		keys <- i
	}
	close(keys)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d keys failed, first: %v", len(errs), n, errs[0])
	}
	for i := range n {
		key := e.key(fmt.Sprint(i))
		if res := e.expect(key, "", dedup.Duplicate); string(res.Result) != key {
			t.Fatalf("key %s has result %q: records mixed up", key, res.Result)
		}
	}
}

// TestLongAndUnicodeKeys: 10 KB keys that differ in one byte, and unicode,
// separators and whitespace, each keep a record of their own.
func TestLongAndUnicodeKeys(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "LongAndUnicodeKeys", newStore, features)
	long := strings.Repeat("x", 10*1024)
	keys := []string{
		long + "a",
		long + "b", // differs only in the last byte: a store that hashes long keys must not collide
		"a" + long, // and in the first
		"注文-003-🚀",
		"order:with:colons",
		"spaces and\ttabs\nnewline",
		"percent%3Aescaped",
		strings.Repeat("é", 3000),
	}
	claims := make([]dedup.Claim, len(keys))
	for i, k := range keys {
		claims[i] = e.acquire(e.key(k), "", longLease)
	}
	for i, c := range claims {
		e.complete(c, []byte(fmt.Sprint(i)), longLease)
	}
	for i, k := range keys {
		if res := e.expect(e.key(k), "", dedup.Duplicate); string(res.Result) != fmt.Sprint(i) {
			t.Fatalf("key #%d has result %q: keys collided", i, res.Result)
		}
	}
}

// TestScopesNeverCollide: the scoped keys of admin.ScopedKey that differ
// only in where the scope ends keep records of their own.
func TestScopesNeverCollide(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "ScopesNeverCollide", newStore, features)
	pairs := [][2]string{
		{admin.ScopedKey("a:b", "c"), admin.ScopedKey("a", "b:c")},
		{admin.ScopedKey("charge", "ORDER-1"), admin.ScopedKey("email", "ORDER-1")},
		{admin.ScopedKey("x%3A", "y"), admin.ScopedKey("x:", "y")},
		{admin.ScopedKey("", "k"), admin.ScopedKey("k", "")},
	}
	for _, p := range pairs {
		if p[0] == p[1] {
			t.Fatalf("ScopedKey collision: %q", p[0])
		}
		a := e.acquire(e.key(p[0]), "", longLease)
		b := e.acquire(e.key(p[1]), "", longLease)
		e.complete(a, []byte("A"), longLease)
		if res := e.expect(e.key(p[1]), "", dedup.InProgress); res.Result != nil {
			t.Fatalf("scope leak: %q sees %q", p[1], res.Result)
		}
		e.complete(b, []byte("B"), longLease)
		if res := e.expect(e.key(p[1]), "", dedup.Duplicate); string(res.Result) != "B" {
			t.Fatalf("%q returned %q, want B", p[1], res.Result)
		}
	}
}

// TestInvalidDurationsRefused: a lease or retention of zero or less is
// refused with ErrInvalidDuration and changes nothing (never "forever").
func TestInvalidDurationsRefused(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "InvalidDurationsRefused", newStore, features)
	key := e.key("k")
	for _, d := range []time.Duration{0, -time.Second} {
		if _, err := e.store.Claim(e.ctx, key, "", d); !errors.Is(err, dedup.ErrInvalidDuration) {
			t.Fatalf("Claim with lease %v: got %v, want ErrInvalidDuration", d, err)
		}
	}
	c := e.acquire(key, "", longLease) // the refused claims created nothing
	for _, d := range []time.Duration{0, -time.Second} {
		if err := e.store.Extend(e.ctx, c, d); !errors.Is(err, dedup.ErrInvalidDuration) {
			t.Fatalf("Extend with lease %v: got %v, want ErrInvalidDuration", d, err)
		}
		if err := e.store.Complete(e.ctx, c, nil, d); !errors.Is(err, dedup.ErrInvalidDuration) {
			t.Fatalf("Complete with retention %v: got %v, want ErrInvalidDuration", d, err)
		}
	}
	e.expect(key, "", dedup.InProgress) // still in progress: nothing completed forever
	e.complete(c, nil, longLease)
}

// TestAnyFingerprintBytes: a fingerprint is any string of bytes (a key
// function may return a raw digest, string(sha256.Sum256(payload)[:]), with
// NUL bytes and invalid UTF-8), of any length. A store must compare them as
// byte strings: the same bytes are the same payload (Duplicate or
// InProgress, never Conflict), and a fingerprint differing in one byte, or
// only by an invalid byte a UTF-8 conversion would replace, is a Conflict.
func TestAnyFingerprintBytes(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "AnyFingerprintBytes", newStore, features)
	raw := sha256.Sum256([]byte(`{"order_id":"ORDER-1","amount":150}`))
	ff := string(bytes.Repeat([]byte{0xff}, 32))
	long := strings.Repeat("0123456789abcdef", 100*1024/16) // 100 KB
	longBinary := long[:50*1024] + "\x00\xff" + long[50*1024:]
	hexOf := func(s string) string { sum := sha256.Sum256([]byte(s)); return hex.EncodeToString(sum[:]) }
	cases := []struct{ name, fp, other string }{
		{"raw-digest", string(raw[:]), string(raw[:31]) + string(raw[31]^1)},
		{"raw-digest-vs-hex", string(raw[:]), hex.EncodeToString(raw[:])},
		{"nul-inside", "a\x00b", "a\x00c"},
		{"nul-vs-none", "a\x00", "a"},
		{"only-nul", "\x00", "\x00\x00"},
		{"invalid-utf8", "\xff\xfe", "\ufffd\ufffd"}, // what a lossy UTF-8 conversion makes of it
		{"invalid-utf8-one-byte", "\xc3", "\xc4"},
		{"all-ff", ff, ff[:31]},
		{"control-chars", "\x01\x02\x1b[0m", "\x01\x02\x1b[1m"},
		{"long", long, long[:len(long)-1] + "g"},
		{"long-binary", longBinary, longBinary[:len(longBinary)-1] + "g"},
		{"long-vs-prefix", long, long[:64]},
		{"long-vs-64-bytes", strings.Repeat("f", 300), strings.Repeat("f", 64)},
		// Encodings a store might use for fingerprints it cannot hold
		// verbatim: the encoded form of one must not equal another
		// fingerprint given verbatim.
		{"vs-sha256-text", "\xff", "sha256:" + hexOf("\xff")},
		{"vs-prefixed-sha256-text", "\x00", "\x01sha256:" + hexOf("\x00")},
		{"vs-hex", "\xff\x00", "ff00"},
	}
	for _, c := range cases {
		if c.fp == c.other {
			t.Fatalf("%s: the two fingerprints are equal", c.name)
		}
		key := e.key(c.name)
		claim := e.acquire(key, c.fp, longLease)
		e.expect(key, c.fp, dedup.InProgress)
		e.expect(key, c.other, dedup.Conflict)
		e.complete(claim, []byte(c.name), longLease)
		if res := e.expect(key, c.fp, dedup.Duplicate); string(res.Result) != c.name {
			t.Fatalf("%s: duplicate returned %q", c.name, res.Result)
		}
		e.expect(key, c.other, dedup.Conflict)
		e.expect(key, "", dedup.Duplicate) // no fingerprint: no comparison

		// The other way round: the other fingerprint recorded first.
		key = e.key(c.name + "-reversed")
		claim = e.acquire(key, c.other, longLease)
		e.expect(key, c.fp, dedup.Conflict)
		e.complete(claim, nil, longLease)
		e.expect(key, c.other, dedup.Duplicate)
		e.expect(key, c.fp, dedup.Conflict)
	}
}

// TestAnyAcceptedKey: a store holds every key the middleware accepts (valid
// UTF-8 without control characters, up to dedup.Config.MaxKeyLength, 1024
// bytes by default, plus the scope), whatever characters it holds: the
// separators and escape characters of the stores' own formats (':' '%'
// '\\'), glob and LIKE wildcards ('*' '?' '[' ']' '_'), spaces, emoji,
// right-to-left text. Claim, Complete and a duplicate Claim see one record
// per key; with Features.Admin, Inspect returns the same key and List with
// the key as prefix finds it.
func TestAnyAcceptedKey(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "AnyAcceptedKey", newStore, features)
	keys := []string{
		"a:b", "a%3Ab", "a%b", `back\slash`, `\`, `\*`,
		"star*", "*", "quest?", "?", "[", "]", "[a-z]", "[^x]", "under_score", "_%",
		"with space", " leading", "trailing ", "  ",
		"🚀📦 order", "👩‍👩‍👧", "طلب-١٢٣", "הזמנה 42", "mixed עברית and English",
		"quote\"'`", "{hash}tag", "{", "}{", "a/b/../c", "semi;colon", "#&=+",
		"\u00a0nbsp", "zero\u200bwidth", "\ufeffbom", "\ufffd",
		strings.Repeat("k", 1024),
		strings.Repeat("é", 512), // 1024 bytes
		strings.Repeat("🚀", 256), // 1024 bytes
		strings.Repeat(":%*?[", 204) + "end",
	}
	claims := make([]dedup.Claim, len(keys))
	for i, k := range keys {
		claims[i] = e.acquire(e.key(k), "fp", longLease)
	}
	for i, k := range keys {
		e.expect(e.key(k), "fp", dedup.InProgress)
		e.complete(claims[i], []byte(fmt.Sprint(i)), longLease)
	}
	for i, k := range keys {
		if res := e.expect(e.key(k), "fp", dedup.Duplicate); string(res.Result) != fmt.Sprint(i) {
			t.Fatalf("key #%d %.40q has result %q: keys collided", i, k, res.Result)
		}
	}
	if !e.features.Admin {
		return
	}
	adm := e.store.(admin.Interface)
	for i, k := range keys {
		key := e.key(k)
		rec, err := adm.Inspect(e.ctx, key)
		if err != nil {
			t.Fatalf("Inspect(key #%d %.40q): %v", i, k, err)
		}
		if rec.Key != key || rec.State != admin.StateCompleted || rec.ResultSize != len(fmt.Sprint(i)) {
			t.Fatalf("Inspect(key #%d %.40q) = key %.60q, state %s, result %d bytes; want the same key, completed, %d bytes",
				i, k, rec.Key, rec.State, rec.ResultSize, len(fmt.Sprint(i)))
		}
		listed := e.features.ListedKey(key)
		if found := e.listAll(listed, admin.MaxListLimit, nil); !slices.Contains(found, listed) {
			t.Fatalf("List(prefix %.60q) = %.60q, want the key among them", listed, found)
		}
	}
}

// TestLargeResult: a result of 1 MiB (or Features.MaxResultSize, when
// smaller) is stored and returned byte for byte.
func TestLargeResult(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "LargeResult", newStore, features)
	size := 1 << 20
	if e.features.MaxResultSize > 0 {
		size = min(size, e.features.MaxResultSize)
	}
	result := bytes.Repeat([]byte("\x00\xffresult"), size/8+1)[:size]
	key := e.key("k")
	c := e.acquire(key, "", longLease)
	e.complete(c, result, longLease)
	if res := e.expect(key, "", dedup.Duplicate); !bytes.Equal(res.Result, result) {
		t.Fatalf("duplicate returned %d bytes, want the %d stored", len(res.Result), len(result))
	}
}

// TestResultTooLarge (needs MaxResultSize): one byte over the maximum is
// refused with ErrResultTooLarge and leaves the record in progress for its
// owner, who completes it with the largest result that fits (the
// middleware then completes without the result); that one is returned byte
// for byte.
func TestResultTooLarge(t *testing.T, newStore Constructor, features Features) {
	if features.MaxResultSize <= 0 {
		t.Skip("storetest: Features.MaxResultSize is not set: the store has no result limit the suite could reach")
	}
	e := newEnv(t, "ResultTooLarge", newStore, features)
	key := e.key(strings.Repeat("k", 1000))
	c := e.acquire(key, strings.Repeat("f", 100), longLease)
	tooLarge := bytes.Repeat([]byte{0xab}, e.features.MaxResultSize+1)
	err := e.store.Complete(e.ctx, c, tooLarge, longLease)
	if !errors.Is(err, dedup.ErrResultTooLarge) {
		t.Fatalf("Complete with %d bytes = %v, want ErrResultTooLarge", len(tooLarge), err)
	}
	e.expect(key, "", dedup.InProgress)
	largest := tooLarge[:e.features.MaxResultSize]
	largest[0], largest[len(largest)-1] = 1, 2
	e.complete(c, largest, longLease)
	if res := e.expect(key, "", dedup.Duplicate); !bytes.Equal(res.Result, largest) {
		t.Fatalf("duplicate returned %d bytes, want the %d stored", len(res.Result), len(largest))
	}
}

// TestCancelledContext: every operation refuses a cancelled context with an
// error matching context.Canceled (never ErrClaimLost: the caller cannot
// know it lost anything), and a cancelled claim creates nothing.
func TestCancelledContext(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "CancelledContext", newStore, features)
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	key := e.key("k")
	if _, err := e.store.Claim(ctx, key, "", longLease); !errors.Is(err, context.Canceled) {
		t.Fatalf("Claim with a cancelled context: %v, want context.Canceled", err)
	}
	c := e.acquire(key, "", longLease) // the cancelled claim created nothing
	for op, err := range map[string]error{
		"Complete": e.store.Complete(ctx, c, nil, longLease),
		"Release":  e.store.Release(ctx, c),
		"Extend":   e.store.Extend(ctx, c, longLease),
	} {
		if !errors.Is(err, context.Canceled) || errors.Is(err, dedup.ErrClaimLost) {
			t.Errorf("%s with a cancelled context: %v, want context.Canceled and not ErrClaimLost", op, err)
		}
	}
	e.expect(key, "", dedup.InProgress) // the cancelled calls changed nothing
	e.complete(c, nil, longLease)
}

// TestClaimIsOneRequest (needs OneRequestClaim and a RequestCounter store of
// the case's own): every outcome of Claim, including Duplicate with its
// result and Conflict, costs exactly one request to the server.
func TestClaimIsOneRequest(t *testing.T, newStore Constructor, features Features) {
	if !features.OneRequestClaim {
		t.Skip("storetest: Features.OneRequestClaim is not set: the store does not promise one request per claim (or sends none)")
	}
	e := newEnv(t, "ClaimIsOneRequest", newStore, features)
	counter, ok := e.store.(RequestCounter)
	if !ok {
		t.Fatalf("storetest: Features.OneRequestClaim needs the constructor's store to implement storetest.RequestCounter; %T does not", e.store)
	}
	key := e.key("k")
	claim := func(fp string, want dedup.Outcome) dedup.ClaimResult {
		t.Helper()
		before := counter.Requests()
		res := e.claim(key, fp, longLease)
		if res.Outcome != want {
			t.Fatalf("Claim = %v, want %v", res.Outcome, want)
		}
		if n := counter.Requests() - before; n != 1 {
			t.Fatalf("a claim that found %v sent %d requests, want 1", want, n)
		}
		return res
	}
	c := claim("fp", dedup.Acquired).Claim
	claim("fp", dedup.InProgress)
	claim("other", dedup.Conflict)
	result := []byte{0, 1, 2, 0xff, 'x', 0}
	e.complete(c, result, longLease)
	if res := claim("fp", dedup.Duplicate); !bytes.Equal(res.Result, result) {
		t.Fatalf("Duplicate result = %q, want %q", res.Result, result)
	}
	claim("other", dedup.Conflict)
}
