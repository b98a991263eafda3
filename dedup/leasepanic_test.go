package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// errExtendBug is what panickingExtendStore's Extend panics with.
var errExtendBug = errors.New("store bug: nil map in Extend")

// panickingExtendStore is the memory store whose Extend panics (a store
// bug), with an error or, with value set, with that value.
type panickingExtendStore struct {
	*memory.Store
	value any
	calls atomic.Int32
}

func (s *panickingExtendStore) Extend(context.Context, dedup.Claim, time.Duration) error {
	s.calls.Add(1)
	if s.value != nil {
		panic(s.value)
	}
	panic(errExtendBug)
}

// untilCancelled is work that runs until its context ends, and returns the
// cause.
func untilCancelled(ctx context.Context) ([]byte, error) {
	<-ctx.Done()
	return nil, context.Cause(ctx)
}

// runToTheDeadline runs the work of a claim of lease 30s with heartbeat
// 10s (deadline at 29s) on clock while two heartbeats and the deadline
// pass, a timer at a time, and returns what Do returned. reported says
// how many extensions the engine has reported so far (their store_error
// decisions): the deadline's timer, armed while an extension is in
// flight, is due when the one armed after it is.
func runToTheDeadline(t *testing.T, e *dedup.Engine, clock *fakeclock.Clock, work func(context.Context) ([]byte, error), reported func() int) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), dedup.Call{Scope: "s", Key: "k"}, work)
		done <- err
	}()
	for i, at := range []time.Duration{10 * time.Second, 20 * time.Second, 29 * time.Second} {
		for reported() < i { // the previous extension was reported
			if ctx.Err() != nil {
				t.Fatalf("extension %d was never reported", i)
			}
			runtime.Gosched()
		}
		if err := clock.WaitForTimerAt(ctx, epoch.Add(at)); err != nil {
			t.Fatal(err)
		}
		clock.Advance(epoch.Add(at).Sub(clock.Now()))
	}
	// The lease's end (30s), where claim_lost is decided: the work (see
	// untilLost) outlasts it.
	if err := clock.WaitForTimerAt(ctx, epoch.Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	clock.Advance(epoch.Add(30 * time.Second).Sub(clock.Now()))
	return recv(t, "Do to return", done)
}

// untilLost is work that runs until its context ends, and then until lost
// reports that claim_lost was decided (within a minute), and returns the
// context's cause: work that outlasts its lease.
func untilLost(lost func() bool) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		<-ctx.Done()
		for end := time.Now().Add(time.Minute); !lost() && time.Now().Before(end); {
			runtime.Gosched()
		}
		return nil, context.Cause(ctx)
	}
}

// TestPanickingExtendIsAStoreError: Store.Extend runs on the lease's
// timer goroutine, where no Watermill Recoverer catches a panic; a panic
// there is an extension that failed (a store_error whose *StoreError
// carries the panic value, errors.Is-matchable when it is an error), and
// the lease still ends at its deadline: the work is cancelled with
// ErrClaimLost. (The panic crashed the process.)
func TestPanickingExtendIsAStoreError(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value any
	}{
		{"error", nil},
		{"string", "store: extend"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := fakeclock.New(epoch)
			store := &panickingExtendStore{Store: memstore.New(clock), value: tc.value}
			obs := newDecisions()
			e, err := dedup.NewEngine(dedup.Config{Store: store, Clock: clock, Lease: 30 * time.Second, Heartbeat: 10 * time.Second, Observer: obs})
			if err != nil {
				t.Fatal(err)
			}
			lost := func() bool { return len(obs.of(event.ClaimLost)) > 0 }
			err = runToTheDeadline(t, e, clock, untilLost(lost), func() int { return len(obs.of(event.StoreError)) })
			if !errors.Is(err, dedup.ErrClaimLost) {
				t.Errorf("Do = %v; want the work cancelled with ErrClaimLost at the lease deadline", err)
			}
			if n := store.calls.Load(); n != 2 {
				t.Errorf("%d extensions sent, want 2 (one per heartbeat before the deadline)", n)
			}
			storeErrors := obs.of(event.StoreError)
			if len(storeErrors) != 2 {
				t.Errorf("%d store_error decisions, want 2 (one per panicking extension)", len(storeErrors))
			}
			for _, d := range storeErrors {
				var se *dedup.StoreError
				if d.Op != "extend" || !errors.As(d.Err, &se) || se.Op != "extend" {
					t.Errorf("store_error op %q: %v; want op extend with a *StoreError of op extend", d.Op, d.Err)
				}
				// The *StoreError's Err carries the panic value and the
				// stack where it was recovered.
				if se != nil && (se.Err == nil || !strings.Contains(se.Err.Error(), "Store.Extend panicked") || !strings.Contains(se.Err.Error(), "storeExtend")) {
					t.Errorf("store_error %v: its Err does not carry the panic and its stack", d.Err)
				}
				if se != nil && tc.value != nil && !strings.Contains(se.Err.Error(), fmt.Sprint(tc.value)) {
					t.Errorf("store_error %v does not carry the panic value %v", d.Err, tc.value)
				}
				if tc.value == nil && !errors.Is(d.Err, errExtendBug) {
					t.Errorf("store_error %v does not match the error Extend panicked with", d.Err)
				}
			}
			// One of the lease's end (op extend); then the release finds the
			// claim lost too (op release), the call's outcome.
			if lost := obs.of(event.ClaimLost); len(lost) != 2 || lost[0].Op != "extend" || lost[1].Op != "release" {
				t.Errorf("claim_lost decisions %v; want one of op extend, then one of op release", lost)
			}
		})
	}
}

// panickingObserver records decisions and panics on those of the lease
// (op extend) and on the extensions' store operations.
type panickingObserver struct {
	decisions
	mu      sync.Mutex
	entered map[string]int // decision event or "op:extend": calls
}

func (o *panickingObserver) ObserveDecision(d dedup.Decision) {
	o.decisions.ObserveDecision(d)
	if d.Op == "extend" {
		o.count(string(d.Event))
		panic("observer: " + string(d.Event))
	}
}

func (o *panickingObserver) ObserveStoreOp(op string, _ time.Duration, _ error) {
	if op == "extend" {
		o.count("op:extend")
		panic("observer: store op extend")
	}
}

func (o *panickingObserver) count(what string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.entered[what]++
}

// failingExtendStore is the memory store whose Extend fails (unreachable).
type failingExtendStore struct{ *memory.Store }

func (failingExtendStore) Extend(context.Context, dedup.Claim, time.Duration) error {
	return errNetwork
}

// TestObserverPanicOnTheLeaseGoroutine: the Observer is told of the
// lease's extensions and decisions on the lease's timer goroutine, where
// no Watermill Recoverer catches a panic. A panicking Observer must not
// crash the process nor change the lease: extensions that succeed keep
// the claim past the first deadline, extensions that fail let the
// deadline cancel the work; and the Observer is not told of its own
// panic. (The panic crashed the process.)
func TestObserverPanicOnTheLeaseGoroutine(t *testing.T) {
	const lease, heartbeat = 30 * time.Second, 10 * time.Second
	t.Run("extensions succeed", func(t *testing.T) {
		clock := fakeclock.New(epoch)
		obs := &panickingObserver{entered: map[string]int{}}
		e, err := dedup.NewEngine(dedup.Config{Store: memstore.New(clock), Clock: clock, Lease: lease, Heartbeat: heartbeat, Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		workGo, done := doHeld(e, true)
		// Four heartbeats: the first lease's deadline (29s) passes.
		for i := 1; i <= 4; i++ {
			next := epoch.Add(time.Duration(i) * heartbeat)
			if err := clock.WaitForTimerAt(ctx, next); err != nil {
				t.Fatalf("heartbeat %d: %v", i, err)
			}
			clock.Advance(next.Sub(clock.Now()))
		}
		if err := clock.WaitForTimerAt(ctx, epoch.Add(5*heartbeat)); err != nil {
			t.Fatalf("the fifth heartbeat: %v", err)
		}
		res, err := e.Do(context.Background(), dedup.Call{Scope: "s", Key: "k"}, untilCancelled)
		if !errors.Is(err, dedup.ErrInProgress) {
			t.Errorf("a copy at %v: %v, %v; want ErrInProgress (the extensions hold the claim)", clock.Now().Sub(epoch), res.Outcome, err)
		}
		close(workGo)
		if err := recv(t, "Do to return", done); err != nil {
			t.Errorf("Do = %v; want success (the extensions held the claim)", err)
		}
		obs.mu.Lock()
		defer obs.mu.Unlock()
		if n := obs.entered["op:extend"]; n != 4 {
			t.Errorf("ObserveStoreOp(extend) called %d times, want 4", n)
		}
		if n := len(obs.of(event.StoreError)) + len(obs.of(event.ClaimLost)); n != 0 {
			t.Errorf("%d store_error or claim_lost decisions, want none (the Observer is not told of its own panic)", n)
		}
	})
	t.Run("extensions fail", func(t *testing.T) {
		clock := fakeclock.New(epoch)
		obs := &panickingObserver{entered: map[string]int{}}
		e, err := dedup.NewEngine(dedup.Config{Store: failingExtendStore{memstore.New(clock)}, Clock: clock, Lease: lease, Heartbeat: heartbeat, Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		entered := func(what string) int {
			obs.mu.Lock()
			defer obs.mu.Unlock()
			return obs.entered[what]
		}
		lost := func() bool { return entered(string(event.ClaimLost)) > 0 }
		err = runToTheDeadline(t, e, clock, untilLost(lost), func() int { return entered(string(event.StoreError)) })
		if !errors.Is(err, dedup.ErrClaimLost) {
			t.Errorf("Do = %v; want the work cancelled with ErrClaimLost at the lease deadline", err)
		}
		obs.mu.Lock()
		defer obs.mu.Unlock()
		want := map[string]int{"op:extend": 2, string(event.StoreError): 2, string(event.ClaimLost): 1}
		for what, n := range want {
			if obs.entered[what] != n {
				t.Errorf("Observer told of %s %d times, want %d", what, obs.entered[what], n)
			}
		}
		if len(obs.entered) != len(want) {
			t.Errorf("Observer told of %v; want %v only (not of its own panics)", obs.entered, want)
		}
	})
}
