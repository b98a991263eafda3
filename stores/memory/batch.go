package memory

import (
	"context"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

var _ dedup.BatchStore = (*Store)(nil)

// ClaimBatch implements [dedup.BatchStore.ClaimBatch]: every record is
// claimed as Claim claims it, in request order, under one acquisition of
// the store's mutex (one clock reading for the batch). A record with a
// lease ≤ 0 gets ErrInvalidDuration; a cancelled ctx fails every record
// and claims none.
func (s *Store) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.ClaimResult, []error) {
	res, errs := make([]dedup.ClaimResult, len(reqs)), make([]error, len(reqs))
	if len(reqs) == 0 {
		return res, errs
	}
	if err := ctx.Err(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return res, errs
	}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range reqs {
		if errs[i] = storekit.CheckDuration("lease", r.Lease); errs[i] == nil {
			res[i] = s.claimLocked(r.Key, r.Fingerprint, r.Lease, r.Origin, now)
		}
	}
	return res, errs
}

// CompleteBatch implements [dedup.BatchStore.CompleteBatch]: every record
// is completed as Complete completes it, under one acquisition of the
// store's mutex; the response status of the dedup.RecordDetails ctx
// carries, if any, goes with every record.
func (s *Store) CompleteBatch(ctx context.Context, reqs []dedup.CompleteRequest) []error {
	errs := make([]error, len(reqs))
	if len(reqs) == 0 {
		return errs
	}
	if err := ctx.Err(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	status := responseStatus(ctx)
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range reqs {
		if errs[i] = storekit.CheckDuration("retention", r.Retention); errs[i] == nil {
			errs[i] = s.completeLocked(r.Claim, r.Result, r.Retention, status, now)
		}
	}
	return errs
}

// ReleaseBatch implements [dedup.BatchStore.ReleaseBatch]: every claim is
// released as Release releases it, under one acquisition of the store's
// mutex.
func (s *Store) ReleaseBatch(ctx context.Context, claims []dedup.Claim) []error {
	errs := make([]error, len(claims))
	if len(claims) == 0 {
		return errs
	}
	if err := ctx.Err(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, c := range claims {
		errs[i] = s.releaseLocked(c, now)
	}
	return errs
}
