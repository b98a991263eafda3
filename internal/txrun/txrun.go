// Package txrun is the Watermill side of the stores' "effect in the
// store's own transaction" helpers (stores/postgres, stores/dynamo and
// stores/redis TxMiddleware): it runs a handler as the work of the store's
// RunInTx, so the three middlewares share one shape.
package txrun

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/internal/claimctx"
	"github.com/watermill-dedup/watermill-dedup/internal/replay"
)

// RunInTx is a store's RunInTx: it runs work and completes the claim's
// record in the same atomic step as work's writes.
type RunInTx func(ctx context.Context, work func(ctx context.Context) ([]byte, error)) ([]byte, error)

// Middleware runs h inside run: the message's context is the one run gives
// the work (with the store's transaction in it) while h runs, and the
// message's own again after. The work's result is h's output messages,
// encoded for replay when the dedup middleware replays
// (dedup.Config.Replay), else nil. h's output is returned only when run
// succeeds.
func Middleware(h message.HandlerFunc, run RunInTx) message.HandlerFunc {
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
			if hc, ok := claimctx.From(ctx); ok && hc.Replay {
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
