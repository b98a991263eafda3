package redis_test

import (
	"context"
	"encoding/hex"
	"errors"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// scriptArgCounts is a go-redis hook that records how many arguments each
// script command (EVAL, EVALSHA) sent, its name included, but for those
// answered NOSCRIPT (sent again with EVAL).
type scriptArgCounts struct {
	mu sync.Mutex
	n  []int
}

func (h *scriptArgCounts) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *scriptArgCounts) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd) // (Client.Process sets it on cmd after the hooks)
		h.record(cmd, err)
		return err
	}
}

func (h *scriptArgCounts) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.record(cmd, cmd.Err())
		}
		return err
	}
}

func (h *scriptArgCounts) record(cmd goredis.Cmder, err error) {
	if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		return
	}
	if name := cmd.Name(); name == "evalsha" || name == "eval" {
		h.mu.Lock()
		h.n = append(h.n, len(cmd.Args()))
		h.mu.Unlock()
	}
}

// take returns the counts recorded since the last take.
func (h *scriptArgCounts) take() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.n
	h.n = nil
	return n
}

// TestCompleteAsClaimedSendsTheLeastScript: Complete of a record that is
// still the one its claim wrote sends one script command of seven words
// (EVALSHA, the SHA, 1, the key, that record, the completed record built by
// the client, the retention; eight with a result), not the whole
// compare-and-set of twelve; a record that changed since (gone, released,
// taken over, completed already) gets that first script's "not as claimed"
// and then the whole script, which tells why, as before. A token that is
// not such a record (the owner's 16 bytes in hex), and a record that
// completes to the compact form (no fingerprint, OmitProvenance), get the
// whole script alone. CompleteBatch sends the same, the first scripts in
// one pipeline. (Before, every Complete sent the twelve.)
func TestCompleteAsClaimedSendsTheLeastScript(t *testing.T) {
	withAndWithoutAutoPipeline(t, func(t *testing.T, client *goredis.Client, store *redis.Store) {
		ctx := context.Background()
		hook := &scriptArgCounts{}
		client.AddHook(hook)
		claim := func(key string) dedup.Claim {
			t.Helper()
			res, err := store.Claim(ctx, key, "fp", time.Minute)
			if err != nil || res.Outcome != dedup.Acquired {
				t.Fatalf("Claim %s: %v %v", key, res.Outcome, err)
			}
			return res.Claim
		}
		check := func(what string, err, wantErr error, want ...int) {
			t.Helper()
			got := hook.take()
			if !errors.Is(err, wantErr) || len(got) != len(want) {
				t.Fatalf("%s: %v, script commands of %v arguments; want %v, %v", what, err, got, wantErr, want)
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("%s: script commands of %v arguments; want %v", what, got, want)
				}
			}
		}

		c := claim("as-claimed")
		hook.take()
		check("Complete without a result", store.Complete(ctx, c, nil, time.Hour), nil, 7)
		// Again (as go-redis sends it again after a lost reply): completed
		// by this claim.
		check("Complete again", store.Complete(ctx, c, nil, time.Hour), redis.ErrAlreadyCompleted, 7, 12)
		if dup, err := store.Claim(ctx, "as-claimed", "fp", time.Minute); err != nil || dup.Outcome != dedup.Duplicate {
			t.Fatalf("Claim after Complete: %v %v", dup.Outcome, err)
		}

		c = claim("with-result")
		hook.take()
		check("Complete with a result", store.Complete(ctx, c, []byte("r"), time.Hour), nil, 8)
		if dup, err := store.Claim(ctx, "with-result", "fp", time.Minute); err != nil || dup.Outcome != dedup.Duplicate || string(dup.Result) != "r" {
			t.Fatalf("Claim after Complete: %v %q %v", dup.Outcome, dup.Result, err)
		}

		c = claim("gone")
		if err := client.Del(ctx, store.RedisKey("gone")).Err(); err != nil {
			t.Fatal(err)
		}
		hook.take()
		check("Complete of a record gone", store.Complete(ctx, c, nil, time.Hour), redis.ErrExpired, 7, 12)

		c = claim("released")
		if err := store.Release(ctx, c); err != nil {
			t.Fatal(err)
		}
		hook.take()
		check("Complete of a record released", store.Complete(ctx, c, nil, time.Hour), redis.ErrExpired, 7, 12)

		c = claim("hex-token")
		c.Token = hex.EncodeToString([]byte(c.Token[2:18]))
		hook.take()
		check("Complete with a hex token", store.Complete(ctx, c, nil, time.Hour), nil, 12)

		compact := newStore(t, client, redis.Config{KeyPrefix: watchPrefix(t.Name() + "-compact"), OmitProvenance: true})
		res, err := compact.Claim(ctx, "compact", "", time.Minute)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("Claim: %v %v", res.Outcome, err)
		}
		hook.take()
		check("Complete of a record without fields", compact.Complete(ctx, res.Claim, nil, time.Hour), nil, 12)

		c = claim("taken-over")
		if err := client.Del(ctx, store.RedisKey("taken-over")).Err(); err != nil {
			t.Fatal(err)
		}
		claim("taken-over")
		hook.take()
		check("Complete of a record taken over", store.Complete(ctx, c, nil, time.Hour), redis.ErrNotOwner, 7, 12)

		// CompleteBatch the same way: the least script of each record in
		// one pipeline, then the whole script of the one gone.
		reqs := []dedup.ClaimRequest{{Key: "batch-1", Lease: time.Minute}, {Key: "batch-2", Lease: time.Minute}, {Key: "batch-gone", Lease: time.Minute}}
		results, errs := store.ClaimBatch(ctx, reqs)
		var done []dedup.CompleteRequest
		for i, r := range results {
			if errs[i] != nil || r.Outcome != dedup.Acquired {
				t.Fatalf("ClaimBatch %s: %v %v", reqs[i].Key, r.Outcome, errs[i])
			}
			done = append(done, dedup.CompleteRequest{Claim: r.Claim, Result: []byte(reqs[i].Key), Retention: time.Hour})
		}
		done[0].Result = nil
		if err := client.Del(ctx, store.RedisKey("batch-gone")).Err(); err != nil {
			t.Fatal(err)
		}
		hook.take()
		errs = store.CompleteBatch(ctx, done)
		check("CompleteBatch", errs[2], redis.ErrExpired, 7, 8, 8, 12)
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("CompleteBatch: %v", errs)
		}
		for i, want := range []string{"", "batch-2"} {
			if dup, err := store.Claim(ctx, reqs[i].Key, "", time.Minute); err != nil || dup.Outcome != dedup.Duplicate || string(dup.Result) != want {
				t.Fatalf("Claim after CompleteBatch: %v %q %v", dup.Outcome, dup.Result, err)
			}
		}
	})
}
