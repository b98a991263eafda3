package storetest

import (
	"sync"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// TestFenceIncreases: the fence of each winning claim of one key is larger
// than every earlier one's, through each way a claim can win: a fresh key,
// a released record, an in-progress record whose lease ended, and a key
// whose completed record's retention passed.
func TestFenceIncreases(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "FenceIncreases", newStore, features)
	if !e.features.Fencing {
		t.Skip("storetest: the store does not fence (Features.Fencing)")
	}
	short := e.features.ShortDuration
	key := e.key("k")
	var last uint64
	won := func(how string, c dedup.Claim) {
		t.Helper()
		if c.Fence == 0 {
			t.Fatalf("%s: fence 0 on a won claim", how)
		}
		if c.Fence <= last {
			t.Fatalf("%s: fence %d, not larger than the earlier winner's %d", how, c.Fence, last)
		}
		last = c.Fence
	}
	first := e.acquire(key, "", longLease)
	won("fresh key", first)
	if err := e.store.Release(e.ctx, first); err != nil {
		t.Fatalf("Release: %v", err)
	}
	afterRelease := e.acquire(key, "", short)
	won("after a release", afterRelease)
	e.wait(2 * short)
	takeover := e.acquire(key, "", longLease)
	won("takeover after the lease ended", takeover)
	e.complete(takeover, nil, short)
	e.wait(2 * short)
	won("after the retention passed", e.acquire(key, "", longLease))

	done := e.key("done")
	e.record(done, "", longLease, []byte("ok"), longLease)
	if res := e.expect(done, "", dedup.Duplicate); res.Claim.Fence != 0 {
		t.Fatalf("a duplicate carries fence %d; only a won claim has one", res.Claim.Fence)
	}
}

// TestFencesOfContendersIncrease: rounds of concurrent claims of one key,
// each round's winner releasing the key for the next: one winner a round,
// and the winners' fences strictly increase, so no two claimers ever hold
// the same fence.
func TestFencesOfContendersIncrease(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "FencesOfContendersIncrease", newStore, features)
	if !e.features.Fencing {
		t.Skip("storetest: the store does not fence (Features.Fencing)")
	}
	key := e.key("k")
	const rounds, contenders = 10, 8
	var last uint64
	for round := range rounds {
		var (
			mu      sync.Mutex
			winners []dedup.Claim
			wg      sync.WaitGroup
			errs    []error
		)
		for range contenders {
			wg.Go(func() {
				res, err := e.store.Claim(e.ctx, key, "", longLease)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				if res.Outcome == dedup.Acquired {
					winners = append(winners, res.Claim)
				} else if res.Claim.Fence != 0 {
					errs = append(errs, errFenceOnRefusal)
				}
			})
		}
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("round %d: %v", round, errs[0])
		}
		if len(winners) != 1 {
			t.Fatalf("round %d: %d winners, want 1", round, len(winners))
		}
		w := winners[0]
		if w.Fence <= last {
			t.Fatalf("round %d: the winner's fence %d is not larger than the last winner's %d", round, w.Fence, last)
		}
		last = w.Fence
		if err := e.store.Release(e.ctx, w); err != nil {
			t.Fatalf("round %d: Release: %v", round, err)
		}
	}
}

var errFenceOnRefusal = &fenceError{"a claim that did not win carries a fence"}

type fenceError struct{ msg string }

func (e *fenceError) Error() string { return "storetest: " + e.msg }

// TestNoFenceWithoutFencing: a store that does not declare
// Features.Fencing gives every claim fence 0, so that the work reads "no
// fence" (dedup.FenceFromContext), never a made-up number.
func TestNoFenceWithoutFencing(t *testing.T, newStore Constructor, features Features) {
	e := newEnv(t, "NoFenceWithoutFencing", newStore, features)
	if e.features.Fencing {
		t.Skip("storetest: the store fences (Features.Fencing); TestFenceIncreases checks it")
	}
	c := e.acquire(e.key("k"), "", longLease)
	if c.Fence != 0 {
		t.Fatalf("fence %d from a store that does not declare Features.Fencing: declare it, or return 0", c.Fence)
	}
}
