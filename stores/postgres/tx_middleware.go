package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

// ErrNoClaim is dedup.ErrNoClaim: TxMiddleware got a message without a
// dedup claim in its context (it was added before, that is outside, the
// dedup middleware), or RunInTx was called outside the work of
// dedup.Engine.Do. A run the engine marks as unclaimed (dedup.Config.Shadow,
// or Config.FailOpen while the store could not be reached) is not refused:
// see RunInTx. Nothing was written.
var ErrNoClaim = dedup.ErrNoClaim

// ErrNestedTx is dedup.ErrNestedTx: RunInTx (or TxMiddleware) was called
// for a claim whose RunInTx still runs, as when a helper that opens its own
// RunInTx is called from a handler TxMiddleware already wraps, or after a
// RunInTx of the claim completed the record. Its work did not run and no
// transaction was begun. The enclosing RunInTx goes on: if its work returns
// the error, it rolls back and the claim is released; if it swallows it,
// its own writes commit with the completion. Write through the transaction
// already open instead: call RunInTx only when TxFromContext finds none.
var ErrNestedTx = dedup.ErrNestedTx

type txKey struct{}

// TxFromContext returns the transaction TxMiddleware began for the current
// message. Do the handler's business writes through it: they are committed
// together with the key's completion, or not at all. The handler must not
// commit or roll it back itself.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// TxMiddleware is a Watermill middleware that commits the handler's business
// writes and the completion of its dedup key in one database transaction:
// the strongest guarantee this library offers, with no window between the
// effect and its record. Add it after the dedup middleware (the first
// middleware added is the outermost), with this Store as the dedup
// middleware's store:
//
//	router.AddMiddleware(deduplicator.Middleware, store.TxMiddleware)
//
// For each message it begins a transaction (Config.TxOptions), puts it in
// the message's context (see TxFromContext) and runs the handler. Then:
//
//   - handler ok: in the same transaction, the token-checked completion
//     UPDATE (the result is the handler's output when the dedup middleware
//     replays, as with Store.Complete), then COMMIT, then
//     marks the claim completed so the dedup middleware does not complete
//     again. If the claim was lost meanwhile (lease ended and taken over,
//     or released), the completion matches no row: the business writes are
//     rolled back and the error wraps dedup.ErrClaimLost.
//   - handler error or panic: ROLLBACK, and the error or panic goes on; the
//     dedup middleware then releases the key so a redelivery runs again.
//   - the process dies before COMMIT: the server rolls back; nothing is
//     recorded, and the key is claimable again when its lease ends.
//   - COMMIT fails or its outcome is unknown (connection lost): the error
//     is returned. Either both the writes and the completion were
//     committed (the dedup middleware's release then finds the record
//     completed and changes nothing; a redelivery is a duplicate) or
//     neither was (the release frees the key; a redelivery runs again).
//
// A message without a dedup claim fails with ErrNoClaim before any write,
// unless dedup.Config.Shadow runs it without one (see RunInTx). A RunInTx
// the handler calls for the message fails with ErrNestedTx: write through
// the middleware's transaction.
// Cost: the transaction holds one pooled connection while the handler runs
// (size the pool for the handlers running at once plus the dedup store's own
// claims and heartbeats), and adds BEGIN, the completion UPDATE and COMMIT:
// three round trips, replacing the dedup middleware's separate Complete.
func (s *Store) TxMiddleware(h message.HandlerFunc) message.HandlerFunc {
	return storekit.TxMiddleware(h, s.RunInTx)
}

// RunInTx runs work in a database transaction that also completes the
// record of the claim work runs under, so that work's writes and the
// completed record commit together or not at all. Call it inside the work
// given to dedup.Engine.Do (its context carries the claim); httpdedup calls
// it through Config.InTransaction, TxMiddleware through its handler. work
// finds the transaction with TxFromContext and must not commit or roll it
// back.
//
//   - work returns nil: in the same transaction, the token-checked
//     completion UPDATE stores the bytes work returned as the record's
//     result (for replay), with completed_at and, for httpdedup, the
//     response status; then COMMIT, and the claim is marked completed so
//     that the engine does not complete it again. RunInTx returns work's
//     bytes.
//   - work returns an error or panics: ROLLBACK; the error (or panic) goes
//     on, and the engine releases the claim so that a retry runs again.
//   - the claim was lost meanwhile (lease ended and taken over): the
//     completion matches no row, everything is rolled back, and the error
//     wraps dedup.ErrClaimLost.
//   - the process dies before COMMIT: the server rolls back; the record
//     stays in progress until its lease ends, then a retry runs once.
//   - COMMIT fails or its outcome is unknown: the error is returned; either
//     both were committed (the engine's release then finds the record
//     completed and changes nothing) or neither (the release frees it).
//   - called inside a RunInTx of the same claim (a helper that opens its
//     own, called from a handler TxMiddleware wraps), or after one
//     completed the record: ErrNestedTx before any transaction begins.
//     The enclosing RunInTx then commits its own writes with the
//     completion, or rolls them back if its work returns the error.
//
// A context without a claim fails with ErrNoClaim before anything is
// written, except a run the engine marks as unclaimed (dedup.Config.Shadow
// runs a copy that dedup would have skipped or refused without a claim;
// Shadow or Config.FailOpen run any copy without one while the store
// cannot be reached): work then runs in a transaction that
// commits its writes, and nothing is completed, as without the
// middleware; its error rolls them back. Cost: the transaction holds one pooled connection while work
// runs, and adds BEGIN, the completion UPDATE and COMMIT (three round
// trips), replacing the engine's separate Complete. The completion and
// COMMIT (or ROLLBACK) run within Config.FinishTimeout even if ctx was
// cancelled meanwhile.
func (s *Store) RunInTx(ctx context.Context, work func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	return storekit.RunInTx(ctx, s.cfg.FinishTimeout, s.beginTx, work)
}

// beginTx begins the transaction of a RunInTx (storekit.RunInTx).
func (s *Store) beginTx(ctx context.Context, _ *dedup.Claim) (context.Context, storekit.Tx, error) {
	tx, err := s.db.BeginTx(ctx, s.cfg.TxOptions)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: begin: %w", err)
	}
	return context.WithValue(ctx, txKey{}, tx), txRun{s: s, tx: tx}, nil
}

// txRun ends the transaction of a RunInTx for storekit.RunInTx.
type txRun struct {
	s  *Store
	tx pgx.Tx
}

// Complete runs the completion UPDATE and COMMIT: the UPDATE holds the
// record's row lock after checking the token and the lease on the
// server's clock, so a claim that wants to take the record over waits for
// the COMMIT and then finds it completed.
func (r txRun) Complete(ctx context.Context, claim dedup.Claim, result []byte, retention time.Duration) (bool, error) {
	if err := r.s.complete(ctx, r.tx, claim, result, retention, "complete in transaction"); err != nil {
		if errors.Is(err, dedup.ErrClaimLost) {
			return false, fmt.Errorf("business writes rolled back: %w", err)
		}
		return false, err
	}
	if err := r.tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("postgres: commit: %w", err)
	}
	return true, nil
}

func (r txRun) Commit(ctx context.Context) error {
	if err := r.tx.Commit(ctx); err != nil {
		return fmt.Errorf("postgres: commit: %w", err)
	}
	return nil
}

// Abort rolls the transaction back. An error here means the connection is
// gone or broken; pgx then closes it and the server rolls the transaction
// back on its own.
func (r txRun) Abort(ctx context.Context) { _ = r.tx.Rollback(ctx) }
