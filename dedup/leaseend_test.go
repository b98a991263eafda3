package dedup_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// endedTrace is a Tracer of one call that records whether a decision
// reached the call's CallTrace after EndCall (after Do returned).
type endedTrace struct {
	mu    sync.Mutex
	ended chan struct{}    // closed by EndCall
	lost  chan struct{}    // closed by the first claim_lost
	late  []dedup.Decision // decisions after EndCall

	lostOnce sync.Once
}

func (t *endedTrace) StartCall(ctx context.Context, _ dedup.Call) (context.Context, dedup.CallTrace) {
	return ctx, t
}

func (t *endedTrace) ObserveDecision(d dedup.Decision) {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-t.ended:
		t.late = append(t.late, d)
	default:
	}
	if d.Event == event.ClaimLost {
		t.lostOnce.Do(func() { close(t.lost) })
	}
}

func (t *endedTrace) ObserveStoreOp(string, time.Duration, error) {}

func (t *endedTrace) EndCall(dedup.ClaimResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	close(t.ended)
}

// blockingObserver blocks the goroutine that decides the first claim_lost
// until proceed is closed (the Observer is told before the CallTrace).
type blockingObserver struct {
	once    sync.Once
	entered chan struct{}
	proceed chan struct{}
}

func (o *blockingObserver) ObserveDecision(d dedup.Decision) {
	if d.Event == event.ClaimLost {
		o.once.Do(func() {
			close(o.entered)
			<-o.proceed
		})
	}
}

func (o *blockingObserver) ObserveStoreOp(string, time.Duration, error) {}

// hangingExtendStore is the memory store whose Extend signals that it was
// sent and waits for its context to end (a store cut off).
type hangingExtendStore struct {
	*memory.Store
	sent chan struct{}
}

func (s *hangingExtendStore) Extend(ctx context.Context, _ dedup.Claim, _ time.Duration) error {
	s.sent <- struct{}{}
	<-ctx.Done()
	return ctx.Err()
}

// stopWaiting reports whether a goroutine is parked in the lease keeper's
// stop, waiting for the keeper's goroutines to end.
func stopWaiting() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "[sync.WaitGroup.Wait") && strings.Contains(g, "dedup.(*leaseKeeper).stop") {
			return true
		}
	}
	return false
}

// waitDoReturnedOrStopWaiting waits until ended is closed (Do returned)
// or a goroutine waits in the lease keeper's stop.
func waitDoReturnedOrStopWaiting(ctx context.Context, t *testing.T, ended <-chan struct{}) {
	t.Helper()
	for {
		select {
		case <-ended:
			return
		default:
		}
		if stopWaiting() {
			return
		}
		if ctx.Err() != nil {
			t.Fatal("Do neither returned nor waited for the lease keeper")
		}
		runtime.Gosched()
	}
}

// TestNoDecisionAfterDoReturned: the lease deadline's claim_lost is
// decided on a timer goroutine; once Do has returned, it must have reached
// the Observer and the CallTrace, or never reach them. (expire ran outside
// the keeper's WaitGroup, both when the heartbeat timer found the deadline
// passed and from the deadline's own timer armed while an extension was
// in flight: stop did not wait for it, and a claim_lost reached the
// CallTrace after EndCall, a span event after the span ended.)
//
// The Observer holds the claim_lost while the work ends; it is let go
// once Do has returned (the bug) or is seen waiting in stop (the fix).
func TestNoDecisionAfterDoReturned(t *testing.T) {
	const lease, heartbeat = 30 * time.Second, 10 * time.Second // deadline at 29s
	for _, tc := range []struct {
		name      string
		heartbeat bool
	}{
		{"deadline timer", false},              // the only timer is the deadline
		{"deadline during an extension", true}, // the deadline's own timer, the extension hung
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			clock := fakeclock.New(epoch)
			store := &hangingExtendStore{Store: memstore.New(clock), sent: make(chan struct{}, 1)}
			obs := &blockingObserver{entered: make(chan struct{}), proceed: make(chan struct{})}
			trace := &endedTrace{ended: make(chan struct{}), lost: make(chan struct{})}
			cfg := dedup.Config{Store: store, Clock: clock, Lease: lease, Heartbeat: heartbeat, Observer: obs, Tracer: trace}
			if !tc.heartbeat {
				cfg.Heartbeat, cfg.DisableHeartbeat = 0, true
			}
			e, err := dedup.NewEngine(cfg)
			if err != nil {
				t.Fatal(err)
			}
			workGo, done := doHeld(e, false)
			if err := clock.WaitForTimers(ctx, 1); err != nil {
				t.Fatal(err)
			}
			if tc.heartbeat {
				clock.Advance(heartbeat)
				recv(t, "the extension to be sent", store.sent)
				// The deadline's own timer, armed before the extension was sent.
				if err := clock.WaitForTimerAt(ctx, epoch.Add(lease-deadlineMarginOf(lease))); err != nil {
					t.Fatal(err)
				}
				clock.Advance(lease - deadlineMarginOf(lease) - heartbeat)
			} else {
				clock.Advance(lease - deadlineMarginOf(lease))
			}
			// The deadline cancels the work; claim_lost is decided at the
			// lease's end, a margin later, on a timer of its own.
			if err := clock.WaitForTimerAt(ctx, epoch.Add(lease)); err != nil {
				t.Fatal(err)
			}
			clock.Advance(deadlineMarginOf(lease))
			recv(t, "the lease end's claim_lost to reach the Observer", obs.entered)
			close(workGo) // the work ends (it ignores its context), Do completes
			waitDoReturnedOrStopWaiting(ctx, t, trace.ended)
			close(obs.proceed)
			if err := recv(t, "Do to return", done); err != nil {
				t.Logf("Do: %v", err)
			}
			recv(t, "the claim_lost to reach the CallTrace", trace.lost)
			trace.mu.Lock()
			defer trace.mu.Unlock()
			for _, d := range trace.late {
				t.Errorf("%s (op %q) reached the CallTrace after Do returned: %v", d.Event, d.Op, d.Err)
			}
		})
	}
}
