package dedup_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// admissionStore blocks the claim of key "first" until release is closed,
// and reports the lease of every claim.
type admissionStore struct {
	dedup.Store
	entered chan struct{}
	release chan struct{}
	leases  chan time.Duration
}

func (s *admissionStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	if key == "s:first" {
		close(s.entered)
		<-s.release
	} else {
		s.leases <- lease
	}
	return s.Store.Claim(ctx, key, fp, lease)
}

// holdAdmission makes an engine of cfg (MaxClaimsInFlight 1, no
// heartbeat) on an admissionStore and starts a call of key "first" whose
// claim holds the only admission until s.release is closed; first
// receives that call's error.
func holdAdmission(t *testing.T, clock *fakeclock.Clock, cfg dedup.Config) (s *admissionStore, e *dedup.Engine, first chan error) {
	t.Helper()
	s = &admissionStore{Store: memstore.New(clock), entered: make(chan struct{}), release: make(chan struct{}), leases: make(chan time.Duration, 1)}
	cfg.Store, cfg.Clock, cfg.MaxClaimsInFlight, cfg.DisableHeartbeat = s, clock, 1, true
	e, err := dedup.NewEngine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	first = make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), dedup.Call{Scope: "s", Key: "first"}, func(context.Context) ([]byte, error) { return nil, nil })
		first <- err
	}()
	recv(t, "the first claim to hold the only admission", s.entered)
	return s, e, first
}

// doneSignal is a context that tells when something first waits on it:
// the engine's admission does (select on Done).
type doneSignal struct {
	context.Context
	asked chan struct{}
	once  sync.Once
}

func (c *doneSignal) Done() <-chan struct{} {
	c.once.Do(func() { close(c.asked) })
	return c.Context.Done()
}

// TestLeaseCutToTheDeadlineAfterAdmission: a call with a Deadline that
// waits for admission (MaxClaimsInFlight) sends a lease that ends at its
// Deadline, not one computed before the wait, which reached past it by the
// time waited.
func TestLeaseCutToTheDeadlineAfterAdmission(t *testing.T) {
	clock := fakeclock.New(time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC))
	s, e, first := holdAdmission(t, clock, dedup.Config{Lease: 30 * time.Second})
	second := make(chan error, 1)
	deadline := clock.Now().Add(10 * time.Second)
	ctx := &doneSignal{Context: context.Background(), asked: make(chan struct{})}
	go func() {
		_, err := e.Do(ctx, dedup.Call{Scope: "s", Key: "second", Deadline: deadline}, func(context.Context) ([]byte, error) { return nil, nil })
		second <- err
	}()
	// The second call waits for admission; the clock moves 4 s meanwhile.
	recv(t, "the second call to wait for admission", ctx.asked)
	clock.Advance(4 * time.Second)
	close(s.release)
	if err := recv(t, "the first call", first); err != nil {
		t.Fatal(err)
	}
	lease := recv(t, "the second claim's lease", s.leases)
	if err := recv(t, "the second call", second); err != nil {
		t.Fatal(err)
	}
	if want := deadline.Sub(clock.Now()); lease != want {
		t.Fatalf("the second claim's lease is %v, want %v: it must end at the call's Deadline", lease, want)
	}
}

// TestDeadlinePassedInAdmissionIsNoStoreFailure: a call whose Deadline
// passes while it waits for admission (MaxClaimsInFlight) is refused as a
// call whose Deadline had passed before it started is: with
// context.DeadlineExceeded, its work not run. (It was reported as a
// store_error decision, the store having not failed, wrapped in a
// *StoreError, and Config.FailOpen then ran the work unclaimed after the
// call's deadline, as a Lambda invocation is being cut off.)
func TestDeadlinePassedInAdmissionIsNoStoreFailure(t *testing.T) {
	clock := fakeclock.New(epoch)
	obs := newDecisions()
	s, e, first := holdAdmission(t, clock, dedup.Config{FailOpen: true, Observer: obs})
	var ran atomic.Bool
	second := make(chan error, 1)
	ctx := &doneSignal{Context: context.Background(), asked: make(chan struct{})}
	go func() {
		_, err := e.Do(ctx, dedup.Call{Scope: "s", Key: "second", Deadline: clock.Now().Add(10 * time.Second)}, func(context.Context) ([]byte, error) {
			ran.Store(true)
			return nil, nil
		})
		second <- err
	}()
	recv(t, "the second call to wait for admission", ctx.asked)
	clock.Advance(11 * time.Second) // past the second call's Deadline
	close(s.release)
	if err := recv(t, "the first call", first); err != nil {
		t.Fatal(err)
	}
	err := recv(t, "the second call", second)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("second call: %v, want context.DeadlineExceeded", err)
	}
	if ran.Load() {
		t.Errorf("the second call's work ran after its Deadline (FailOpen took the passed deadline for a store failure)")
	}
	var se *dedup.StoreError
	if errors.As(err, &se) {
		t.Errorf("second call: a *StoreError (%v), but the store did not fail", err)
	}
	for _, d := range obs.of(event.StoreError) {
		t.Errorf("spurious store_error decision: %v", d.Err)
	}
	for _, d := range obs.of(event.FailOpen) {
		t.Errorf("spurious fail_open decision: %v", d.Err)
	}
}
