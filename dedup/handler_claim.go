package dedup

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// HandlerClaim is the claim under which a handler runs. The middleware puts
// it in the message's context before calling the handler; read it with
// ClaimFromContext. Stores that can commit the handler's business writes
// together with the completion (stores/postgres) use it to complete the
// record inside the handler's own transaction and then call MarkCompleted,
// so that no window remains between the effect and its record.
type HandlerClaim struct {
	// Claim is the ownership of the key.
	Claim Claim
	// Retention is what Complete must be given.
	Retention time.Duration
	// Replay tells whether the handler's output messages are stored.
	Replay bool

	completed     atomic.Bool
	stopHeartbeat func()
}

type handlerClaimKey struct{}

// ClaimFromContext returns the claim the current handler runs under, if the
// handler was called by a Deduplicator after winning the claim.
func ClaimFromContext(ctx context.Context) (*HandlerClaim, bool) {
	hc, ok := ctx.Value(handlerClaimKey{}).(*HandlerClaim)
	return hc, ok
}

// Result returns what Complete must store for the handler's output messages:
// their encoding when Replay is on, nil otherwise.
func (hc *HandlerClaim) Result(out []*message.Message) []byte {
	if !hc.Replay {
		return nil
	}
	return EncodeMessages(out)
}

// MarkCompleted tells the middleware that the record was completed (with
// Store.Complete semantics) as part of the handler's own work, so it must not
// call Complete again. Call it only after the completion is durable (after
// the commit).
func (hc *HandlerClaim) MarkCompleted() { hc.completed.Store(true) }

// StopHeartbeat stops the lease extensions of this claim and waits until no
// extension is in flight. A store that completes the record inside the
// handler calls it just before completing, so that an extension queued
// behind the completion cannot report the claim lost afterwards (and cancel
// the handler's context after the fact). The lease then runs its normal
// course: the completion must happen within it. Safe to call more than once.
func (hc *HandlerClaim) StopHeartbeat() {
	if hc.stopHeartbeat != nil {
		hc.stopHeartbeat()
	}
}

// Completed reports whether MarkCompleted was called.
func (hc *HandlerClaim) Completed() bool { return hc.completed.Load() }
