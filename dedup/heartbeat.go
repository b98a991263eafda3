package dedup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// HeartbeatConfig describes the lease extensions of one claim while its
// handler runs. The Deduplicator uses it, and so does any middleware built on
// a Store (httpdedup).
type HeartbeatConfig struct {
	// Store holds the claim. Required.
	Store Store
	// Claim is the claim to extend. Required.
	Claim Claim
	// Lease is what each Extend sets: the lease then ends Lease after it.
	// Required, > 0.
	Lease time.Duration
	// Interval is the time between extensions. Required, > 0 and < Lease.
	Interval time.Duration
	// ClaimedAt is the clock's reading before the request that set the
	// lease: the lease certainly holds until ClaimedAt+Lease.
	ClaimedAt time.Time
	// Clock drives the extensions. Defaults to the wall clock.
	Clock Clock
	// StoreTimeout bounds each Extend, which runs even after the context
	// given to StartHeartbeat is cancelled. Defaults to DefaultStoreTimeout.
	StoreTimeout time.Duration
	// Lost, when set, is called once when the claim is lost: an extension
	// found the record gone or owned by another claim, or the lease ended
	// without a successful extension (the store could not be reached). Its
	// argument wraps ErrClaimLost. No extension follows.
	Lost func(cause error)
	// Decide, when set, receives the claim_lost and store_error decisions
	// (Op "extend") for logging and metrics.
	Decide func(Decision)
	// ObserveOp, when set, receives each Extend's latency and error.
	ObserveOp func(op string, elapsed time.Duration, err error)
}

// Heartbeat extends a claim's lease every Interval until Stop. It is a chain
// of clock timers, not a goroutine: a handler shorter than the interval costs
// one timer, and a goroutine exists only while an extension runs. Each
// extension is one Store.Extend round trip.
type Heartbeat struct {
	cfg HeartbeatConfig
	ctx context.Context

	mu       sync.Mutex
	stopped  bool
	timer    Timer
	leaseEnd time.Time      // the lease certainly holds until then
	active   sync.WaitGroup // an extension in flight
}

// StartHeartbeat arms the first extension, Interval from now. ctx supplies
// the values of the store calls; its cancellation does not stop the
// heartbeat (call Stop).
func StartHeartbeat(ctx context.Context, cfg HeartbeatConfig) *Heartbeat {
	if cfg.Clock == nil {
		cfg.Clock = RealClock{}
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = DefaultStoreTimeout
	}
	hb := &Heartbeat{cfg: cfg, ctx: ctx, leaseEnd: cfg.ClaimedAt.Add(cfg.Lease)}
	hb.mu.Lock()
	hb.timer = cfg.Clock.AfterFunc(cfg.Interval, hb.tick)
	hb.mu.Unlock()
	return hb
}

// Stop prevents further extensions and waits until none is in flight. Safe to
// call more than once, and on a nil *Heartbeat (a disabled heartbeat).
func (hb *Heartbeat) Stop() {
	if hb == nil {
		return
	}
	hb.mu.Lock()
	hb.stopped = true
	if hb.timer != nil {
		hb.timer.Stop()
	}
	hb.mu.Unlock()
	hb.active.Wait()
}

// tick runs one extension and, unless the claim is lost or the heartbeat was
// stopped meanwhile, arms the next one.
func (hb *Heartbeat) tick() {
	hb.mu.Lock()
	if hb.stopped {
		hb.mu.Unlock()
		return
	}
	hb.active.Add(1) // under the lock: Stop cannot be waiting yet
	hb.mu.Unlock()
	defer hb.active.Done()

	if !hb.extend() {
		return
	}
	hb.mu.Lock()
	if !hb.stopped {
		hb.timer = hb.cfg.Clock.AfterFunc(hb.cfg.Interval, hb.tick)
	}
	hb.mu.Unlock()
}

// extend extends the lease once; it reports whether the claim is still held.
func (hb *Heartbeat) extend() bool {
	cfg, claim := hb.cfg, hb.cfg.Claim
	sent := cfg.Clock.Now()
	ectx, cancel := context.WithTimeout(context.WithoutCancel(hb.ctx), cfg.StoreTimeout)
	start := time.Now()
	err := cfg.Store.Extend(ectx, claim, cfg.Lease)
	cancel()
	if cfg.ObserveOp != nil {
		cfg.ObserveOp("extend", time.Since(start), err)
	}
	switch {
	case err == nil:
		hb.leaseEnd = sent.Add(cfg.Lease)
		return true
	case errors.Is(err, ErrClaimLost):
		err = fmt.Errorf("extending the lease of %q: %w", claim.Key, err)
		hb.decide(Decision{Event: EventClaimLost, Op: "extend", Key: claim.Key, Elapsed: sent.Sub(cfg.ClaimedAt), Err: err})
		hb.lost(err)
		return false
	default:
		hb.decide(Decision{Event: EventStoreError, Op: "extend", Key: claim.Key, Elapsed: sent.Sub(cfg.ClaimedAt),
			Err: &StoreError{Op: "extend", Key: claim.Key, Err: err}})
		if !cfg.Clock.Now().Before(hb.leaseEnd) {
			hb.lost(fmt.Errorf("%w: the lease of %q ended while the store could not be reached", ErrClaimLost, claim.Key))
			return false
		}
		return true
	}
}

func (hb *Heartbeat) decide(d Decision) {
	if hb.cfg.Decide != nil {
		hb.cfg.Decide(d)
	}
}

func (hb *Heartbeat) lost(cause error) {
	if hb.cfg.Lost != nil {
		hb.cfg.Lost(cause)
	}
}
