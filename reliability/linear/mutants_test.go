package linear

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
)

// Mutant stores: the memory store with one known bug each. The same
// workload that the real stores pass must make porcupine refuse each of
// them; otherwise the model (or the workload) could not tell.

// mutant wraps the memory store; it has no batch capability (a batch
// would bypass the bug), and Inspect is the memory store's.
type mutant struct {
	dedup.Store
	admin.Interface

	mu     sync.Mutex
	latest map[string]dedup.Claim // the last claim won per key
	fences map[string]uint64      // the last fence given per key
	done   map[string]bool        // keys completed since the last restart
	wins   int
}

func newMutant(t testing.TB) *mutant {
	s := newMemory(t)
	return &mutant{Store: s, Interface: s, latest: map[string]dedup.Claim{}, fences: map[string]uint64{}, done: map[string]bool{}}
}

func (m *mutant) won(c dedup.Claim) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.latest[c.Key] = c
	m.fences[c.Key] = c.Fence
}

func (m *mutant) latestOf(key string) (dedup.Claim, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.latest[key]
	return c, ok
}

// releasesForAnyone lets a non-owner release: a Release whose token no
// longer owns the record releases the record's current owner instead.
type releasesForAnyone struct{ *mutant }

func (m releasesForAnyone) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	res, err := m.Store.Claim(ctx, key, fp, lease)
	if err == nil && res.Outcome == dedup.Acquired {
		m.won(res.Claim)
	}
	return res, err
}

func (m releasesForAnyone) Release(ctx context.Context, c dedup.Claim) error {
	err := m.Store.Release(ctx, c)
	if errors.Is(err, dedup.ErrClaimLost) {
		if owner, ok := m.latestOf(c.Key); ok && m.Store.Release(ctx, owner) == nil {
			return nil
		}
	}
	return err
}

// takesLiveLeases takes over a record whose lease is live: a claim that
// finds the key in progress releases the holder and claims again.
type takesLiveLeases struct{ *mutant }

func (m takesLiveLeases) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	res, err := m.Store.Claim(ctx, key, fp, lease)
	if err == nil && res.Outcome == dedup.InProgress {
		if owner, ok := m.latestOf(key); ok && m.Store.Release(ctx, owner) == nil {
			res, err = m.Store.Claim(ctx, key, fp, lease)
		}
	}
	if err == nil && res.Outcome == dedup.Acquired {
		m.won(res.Claim)
	}
	return res, err
}

// forgetsCompletions on restart: a store with persistence on whose
// restart loses its completed records (as a Redis without persistence
// does). restart evicts every key completed since the last one.
type forgetsCompletions struct{ *mutant }

func (m forgetsCompletions) Complete(ctx context.Context, c dedup.Claim, result []byte, retention time.Duration) error {
	err := m.Store.Complete(ctx, c, result, retention)
	if err == nil {
		m.mu.Lock()
		m.done[c.Key] = true
		m.mu.Unlock()
	}
	return err
}

func (m forgetsCompletions) restart() {
	m.mu.Lock()
	keys := m.done
	m.done = map[string]bool{}
	m.mu.Unlock()
	for k := range keys {
		_, _ = m.Interface.Evict(context.Background(), k)
	}
}

// reusesFences gives every third claim won of a key the fence of the
// claim that won before it.
type reusesFences struct{ *mutant }

func (m reusesFences) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	res, err := m.Store.Claim(ctx, key, fp, lease)
	if err != nil || res.Outcome != dedup.Acquired {
		return res, err
	}
	m.mu.Lock()
	m.wins++
	if prev, ok := m.fences[key]; ok && m.wins%3 == 0 {
		res.Claim.Fence = prev
	}
	m.fences[key] = res.Claim.Fence
	m.mu.Unlock()
	return res, err
}

// runMutant runs the default workload against s, calling during (if not
// nil) every 300ms meanwhile, and requires porcupine to refuse the history.
func runMutant(t *testing.T, s dedup.Store, during func()) {
	t.Parallel()
	rec := newRecorder()
	w := defaultWorkload("linear:mutant:")
	w.Stale = 0.3 // more calls by non-owners, for the non-owner's release
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if during != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(300 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					during()
				}
			}
		}()
	}
	w.run(rec, newTarget(s), nil, 7)
	close(stop)
	wg.Wait()
	requireAnomaly(t, rec.history(), params{})
}

func TestPorcupineCatchesNonOwnerRelease(t *testing.T) {
	runMutant(t, releasesForAnyone{newMutant(t)}, nil)
}

func TestPorcupineCatchesLiveTakeover(t *testing.T) {
	runMutant(t, takesLiveLeases{newMutant(t)}, nil)
}

func TestPorcupineCatchesCompletionLostOnRestart(t *testing.T) {
	m := forgetsCompletions{newMutant(t)}
	runMutant(t, m, m.restart)
}

func TestPorcupineCatchesReusedFence(t *testing.T) {
	runMutant(t, reusesFences{newMutant(t)}, nil)
}

// TestPorcupineModel checks the model on hand-written histories of one
// key: a takeover is refused while the holder's lease certainly runs,
// accepted once it certainly ended and either way in between; a pending
// claim may have taken the key; a batch's records of one key take effect
// in request order, other calls possibly between them.
func TestPorcupineModel(t *testing.T) {
	t.Parallel()
	const msec = int64(time.Millisecond)
	lease := 100 * time.Millisecond
	claim := func(client int, c, r int64, out stepOut, unknown bool) porcupine.Operation {
		if unknown {
			r = never
		}
		return porcupine.Operation{ClientId: client, Call: c, Return: r,
			Input:  input{Key: "k", Step: step{Kind: opClaim, Lease: lease}, Call: c, Return: r},
			Output: output{Unknown: unknown, Out: out}}
	}
	acq := func(tok string) stepOut { return stepOut{Outcome: dedup.Acquired, Token: tok} }
	// batch is record seq of a two-record ClaimBatch of key k, the
	// batch's interval [2ms, 8ms].
	batch := func(seq int, id int64, of int, out stepOut) porcupine.Operation {
		return porcupine.Operation{ClientId: 1, Call: 2 * msec, Return: 8 * msec,
			Input:  input{Key: "k", Step: step{Kind: opClaim, Lease: lease}, Batch: "claim_batch", BatchID: id, Seq: seq, Of: of, Call: 2 * msec, Return: 8 * msec},
			Output: output{Out: out}}
	}
	busy := stepOut{Outcome: dedup.InProgress}
	cases := []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"takeover while the lease certainly runs", []porcupine.Operation{claim(0, 0, msec, acq("a"), false), claim(1, 50*msec, 51*msec, acq("b"), false)}, porcupine.Illegal},
		{"takeover once it certainly ended", []porcupine.Operation{claim(0, 0, msec, acq("a"), false), claim(1, 110*msec, 111*msec, acq("b"), false)}, porcupine.Ok},
		{"in progress once it certainly ended", []porcupine.Operation{claim(0, 0, msec, acq("a"), false), claim(1, 110*msec, 111*msec, busy, false)}, porcupine.Illegal},
		{"takeover in the band", []porcupine.Operation{claim(0, 0, 10*msec, acq("a"), false), claim(1, 105*msec, 106*msec, acq("b"), false)}, porcupine.Ok},
		{"in progress in the band", []porcupine.Operation{claim(0, 0, 10*msec, acq("a"), false), claim(1, 105*msec, 106*msec, busy, false)}, porcupine.Ok},
		{"a pending claim may hold the key", []porcupine.Operation{claim(0, 0, 0, stepOut{}, true), claim(1, 50*msec, 51*msec, busy, false)}, porcupine.Ok},
		{"a pending claim may not have run", []porcupine.Operation{claim(0, 0, 0, stepOut{}, true), claim(1, 50*msec, 51*msec, acq("b"), false)}, porcupine.Ok},
		{"in progress with no holder", []porcupine.Operation{claim(1, 50*msec, 51*msec, busy, false)}, porcupine.Illegal},
		{"a batch's records of one key in request order", []porcupine.Operation{batch(0, 1, 2, acq("a")), batch(1, 1, 2, busy)}, porcupine.Ok},
		{"a batch's records of one key out of order", []porcupine.Operation{batch(0, 1, 2, busy), batch(1, 1, 2, acq("a"))}, porcupine.Illegal},
		{"another call between a batch's records", []porcupine.Operation{
			claim(0, 0, msec, acq("a"), false),
			batch(0, 2, 2, busy), batch(1, 2, 2, stepOut{Outcome: dedup.Duplicate, Result: "r"}),
			{ClientId: 0, Call: 4 * msec, Return: 6 * msec,
				Input:  input{Key: "k", Step: step{Kind: opComplete, Token: "a", Result: "r", Retention: time.Minute}, Call: 4 * msec, Return: 6 * msec},
				Output: output{}},
		}, porcupine.Ok},
	}
	for _, c := range cases {
		got := porcupine.CheckOperations(params{}.porcupineModel(), c.ops)
		if (got && c.want != porcupine.Ok) || (!got && c.want != porcupine.Illegal) {
			t.Errorf("%s: linearizable=%v, want %s", c.name, got, c.want)
		}
	}
}
