package storekit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/replay"
)

// Tx is one transaction of a store's RunInTx: the writes the work made
// through it, held until RunInTx ends them one of three ways. A store
// supplies it from the begin function it gives RunInTx; the rest of the
// sequence is RunInTx's.
type Tx interface {
	// Complete writes the work's writes and the completion of claim (as
	// the store's Complete would: result, retention) in one atomic step,
	// and only if the store still holds claim in progress under its token;
	// otherwise it writes nothing and returns an error wrapping
	// dedup.ErrClaimLost. It reports whether the record was completed:
	// also with an error when the completion was written but a write of
	// the work was refused after it (Redis runs the rest of a script).
	Complete(ctx context.Context, claim dedup.Claim, result []byte, retention time.Duration) (completed bool, err error)
	// Commit writes the work's writes alone, completing nothing: the work
	// ran without a claim (dedup.RunsUnclaimed).
	Commit(ctx context.Context) error
	// Abort drops the work's writes: the work failed or panicked, or
	// Complete failed without completing.
	Abort(ctx context.Context)
}

// RunInTx is the sequence every store's RunInTx shares, written once:
// work runs in a transaction the store opens (begin), and its writes are
// committed in the same atomic step as the completion of the claim the
// context carries (Tx.Complete), only if the claim is still held, so that
// no window remains between the effect and its record.
//
//   - ctx carries no claim of the Engine and is not an unclaimed run:
//     dedup.ErrNoClaim, before anything begins.
//   - a transaction of the same claim is open, or completed the record:
//     dedup.ErrNestedTx, before anything begins.
//   - the claim's retention is not positive: dedup.ErrInvalidDuration,
//     before anything begins.
//   - begin fails: its error, nothing began.
//   - work returns an error or panics: Tx.Abort, and the error (or panic)
//     goes on; the Engine then releases the claim.
//   - the claim was lost while work ran (the Engine cancelled work's
//     context with dedup.ErrClaimLost): Tx.Abort, and that cause is
//     returned, without a request the store would refuse anyway.
//   - otherwise the claim's heartbeat is stopped (no extension may find
//     the record completed afterwards and report it lost) and Tx.Complete
//     runs; the record completed, the claim is marked completed
//     (dedup.HeldClaim.MarkCompleted), so that the Engine does not
//     complete it again. Complete's error is returned (after Tx.Abort when
//     it did not complete).
//   - an unclaimed run (dedup.RunsUnclaimed: Config.Shadow or FailOpen
//     ran the work without a claim): work runs in the transaction and
//     Tx.Commit writes its writes alone.
//
// begin gets the claim to be completed (nil for an unclaimed run) and
// returns the context work runs with (carrying the store's transaction,
// for the store's TxFromContext) and the Tx. Tx.Complete, Commit and
// Abort run within finish even if ctx was cancelled meanwhile.
func RunInTx(ctx context.Context, finish time.Duration, begin func(ctx context.Context, claim *dedup.Claim) (context.Context, Tx, error),
	work func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	held, claimed := dedup.HeldClaimFromContext(ctx)
	if !claimed && !dedup.RunsUnclaimed(ctx) {
		return nil, dedup.ErrNoClaim
	}
	var claim *dedup.Claim
	if claimed {
		if err := CheckDuration("retention", held.Retention()); err != nil {
			return nil, err
		}
		c := held.Claim()
		claim = &c
		if !held.BeginTx() {
			return nil, dedup.ErrNestedTx
		}
		defer held.EndTx()
	}
	txCtx, tx, err := begin(ctx, claim)
	if err != nil {
		return nil, err
	}
	finished := false
	defer func() {
		if !finished { // work panicked (or called runtime.Goexit)
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finish)
			defer cancel()
			tx.Abort(fctx)
		}
	}()
	result, err := work(txCtx)
	finished = true
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finish)
	defer cancel()
	if err != nil {
		tx.Abort(fctx)
		return nil, err
	}
	if !claimed {
		return result, tx.Commit(fctx)
	}
	if cause := context.Cause(ctx); errors.Is(cause, dedup.ErrClaimLost) {
		tx.Abort(fctx)
		return nil, fmt.Errorf("the work's writes were not written: %w", cause)
	}
	held.StopHeartbeat()
	completed, err := tx.Complete(fctx, *claim, result, held.Retention())
	if completed {
		held.MarkCompleted()
	}
	if err != nil {
		if !completed {
			tx.Abort(fctx)
		}
		return nil, err
	}
	return result, nil
}

// TxMiddleware is the Watermill side of a store's RunInTx (the store's own
// TxMiddleware is TxMiddleware(h, store.RunInTx)): it runs h as the work
// of run, with the message's context the work's (carrying the store's
// transaction) while h runs, and the message's own again after. The
// work's result is h's output messages, encoded for replay when the dedup
// middleware replays (Config.Replay), else nil. h's output is returned
// only when run succeeds.
func TxMiddleware(h message.HandlerFunc, run func(ctx context.Context, work func(ctx context.Context) ([]byte, error)) ([]byte, error)) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		var out []*message.Message
		_, err := run(ctx, func(txCtx context.Context) ([]byte, error) {
			msg.SetContext(txCtx)
			defer msg.SetContext(ctx)
			var herr error
			out, herr = h(msg)
			if herr != nil {
				return nil, herr
			}
			if held, ok := dedup.HeldClaimFromContext(ctx); ok && held.Replay() {
				return replay.Encode(out), nil
			}
			return nil, nil
		})
		if err != nil {
			return nil, err
		}
		return out, nil
	}
}
