// Package storetest is the conformance suite every dedup.Store must pass, in
// the spirit of Watermill's pubsub/tests: an ordinary, importable package.
// A store's own test calls Run with a constructor:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) (dedup.Store, func(time.Duration)) {
//			return newStoreForTest(t), nil // nil: the suite waits in real time
//		}, storetest.Features{})
//	}
//
// Every subtest runs in parallel and uses keys under its own unique prefix,
// so the suite can share one server (and one table) with other tests.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
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
	"github.com/watermill-dedup/watermill-dedup/internal/storekit"
)

// Constructor returns the store a subtest uses, and a function that moves
// that store's clock forward. Return a nil advance when the store's clock
// cannot be controlled (Redis and PostgreSQL decide expiry on the server):
// the suite then waits in real time, using Features.ShortDuration for the
// leases and retentions it lets expire. A constructor may return the same
// store to every subtest only when advance is nil, since subtests run in
// parallel.
type Constructor func(t *testing.T) (store dedup.Store, advance func(time.Duration))

// Features describes what a store can do and how long the suite may wait.
type Features struct {
	// ShortDuration is the lease or retention the suite lets expire.
	// Defaults to 100ms. It must be well above the store's expiry
	// resolution and the round-trip time under -race.
	ShortDuration time.Duration

	// Contenders is how many goroutines race to claim one key. Defaults to
	// 200.
	Contenders int

	// DistinctKeys is how many distinct keys are claimed concurrently.
	// Defaults to 256.
	DistinctKeys int
}

func (f *Features) setDefaults() {
	if f.ShortDuration == 0 {
		f.ShortDuration = 100 * time.Millisecond
	}
	if f.Contenders == 0 {
		f.Contenders = 200
	}
	if f.DistinctKeys == 0 {
		f.DistinctKeys = 256
	}
}

// longLease is a lease that no subtest waits for.
const longLease = 10 * time.Minute

// env is what one subtest works with.
type env struct {
	t        *testing.T
	store    dedup.Store
	advance  func(time.Duration)
	features Features
	prefix   string
	ctx      context.Context
}

// key returns a key unique to this subtest.
func (e *env) key(name string) string { return e.prefix + name }

// wait lets d pass on the store's clock.
func (e *env) wait(d time.Duration) {
	if e.advance != nil {
		e.advance(d)
		return
	}
	time.Sleep(d)
}

func (e *env) claim(key, fingerprint string, lease time.Duration) dedup.ClaimResult {
	e.t.Helper()
	res, err := e.store.Claim(e.ctx, key, fingerprint, lease)
	if err != nil {
		e.t.Fatalf("Claim(%.40q): %v", key, err)
	}
	return res
}

func (e *env) acquire(key, fingerprint string, lease time.Duration) dedup.Claim {
	e.t.Helper()
	res := e.claim(key, fingerprint, lease)
	if res.Outcome != dedup.Acquired {
		e.t.Fatalf("Claim(%.40q) = %v, want acquired", key, res.Outcome)
	}
	if res.Claim.Token == "" {
		e.t.Fatalf("Claim(%.40q) acquired with an empty token", key)
	}
	if res.Claim.Key != key {
		e.t.Fatalf("Claim(%.40q) returned claim for key %.40q", key, res.Claim.Key)
	}
	return res.Claim
}

func (e *env) expect(key, fingerprint string, want dedup.Outcome) dedup.ClaimResult {
	e.t.Helper()
	res := e.claim(key, fingerprint, longLease)
	if res.Outcome != want {
		e.t.Fatalf("Claim(%.40q) = %v, want %v", key, res.Outcome, want)
	}
	return res
}

func (e *env) complete(c dedup.Claim, result []byte, retention time.Duration) {
	e.t.Helper()
	if err := e.store.Complete(e.ctx, c, result, retention); err != nil {
		e.t.Fatalf("Complete(%.40q): %v", c.Key, err)
	}
}

func expectClaimLost(t *testing.T, op string, err error) {
	t.Helper()
	if !errors.Is(err, dedup.ErrClaimLost) {
		t.Fatalf("%s: got %v, want ErrClaimLost", op, err)
	}
}

// Run runs the conformance suite. Each subtest calls newStore once.
func Run(t *testing.T, newStore Constructor, features Features) {
	features.setDefaults()
	run := randomID()
	tests := []struct {
		name string
		fn   func(e *env)
	}{
		{"Acquire", testAcquire},
		{"DuplicateAfterComplete", testDuplicateAfterComplete},
		{"InProgressWhileClaimed", testInProgressWhileClaimed},
		{"ConflictOnFingerprintMismatch", testConflict},
		{"EmptyFingerprintSkipsCheck", testEmptyFingerprint},
		{"TakeoverAfterLeaseExpiry", testTakeover},
		{"ReclaimAfterRetentionExpiry", testRetentionExpiry},
		{"StaleTokenChangesNothing", testStaleToken},
		{"CompletedRecordIsFinal", testCompletedIsFinal},
		{"ReleaseThenReacquire", testReleaseThenReacquire},
		{"ExtendKeepsClaimAlive", testExtend},
		{"ExtendAfterExpiryIsLost", testExtendAfterExpiry},
		{"OneWinnerAmongContenders", testContenders},
		{"ManyDistinctKeysConcurrently", testDistinctKeys},
		{"LongAndUnicodeKeys", testLongAndUnicodeKeys},
		{"ScopesNeverCollide", testScopes},
		{"AnyFingerprintBytes", testAnyFingerprintBytes},
		{"AnyAcceptedKey", testAnyAcceptedKey},
		{"InvalidDurationsRefused", testInvalidDurations},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store, advance := newStore(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			t.Cleanup(cancel)
			tc.fn(&env{
				t: t, store: store, advance: advance, features: features, ctx: ctx,
				prefix: fmt.Sprintf("storetest-%s-%s-", run, tc.name),
			})
		})
	}
}

func randomID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func testAcquire(e *env) {
	a := e.acquire(e.key("k"), "", longLease)
	b := e.acquire(e.key("other"), "", longLease)
	if a.Token == b.Token {
		e.t.Fatalf("two claims got the same token %q", a.Token)
	}
}

func testDuplicateAfterComplete(e *env) {
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
				e.t.Fatalf("%s: duplicate returned result of %d bytes %.32q, want %d bytes %.32q", name, len(res.Result), res.Result, len(result), result)
			}
			if res.Claim.Token != "" {
				e.t.Fatalf("%s: duplicate returned a claim token", name)
			}
		}
	}
}

func testInProgressWhileClaimed(e *env) {
	key := e.key("k")
	c := e.acquire(key, "fp", longLease)
	for range 3 {
		res := e.expect(key, "fp", dedup.InProgress)
		if res.Claim.Token != "" || res.Result != nil {
			e.t.Fatalf("in-progress result carries a claim or a result: %+v", res)
		}
	}
	e.complete(c, []byte("done"), longLease)
	e.expect(key, "fp", dedup.Duplicate)
}

func testConflict(e *env) {
	inProgress, completed := e.key("in-progress"), e.key("completed")
	e.acquire(inProgress, "fp-a", longLease)
	e.expect(inProgress, "fp-b", dedup.Conflict)
	e.expect(inProgress, "fp-a", dedup.InProgress) // the conflict changed nothing

	c := e.acquire(completed, "fp-a", longLease)
	e.complete(c, []byte("r"), longLease)
	res := e.expect(completed, "fp-b", dedup.Conflict)
	if res.Result != nil {
		e.t.Fatalf("a conflict returned the stored result %q to a different payload", res.Result)
	}
	e.expect(completed, "fp-a", dedup.Duplicate)
}

func testEmptyFingerprint(e *env) {
	a, b := e.key("recorded-without"), e.key("claimed-without")
	e.acquire(a, "", longLease)
	e.expect(a, "fp", dedup.InProgress)
	c := e.acquire(b, "fp", longLease)
	e.complete(c, nil, longLease)
	e.expect(b, "", dedup.Duplicate)
}

func testTakeover(e *env) {
	short := e.features.ShortDuration
	key := e.key("k")
	old := e.acquire(key, "fp", short)
	e.wait(2 * short)
	taken := e.acquire(key, "fp", longLease)
	if taken.Token == old.Token {
		e.t.Fatalf("takeover reused the old token")
	}
	expectClaimLost(e.t, "Complete with the expired claim", e.store.Complete(e.ctx, old, []byte("late"), longLease))
	expectClaimLost(e.t, "Release with the expired claim", e.store.Release(e.ctx, old))
	expectClaimLost(e.t, "Extend with the expired claim", e.store.Extend(e.ctx, old, longLease))
	e.expect(key, "fp", dedup.InProgress) // the new owner's record survived
	e.complete(taken, []byte("new"), longLease)
	if res := e.expect(key, "fp", dedup.Duplicate); string(res.Result) != "new" {
		e.t.Fatalf("result = %q, want the new owner's", res.Result)
	}
}

func testRetentionExpiry(e *env) {
	short := e.features.ShortDuration
	key := e.key("k")
	c := e.acquire(key, "fp-a", longLease)
	e.complete(c, []byte("old"), short)
	e.expect(key, "fp-a", dedup.Duplicate)
	e.wait(2 * short)
	// An expired record counts as none: no duplicate, and no conflict either.
	again := e.acquire(key, "fp-b", longLease)
	expectClaimLost(e.t, "Release with the first claim", e.store.Release(e.ctx, c))
	e.expect(key, "fp-b", dedup.InProgress)
	e.complete(again, nil, longLease)
	e.expect(key, "fp-b", dedup.Duplicate)
}

func testStaleToken(e *env) {
	key := e.key("k")
	c := e.acquire(key, "", longLease)
	stale := dedup.Claim{Key: key, Token: storekit.NewToken()}
	err := e.store.Complete(e.ctx, stale, []byte("x"), longLease)
	expectClaimLost(e.t, "Complete with a foreign token", err)
	if errors.Is(err, dedup.ErrAlreadyCompleted) {
		e.t.Fatalf("Complete with a foreign token reported ErrAlreadyCompleted")
	}
	expectClaimLost(e.t, "Release with a foreign token", e.store.Release(e.ctx, stale))
	expectClaimLost(e.t, "Extend with a foreign token", e.store.Extend(e.ctx, stale, longLease))
	e.expect(key, "", dedup.InProgress) // nothing deleted, nothing completed
	e.complete(c, []byte("owner"), longLease)
	if res := e.expect(key, "", dedup.Duplicate); string(res.Result) != "owner" {
		e.t.Fatalf("result = %q, want the owner's", res.Result)
	}
	err = e.store.Complete(e.ctx, stale, []byte("x"), longLease)
	expectClaimLost(e.t, "Complete of a completed record with a foreign token", err)
	if errors.Is(err, dedup.ErrAlreadyCompleted) {
		e.t.Fatalf("Complete with a foreign token of a record completed by another claim reported ErrAlreadyCompleted")
	}

	missing := dedup.Claim{Key: e.key("never-claimed"), Token: storekit.NewToken()}
	expectClaimLost(e.t, "Complete of a key never claimed", e.store.Complete(e.ctx, missing, nil, longLease))
	expectClaimLost(e.t, "Release of a key never claimed", e.store.Release(e.ctx, missing))
	expectClaimLost(e.t, "Extend of a key never claimed", e.store.Extend(e.ctx, missing, longLease))
	e.acquire(missing.Key, "", longLease) // and they created nothing
}

// testCompletedIsFinal: once completed, the owner's token no longer lets it
// release, extend (which would shorten the retention to a lease) or complete
// again.
func testCompletedIsFinal(e *env) {
	short := e.features.ShortDuration
	key := e.key("k")
	c := e.acquire(key, "", longLease)
	e.complete(c, []byte("first"), longLease)
	expectClaimLost(e.t, "Release after Complete", e.store.Release(e.ctx, c))
	expectClaimLost(e.t, "Extend after Complete", e.store.Extend(e.ctx, c, short))
	err := e.store.Complete(e.ctx, c, []byte("second"), short)
	expectClaimLost(e.t, "Complete after Complete", err)
	// A store may say why (dedup.ErrAlreadyCompleted); it must not claim
	// that for a record it never completed (see testStaleToken).
	e.wait(2 * short)
	if res := e.expect(key, "", dedup.Duplicate); string(res.Result) != "first" {
		e.t.Fatalf("result = %q, want %q", res.Result, "first")
	}
}

func testReleaseThenReacquire(e *env) {
	key := e.key("k")
	c := e.acquire(key, "fp", longLease)
	if err := e.store.Release(e.ctx, c); err != nil {
		e.t.Fatalf("Release: %v", err)
	}
	expectClaimLost(e.t, "second Release", e.store.Release(e.ctx, c))
	expectClaimLost(e.t, "Complete after Release", e.store.Complete(e.ctx, c, nil, longLease))
	again := e.acquire(key, "fp", longLease)
	if again.Token == c.Token {
		e.t.Fatalf("re-acquire reused the released token")
	}
	e.complete(again, nil, longLease)
	e.expect(key, "fp", dedup.Duplicate)
}

func testExtend(e *env) {
	short := e.features.ShortDuration
	key := e.key("k")
	c := e.acquire(key, "", short)
	if err := e.store.Extend(e.ctx, c, longLease); err != nil {
		e.t.Fatalf("Extend: %v", err)
	}
	e.wait(3 * short) // well past the original lease
	e.expect(key, "", dedup.InProgress)
	if err := e.store.Extend(e.ctx, c, longLease); err != nil {
		e.t.Fatalf("second Extend: %v", err)
	}
	e.complete(c, []byte("r"), longLease)
	e.expect(key, "", dedup.Duplicate)
}

func testExtendAfterExpiry(e *env) {
	short := e.features.ShortDuration
	key := e.key("k")
	c := e.acquire(key, "", short)
	e.wait(2 * short)
	expectClaimLost(e.t, "Extend after the lease ended", e.store.Extend(e.ctx, c, longLease))
	e.acquire(key, "", longLease) // Extend did not revive the record
}

func testContenders(e *env) {
	key := e.key("k")
	n := e.features.Contenders
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		outcomes = map[dedup.Outcome]int{}
		errs     []error
		start    = make(chan struct{})
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := e.store.Claim(e.ctx, key, "fp", longLease)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			outcomes[res.Outcome]++
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		e.t.Fatalf("%d of %d claims failed, first: %v", len(errs), n, errs[0])
	}
	if outcomes[dedup.Acquired] != 1 || outcomes[dedup.InProgress] != n-1 {
		e.t.Fatalf("outcomes of %d concurrent claims: %v, want exactly 1 acquired and %d in progress", n, outcomes, n-1)
	}
}

func testDistinctKeys(e *env) {
	n := e.features.DistinctKeys
	const workers = 16
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		keys = make(chan int)
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
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
		}()
	}
	for i := range n {
		keys <- i
	}
	close(keys)
	wg.Wait()
	if len(errs) > 0 {
		e.t.Fatalf("%d of %d keys failed, first: %v", len(errs), n, errs[0])
	}
	for i := range n {
		key := e.key(fmt.Sprint(i))
		if res := e.expect(key, "", dedup.Duplicate); string(res.Result) != key {
			e.t.Fatalf("key %s has result %q: records mixed up", key, res.Result)
		}
	}
}

func testLongAndUnicodeKeys(e *env) {
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
			e.t.Fatalf("key #%d has result %q: keys collided", i, res.Result)
		}
	}
}

func testScopes(e *env) {
	pairs := [][2]string{
		{admin.ScopedKey("a:b", "c"), admin.ScopedKey("a", "b:c")},
		{admin.ScopedKey("charge", "ORDER-1"), admin.ScopedKey("email", "ORDER-1")},
		{admin.ScopedKey("x%3A", "y"), admin.ScopedKey("x:", "y")},
		{admin.ScopedKey("", "k"), admin.ScopedKey("k", "")},
	}
	for _, p := range pairs {
		if p[0] == p[1] {
			e.t.Fatalf("ScopedKey collision: %q", p[0])
		}
		a := e.acquire(e.key(p[0]), "", longLease)
		b := e.acquire(e.key(p[1]), "", longLease)
		e.complete(a, []byte("A"), longLease)
		if res := e.expect(e.key(p[1]), "", dedup.InProgress); res.Result != nil {
			e.t.Fatalf("scope leak: %q sees %q", p[1], res.Result)
		}
		e.complete(b, []byte("B"), longLease)
		if res := e.expect(e.key(p[1]), "", dedup.Duplicate); string(res.Result) != "B" {
			e.t.Fatalf("%q returned %q, want B", p[1], res.Result)
		}
	}
}

func testInvalidDurations(e *env) {
	key := e.key("k")
	for _, d := range []time.Duration{0, -time.Second} {
		if _, err := e.store.Claim(e.ctx, key, "", d); !errors.Is(err, dedup.ErrInvalidDuration) {
			e.t.Fatalf("Claim with lease %v: got %v, want ErrInvalidDuration", d, err)
		}
	}
	c := e.acquire(key, "", longLease) // the refused claims created nothing
	for _, d := range []time.Duration{0, -time.Second} {
		if err := e.store.Extend(e.ctx, c, d); !errors.Is(err, dedup.ErrInvalidDuration) {
			e.t.Fatalf("Extend with lease %v: got %v, want ErrInvalidDuration", d, err)
		}
		if err := e.store.Complete(e.ctx, c, nil, d); !errors.Is(err, dedup.ErrInvalidDuration) {
			e.t.Fatalf("Complete with retention %v: got %v, want ErrInvalidDuration", d, err)
		}
	}
	e.expect(key, "", dedup.InProgress) // still in progress: nothing completed forever
	e.complete(c, nil, longLease)
}

// testAnyFingerprintBytes: a fingerprint is any string of bytes (a key
// function may return a raw digest, string(sha256.Sum256(payload)[:]), with
// NUL bytes and invalid UTF-8), of any length. A store must compare them as
// byte strings: the same bytes are the same payload (Duplicate or
// InProgress, never Conflict), and a fingerprint differing in one byte, or
// only by an invalid byte a UTF-8 conversion would replace, is a Conflict.
func testAnyFingerprintBytes(e *env) {
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
		// Encodings a store might use for fingerprints it cannot hold
		// verbatim: the encoded form of one must not equal another
		// fingerprint given verbatim.
		{"vs-sha256-text", "\xff", "sha256:" + hexOf("\xff")},
		{"vs-prefixed-sha256-text", "\x00", "\x01sha256:" + hexOf("\x00")},
		{"vs-hex", "\xff\x00", "ff00"},
	}
	for _, c := range cases {
		if c.fp == c.other {
			e.t.Fatalf("%s: the two fingerprints are equal", c.name)
		}
		key := e.key(c.name)
		claim := e.acquire(key, c.fp, longLease)
		e.expect(key, c.fp, dedup.InProgress)
		e.expect(key, c.other, dedup.Conflict)
		e.complete(claim, []byte(c.name), longLease)
		if res := e.expect(key, c.fp, dedup.Duplicate); string(res.Result) != c.name {
			e.t.Fatalf("%s: duplicate returned %q", c.name, res.Result)
		}
		e.expect(key, c.other, dedup.Conflict)

		// The other way round: the other fingerprint recorded first.
		key = e.key(c.name + "-reversed")
		claim = e.acquire(key, c.other, longLease)
		e.expect(key, c.fp, dedup.Conflict)
		e.complete(claim, nil, longLease)
		e.expect(key, c.other, dedup.Duplicate)
		e.expect(key, c.fp, dedup.Conflict)
	}
}

// testAnyAcceptedKey: a store holds every key the middleware accepts (valid
// UTF-8 without control characters, up to dedup.Config.MaxKeyLength, 1024
// bytes by default, plus the scope), whatever characters it holds: the
// separators and escape characters of the stores' own formats (':' '%'
// '\\'), glob and LIKE wildcards ('*' '?' '[' ']' '_'), spaces, emoji,
// right-to-left text. Claim, Complete and a duplicate Claim see one record
// per key; a store that implements admin.Interface returns the same key from
// Inspect, and List with the key as prefix finds it.
func testAnyAcceptedKey(e *env) {
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
			e.t.Fatalf("key #%d %.40q has result %q: keys collided", i, k, res.Result)
		}
	}
	adm, ok := e.store.(admin.Interface)
	if !ok {
		return
	}
	for i, k := range keys {
		key := e.key(k)
		rec, err := adm.Inspect(e.ctx, key)
		if err != nil {
			e.t.Fatalf("Inspect(key #%d %.40q): %v", i, k, err)
		}
		if rec.Key != key || rec.State != admin.StateCompleted || rec.ResultSize != len(fmt.Sprint(i)) {
			e.t.Fatalf("Inspect(key #%d %.40q) = key %.60q, state %s, result %d bytes; want the same key, completed, %d bytes",
				i, k, rec.Key, rec.State, rec.ResultSize, len(fmt.Sprint(i)))
		}
		if len(key) > 256 {
			continue // DynamoDB's List shows long keys by their hashed partition key
		}
		if found := listAll(e, adm, key); !slices.Contains(found, key) {
			e.t.Fatalf("List(prefix %.60q) = %.60q, want the key among them", key, found)
		}
	}
}

// listAll returns the keys of every record List finds under prefix.
func listAll(e *env, adm admin.Interface, prefix string) []string {
	e.t.Helper()
	var keys []string
	cursor := ""
	for range 10_000 {
		records, next, err := adm.List(e.ctx, prefix, cursor, admin.MaxListLimit)
		if err != nil {
			e.t.Fatalf("List(prefix %.60q): %v", prefix, err)
		}
		for _, r := range records {
			if !strings.HasPrefix(r.Key, prefix) {
				e.t.Fatalf("List(prefix %.60q) returned key %.60q outside the prefix", prefix, r.Key)
			}
			keys = append(keys, r.Key)
		}
		if next == "" {
			return keys
		}
		cursor = next
	}
	e.t.Fatalf("List(prefix %.60q) did not end after 10000 pages", prefix)
	return nil
}
