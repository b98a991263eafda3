package dedup_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// validConfig is a Config that New accepts, for the cases below to
// break one field at a time.
func validConfig() dedup.Config {
	return dedup.Config{Store: memstore.New(nil), Key: keyfuncs.JSON("id")}
}

// newErr is New's error for cfg: the configuration checks that New
// applies (NewEngine applies the same, less the key function).
func newErr(cfg dedup.Config) error {
	_, err := dedup.New(cfg)
	return err
}

// wantRefused checks that err matches ErrInvalidDuration and names every
// fragment (what to change).
func wantRefused(t *testing.T, err error, fragments ...string) {
	t.Helper()
	if !errors.Is(err, dedup.ErrInvalidDuration) {
		t.Fatalf("got %v, want an error matching ErrInvalidDuration", err)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error %q does not say %q", err, f)
		}
	}
}

// TestConfigRefusesRetentionShorterThanLease: a completed record would
// vanish before a crashed claim's lease could end (copies 20ms apart all
// ran the handler with Retention: 1ms). New and NewEngine
// refuse it; Retention equal to Lease is the least accepted.
func TestConfigRefusesRetentionShorterThanLease(t *testing.T) {
	cfg := validConfig()
	cfg.Lease, cfg.Retention = time.Minute, time.Second
	wantRefused(t, newErr(cfg), "Config.Retention (1s)", "Config.Lease (1m0s)")
	if _, err := dedup.New(cfg); !errors.Is(err, dedup.ErrInvalidDuration) {
		t.Errorf("New: %v", err)
	}
	if _, err := dedup.NewEngine(cfg); !errors.Is(err, dedup.ErrInvalidDuration) {
		t.Errorf("NewEngine: %v", err)
	}
	// The default retention (24h) against a longer lease.
	cfg = validConfig()
	cfg.Lease = 48 * time.Hour
	wantRefused(t, newErr(cfg), "Config.Retention")
	cfg.Lease, cfg.Retention = time.Minute, time.Minute
	if err := newErr(cfg); err != nil {
		t.Errorf("Retention == Lease: %v", err)
	}
}

// TestConfigRefusesLeaseBelowMinLease: Lease: 1ms gave 258 handler runs,
// every one cancelled, and 474 claim_lost lines.
func TestConfigRefusesLeaseBelowMinLease(t *testing.T) {
	for _, lease := range []time.Duration{time.Nanosecond, time.Millisecond, dedup.MinLease - time.Millisecond} {
		cfg := validConfig()
		cfg.Lease = lease
		wantRefused(t, newErr(cfg), "Config.Lease ("+lease.String()+")", "at least "+dedup.MinLease.String())
		if _, err := dedup.NewEngine(cfg); !errors.Is(err, dedup.ErrInvalidDuration) {
			t.Errorf("NewEngine with Lease %v: %v", lease, err)
		}
	}
	cfg := validConfig()
	cfg.Lease = dedup.MinLease
	if err := newErr(cfg); err != nil {
		t.Errorf("Lease == MinLease: %v", err)
	}
}

// TestConfigRefusesHeartbeatWithDisableHeartbeat: one of the two says
// what the user wants, the other is ignored in silence.
func TestConfigRefusesHeartbeatWithDisableHeartbeat(t *testing.T) {
	cfg := validConfig()
	cfg.Heartbeat, cfg.DisableHeartbeat = 5*time.Second, true
	wantRefused(t, newErr(cfg), "Config.Heartbeat", "Config.DisableHeartbeat")
	cfg.Heartbeat = 0
	if err := newErr(cfg); err != nil {
		t.Errorf("DisableHeartbeat alone: %v", err)
	}
	// A heartbeat not shorter than the lease less its margin.
	cfg = validConfig()
	cfg.Lease, cfg.Heartbeat = 10*time.Second, 9*time.Second
	wantRefused(t, newErr(cfg), "Config.Heartbeat (9s)", "shorter than")
}

// TestNewJoinsEveryProblem: every problem at once, each on its
// own line (errors.Join), each saying what to change.
func TestNewJoinsEveryProblem(t *testing.T) {
	err := newErr(dedup.Config{
		Lease: time.Millisecond, Retention: -time.Second, Heartbeat: time.Second, DisableHeartbeat: true,
		MaxKeyLength: -1,
	})
	if err == nil {
		t.Fatal("New accepted it")
	}
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) {
		t.Fatalf("%v is not a joined error", err)
	}
	want := []string{"Config.Store is required", "Config.Key is required", "Config.Retention must not be negative",
		"Config.Lease (1ms)", "Config.DisableHeartbeat", "Config.MaxKeyLength"}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%q is not in\n%v", w, err)
		}
	}
	if n := len(joined.Unwrap()); n < len(want) {
		t.Errorf("%d problems joined, want at least %d:\n%v", n, len(want), err)
	}
}

// TestDoTakesConfigScope: NewEngine(Config{Scope: "jobs"}) then Do with a
// call that names no scope claims in "jobs" (it failed with "set
// Config.Scope").
func TestDoTakesConfigScope(t *testing.T) {
	store := memstore.New(nil)
	e, err := dedup.NewEngine(dedup.Config{Store: store, Scope: "jobs"})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	work := func(context.Context) ([]byte, error) { runs++; return nil, nil }
	res, err := e.Do(context.Background(), dedup.Call{Key: "x"}, work)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("Do without a scope: %v, %v", res.Outcome, err)
	}
	if res.Claim.Key != admin.ScopedKey("jobs", "x") {
		t.Errorf("claimed %q, want %q", res.Claim.Key, admin.ScopedKey("jobs", "x"))
	}
	// The same key in the call's own scope is another record.
	if res, err := e.Do(context.Background(), dedup.Call{Scope: "other", Key: "x"}, work); err != nil || res.Outcome != dedup.Acquired {
		t.Errorf("Do in scope other: %v, %v", res.Outcome, err)
	}
	if res, err := e.Do(context.Background(), dedup.Call{Scope: "jobs", Key: "x"}, work); err != nil || res.Outcome != dedup.Duplicate {
		t.Errorf("Do in scope jobs: %v, %v; want the duplicate of the first", res.Outcome, err)
	}
	if runs != 2 {
		t.Errorf("%d runs, want 2", runs)
	}
	// Neither: ErrNoScope, as before.
	e2, err := dedup.NewEngine(dedup.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e2.Do(context.Background(), dedup.Call{Key: "x"}, work); !errors.Is(err, dedup.ErrNoScope) {
		t.Errorf("no scope anywhere: %v, want ErrNoScope", err)
	}
}
