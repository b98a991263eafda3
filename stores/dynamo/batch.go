package dynamo

import (
	"context"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

var _ dedup.BatchStore = (*Store)(nil)

// BatchConcurrency is how many requests the batch methods keep in flight
// at once. DynamoDB has no batch write with a condition per item
// (BatchWriteItem takes none; TransactWriteItems fails every item when one
// condition fails), so a batch is a set of single conditional writes sent
// concurrently: a batch of n new keys takes about n/BatchConcurrency round
// trips of time, and n write requests.
const BatchConcurrency = 32

// ClaimBatch implements [dedup.BatchStore.ClaimBatch]: every record is
// claimed with Claim's own conditional PutItem (and, for a record found no
// longer live, its takeover write), up to BatchConcurrency at once, each
// keeping its request's Origin; a key named twice is claimed the second
// time after the first claim returned. A throttled or failed request fails
// only its record.
func (s *Store) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.ClaimResult, []error) {
	res, errs := make([]dedup.ClaimResult, len(reqs)), make([]error, len(reqs))
	keys := make([]string, len(reqs))
	for i, r := range reqs {
		keys[i] = r.Key
	}
	storekit.EachInKeyOrder(keys, BatchConcurrency, func(i int) {
		r := reqs[i]
		res[i], errs[i] = s.Claim(dedup.WithOrigin(ctx, r.Origin), r.Key, r.Fingerprint, r.Lease)
	})
	return res, errs
}

// CompleteBatch implements [dedup.BatchStore.CompleteBatch]: Complete's
// conditional UpdateItem for every record, up to BatchConcurrency at once.
func (s *Store) CompleteBatch(ctx context.Context, reqs []dedup.CompleteRequest) []error {
	errs := make([]error, len(reqs))
	keys := make([]string, len(reqs))
	for i, r := range reqs {
		keys[i] = r.Claim.Key
	}
	storekit.EachInKeyOrder(keys, BatchConcurrency, func(i int) {
		errs[i] = s.Complete(ctx, reqs[i].Claim, reqs[i].Result, reqs[i].Retention)
	})
	return errs
}

// ReleaseBatch implements [dedup.BatchStore.ReleaseBatch]: Release's
// conditional write for every claim, up to BatchConcurrency at once.
func (s *Store) ReleaseBatch(ctx context.Context, claims []dedup.Claim) []error {
	errs := make([]error, len(claims))
	keys := make([]string, len(claims))
	for i, c := range claims {
		keys[i] = c.Key
	}
	storekit.EachInKeyOrder(keys, BatchConcurrency, func(i int) {
		errs[i] = s.Release(ctx, claims[i])
	})
	return errs
}
