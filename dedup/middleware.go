package dedup

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/internal/keys"
	"github.com/watermill-dedup/watermill-dedup/internal/replay"
)

// Deduplicator is the router middleware. Create it with New; it is safe for
// concurrent use by any number of handlers and routers. It takes the key out
// of each message and maps the Engine's outcomes to ack, nack and replay.
type Deduplicator struct {
	cfg    Config
	engine *Engine
}

// New validates config, applies its defaults and returns a Deduplicator. A
// configuration problem fails here, not on the first message: the error
// reports every problem at once (errors.Join), each saying what to change;
// a negative or unworkable duration matches ErrInvalidDuration.
func New(config Config) (*Deduplicator, error) {
	if err := config.validate(true); err != nil {
		return nil, err
	}
	config.setDefaults()
	e := newEngine(config)
	e.hint = routerRefusedHint
	return &Deduplicator{cfg: config, engine: e}, nil
}

// Middleware has the shape of Watermill's message.HandlerMiddleware. For each
// message it takes the key, claims it, and:
//
//   - Acquired: runs the handler while a heartbeat extends the lease. On
//     success it completes the record and returns the handler's messages
//     (ack). On error it releases the claim and returns the error (nack); on
//     panic it releases the claim and lets the panic continue.
//   - Duplicate: returns without calling the handler (ack), with the stored
//     output messages when Config.Replay is on.
//   - InProgress: returns ErrInProgress (nack: retry later; never acked).
//     With Config.InProgressWait it first waits for the holder: then a
//     duplicate (ack, replay), or the key is won and the handler runs.
//   - Conflict: returns ErrKeyReuse (permanent).
//   - no usable key or fingerprint (see Config.TakeKey): returns ErrNoKey or
//     ErrTransportKey (permanent); the store is not touched.
//   - store failure: returns a *StoreError (nack), unless Config.FailOpen.
//
// With Config.Shadow the handler runs for every message whatever the
// outcome (logged would_skip or would_reject where it would not have), and
// its messages and error are returned as they are.
//
// Cost: two store round trips per new message (claim, complete), one per
// duplicate, plus one per heartbeat interval while the handler runs.
func (d *Deduplicator) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		growStack()
		return d.handle(h, msg)
	}
}

// delivery is one message through the middleware: the engine's callRun
// and what the work needs, in one allocation (its work method is the
// handler call, with no closure).
type delivery struct {
	callRun
	d   *Deduplicator
	h   message.HandlerFunc
	msg *message.Message
	out []*message.Message
}

func (m *delivery) work(workCtx context.Context) ([]byte, error) {
	if hc, ok := HeldClaimFromContext(workCtx); ok {
		hc.replay = m.d.cfg.Replay
	}
	ctx := m.msg.Context()
	m.msg.SetContext(workCtx)
	defer m.msg.SetContext(ctx)
	var herr error
	m.out, herr = m.h(m.msg)
	if herr != nil || !m.d.cfg.Replay {
		return nil, herr
	}
	return replay.Encode(m.out), nil
}

// keyMissing refuses a message without a usable key or fingerprint (see
// refuse).
//
// With Config.Tracer the refusal is a call of its own, as Engine.Do's are:
// the Tracer starts it, sees the decision and ends it (with the handler, in
// shadow mode, as its child).
func (d *Deduplicator) keyMissing(h message.HandlerFunc, msg *message.Message, call *Call, key string, err error) ([]*message.Message, error) {
	dec := Decision{Event: keyEvent(err), Key: key, Err: err}
	if d.engine.cfg.Tracer == nil {
		return d.refuse(h, msg, call, dec)
	}
	ctx := msg.Context()
	traceCtx, trace := d.engine.cfg.Tracer.StartCall(ctx, *call)
	if trace == nil {
		return d.refuse(h, msg, call, dec)
	}
	call.trace = trace
	msg.SetContext(traceCtx)
	defer msg.SetContext(ctx)
	ended := false
	defer func() {
		if !ended {
			trace.EndCall(ClaimResult{}, errWorkPanicked)
		}
	}()
	out, err := d.refuse(h, msg, call, dec)
	ended = true
	trace.EndCall(ClaimResult{}, err)
	return out, err
}

// traced runs the delivery through Engine.Do, whose Tracer starts the
// call.
func (m *delivery) traced(ctx context.Context) (ClaimResult, error) {
	return m.d.engine.Do(ctx, m.callRun.call, m.work)
}

func (d *Deduplicator) handle(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	ctx := msg.Context()
	m := &delivery{d: d, h: h, msg: msg}
	m.callRun.e = d.engine
	call := &m.callRun.call
	call.Scope = d.cfg.Scope
	call.Handler = message.HandlerNameFromCtx(ctx)
	call.Topic = message.SubscribeTopicFromCtx(ctx)
	call.MessageUUID = msg.UUID
	if call.Scope == "" {
		call.Scope = call.Handler
	}
	if err := d.cfg.TakeKey(call, msg); err != nil {
		key := "" // the record, when only the fingerprint failed
		if call.Key != "" {
			key = keys.Scoped(call.Scope, call.Key)
		}
		return d.keyMissing(h, msg, call, key, err)
	}

	var res ClaimResult
	var err error
	if d.engine.cfg.Tracer != nil {
		res, err = m.traced(ctx)
	} else {
		res, err = m.callRun.do(ctx, m)
	}
	if err != nil || res.Outcome != Duplicate {
		return m.out, err
	}
	if !d.cfg.Replay || len(res.Result) == 0 {
		return nil, nil
	}
	replayed, err := replay.Decode(res.Result)
	if err != nil {
		return nil, fmt.Errorf("%w: replaying %q: %v", ErrCorruptResult, keys.Scoped(call.Scope, call.Key), err)
	}
	return replayed, nil
}
