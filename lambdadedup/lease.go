package lambdadedup

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// deadlineStore keeps every lease of a claim within its invocation: Claim
// is given at most the time left until the invocation's deadline (through
// dedup.Call.Lease), and each heartbeat's Extend is cut to the time left
// too, so that a record of an invocation that timed out or crashed is in
// progress no longer than that invocation could have run. The engine's
// heartbeat alone would push the lease a whole lease past the extension.
type deadlineStore struct {
	dedup.Store
	clock dedup.Clock

	mu        sync.Mutex
	deadlines map[string]time.Time // claim token -> invocation deadline
}

type deadlineKey struct{}

func withDeadline(ctx context.Context, deadline time.Time) context.Context {
	return context.WithValue(ctx, deadlineKey{}, deadline)
}

func (s *deadlineStore) Claim(ctx context.Context, key, fingerprint string, lease time.Duration) (dedup.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, key, fingerprint, lease)
	deadline, ok := ctx.Value(deadlineKey{}).(time.Time)
	if err != nil || !ok || res.Outcome != dedup.Acquired {
		return res, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	for token, d := range s.deadlines {
		// A claim completed inside its handler (HandlerClaim.MarkCompleted)
		// never comes back through Complete or Release.
		if d.Before(now) {
			delete(s.deadlines, token)
		}
	}
	s.deadlines[res.Claim.Token] = deadline
	return res, nil
}

// Extend pushes the lease to now+lease, or to the invocation's deadline if
// that comes first; past the deadline it leaves the lease to end there.
func (s *deadlineStore) Extend(ctx context.Context, claim dedup.Claim, lease time.Duration) error {
	s.mu.Lock()
	deadline, ok := s.deadlines[claim.Token]
	s.mu.Unlock()
	if ok {
		left := deadline.Sub(s.clock.Now())
		if left <= 0 {
			return nil
		}
		lease = min(lease, left)
	}
	return s.Store.Extend(ctx, claim, lease)
}

// Complete forgets the claim once it is over: completed, or lost. After
// another error the engine retries, and heartbeats go on meanwhile.
func (s *deadlineStore) Complete(ctx context.Context, claim dedup.Claim, result []byte, retention time.Duration) error {
	err := s.Store.Complete(ctx, claim, result, retention)
	if err == nil || errors.Is(err, dedup.ErrClaimLost) {
		s.forget(claim)
	}
	return err
}

func (s *deadlineStore) Release(ctx context.Context, claim dedup.Claim) error {
	err := s.Store.Release(ctx, claim)
	s.forget(claim)
	return err
}

func (s *deadlineStore) forget(claim dedup.Claim) {
	s.mu.Lock()
	delete(s.deadlines, claim.Token)
	s.mu.Unlock()
}

// wallClock is the wall clock, when Dedup.Clock is nil: the adapter reads
// the time left in the invocation with it.
type wallClock struct{}

func (wallClock) Now() time.Time                       { return time.Now() }
func (wallClock) NewTimer(d time.Duration) dedup.Timer { return wallTimer{time.NewTimer(d)} }
func (wallClock) AfterFunc(d time.Duration, f func()) dedup.Timer {
	return wallTimer{time.AfterFunc(d, f)}
}

type wallTimer struct{ t *time.Timer }

func (t wallTimer) C() <-chan time.Time { return t.t.C }
func (t wallTimer) Stop() bool          { return t.t.Stop() }
