// Package storetest is the conformance suite every dedup.Store must pass, in
// the spirit of Watermill's pubsub/tests: an ordinary, importable package.
// A store declares what it can do in [Features]; the suite runs every case
// that applies and skips the others with the reason. A store's own tests
// shrink to a constructor:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) (dedup.Store, func(time.Duration)) {
//			return newStoreForTest(t), nil // nil: the suite waits in real time
//		}, storetest.Features{Admin: true})
//	}
//
//	func TestAdmin(t *testing.T)  { storetest.RunAdmin(t, newStore, features) }
//	func TestRouter(t *testing.T) { storetest.RunRouter(t, newStore, features) }
//
// [Run] runs the store contract (Claim, Complete, Release, Extend),
// [RunAdmin] the operator's contract of dedup/admin (Inspect, Evict, List),
// [RunRouter] the middleware end to end through a real Watermill router,
// [RunBatch] the optional batch capability (dedup.BatchStore). Run also
// checks the optional key watches (dedup.KeyWatcher, Features.Watch), and
// RunAdmin the record details (Features.RecordDetails).
// Every case is also exported on its own (TestDuplicateAfterComplete,
// TestAdminList, TestRouterReplay, …) with the same arguments, so a store
// can run one case, or a case again under other conditions.
//
// Every case runs in parallel with the others and keeps its keys under a
// prefix of its own (a random id and the case's name), so the suite can
// share one server, one table and one store with other tests. The suite
// never deletes what it wrote: a store on a shared server keeps the records
// until their retention ends (at most 10 minutes).
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
)

// Constructor returns the store a case uses, and a function that moves
// that store's clock forward. Return a nil advance when the store's clock
// cannot be controlled (Redis and PostgreSQL decide expiry on the server):
// the suite then waits in real time, using Features.ShortDuration for the
// leases and retentions it lets expire. A constructor may return the same
// store to every case only when advance is nil, since cases run in
// parallel.
type Constructor func(t *testing.T) (store dedup.Store, advance func(time.Duration))

// Features describes what a store can do and how long the suite may wait.
// The zero value is a store with none of the optional capabilities, whose
// expiry the suite waits for in real time.
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

	// ControllableClock: the constructor returns a non-nil advance that
	// moves the clock deciding the store's expiry, and a store of its own
	// to each case (memory, DynamoDB with a fake Config.Clock). Cases that
	// need exact times (a lease that ends at its deadline to the
	// millisecond, the exact Remaining of an admin.Record) run only then.
	// The suite fails when this and the constructor's advance disagree.
	ControllableClock bool

	// MaxResultSize is the largest result Complete stores; a result one
	// byte longer is refused with an error matching dedup.ErrResultTooLarge
	// and the record stays in progress (DynamoDB: the store's
	// MaxResultSize). 0: no limit the suite could reach;
	// TestResultTooLarge is then skipped, and TestLargeResult stores 1 MiB.
	MaxResultSize int

	// AlreadyCompleted: a Complete retried by the claim that already
	// completed the record returns an error matching
	// dedup.ErrAlreadyCompleted (Redis, memory). Without it the suite only
	// requires dedup.ErrClaimLost there.
	AlreadyCompleted bool

	// OneRequestClaim: a Claim that finds no record or a live one (Acquired,
	// InProgress, Duplicate with its result, Conflict) is one request to
	// the server, because the server returns the existing record with a
	// refused claim (Redis SET NX PX GET; DynamoDB when the server honours
	// ReturnValuesOnConditionCheckFailure=ALL_OLD). Taking over a released
	// or abandoned record may cost one more (Redis and DynamoDB: the write
	// that replaces it). TestClaimIsOneRequest checks it on a store that
	// implements [RequestCounter].
	OneRequestClaim bool

	// Admin: the store implements admin.Interface. RunAdmin's cases run
	// only then, and TestAnyAcceptedKey also checks Inspect and List.
	Admin bool

	// ListedKey returns the key admin.Interface.List reports for a record
	// (DynamoDB: dynamo.PartitionKey, which shortens keys over 512 bytes).
	// Nil: the scoped key itself.
	ListedKey func(key string) string

	// AdminFingerprint returns the admin.Record.Fingerprint of a record
	// claimed with fingerprint fp (Redis: the hex of its 16-byte digest).
	// Nil: the suite only checks that it is empty exactly when fp is.
	AdminFingerprint func(fp string) string

	// ListFillsPages: List returns full pages until the last one and never
	// an empty last page (memory, PostgreSQL). Without it a page may hold
	// fewer records than the limit, even none, while more follow.
	ListFillsPages bool

	// RecordsCreated: admin.Record.Created is set (PostgreSQL). Without it
	// the suite requires the zero time.
	RecordsCreated bool

	// Provenance: the store keeps who and when with every record (see
	// dedup.Store.Claim): admin.Record.ClaimedAt, CompletedAt,
	// TransportID, MessageID and Claims. RunAdmin's provenance cases
	// need it (and Admin); without it they are skipped.
	Provenance bool

	// CountsTakeovers: a claim that takes over an in-progress record whose
	// lease ended keeps its provenance and counts one more claim (memory,
	// DynamoDB, PostgreSQL). Without it (Redis, where such a record is
	// gone) the suite requires a fresh count instead.
	CountsTakeovers bool

	// RecordDetails: the store keeps the dedup.RecordDetails that Complete
	// finds in its context with the record, and reports its response
	// status in admin.Record.ResponseStatus (PostgreSQL, memory).
	// TestAdminResponseStatus needs it (and Admin); without it the suite
	// requires a zero ResponseStatus on every record.
	RecordDetails bool

	// Watch: the store implements dedup.KeyWatcher (Redis, PostgreSQL
	// with Config.Notify, memory). The watch cases (TestWatchAfterChange,
	// TestWatchWakesWaiters) run only then. The suite fails when it is set
	// and the store does not implement the interface.
	Watch bool

	// Fencing: every Acquired claim carries a fence (dedup.Claim.Fence),
	// larger than every earlier winning claim's fence for the key, through
	// release, lease expiry, takeover and retention (TestFenceIncreases,
	// TestFencesOfContendersIncrease, and the batch's TestBatchFences).
	// Without it the suite requires Fence 0 on every claim: a store that
	// does not fence never makes one up (TestNoFenceWithoutFencing).
	Fencing bool

	// Transactions, when set, says the store completes a record in the
	// handler's own transaction; RunRouter then runs
	// TestRouterEffectInTransaction.
	Transactions *Transactions

	// Batch: the store implements dedup.BatchStore. RunBatch's cases run
	// only then.
	Batch bool

	// BatchRequestSize is the most records one request of the store's
	// batch methods carries (a pipeline or statement chunk, the requests
	// in flight); TestBatchLargerThanOneRequest claims more than twice as
	// many. 0: no limit; the case then claims 1000.
	BatchRequestSize int

	// OneRequestBatch: a ClaimBatch of new keys, a CompleteBatch and a
	// ReleaseBatch of at most BatchRequestSize records are one request to
	// the server each (Redis: one pipeline; PostgreSQL: one batch of
	// statements). TestBatchOneRequest checks it on a store that
	// implements [RequestCounter].
	OneRequestBatch bool

	// Skip names cases (as Run, RunAdmin and RunRouter name their subtests,
	// e.g. "ResultTooLarge") that are skipped with the given reason. It is
	// for a server's known deviation that the store cannot help (an
	// emulator's limit the real service does not have), never for a store
	// bug: the reason is printed with every run.
	Skip map[string]string
}

// Transactions is how RunRouter writes an effect inside the transaction a
// store's middleware opens for the handler (PostgreSQL: Store.TxMiddleware
// and postgres.TxFromContext).
type Transactions struct {
	// Middleware opens the transaction the record completes in. The suite
	// adds it inside the dedup middleware. Required.
	Middleware message.HandlerMiddleware

	// Effect writes one effect of key through the transaction that
	// Middleware opened for msg (found in msg.Context()). Required.
	Effect func(msg *message.Message, key string) error

	// Effects returns how many effects of key are committed. Required.
	Effects func(ctx context.Context, key string) (int, error)
}

// RequestCounter is implemented by a store under test that counts the
// requests it has sent to its server (usually a test wrapper around the
// store and a counting client). TestClaimIsOneRequest needs it, and needs
// the store to be the case's own: requests of other cases on a shared
// store would be counted too.
type RequestCounter interface {
	Requests() int64
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
	if f.ListedKey == nil {
		f.ListedKey = func(key string) string { return key }
	}
}

// longLease is a lease or retention that no case waits for.
const longLease = 10 * time.Minute

// caseTimeout bounds every store call of one case.
const caseTimeout = 2 * time.Minute

// env is what one case works with.
type env struct {
	t        *testing.T
	store    dedup.Store
	advance  func(time.Duration)
	features Features
	prefix   string
	ctx      context.Context
}

// newEnv builds a case's environment: it calls newStore once, checks that
// the store matches its Features, and gives the case a key prefix of its
// own.
func newEnv(t *testing.T, name string, newStore Constructor, features Features) *env {
	t.Helper()
	if reason, ok := features.Skip[name]; ok {
		t.Skipf("storetest: skipped by Features.Skip: %s", reason)
	}
	features.setDefaults()
	store, advance := newStore(t)
	if store == nil {
		t.Fatal("storetest: the constructor returned a nil store")
	}
	switch {
	case features.ControllableClock && advance == nil:
		t.Fatal("storetest: Features.ControllableClock is set, but the constructor returned no advance function")
	case !features.ControllableClock && advance != nil:
		t.Fatal("storetest: the constructor returned an advance function: set Features.ControllableClock (and give each case a store of its own)")
	}
	if _, ok := store.(admin.Interface); features.Admin && !ok {
		t.Fatalf("storetest: Features.Admin is set, but %T does not implement admin.Interface", store)
	}
	if _, ok := store.(dedup.KeyWatcher); features.Watch && !ok {
		t.Fatalf("storetest: Features.Watch is set, but %T does not implement dedup.KeyWatcher", store)
	}
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
	t.Cleanup(cancel)
	id := randomID()
	t.Logf("storetest: case %s runs under key prefix storetest-%s-", name, id)
	return &env{
		t: t, store: store, advance: advance, features: features, ctx: ctx,
		prefix: "storetest-" + id + "-" + name + "-",
	}
}

// key returns a key unique to this case.
func (e *env) key(name string) string { return e.prefix + name }

// wait lets d pass on the store's clock.
func (e *env) wait(d time.Duration) {
	if e.advance != nil {
		e.advance(d)
		return
	}
	time.Sleep(d) // the server's clock decides expiry: nothing to inject
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

// record claims key and, unless result is nil, completes it.
func (e *env) record(key, fingerprint string, lease time.Duration, result []byte, retention time.Duration) dedup.Claim {
	e.t.Helper()
	c := e.acquire(key, fingerprint, lease)
	if result != nil {
		e.complete(c, result, retention)
	}
	return c
}

func expectClaimLost(t *testing.T, op string, err error) {
	t.Helper()
	if !errors.Is(err, dedup.ErrClaimLost) {
		t.Fatalf("%s: got %v, want ErrClaimLost", op, err)
	}
}

// suiteCase is one exported case as Run, RunAdmin and RunRouter list it.
type suiteCase struct {
	name string
	fn   func(t *testing.T, newStore Constructor, features Features)
}

// runAll runs every case as a parallel subtest named after it.
func runAll(t *testing.T, cases []suiteCase, newStore Constructor, features Features) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, newStore, features)
		})
	}
}

func randomID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
