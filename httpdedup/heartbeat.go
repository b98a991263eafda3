package httpdedup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// heartbeat extends a claim's lease while its handler runs, like the
// message middleware's: every Config.Heartbeat, one Extend.
type heartbeat struct {
	quit chan struct{}
	done chan struct{}
	once sync.Once
}

func (hb *heartbeat) stop() {
	if hb == nil {
		return
	}
	hb.once.Do(func() { close(hb.quit) })
	<-hb.done
}

func (m *Middleware) startHeartbeat(ctx context.Context, claim dedup.Claim, info requestInfo, claimedAt time.Time, cancelHandler context.CancelCauseFunc) *heartbeat {
	if m.cfg.DisableHeartbeat {
		return nil
	}
	hb := &heartbeat{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(hb.done)
		// The lease certainly holds until leaseEnd: it is measured from
		// before the request that set it.
		leaseEnd := claimedAt.Add(m.cfg.Lease)
		for {
			if !sleep(m.cfg.Clock, m.cfg.Heartbeat, hb.quit) {
				return
			}
			sent := m.cfg.Clock.Now()
			ectx, cancel := m.cleanupContext(ctx)
			start := time.Now()
			err := m.cfg.Store.Extend(ectx, claim, m.cfg.Lease)
			m.observeOp("extend", time.Since(start), err)
			cancel()
			switch {
			case err == nil:
				leaseEnd = sent.Add(m.cfg.Lease)
			case errors.Is(err, dedup.ErrClaimLost):
				err = fmt.Errorf("extending the lease of %q: %w", claim.Key, err)
				m.decide(info, dedup.Decision{Event: dedup.EventClaimLost, Op: "extend", Key: claim.Key, Elapsed: sent.Sub(claimedAt), Err: err})
				cancelHandler(err)
				return
			default:
				m.decide(info, dedup.Decision{Event: dedup.EventStoreError, Op: "extend", Key: claim.Key, Elapsed: sent.Sub(claimedAt),
					Err: &dedup.StoreError{Op: "extend", Key: claim.Key, Err: err}})
				if !m.cfg.Clock.Now().Before(leaseEnd) {
					err = fmt.Errorf("%w: the lease of %q ended while the store could not be reached", dedup.ErrClaimLost, claim.Key)
					cancelHandler(err)
					return
				}
			}
		}
	}()
	return hb
}

// sleep waits d on clock, or returns early with false when quit closes.
func sleep(clock dedup.Clock, d time.Duration, quit <-chan struct{}) bool {
	t := clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-quit:
		return false
	}
}
