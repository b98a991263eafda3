package dedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
)

// polling is a store with only the dedup.Store methods: a wait on it polls
// even where the store could wake it (its WatchKey method).
type polling struct{ dedup.Store }

// On Redis, a copy waiting for a held key is woken by the release of the
// holder's claim (announced by the releasing script): it wins the key and
// runs its work without the engine's clock moving, so without a poll.
func TestInProgressWaitWokenByRedis(t *testing.T) { eachAutoPipeline(t, inProgressWaitWokenByRedis) }

func inProgressWaitWokenByRedis(t *testing.T, autoPipeline bool) {
	store := newRedisStore(t, autoPipeline)
	if _, ok := store.(dedup.KeyWatcher); !ok {
		t.Fatal("the Redis store has no WatchKey method (dedup.KeyWatcher)")
	}
	clock := fakeclock.New(epoch)
	seen := newDecisions()
	e := newEngine(t, dedup.Config{Store: store, Clock: clock, InProgressWait: time.Minute, DisableHeartbeat: true, Observer: seen})
	call := dedup.Call{Scope: "charge", Key: "ORDER-003"}
	release := make(chan struct{})
	gateway := errors.New("gateway timeout")
	holder := holdKey(t, e, call, "", gateway, release)
	copyDone := startDo(e, call, func(context.Context) ([]byte, error) { return []byte("charged by the copy"), nil })
	waitTimers(t, clock, 2, "the copy's pause")
	close(release)
	if err := recv(t, "the holder to fail", holder); !errors.Is(err, gateway) {
		t.Fatalf("holder: %v", err)
	}
	got := recv(t, "the copy, woken by the release", copyDone)
	if got.err != nil || got.res.Outcome != dedup.Acquired || string(got.res.Result) != "charged by the copy" {
		t.Fatalf("copy: %+v, %v; want it to win the released key and run", got.res, got.err)
	}
	if won := seen.of(event.ClaimWon); len(won) != 2 || won[1].Waited != 0 {
		t.Fatalf("claim_won decisions %+v, want the copy's with Waited 0 (the clock never moved)", won)
	}
}
