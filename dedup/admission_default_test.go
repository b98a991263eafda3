package dedup_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// admittingStore says how many claims the engine should admit at once
// (dedup.ClaimAdmitter), and holds every Claim until gate is closed, counting
// the claims that reached it.
type admittingStore struct {
	dedup.Store
	admission int
	arrived   atomic.Int64
	gate      chan struct{}
}

func (s *admittingStore) ClaimAdmission() int { return s.admission }

var _ dedup.ClaimAdmitter = (*admittingStore)(nil)

func (s *admittingStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	s.arrived.Add(1)
	<-s.gate
	return s.Store.Claim(ctx, key, fp, lease)
}

// blockedInAdmission counts the goroutines blocked in the engine's
// admission: in a select inside the engine's claim, not in a store.
func blockedInAdmission() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "[select") && strings.Contains(g, "dedup.(*callRun).claim(") && !strings.Contains(g, "admittingStore") {
			n++
		}
	}
	return n
}

// claimsAtOnce starts calls concurrent calls of distinct keys on an engine
// of cfg over an admittingStore whose admission default is storeDefault,
// waits until each has either reached the store's Claim or is blocked in
// the engine's admission, and returns how many reached the store. Then it
// lets every claim through and checks every call ran.
func claimsAtOnce(t *testing.T, cfg dedup.Config, storeDefault, calls int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clock := fakeclock.New(epoch)
	s := &admittingStore{Store: memstore.New(clock), admission: storeDefault, gate: make(chan struct{})}
	cfg.Store, cfg.Clock, cfg.DisableHeartbeat = s, clock, true
	e, err := dedup.NewEngine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var ran atomic.Int64
	for i := range calls {
		wg.Go(func() {
			_, err := e.Do(ctx, dedup.Call{Scope: "s", Key: fmt.Sprint("k", i)}, func(context.Context) ([]byte, error) {
				ran.Add(1)
				return nil, nil
			})
			if err != nil {
				t.Errorf("call %d: %v", i, err)
			}
		})
	}
	// Every call is either at the store or blocked in admission: the
	// count at the store no longer changes until the gate opens.
	for int(s.arrived.Load())+blockedInAdmission() != calls {
		if ctx.Err() != nil {
			t.Fatalf("%d claims reached the store and %d wait for admission, of %d calls", s.arrived.Load(), blockedInAdmission(), calls)
		}
		runtime.Gosched()
	}
	atStore := int(s.arrived.Load())
	close(s.gate)
	wg.Wait()
	if got := ran.Load(); got != int64(calls) {
		t.Errorf("%d of %d calls ran", got, calls)
	}
	return atStore
}

// TestStoreAdmissionDefault: with Config.MaxClaimsInFlight left at zero, a
// store that admits more claims than the engine's default (stores/redis
// with AutoPipeline, whose batcher puts concurrent claims in one batch)
// gets them all at once: 40 calls blocked inside Claim all reach the
// store, where the engine's default of 16 would hold 24 back.
func TestStoreAdmissionDefault(t *testing.T) {
	const calls = 40
	if got := claimsAtOnce(t, dedup.Config{}, 64, calls); got != calls {
		t.Errorf("%d of %d concurrent claims reached a store whose admission default is 64, want all", got, calls)
	}
}

// TestExplicitMaxClaimsInFlightWins: a MaxClaimsInFlight set in the
// Config bounds the claims at once even when the store's default is
// higher.
func TestExplicitMaxClaimsInFlightWins(t *testing.T) {
	const calls, bound = 40, 16
	if got := claimsAtOnce(t, dedup.Config{MaxClaimsInFlight: bound}, 64, calls); got != bound {
		t.Errorf("%d concurrent claims reached the store with MaxClaimsInFlight %d, want %d", got, bound, bound)
	}
}

// TestNoStoreAdmissionDefault: a store without the capability (or one
// that says 0) keeps the engine's default of 16.
func TestNoStoreAdmissionDefault(t *testing.T) {
	const calls = 40
	if got := claimsAtOnce(t, dedup.Config{}, 0, calls); got != 16 {
		t.Errorf("%d concurrent claims reached a store with no admission default, want the engine's 16", got)
	}
}
