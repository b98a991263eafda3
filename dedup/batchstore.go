package dedup

import (
	"context"
	"time"
)

// ClaimRequest is one record of [BatchStore.ClaimBatch]: the arguments of
// [Store.Claim] and the Origin its context would carry.
type ClaimRequest struct {
	// Key is the scoped key, as Store.Claim takes it.
	Key string
	// Fingerprint, when not empty, is compared as Store.Claim compares it.
	Fingerprint string
	// Lease is the claim's lease; zero or less is ErrInvalidDuration for
	// this record.
	Lease time.Duration
	// Origin is kept with a record this claim creates, as the Origin a
	// single claim reads with OriginFromContext. Already cleaned.
	Origin Origin
}

// CompleteRequest is one record of [BatchStore.CompleteBatch]: the
// arguments of [Store.Complete].
type CompleteRequest struct {
	Claim     Claim
	Result    []byte
	Retention time.Duration
}

// BatchStore is the optional batch capability of a [Store]: the claims,
// completions and releases of many records sent together, in the fewest
// round trips the server allows. Each record is exactly as atomic as its
// single operation and gets the answer the single operation would have
// given, in request order: the same key twice in one ClaimBatch is claimed
// as if the two claims ran one after the other (the second finds the
// first's record). The Engine uses it for Engine.DoBatch; a store without
// it is called once per record.
//
// Every method returns one entry per request, in request order (the
// results' length is the requests'). A store failure may end a batch
// part-way: the records it reached have their answer, every other record
// an error that is neither ErrClaimLost nor ErrInvalidDuration (the caller
// does not know whether it took effect, as with a single operation whose
// reply was lost: a claim then holds the record until its lease ends).
// An empty batch makes no request. dedup/storetest's RunBatch checks
// these promises.
type BatchStore interface {
	Store
	// ClaimBatch claims every record, each as Store.Claim does, and
	// returns each record's result and error.
	ClaimBatch(ctx context.Context, reqs []ClaimRequest) ([]ClaimResult, []error)
	// CompleteBatch completes every record, each as Store.Complete does.
	CompleteBatch(ctx context.Context, reqs []CompleteRequest) []error
	// ReleaseBatch releases every claim, each as Store.Release does.
	ReleaseBatch(ctx context.Context, claims []Claim) []error
}
