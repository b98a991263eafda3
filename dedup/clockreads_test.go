package dedup_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// countingClock is a fake clock that counts the engine's readings.
type countingClock struct {
	*fakeclock.Clock
	reads atomic.Int64
}

func (c *countingClock) Now() time.Time {
	c.reads.Add(1)
	return c.Clock.Now()
}

// TestQuietEngineReadsTheClockForTheLeaseOnly: an engine that tells nobody
// of a new key's decisions (no Observer, no Tracer, and no Logger, which
// writes only the error level to slog, or the NopLogger) reads its clock
// for the lease alone, twice per new key (the claim's time, and the
// keeper's timer): not for the durations it would report. With an
// Observer it reads it for them too, and reports them.
func TestQuietEngineReadsTheClockForTheLeaseOnly(t *testing.T) {
	for _, observed := range []bool{false, true} {
		for _, nop := range []bool{false, true} {
			if observed && nop {
				continue
			}
			quietEngineReads(t, observed, nop)
		}
	}
}

func quietEngineReads(t *testing.T, observed, nop bool) {
	clock := &countingClock{Clock: fakeclock.New(time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC))}
	cfg := dedup.Config{Store: memstore.New(nil), Clock: clock, Lease: time.Minute}
	if nop {
		cfg.Logger = watermill.NopLogger{}
	}
	obs := newDecisions()
	if observed {
		cfg.Observer = obs
	}
	e := newEngine(t, cfg)
	res, err := e.Do(context.Background(), dedup.Call{Scope: "s", Key: "k"}, func(context.Context) ([]byte, error) {
		clock.Advance(5 * time.Second) // the work's time, before its lease's heartbeat
		return nil, nil
	})
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("observed %v: Do = %v, %v", observed, res.Outcome, err)
	}
	want := int64(2)
	if observed {
		want = 3 // and the completion's elapsed time
	}
	if got := clock.reads.Load(); got != want {
		t.Errorf("observed %v, NopLogger %v: %d clock readings for a new key, want %d", observed, nop, got, want)
	}
	if !observed {
		return
	}
	done := obs.of(event.Completed)
	if len(done) != 1 || done[0].Elapsed != 5*time.Second {
		t.Errorf("completed decisions %+v, want one of 5s", done)
	}
}
