package dedup_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// TestDeadlinePassedInAdmissionIsNoStoreFailure: a call whose Deadline
// passes while it waits for admission (MaxClaimsInFlight) is refused as a
// call whose Deadline had passed before it started is: with
// context.DeadlineExceeded, its work not run. Today the error goes through
// claimFailed: it is reported as a store_error decision (the store did not
// fail) wrapped in a *StoreError, and Config.FailOpen then runs the work
// unclaimed after the call's deadline (a Lambda invocation being cut off).
func TestDeadlinePassedInAdmissionIsNoStoreFailure(t *testing.T) {
	clock := fakeclock.New(epoch)
	s := &admissionStore{Store: memory.New(clock), entered: make(chan struct{}), release: make(chan struct{}), leases: make(chan time.Duration, 1)}
	obs := newDecisions()
	e, err := dedup.NewEngine(dedup.Config{Store: s, Clock: clock, MaxClaimsInFlight: 1, DisableHeartbeat: true, FailOpen: true, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), dedup.Call{Scope: "s", Key: "first"}, func(context.Context) ([]byte, error) { return nil, nil })
		first <- err
	}()
	recv(t, "the first claim to hold the only admission", s.entered)
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
	err = recv(t, "the second call", second)
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
	for _, d := range obs.of(dedup.EventStoreError) {
		t.Errorf("spurious store_error decision: %v", d.Err)
	}
	for _, d := range obs.of(dedup.EventFailOpen) {
		t.Errorf("spurious fail_open decision: %v", d.Err)
	}
}
