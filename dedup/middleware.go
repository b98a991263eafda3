package dedup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Deduplicator is the router middleware. Create it with New; it is safe for
// concurrent use by any number of handlers and routers.
type Deduplicator struct {
	cfg Config
}

// New validates config, applies its defaults and returns a Deduplicator. A
// configuration problem fails here, not on the first message.
func New(config Config) (*Deduplicator, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config.setDefaults()
	return &Deduplicator{cfg: config}, nil
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
//   - Conflict: returns ErrKeyReuse (permanent).
//   - no usable key: returns ErrNoKey or ErrTransportKey (permanent); the
//     store is not touched.
//   - store failure: returns a *StoreError (nack), unless Config.FailOpen.
//
// Cost: two store round trips per new message (claim, complete), one per
// duplicate, plus one per heartbeat interval while the handler runs.
func (d *Deduplicator) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		return d.handle(h, msg)
	}
}

// messageInfo is what every decision about one message carries.
type messageInfo struct {
	handler, topic, uuid string
}

func (d *Deduplicator) decide(info messageInfo, dec Decision) {
	dec.Handler, dec.Topic, dec.MessageUUID = info.handler, info.topic, info.uuid
	dec.log(d.cfg.Logger)
	if d.cfg.Observer != nil {
		d.cfg.Observer.ObserveDecision(dec)
	}
}

func (d *Deduplicator) observeOp(op string, elapsed time.Duration, err error) {
	if d.cfg.Observer != nil {
		d.cfg.Observer.ObserveStoreOp(op, elapsed, err)
	}
}

func (d *Deduplicator) handle(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	ctx := msg.Context()
	info := messageInfo{
		handler: message.HandlerNameFromCtx(ctx),
		topic:   message.SubscribeTopicFromCtx(ctx),
		uuid:    msg.UUID,
	}

	key, err := d.businessKey(msg)
	if err != nil {
		d.decide(info, Decision{Event: EventKeyMissing, Err: err})
		return nil, err
	}
	scope := d.cfg.Scope
	if scope == "" {
		scope = info.handler
	}
	if scope == "" {
		return nil, ErrNoScope
	}
	scoped := ScopedKey(scope, key)

	fingerprint := ""
	if d.cfg.Fingerprint != nil {
		fingerprint, err = d.cfg.Fingerprint(msg)
		if err != nil {
			err = &KeyError{Field: "fingerprint", Reason: "fingerprint failed", MessageUUID: msg.UUID, Err: err}
			d.decide(info, Decision{Event: EventKeyMissing, Key: scoped, Err: err})
			return nil, err
		}
	}

	claimCtx, cancel := context.WithTimeout(ctx, d.cfg.StoreTimeout)
	// The lease certainly runs until claimedAt+Lease: the clock is read
	// before the request that sets it.
	claimedAt := d.cfg.Clock.Now()
	start := time.Now()
	res, err := d.cfg.Store.Claim(claimCtx, scoped, fingerprint, d.cfg.Lease)
	elapsed := time.Since(start)
	cancel()
	d.observeOp("claim", elapsed, err)
	if err != nil {
		err = &StoreError{Op: "claim", Key: scoped, Err: err}
		d.decide(info, Decision{Event: EventStoreError, Op: "claim", Key: scoped, Elapsed: elapsed, Err: err})
		if d.cfg.FailOpen {
			d.decide(info, Decision{Event: EventFailOpen, Op: "claim", Key: scoped, Err: err})
			return h(msg)
		}
		return nil, err
	}

	switch res.Outcome {
	case Acquired:
		d.decide(info, Decision{Event: EventClaimWon, Op: "claim", Key: scoped, Elapsed: elapsed})
		return d.run(h, msg, res.Claim, info, claimedAt)
	case Duplicate:
		d.decide(info, Decision{Event: EventSkipDuplicate, Op: "claim", Key: scoped, Elapsed: elapsed})
		if !d.cfg.Replay || len(res.Result) == 0 {
			return nil, nil
		}
		out, err := DecodeMessages(res.Result)
		if err != nil {
			return nil, fmt.Errorf("replaying %q: %w", scoped, err)
		}
		return out, nil
	case InProgress:
		err := fmt.Errorf("%w: %q", ErrInProgress, scoped)
		d.decide(info, Decision{Event: EventInProgress, Op: "claim", Key: scoped, Elapsed: elapsed, Err: err})
		return nil, err
	case Conflict:
		err := fmt.Errorf("%w: %q", ErrKeyReuse, scoped)
		d.decide(info, Decision{Event: EventKeyReuse, Op: "claim", Key: scoped, Elapsed: elapsed, Err: err})
		return nil, err
	default:
		err := &StoreError{Op: "claim", Key: scoped, Err: fmt.Errorf("unknown outcome %v", res.Outcome)}
		d.decide(info, Decision{Event: EventStoreError, Op: "claim", Key: scoped, Err: err})
		return nil, err
	}
}

// businessKey runs the key function and refuses keys that cannot identify a
// business fact. A panicking key function counts as a malformed message.
func (d *Deduplicator) businessKey(msg *message.Message) (key string, err error) {
	defer func() {
		if p := recover(); p != nil {
			key, err = "", &KeyError{Reason: fmt.Sprintf("key function panicked: %v", p), MessageUUID: msg.UUID}
		}
	}()
	key, err = d.cfg.Key(msg)
	if err != nil {
		if !errors.Is(err, ErrNoKey) && !errors.Is(err, ErrTransportKey) {
			err = &KeyError{Reason: "key function failed", MessageUUID: msg.UUID, Err: err}
		}
		return "", err
	}
	switch {
	case strings.TrimFunc(key, unicode.IsSpace) == "":
		return "", &KeyError{Reason: "empty or blank key", MessageUUID: msg.UUID}
	case !utf8.ValidString(key):
		return "", &KeyError{Reason: "key is not valid UTF-8", MessageUUID: msg.UUID}
	case len(key) > d.cfg.MaxKeyLength:
		return "", &KeyError{Reason: fmt.Sprintf("key is %d bytes, longer than MaxKeyLength %d", len(key), d.cfg.MaxKeyLength), MessageUUID: msg.UUID}
	case key == msg.UUID:
		return "", fmt.Errorf("%w: key %q is the message UUID; take the key from the business payload", ErrTransportKey, key)
	}
	return key, nil
}

// cleanupContext is for Complete, Release and Extend: they must run even when
// the message's context was cancelled, but never hang.
func (d *Deduplicator) cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d.cfg.StoreTimeout)
}

func (d *Deduplicator) run(h message.HandlerFunc, msg *message.Message, claim Claim, info messageInfo, claimedAt time.Time) ([]*message.Message, error) {
	ctx := msg.Context()
	hc := &HandlerClaim{Claim: claim, Retention: d.cfg.Retention, Replay: d.cfg.Replay}
	handlerCtx, cancelHandler := context.WithCancelCause(context.WithValue(ctx, handlerClaimKey{}, hc))
	msg.SetContext(handlerCtx)
	defer func() {
		cancelHandler(nil)
		msg.SetContext(ctx)
	}()

	var hb *Heartbeat
	if !d.cfg.DisableHeartbeat {
		hb = StartHeartbeat(ctx, HeartbeatConfig{
			Store: d.cfg.Store, Claim: claim, Lease: d.cfg.Lease, Interval: d.cfg.Heartbeat,
			ClaimedAt: claimedAt, Clock: d.cfg.Clock, StoreTimeout: d.cfg.StoreTimeout,
			Lost:      cancelHandler,
			Decide:    func(dec Decision) { d.decide(info, dec) },
			ObserveOp: d.observeOp,
		})
	}
	hc.stopHeartbeat = hb.Stop

	panicked := true
	defer func() {
		if !panicked {
			return
		}
		// The panic (or runtime.Goexit) goes on after this function returns;
		// the claim is released first so that a redelivery can run again.
		hb.Stop()
		d.release(ctx, claim, info, claimedAt, errors.New("handler panicked"))
	}()
	out, herr := h(msg)
	panicked = false
	hb.Stop()

	if herr != nil {
		d.release(ctx, claim, info, claimedAt, herr)
		return out, herr
	}

	if hc.Completed() {
		d.decide(info, Decision{Event: EventCompleted, Op: "complete", Key: claim.Key, Elapsed: d.cfg.Clock.Now().Sub(claimedAt)})
		return out, nil
	}
	d.complete(ctx, claim, info, claimedAt, hc.Result(out))
	return out, nil
}

func (d *Deduplicator) release(ctx context.Context, claim Claim, info messageInfo, claimedAt time.Time, cause error) {
	rctx, cancel := d.cleanupContext(ctx)
	defer cancel()
	start := time.Now()
	err := d.cfg.Store.Release(rctx, claim)
	d.observeOp("release", time.Since(start), err)
	elapsed := d.cfg.Clock.Now().Sub(claimedAt)
	switch {
	case err == nil:
		d.decide(info, Decision{Event: EventReleased, Op: "release", Key: claim.Key, Elapsed: elapsed, Err: cause})
	case errors.Is(err, ErrClaimLost):
		d.decide(info, Decision{Event: EventClaimLost, Op: "release", Key: claim.Key, Elapsed: elapsed,
			Err: fmt.Errorf("releasing after handler failure (%v): %w", cause, err)})
	default:
		// The record stays in progress until its lease ends; redeliveries
		// get ErrInProgress until then, and are retried.
		d.decide(info, Decision{Event: EventStoreError, Op: "release", Key: claim.Key, Elapsed: elapsed,
			Err: &StoreError{Op: "release", Key: claim.Key, Err: err}})
	}
}

func (d *Deduplicator) complete(ctx context.Context, claim Claim, info messageInfo, claimedAt time.Time, result []byte) {
	var err error
	backoff := d.cfg.CompleteBackoff
	for attempt := 0; ; attempt++ {
		cctx, cancel := d.cleanupContext(ctx)
		start := time.Now()
		err = d.cfg.Store.Complete(cctx, claim, result, d.cfg.Retention)
		d.observeOp("complete", time.Since(start), err)
		cancel()
		if errors.Is(err, ErrResultTooLarge) && result != nil {
			// Record the effect without its output rather than leave the
			// key in progress (which would run the effect again after the
			// lease): the replay is lost, the exactly-once effect is not.
			d.decide(info, Decision{Event: EventStoreError, Op: "complete", Key: claim.Key,
				Err: fmt.Errorf("storing the handler's output for replay (%d bytes); completing without it: %w", len(result), err)})
			result = nil
			continue
		}
		if err == nil || errors.Is(err, ErrClaimLost) || errors.Is(err, ErrInvalidDuration) || attempt >= d.cfg.CompleteRetries {
			break
		}
		sleep(d.cfg.Clock, backoff, nil)
		backoff *= 2
	}
	elapsed := d.cfg.Clock.Now().Sub(claimedAt)
	switch {
	case err == nil || errors.Is(err, ErrAlreadyCompleted):
		// ErrAlreadyCompleted: an earlier attempt whose reply was lost
		// completed the record with this claim.
		d.decide(info, Decision{Event: EventCompleted, Op: "complete", Key: claim.Key, Elapsed: elapsed})
	case errors.Is(err, ErrClaimLost):
		d.decide(info, Decision{Event: EventClaimLost, Op: "complete", Key: claim.Key, Elapsed: elapsed,
			Err: fmt.Errorf("the effect ran but the record was taken over before completing: %w", err)})
	default:
		// Acked anyway: the record stays in progress until its lease ends,
		// then a redelivery (if any) would run the effect again.
		d.decide(info, Decision{Event: EventStoreError, Op: "complete", Key: claim.Key, Elapsed: elapsed,
			Err: &StoreError{Op: "complete", Key: claim.Key, Err: err}})
	}
}

// PayloadFingerprint is a FingerprintFunc: the hex SHA-256 of the payload.
// Metadata is not included (brokers add their own attributes to each copy).
func PayloadFingerprint(msg *message.Message) (string, error) {
	sum := sha256.Sum256(msg.Payload)
	return hex.EncodeToString(sum[:]), nil
}
