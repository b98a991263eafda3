package dynamo_test

import (
	"context"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// ListWithAbandoned lists, besides the live records, an item in progress
// whose lease has passed (its consumer stopped heartbeating), with the time
// since its lease ended as a negative Remaining; List does not; a released
// item is in neither; admin.Summarize counts it as abandoned.
func TestListWithAbandoned(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(epoch)
	store := newStore(t, dynamo.Config{Clock: clock})
	prefix := testKey(t, "")
	claim := func(key string, lease time.Duration) dedup.Claim {
		t.Helper()
		res, err := store.Claim(ctx, prefix+key, "", lease)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("claim %s: %v %v", key, res.Outcome, err)
		}
		return res.Claim
	}
	claim("crashed", time.Minute)
	if err := store.Release(ctx, claim("released", time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, claim("done", time.Minute), nil, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	clock.Advance(90 * time.Second)
	claim("running", time.Hour)

	keys := func(recs []admin.Record) map[string]time.Duration {
		out := map[string]time.Duration{}
		for _, r := range recs {
			out[r.Key[len(prefix):]+" "+r.State] = r.Remaining
		}
		return out
	}
	live, next, err := store.List(ctx, prefix, "", 100)
	if err != nil || next != "" {
		t.Fatal(next, err)
	}
	if got := keys(live); len(got) != 2 || got["done completed"] <= 0 || got["running in_progress"] <= 0 {
		t.Errorf("List = %v, want done and running", got)
	}
	all, next, err := store.ListWithAbandoned(ctx, prefix, "", 100)
	if err != nil || next != "" {
		t.Fatal(next, err)
	}
	if got := keys(all); len(got) != 3 || got["crashed in_progress"] != -30*time.Second || got["running in_progress"] <= 0 {
		t.Errorf("ListWithAbandoned = %v, want done, running and crashed (lease ended 30s ago)", got)
	}
	sum, err := admin.Summarize(ctx, store, prefix, admin.SummaryOptions{PageSize: 1})
	if err != nil || !sum.AbandonedListed || len(sum.Scopes) != 1 {
		t.Fatalf("Summarize = %+v, %v", sum, err)
	}
	if s := sum.Scopes[0]; s.Abandoned != 1 || s.InProgress != 1 || s.Completed != 1 || s.OldestAbandoned == nil {
		t.Errorf("summary %+v", s)
	}
}
