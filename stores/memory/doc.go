// Package memory is a [dedup.Store] in process memory, for tests, examples
// and single-process consumers:
//
//	store, err := memory.New(ctx, memory.Config{}) // never fails; Config.Clock for a fake clock
//
// It deduplicates only within one process and forgets everything on
// restart; see [Store].
//
// It is also the worked example of a store built on the root module's
// exported API only (docs/custom-store.md): it imports dedup, dedup/admin
// and dedup/storekit, nothing internal, and has every capability the
// network stores offer:
//
//   - the operator's view (admin.Interface, admin.AbandonedLister), with
//     who and when (the Origin of the first claim, read with
//     dedup.OriginFromContext) and the response status of an httpdedup
//     record (dedup.RecordDetailsFromContext, admin.Record.ResponseStatus);
//   - batches (dedup.BatchStore: one acquisition of its mutex per batch);
//   - waking waiters (dedup.KeyWatcher: WatchKey; Close ends the watches);
//   - the effect in the work's own transaction (RunInTx, TxMiddleware, on a
//     key-value space of its own: TxFromContext, Get), built on
//     dedup/storekit.RunInTx.
//
// It does not implement dedup.ClaimAdmitter: a claim is a map operation
// under a mutex, which more concurrent claims would not make cheaper, so
// the engine's default admission bound (dedup.Config.MaxClaimsInFlight)
// stays.
package memory

import "github.com/watermill-dedup/watermill-dedup/dedup"

var _ dedup.Store = (*Store)(nil)
