package redis_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/storetest"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
	"github.com/watermill-dedup/watermill-dedup/stores/redis/redisbatch"
)

// The conformance suite with Config.AutoPipeline: its subtests run in
// parallel, so their commands are batched.
func TestConformanceAutoPipeline(t *testing.T) {
	client := newClient(t)
	pipes := &pipelineCounter{}
	client.AddHook(pipes)
	store := newStore(t, client, redis.Config{KeyPrefix: "dedup-ap:", AutoPipeline: true})
	t.Run("suite", func(t *testing.T) {
		storetest.Run(t, shared(store), features)
	})
	t.Logf("%d pipelines, the largest of %d commands", pipes.count(), pipes.largest())
}

func TestAutoPipelineRefusesWaitReplicas(t *testing.T) {
	err := redis.Config{Client: anyClient, AutoPipeline: true, WaitReplicas: 1}.Validate()
	if err == nil || !strings.Contains(err.Error(), "AutoPipeline") {
		t.Fatalf("Validate: %v, want a refusal of AutoPipeline with WaitReplicas", err)
	}
}

// pipelineCounter is a go-redis hook that counts pipelines and their sizes,
// and fails the pipelines that carry a command on a poisoned key as a
// broken connection would (every command of the pipeline gets the error).
type pipelineCounter struct {
	mu     sync.Mutex
	sizes  []int
	poison string
	failed [][]string // keys of the commands of each failed pipeline
}

var errBrokenPipeline = fmt.Errorf("injected: %w", net.ErrClosed)

func (p *pipelineCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (p *pipelineCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return next
}
func (p *pipelineCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		p.mu.Lock()
		p.sizes = append(p.sizes, len(cmds))
		poison := p.poison
		p.mu.Unlock()
		if poison != "" {
			var keys []string
			hit := false
			for _, c := range cmds {
				k := fmt.Sprint(keyOf(c))
				keys = append(keys, k)
				hit = hit || strings.HasSuffix(k, poison)
			}
			if hit {
				p.mu.Lock()
				p.failed = append(p.failed, keys)
				p.mu.Unlock()
				for _, c := range cmds {
					c.SetErr(errBrokenPipeline)
				}
				return errBrokenPipeline
			}
		}
		return next(ctx, cmds)
	}
}

// keyOf returns the key argument of a SET or EVALSHA command.
func keyOf(c goredis.Cmder) any {
	args := c.Args()
	switch {
	case len(args) > 1 && fmt.Sprint(args[0]) == "set":
		return deref(args[1])
	case len(args) > 3:
		return deref(args[3])
	}
	return nil
}

func deref(a any) any {
	if s, ok := a.(*string); ok {
		return *s
	}
	return a
}

func (p *pipelineCounter) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sizes)
}

func (p *pipelineCounter) largest() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.sizes) == 0 {
		return 0
	}
	return slices.Max(p.sizes)
}

// TestAutoPipelineBatchesAndFailsOnlyItsOwn: many concurrent claims and
// completions are batched (pipelines of more than one command are seen),
// every call gets its own outcome, and a batch that fails (its connection
// broke, injected by a hook on the batch that carries one poisoned key)
// fails its own commands only: those calls get a store error, every other
// call succeeds, and each failed call's key is claimable afterwards or
// held by its own in-progress record (nothing was completed by mistake).
func TestAutoPipelineBatchesAndFailsOnlyItsOwn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := goredis.NewClient(&goredis.Options{Addr: server.Addr, PoolSize: 32, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	pipes := &pipelineCounter{poison: "poison-77"}
	client.AddHook(pipes)
	store := newStore(t, client, redis.Config{KeyPrefix: "dedup-apfail:", AutoPipeline: true})

	const calls = 400
	type result struct {
		key      string
		claimErr error
		doneErr  error
	}
	results := make([]result, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := admin.ScopedKey("s", fmt.Sprintf("k-%d", i))
			if i == 77 {
				key = admin.ScopedKey("s", "poison-77")
			}
			r := result{key: key}
			res, err := store.Claim(ctx, key, "", time.Minute)
			switch {
			case err != nil:
				r.claimErr = err
			case res.Outcome != dedup.Acquired:
				r.claimErr = fmt.Errorf("outcome %v", res.Outcome)
			default:
				r.doneErr = store.Complete(ctx, res.Claim, []byte(key), time.Hour)
			}
			results[i] = r
		}()
	}
	wg.Wait()

	if pipes.largest() < 2 {
		t.Fatalf("no pipeline of more than one command among %d: nothing was batched", pipes.count())
	}
	pipes.mu.Lock()
	failedKeys := map[string]bool{}
	for _, batch := range pipes.failed {
		for _, k := range batch {
			failedKeys[strings.TrimPrefix(k, "dedup-apfail:")] = true
		}
	}
	pipes.mu.Unlock()
	if !failedKeys[admin.ScopedKey("s", "poison-77")] {
		t.Fatalf("the poisoned key's batch never failed; failed batches: %v", failedKeys)
	}
	failed := 0
	for _, r := range results {
		err := r.claimErr
		if err == nil {
			err = r.doneErr
		}
		inFailed := failedKeys[r.key]
		switch {
		case err != nil && !errors.Is(err, net.ErrClosed):
			t.Errorf("%s: %v, want success or the injected error", r.key, err)
		case err != nil && !inFailed:
			t.Errorf("%s failed (%v) but none of its commands was in a failed batch", r.key, err)
		case err != nil:
			failed++
		}
		// Every key has a consistent record: completed with its own result
		// when the call succeeded, never completed when it failed.
		rec, ierr := store.Inspect(ctx, r.key)
		switch {
		case err == nil && (ierr != nil || rec.State != admin.StateCompleted || rec.ResultSize != len(r.key)):
			t.Errorf("%s succeeded but its record is %+v (%v)", r.key, rec, ierr)
		case err != nil && r.claimErr == nil && ierr == nil && rec.State == admin.StateCompleted:
			t.Errorf("%s: Complete failed with %v but the record is completed", r.key, err)
		}
	}
	t.Logf("%d pipelines (largest %d commands), %d failed batches, %d of %d calls failed with them",
		pipes.count(), pipes.largest(), len(pipes.failed), failed, calls)
	if failed == 0 || failed > len(failedKeys) {
		t.Errorf("%d calls failed, want at least the poisoned one and at most the %d keys of failed batches", failed, len(failedKeys))
	}
}

// TestAutoPipelineClaimAdmission: with Config.AutoPipeline the store tells
// the engine to admit a full batch of claims at once (dedup.Config.
// MaxClaimsInFlight left at zero), since the batcher bounds the batches
// that every command shares; without it the engine keeps its own default.
func TestAutoPipelineClaimAdmission(t *testing.T) {
	client := newClient(t)
	for _, tc := range []struct {
		autoPipeline bool
		want         int
	}{{true, redisbatch.DefaultMaxBatch}, {false, 0}} {
		store := newStore(t, client, redis.Config{KeyPrefix: "dedup-admit:", AutoPipeline: tc.autoPipeline})
		if got := store.ClaimAdmission(); got != tc.want {
			t.Errorf("AutoPipeline %v: claim admission default %d, want %d", tc.autoPipeline, got, tc.want)
		}
	}
}
