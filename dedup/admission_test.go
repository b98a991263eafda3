package dedup_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// gatedStore holds every Claim of the key "slow" until gate is closed.
type gatedStore struct {
	dedup.Store
	entered chan struct{}
	gate    chan struct{}
}

func (s *gatedStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	if key == admin.ScopedKey("charge", "slow") {
		close(s.entered)
		<-s.gate
	}
	return s.Store.Claim(ctx, key, fp, lease)
}

// waitingForAdmission reports whether a goroutine is inside the engine's claim
// but not in a store's Claim: waiting for an admission slot.
func waitingForAdmission() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "dedup.(*callRun).claim(") && !strings.Contains(g, "gatedStore") {
			return true
		}
	}
	return false
}

// TestLeaseStartsWhenTheClaimIsSent: a call that waits for admission
// (Config.MaxClaimsInFlight) longer than its lease gets a fresh lease from
// the store when its Claim is finally sent, so its work must not be
// cancelled as if the lease had started while it waited. Under a backlog of
// new messages (the case MaxClaimsInFlight is for), waits of seconds are
// normal.
func TestLeaseStartsWhenTheClaimIsSent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const lease = time.Minute
	clock := fakeclock.New(epoch)
	store := &gatedStore{Store: memstore.New(clock), entered: make(chan struct{}), gate: make(chan struct{})}
	e, err := dedup.NewEngine(dedup.Config{Store: store, Clock: clock, Lease: lease, MaxClaimsInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	slow := make(chan error, 1)
	go func() {
		_, err := e.Do(ctx, dedup.Call{Scope: "charge", Key: "slow"}, func(context.Context) ([]byte, error) { return nil, nil })
		slow <- err
	}()
	recv(t, "the first claim to take the admission slot", store.entered) // the one admission slot is taken

	type verdict struct {
		cancelled bool
		cause     error
	}
	got := make(chan verdict, 1)
	waiting := make(chan error, 1)
	go func() {
		_, err := e.Do(ctx, dedup.Call{Scope: "charge", Key: "waiting"}, func(work context.Context) ([]byte, error) {
			// The claim was just made: the lease keeper arms its first
			// timer (the heartbeat) in the future, unless it counts the
			// lease from before the wait and cancels at once.
			timers := make(chan error, 1)
			go func() { timers <- clock.WaitForTimers(work, 1) }()
			select {
			case <-work.Done():
				got <- verdict{true, context.Cause(work)}
			case <-timers:
				got <- verdict{work.Err() != nil, context.Cause(work)}
			}
			return nil, nil
		})
		waiting <- err
	}()
	// The second call waits for admission while more than its lease passes.
	for !waitingForAdmission() {
		if ctx.Err() != nil {
			t.Fatal("the second call never waited for admission")
		}
		runtime.Gosched()
	}
	clock.Advance(lease + 10*time.Second)
	close(store.gate)
	if err := recv(t, "the slow claim to return", slow); err != nil {
		t.Fatalf("first call: %v", err)
	}
	v := recv(t, "the waiting call's work to run", got)
	if err := recv(t, "the waiting call to return", waiting); err != nil {
		t.Fatalf("second call: %v", err)
	}
	if v.cancelled {
		t.Fatalf("the work of a claim acquired after waiting %v for admission was cancelled at once (cause %v): "+
			"its lease was counted from before the wait", lease+10*time.Second, v.cause)
	}
	if errors.Is(v.cause, dedup.ErrClaimLost) {
		t.Fatalf("cause %v", v.cause)
	}
}
