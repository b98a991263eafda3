package memory

import (
	"bytes"
	"context"
	"math"
	"sync"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

// Store is a [dedup.Store] in process memory, for tests, examples and
// single-process consumers. It deduplicates only within one process and
// forgets everything on restart: use a shared store (Redis, DynamoDB,
// PostgreSQL) when more than one process consumes the same messages.
//
// It is safe for concurrent use and starts no goroutine: expired records are
// ignored on access and swept, a bounded number at a time, while claiming,
// so memory stays proportional to the live records. Every operation takes
// one mutex; none blocks on I/O.
//
// Besides dedup.Store it has every capability the network stores have,
// built on the root module's exported API only: dedup.BatchStore,
// dedup.KeyWatcher (WatchKey), the completion inside the work's own
// transaction (RunInTx, TxMiddleware, on a key-value space of its own:
// TxFromContext, Get), the record details (admin.Record.ResponseStatus)
// and admin.Interface.
type Store struct {
	clock dedup.Clock

	mu      sync.Mutex
	records map[string]*memRecord
	claims  int // claims since the last sweep

	// watches holds the open watches of each key (WatchKey); nil until the
	// first. closed: Close was called.
	watches map[string]map[*watch]struct{}
	closed  bool

	// values is the key-value space transactions write (Tx.Set, Get);
	// nil until the first write.
	values map[string][]byte
}

type memRecord struct {
	completed bool
	released  bool // by Release: absent for every operation but the next Claim
	// status is the dedup.RecordDetails.ResponseStatus the record was
	// completed with (0: none).
	status      int16
	token       string
	fingerprint string
	// fence is the fence of the claim that wrote the record (see
	// dedup.Claim.Fence): the next winner's is larger.
	fence    uint64
	deadline time.Time // lease deadline (in progress, released) or expiry (completed)
	result   []byte

	// Who and when (see dedup.Store.Claim): the first claim's origin and
	// time, the completion time, the number of claims.
	origin                 dedup.Origin
	claimedAt, completedAt time.Time
	claims                 int
}

// isLive reports whether r counts as a record at now.
func (r *memRecord) isLive(now time.Time) bool { return !r.released && now.Before(r.deadline) }

// sweepEvery is how many claims pass between two sweeps of expired records.
const sweepEvery = 1024

// Config configures a Store. It is passed by value; New never writes to the
// caller's copy. The zero Config is a working store on the wall clock.
type Config struct {
	// Clock supplies "now" for lease deadlines and expiry. Defaults to the
	// wall clock; tests pass a fakeclock.
	Clock dedup.Clock
}

// New returns an empty store. It has the shape of every store's New, but
// there is no Config it refuses: it never returns an error, and ctx is not
// used (the store needs no server to check).
func New(ctx context.Context, config Config) (*Store, error) {
	clock := config.Clock
	if clock == nil {
		clock = storekit.WallClock{}
	}
	return &Store{clock: clock, records: map[string]*memRecord{}}, nil
}

// live returns the live record under key, or nil. An expired completed
// record is deleted on the way; a released or expired in-progress one is
// left for the next Claim (which counts it) or the sweep.
func (s *Store) live(key string, now time.Time) *memRecord {
	r, ok := s.records[key]
	if !ok {
		return nil
	}
	if !r.isLive(now) {
		if r.completed {
			delete(s.records, key)
		}
		return nil
	}
	return r
}

// Claim implements [dedup.Store.Claim].
func (s *Store) Claim(ctx context.Context, key, fingerprint string, lease time.Duration) (dedup.ClaimResult, error) {
	if err := storekit.CheckDuration("lease", lease); err != nil {
		return dedup.ClaimResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return dedup.ClaimResult{}, err
	}
	origin, _ := dedup.OriginFromContext(ctx)
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claimLocked(key, fingerprint, lease, origin, now), nil
}

// claimLocked is Claim, with s.mu held.
func (s *Store) claimLocked(key, fingerprint string, lease time.Duration, origin dedup.Origin, now time.Time) dedup.ClaimResult {
	s.claims++
	if s.claims >= sweepEvery {
		s.claims = 0
		s.sweep(now, 4*sweepEvery)
	}
	old := s.records[key]
	if r := s.live(key, now); r != nil {
		if fingerprint != "" && r.fingerprint != "" && fingerprint != r.fingerprint {
			return dedup.ClaimResult{Outcome: dedup.Conflict}
		}
		if r.completed {
			return dedup.ClaimResult{Outcome: dedup.Duplicate, Result: bytes.Clone(r.result)}
		}
		return dedup.ClaimResult{Outcome: dedup.InProgress}
	}
	raw := storekit.RawToken()
	token := string(raw[:]) // 16 bytes; tokens never leave the process
	r := &memRecord{token: token, fingerprint: fingerprint, deadline: now.Add(lease), claimedAt: now, claims: 1}
	var prev uint64
	if old != nil { // the record the claim replaces, even one deleted on the way (live)
		prev = old.fence
	}
	r.fence = storekit.NextFence(prev, now)
	if old != nil && !old.completed { // released, or its lease ended: one more claim
		r.origin, r.claimedAt, r.claims = old.origin, old.claimedAt, old.claims+1
	} else {
		r.origin = origin
	}
	s.records[key] = r
	return dedup.ClaimResult{Outcome: dedup.Acquired, Claim: dedup.Claim{Key: key, Token: token, Fence: r.fence}}
}

// owned returns the claim's live in-progress record, or nil.
func (s *Store) owned(c dedup.Claim, now time.Time) *memRecord {
	r := s.live(c.Key, now)
	if r == nil || r.completed || r.token != c.Token {
		return nil
	}
	return r
}

// Complete implements [dedup.Store.Complete]. The record keeps the
// response status of the dedup.RecordDetails ctx carries (httpdedup's), as
// PostgreSQL does, for admin.Record.ResponseStatus.
func (s *Store) Complete(ctx context.Context, c dedup.Claim, result []byte, retention time.Duration) error {
	if err := storekit.CheckDuration("retention", retention); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	status := responseStatus(ctx)
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.completeLocked(c, result, retention, status, now)
}

// completeLocked is Complete, with s.mu held; status is the response
// status to keep (responseStatus).
func (s *Store) completeLocked(c dedup.Claim, result []byte, retention time.Duration, status int16, now time.Time) error {
	r := s.owned(c, now)
	if r == nil {
		if r := s.live(c.Key, now); r != nil && r.completed && r.token == c.Token {
			return dedup.ErrAlreadyCompleted
		}
		return dedup.ErrClaimLost
	}
	r.completed = true
	r.deadline = now.Add(retention)
	r.completedAt = now
	r.result = bytes.Clone(result)
	r.status = status
	s.wake(c.Key)
	return nil
}

// responseStatus is the dedup.RecordDetails.ResponseStatus that ctx
// carries for the completion, as PostgreSQL keeps it: 0 when there is
// none or it is outside 1 to 32767.
func responseStatus(ctx context.Context) int16 {
	if d, ok := dedup.RecordDetailsFromContext(ctx); ok && d.ResponseStatus > 0 && d.ResponseStatus <= math.MaxInt16 {
		return int16(d.ResponseStatus)
	}
	return 0
}

// Release implements [dedup.Store.Release].
func (s *Store) Release(ctx context.Context, c dedup.Claim) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.releaseLocked(c, now)
}

// releaseLocked is Release, with s.mu held.
func (s *Store) releaseLocked(c dedup.Claim, now time.Time) error {
	r := s.owned(c, now)
	if r == nil {
		return dedup.ErrClaimLost
	}
	r.released = true // until its lease would have ended (the sweep)
	s.wake(c.Key)
	return nil
}

// Extend implements [dedup.Store.Extend].
func (s *Store) Extend(ctx context.Context, c dedup.Claim, lease time.Duration) error {
	if err := storekit.CheckDuration("lease", lease); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.owned(c, now)
	if r == nil {
		return dedup.ErrClaimLost
	}
	r.deadline = now.Add(lease)
	return nil
}

// Len returns the number of live records (in progress or completed).
func (s *Store) Len() int {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.records {
		if r.isLive(now) {
			n++
		}
	}
	return n
}

// sweep deletes up to limit expired records. Go's map iteration order is
// random, so successive sweeps visit different records.
func (s *Store) sweep(now time.Time, limit int) {
	for k, r := range s.records {
		if limit == 0 {
			return
		}
		limit--
		if !now.Before(r.deadline) {
			delete(s.records, k)
		}
	}
}
