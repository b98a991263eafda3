package dedup_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// hungStore is a store whose Extend never answers: it blocks until its
// context ends, as a request sent on a network link that stopped carrying
// data does. Every other operation goes to the inner store.
type hungStore struct {
	dedup.Store
	mu      sync.Mutex
	extends int
	sent    chan struct{} // receives one value per Extend sent
}

func (s *hungStore) Extend(ctx context.Context, _ dedup.Claim, _ time.Duration) error {
	s.mu.Lock()
	s.extends++
	s.mu.Unlock()
	select {
	case s.sent <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

// TestHandlerCancelledAtLeaseDeadline: consumer A is cut off from the store
// (its Extend requests hang) while consumer B reaches it. A's handler
// context must be cancelled at the lease deadline less the margin
// (min(Lease/10, 1s)), on the clock the middleware is given, and therefore
// before B can take the key over at the end of the lease: two handlers of
// one key never run at the same time. The clock is fake and the only time
// source; StoreTimeout is a minute, so a hung Extend ends on its own only
// long after the test gave up.
//
// Before the lease engine (commit 9525892), the end of the lease was only
// checked after an Extend returned, so A's context stayed live while the
// Extend hung (up to StoreTimeout) and past B's takeover.
func TestHandlerCancelledAtLeaseDeadline(t *testing.T) {
	t.Run("heartbeat-at-deadline", func(t *testing.T) {
		// The configuration of issue 13: lease 1s, heartbeat 900ms, margin
		// 100ms. The deadline would come before any extension is sent: the
		// configuration is refused.
		_, err := dedup.New(dedup.Config{Store: memstore.New(nil), Key: keyfuncs.JSON("order_id"), Lease: time.Second, Heartbeat: 900 * time.Millisecond})
		if !errors.Is(err, dedup.ErrInvalidDuration) {
			t.Fatalf("Heartbeat 900ms with Lease 1s: %v, want ErrInvalidDuration", err)
		}
	})
	t.Run("no-heartbeat", func(t *testing.T) {
		// Without the heartbeat the deadline comes with no extension sent.
		runLeaseDeadline(t, time.Second, 0)
	})
	t.Run("extension-in-flight-short", func(t *testing.T) {
		// Lease 1s, heartbeat 300ms: the extension sent at 300ms hangs; the
		// deadline (900ms) falls while it is in flight. The Extend's own
		// bound (the deadline, 600ms of wall time here) ends it.
		runLeaseDeadline(t, time.Second, 300*time.Millisecond)
	})
	t.Run("extension-in-flight", func(t *testing.T) {
		// Lease 1 min, heartbeat 20s, margin 1s: the extension sent at 20s
		// hangs; the deadline (59s) falls while it is in flight.
		runLeaseDeadline(t, time.Minute, 20*time.Second)
	})
}

func runLeaseDeadline(t *testing.T, lease, heartbeat time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const patience = 10 * time.Second // real time for goroutines to run; not a clock
	clock := fakeclock.New(epoch)
	mem := memstore.New(clock)
	hung := &hungStore{Store: mem, sent: make(chan struct{}, 16)}
	margin := min(lease/10, time.Second)
	deadline := lease - margin

	dA := newDedup(t, dedup.Config{Store: hung, Clock: clock, Lease: lease, Heartbeat: heartbeat, DisableHeartbeat: heartbeat == 0, StoreTimeout: time.Minute})
	dB := newDedup(t, dedup.Config{Store: mem, Clock: clock, Lease: lease, Heartbeat: heartbeat, DisableHeartbeat: heartbeat == 0, StoreTimeout: time.Minute})
	if heartbeat == 0 {
		heartbeat = lease // no extension is ever sent
	}

	type cancellation struct {
		at    time.Duration // on the fake clock, since the claim
		cause error
	}
	started := make(chan struct{})
	cancelledA := make(chan cancellation, 1)
	doneA := runHandler(dA.Middleware(func(m *message.Message) ([]*message.Message, error) {
		close(started)
		<-m.Context().Done()
		cancelledA <- cancellation{at: clock.Now().Sub(epoch), cause: context.Cause(m.Context())}
		return nil, context.Cause(m.Context())
	}), order("ORDER-1"))
	recv(t, "A's handler to start", started)

	// Up to just before the deadline: the heartbeat may send extensions
	// (they hang), the handler keeps running.
	// Once an extension hangs, nothing else is pending: time just moves.
	hanging := false
	for now := time.Duration(0); now < deadline-time.Millisecond; {
		if !hanging {
			if err := clock.WaitForTimers(ctx, 1); err != nil {
				t.Fatalf("waiting for the heartbeat's timer at %v: %v", now, err)
			}
		}
		step := min(heartbeat, deadline-time.Millisecond-now)
		clock.Advance(step)
		now += step
		if now%heartbeat == 0 && !hanging {
			select { // let the extension start hanging before time moves on
			case <-hung.sent:
				hanging = true
			case <-time.After(patience):
				t.Fatalf("no extension sent at %v (heartbeat %v)", now, heartbeat)
			}
		}
	}
	select {
	case c := <-cancelledA:
		t.Fatalf("A's handler cancelled at %v, before the deadline %v (cause %v)", c.at, deadline, c.cause)
	default:
	}

	// The deadline.
	clock.Advance(time.Millisecond)
	var c cancellation
	select {
	case c = <-cancelledA:
	case <-time.After(patience):
		hung.mu.Lock()
		n := hung.extends
		hung.mu.Unlock()
		t.Fatalf("A's handler context still live %v (real time) after the clock reached the deadline %v of its %v lease "+
			"(%d extensions sent, all hung): it would overlap B's takeover at %v", patience, deadline, lease, n, lease)
	}
	if c.at != deadline {
		t.Errorf("A's handler cancelled at %v, want at the deadline %v (lease %v less margin %v)", c.at, deadline, lease, margin)
	}
	if !errors.Is(c.cause, dedup.ErrClaimLost) {
		t.Errorf("A's handler context: cause %v, want ErrClaimLost", c.cause)
	}
	if err := recv(t, "consumer A to return", doneA); !errors.Is(err, dedup.ErrClaimLost) {
		t.Errorf("consumer A returned %v, want its handler's ErrClaimLost (nack)", err)
	}

	// The end of the lease: B takes the key over, after A stopped.
	clock.Advance(margin)
	var effectsB int
	if _, err := dB.Middleware(func(*message.Message) ([]*message.Message, error) {
		effectsB++
		return nil, nil
	})(order("ORDER-1")); err != nil || effectsB != 1 {
		t.Fatalf("consumer B at the end of A's lease: err %v, handler ran %d times; want the key taken over", err, effectsB)
	}
	t.Logf("lease %v, heartbeat %v: A cancelled at %v (fake clock), B acquired at %v", lease, heartbeat, c.at, lease)
}
