package dedup

import (
	"context"
	"time"
)

// The optional capabilities of a Store. The Engine finds each by a type
// assertion on Config.Store, so that a store outside this module has one by
// having its methods; a store without one works, at the cost each says.
// BatchStore (batchstore.go) is one more. dedup/storetest checks each
// capability a store declares in its Features.

// KeyWatcher is the capability of a Store that wakes a copy waiting for a
// held key (Config.InProgressWait) as soon as the key's record may have
// changed, so that the copy claims again at once instead of at its next
// poll, and N waiting copies cost the store N claims per change of the
// record instead of N per pause. stores/redis (a publish from the
// completing and releasing scripts) and stores/postgres (NOTIFY) have it;
// dedup/storekit.WatchHub keeps the watches of a store that has one. A
// store without it is polled.
//
// A wake is never trusted for the outcome: it only makes the waiter claim
// again, and that claim decides. A store may wake a waiter for nothing (a
// forged or late announcement, a reconnection) and may fail to wake it (an
// announcement lost with a connection, a record changed by a process that
// does not announce, a lease that ended): the Engine keeps claiming every
// Config.InProgressFallback as the safety net.
type KeyWatcher interface {
	// WatchKey starts watching the record of key (the scoped key, as given
	// to Claim) and returns at once, without waiting for the store. Once
	// the watch is in place, wake receives a value (it is buffered; values
	// are coalesced) whenever a Complete or a Release of the key, by any
	// process, may have changed the record after since, a reading of
	// time.Now taken before the caller's last claim of the key was sent. A
	// watch that comes into place after since wakes the caller once, since
	// the store cannot tell what happened in between; so does a watch that
	// comes back after its connection was lost.
	//
	// wake is closed when the watch can no longer wake anyone (the store
	// was closed): the caller then polls. stop ends the watch and must be
	// called once the caller is done with it; it is idempotent and never
	// blocks on the store. An error means no watch: the caller polls.
	// Cost: no round trip of the caller's; a store should share one
	// subscription per key among every watch of the process.
	WatchKey(ctx context.Context, key string, since time.Time) (wake <-chan struct{}, stop func(), err error)
}

// ClaimAdmitter is the capability of a Store that admits more concurrent
// Claim requests than the Engine's default (16: Config.MaxClaimsInFlight)
// at no cost to Complete, Release and Extend. stores/redis has it with
// Config.AutoPipeline, whose batcher sends every command of the store in a
// bounded number of batches, so that a higher bound only makes the batches
// larger. An explicit Config.MaxClaimsInFlight always wins.
type ClaimAdmitter interface {
	// ClaimAdmission returns the number of Claim requests the Engine
	// admits at once when Config.MaxClaimsInFlight is zero; 0 or less:
	// the Engine's own default.
	ClaimAdmission() int
}

// claimAdmission is the admission default of store: its ClaimAdmission
// when it has the capability and says a positive number, else 0.
func claimAdmission(store Store) int {
	if s, ok := store.(ClaimAdmitter); ok {
		if n := s.ClaimAdmission(); n > 0 {
			return n
		}
	}
	return 0
}

// RecordDetails is what an entry point knows of the record it completes
// beyond what Store.Complete takes, for a store that keeps it in a
// readable form: the HTTP status of the response httpdedup stores, which
// stores/postgres writes into its response_status column. The entry point
// puts a *RecordDetails into the context it gives Engine.Do
// (WithRecordDetails) and fills it before its work returns; the Engine
// gives Store.Complete a context derived from that one, where the store
// reads it (RecordDetailsFromContext). Writing and reading happen one
// after the other, on the work's goroutine and then the completion's.
type RecordDetails struct {
	// ResponseStatus is the HTTP status of the stored response; 0 when
	// the record is not an HTTP response.
	ResponseStatus int
}

type recordDetailsKey struct{}

// WithRecordDetails returns ctx carrying d. Cost: one context.WithValue.
func WithRecordDetails(ctx context.Context, d *RecordDetails) context.Context {
	return context.WithValue(ctx, recordDetailsKey{}, d)
}

// RecordDetailsFromContext returns the RecordDetails ctx carries, if any.
func RecordDetailsFromContext(ctx context.Context) (*RecordDetails, bool) {
	d, ok := ctx.Value(recordDetailsKey{}).(*RecordDetails)
	return d, ok && d != nil
}
