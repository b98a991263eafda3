package dedup

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup/event"
)

// runShadow runs fn without a claim for a call that dedup would have
// skipped or refused (Config.Shadow), after deciding dec as would_skip or
// would_reject. The record is not touched: nothing is completed or
// released, so the first copy's record and stored result stay as they are.
func (e *Engine) runShadow(ctx context.Context, call *Call, dec Decision,
	fn func(ctx context.Context) ([]byte, error)) (ClaimResult, error) {
	if dec.Outcome == Duplicate || dec.Outcome == InProgress {
		dec.Event = event.WouldSkip
	} else {
		dec.Event = event.WouldReject
	}
	e.report(call, dec)
	result, err := fn(withUnclaimedRun(ctx, dec.Outcome))
	return ClaimResult{Result: result}, err
}

// OutcomeFromContext tells a handler (or the work of Engine.Do) how dedup
// let it run, from its context:
//
//   - Acquired, true: it runs under a claim it won: a fresh run, whose
//     success is recorded (a retry after a failure or a takeover is one
//     too: the earlier run left no completed record).
//   - Duplicate or InProgress, true: Config.Shadow runs it although the key
//     was completed or held by another claim: without shadow it would have
//     been skipped. Count business metrics apart here (what Powertools
//     users ask for in java#1780).
//   - Conflict, true: Config.Shadow runs it although the key was recorded
//     with another fingerprint (it would have been refused).
//   - 0, false: not run by dedup, or run without a claim after a store
//     failure (FailOpen) or without a usable key (Shadow).
//
// A duplicate outside shadow mode never reaches the handler: count those
// with the skip_duplicate decision (Decision.Replayed tells a replay). The
// innermost call decides when engine calls nest. Cost: one context lookup.
func OutcomeFromContext(ctx context.Context) (Outcome, bool) {
	switch v := ctx.Value(heldKey{}).(type) {
	case unclaimedRun:
		return Outcome(v), v != 0
	case *HeldClaim:
		return Acquired, v != nil
	}
	return 0, false
}

// refuse decides dec (key_missing) for a message that cannot be claimed
// and returns its error; with Config.Shadow the handler runs anyway, logged
// would_reject.
func (d *Deduplicator) refuse(h message.HandlerFunc, msg *message.Message, call *Call, dec Decision) ([]*message.Message, error) {
	if !d.cfg.Shadow {
		d.engine.report(call, dec)
		return nil, dec.Err
	}
	dec.Event = event.WouldReject
	d.engine.report(call, dec)
	ctx := msg.Context()
	msg.SetContext(withUnclaimedRun(ctx, 0))
	defer msg.SetContext(ctx)
	return h(msg)
}
