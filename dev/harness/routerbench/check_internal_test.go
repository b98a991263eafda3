package routerbench

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
)

// forgetful is a broken store: every claim is Acquired, so nothing is ever
// a duplicate.
type forgetful struct{ n atomic.Int64 }

func (f *forgetful) Claim(_ context.Context, key, _ string, _ time.Duration) (dedup.ClaimResult, error) {
	return dedup.ClaimResult{Outcome: dedup.Acquired, Claim: dedup.Claim{Key: key, Token: strings.Repeat("t", int(f.n.Add(1)%7+1))}}, nil
}
func (*forgetful) Complete(context.Context, dedup.Claim, []byte, time.Duration) error { return nil }
func (*forgetful) Release(context.Context, dedup.Claim) error                         { return nil }
func (*forgetful) Extend(context.Context, dedup.Claim, time.Duration) error           { return nil }

// TestDuplicateLaneCatchesHandlerCalls shows that the harness refuses to
// report a duplicate path that runs the handler: a figure for a path that
// does not deduplicate would be meaningless.
func TestDuplicateLaneCatchesHandlerCalls(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := newRig(ctx, &forgetful{}, "check", 2, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.stop() }()
	_, _, err = r.checked(ctx, r.lanes[vDup], 2, 0, 20)
	if err == nil || !strings.Contains(err.Error(), "the handler ran 20 times for 20 messages, want 0") {
		t.Fatalf("checked on a store that forgets: %v, want the handler-call mismatch", err)
	}
	// The happy lane on the same store is fine: every message reaches the
	// handler once.
	if _, _, err := r.checked(ctx, r.lanes[vHappy], 2, 0, 20); err != nil {
		t.Fatalf("happy lane: %v", err)
	}
}

// TestFloorLaneRunsFloor shows that each floor lane's handler (router+raw
// pair, router+raw CAS pair) runs its own floor once per message, with the
// message's scoped key, and that a failing floor fails the measurement.
func TestFloorLaneRunsFloor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var fail atomic.Bool
	floors := []floorLane{{name: vRouterFloor, tag: "pair"}, {name: vRouterCASFloor, tag: "cas"}}
	seen := make([]struct {
		calls atomic.Int64
		bad   atomic.Value
	}, len(floors))
	for i, f := range floors {
		floors[i].run = func(_ context.Context, key string) error {
			seen[i].calls.Add(1)
			if !strings.HasPrefix(key, scope+":ORDER-check-"+f.tag+"-") {
				seen[i].bad.Store(key)
			}
			if fail.Load() {
				return errors.New(f.name + " failed")
			}
			return nil
		}
	}
	r, err := newRig(ctx, &forgetful{}, "check", 2, 0, false, floors...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.stop() }()
	for i, f := range floors {
		l, ok := r.lanes[f.name]
		if !ok {
			t.Fatalf("no %s lane", f.name)
		}
		if _, _, err := r.checked(ctx, l, 2, 0, 20); err != nil {
			t.Fatalf("%s lane: %v", f.name, err)
		}
		if got := seen[i].calls.Load(); got != 20 {
			t.Errorf("%s: its floor ran %d times for 20 messages", f.name, got)
		}
		if k := seen[i].bad.Load(); k != nil {
			t.Errorf("%s: its floor got key %q, want the message's scoped key", f.name, k)
		}
	}
	fail.Store(true)
	for _, f := range floors {
		if _, _, err := r.checked(ctx, r.lanes[f.name], 2, 0, 4); err == nil || !strings.Contains(err.Error(), f.name+" failed") {
			t.Errorf("%s: checked with a failing floor: %v, want its error", f.name, err)
		}
	}
}

// TestRouterCASFloorLaneRunsCASFloor shows, on a redis-server of its own
// (through openRedis, as the benchmark), that the router+raw CAS pair
// lane's handler runs the backend's casFloor: after 20 messages, 20 keys
// of the raw CAS pair hold the value its EVALSHA writes, with the
// retention (not the lease) as expiry, and the raw pair wrote none.
func TestRouterCASFloorLaneRunsCASFloor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, id := twentyThroughLane(ctx, t, StoreRedis, vRouterCASFloor)
	rdb := s.b.redis
	keys, err := rdb.Keys(ctx, "dedup-bench-cas-"+id+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 20 {
		t.Fatalf("%d raw CAS pair keys after 20 messages, want 20: %q", len(keys), keys)
	}
	for _, k := range keys {
		if !strings.HasPrefix(k, "dedup-bench-cas-"+id+":"+scope+":ORDER-"+id+"-cas-") {
			t.Errorf("key %q is not the message's scoped key", k)
		}
		if v, err := rdb.Get(ctx, k).Result(); err != nil || v != rawDone {
			t.Errorf("%s = %q, %v; want the CAS script's write %q", k, v, err, rawDone)
		}
		if ttl, err := rdb.PTTL(ctx, k).Result(); err != nil || ttl <= rawLease {
			t.Errorf("%s expires in %v (%v), want the retention, above the lease %v", k, ttl, err, rawLease)
		}
	}
	if pair, err := rdb.Keys(ctx, "dedup-bench-pair-"+id+":*").Result(); err != nil || len(pair) != 0 {
		t.Errorf("raw pair keys %q (%v), want none: the lane runs the raw CAS pair", pair, err)
	}
}

// TestRouterStoreLaneCompletes shows that the router+claim+complete lane's
// handler claims the message's scoped key in the suite's own store and
// completes it: after 20 messages on the memory store, each of their 20
// keys is a duplicate to a new claim. A store whose claim is not Acquired
// fails the measurement, naming the outcome.
func TestRouterStoreLaneCompletes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, id := twentyThroughLane(ctx, t, StoreMemory, vRouterStore)
	for n := 1; n <= 20; n++ {
		key := admin.ScopedKey(scope, "ORDER-"+id+"-store-"+strconv.Itoa(n))
		res, err := s.b.store.Claim(ctx, key, "", time.Minute)
		if err != nil || res.Outcome != dedup.Duplicate {
			t.Errorf("claim of %q after the lane: %v, %v; want Duplicate (claimed and completed by the lane)", key, res.Outcome, err)
		}
	}

	r, err := newRig(ctx, &forgetful{}, "check", 2, 0, false, floorLane{vRouterStore, "store", storePair(&duplicating{})})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.stop() }()
	if _, _, err := r.checked(ctx, r.lanes[vRouterStore], 2, 0, 4); err == nil || !strings.Contains(err.Error(), "want Acquired") {
		t.Errorf("checked on a store whose claims are duplicates: %v, want the outcome error", err)
	}
}

// duplicating is a store whose every claim finds a completed record.
type duplicating struct{ forgetful }

func (*duplicating) Claim(context.Context, string, string, time.Duration) (dedup.ClaimResult, error) {
	return dedup.ClaimResult{Outcome: dedup.Duplicate}, nil
}

// twentyThroughLane starts a suite of store with only the lane named, closed
// when the test ends, and sends 20 messages through that lane at c=2,
// checked; it returns the suite and its run id (the keys' prefix).
func twentyThroughLane(ctx context.Context, t *testing.T, store, lane string) (*suite, string) {
	t.Helper()
	id := runID()
	s, err := newSuite(ctx, store, id, 2, 0, []string{lane})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	l, ok := s.rig.lanes[lane]
	if !ok {
		t.Fatalf("no %s lane on %s", lane, store)
	}
	if _, ok := s.ops[lane]; !ok {
		t.Fatalf("no %s variant on %s", lane, store)
	}
	if _, _, err := s.rig.checked(ctx, l, 2, 0, 20); err != nil {
		t.Fatal(err)
	}
	return s, id
}
