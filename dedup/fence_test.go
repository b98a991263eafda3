package dedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// unfenced hides the fences of a store that has them, as a store that
// does not fence answers.
type unfenced struct{ dedup.Store }

func (s unfenced) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, key, fp, lease)
	res.Claim.Fence = 0
	return res, err
}

// TestFenceReachesTheWork: the work of a won claim reads its fence from
// its context (FenceFromContext), the same Do returns with the claim, and
// a later winner of the key (after a failed run released it) reads a
// larger one, in Do and in DoBatch alike. On a store that does not fence,
// the work reads no fence: 0, false, never a made-up number.
func TestFenceReachesTheWork(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(epoch)
	e, err := dedup.NewEngine(dedup.Config{Store: memstore.New(clock), Clock: clock, Scope: "s"})
	if err != nil {
		t.Fatal(err)
	}
	var seen []uint64
	work := func(fail bool) func(context.Context) ([]byte, error) {
		return func(ctx context.Context) ([]byte, error) {
			f, ok := dedup.FenceFromContext(ctx)
			if !ok || f == 0 {
				t.Errorf("the work reads no fence (%d, %v)", f, ok)
			}
			seen = append(seen, f)
			if fail {
				return nil, errors.New("declined")
			}
			return nil, nil
		}
	}
	res, err := e.Do(ctx, dedup.Call{Key: "k"}, work(true))
	if err == nil || res.Claim.Fence != seen[0] {
		t.Fatalf("failed run: %v, fence %d; want its error and the fence the work read (%d)", err, res.Claim.Fence, seen[0])
	}
	if res, err = e.Do(ctx, dedup.Call{Key: "k"}, work(true)); err == nil || res.Claim.Fence <= seen[0] {
		t.Fatalf("second run: %v, fence %d; want a fence larger than %d", err, res.Claim.Fence, seen[0])
	}
	_, errs := e.DoBatch(ctx, dedup.Batch{Calls: []dedup.BatchCall{{Call: dedup.Call{Key: "k"}}}}, func(ctx context.Context, _ int) ([]byte, error) {
		return work(false)(ctx)
	})
	if errs[0] != nil || len(seen) != 3 || seen[2] <= seen[1] {
		t.Fatalf("batch run: %v, fences seen %v; want three increasing fences", errs[0], seen)
	}

	plain, err := dedup.NewEngine(dedup.Config{Store: unfenced{memstore.New(clock)}, Clock: clock, Scope: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Do(ctx, dedup.Call{Key: "k"}, func(ctx context.Context) ([]byte, error) {
		if f, ok := dedup.FenceFromContext(ctx); ok || f != 0 {
			t.Errorf("a store without fences: the work reads (%d, %v), want (0, false)", f, ok)
		}
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if f, ok := dedup.FenceFromContext(ctx); ok || f != 0 {
		t.Errorf("outside any work: (%d, %v), want (0, false)", f, ok)
	}
}
