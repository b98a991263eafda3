package admin_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// summaryStore fills a memory store on a fake clock: in scope "charge", two
// completed keys, two in progress claimed a minute apart, one abandoned
// (its lease ended), one released (absent: not abandoned); in scope "a:b"
// one in progress.
func summaryStore(t *testing.T) (*memory.Store, *fakeclock.Clock) {
	t.Helper()
	ctx := context.Background()
	clock := fakeclock.New(time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC))
	s := memstore.New(clock)
	claim := func(scope, key string, lease time.Duration) dedup.Claim {
		t.Helper()
		res, err := s.Claim(ctx, admin.ScopedKey(scope, key), "", lease)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("claim %s %s: %v %v", scope, key, res.Outcome, err)
		}
		return res.Claim
	}
	claim("charge", "ABANDONED", time.Minute) // its consumer crashes
	clock.Advance(10 * time.Second)
	claim("charge", "OLDEST", time.Hour)
	for _, k := range []string{"DONE-1", "DONE-2"} {
		if err := s.Complete(ctx, claim("charge", k, time.Minute), nil, 24*time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Release(ctx, claim("charge", "RELEASED", time.Minute)); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	claim("charge", "NEWER", time.Hour)
	claim("a:b", "X", time.Hour)
	return s, clock
}

// Summarize counts per scope across pages: live records by state, the
// abandoned one, the oldest in progress by its first claim; a released
// record is neither in progress nor abandoned.
func TestSummarize(t *testing.T) {
	s, clock := summaryStore(t)
	for _, pageSize := range []int{1, 2, admin.MaxListLimit} {
		sum, err := admin.Summarize(context.Background(), s, "", admin.SummaryOptions{PageSize: pageSize, Pace: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if !sum.AbandonedListed || sum.Records != 6 || len(sum.Scopes) != 2 {
			t.Fatalf("page size %d: %+v", pageSize, sum)
		}
		if pageSize == 1 && sum.Pages < 6 {
			t.Errorf("page size 1: %d pages for 6 records", sum.Pages)
		}
		ab, charge := sum.Scopes[0], sum.Scopes[1]
		if ab.Scope != "a:b" || ab.InProgress != 1 || ab.Completed != 0 || ab.Abandoned != 0 {
			t.Errorf("scope a:b: %+v", ab)
		}
		if charge.Scope != "charge" || charge.InProgress != 2 || charge.Completed != 2 || charge.Abandoned != 1 || charge.Unreadable != 0 {
			t.Errorf("scope charge: %+v", charge)
		}
		if o := charge.OldestInProgress; o == nil || o.Key != "charge:OLDEST" || !o.ClaimedAt.Equal(clock.Now().Add(-time.Minute)) {
			t.Errorf("oldest in progress: %+v", o)
		}
		if o := charge.OldestAbandoned; o == nil || o.Key != "charge:ABANDONED" || o.Remaining != -10*time.Second {
			t.Errorf("oldest abandoned: %+v", o)
		}
	}
	// One scope, by its prefix.
	sum, err := admin.Summarize(context.Background(), s, admin.ScopePrefix("a:b"), admin.SummaryOptions{})
	if err != nil || len(sum.Scopes) != 1 || sum.Scopes[0].InProgress != 1 {
		t.Errorf("scope a:b alone: %+v, %v", sum, err)
	}
}

// onlyAdmin hides every method but admin.Interface's: a store that cannot
// list abandoned records.
type onlyAdmin struct{ admin.Interface }

func TestSummarizeWithoutAbandonedLister(t *testing.T) {
	s, _ := summaryStore(t)
	sum, err := admin.Summarize(context.Background(), onlyAdmin{s}, admin.ScopePrefix("charge"), admin.SummaryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sum.AbandonedListed || len(sum.Scopes) != 1 || sum.Scopes[0].Abandoned != 0 || sum.Scopes[0].InProgress != 2 {
		t.Errorf("%+v", sum)
	}
}

// failingList fails its second page.
type failingList struct {
	admin.Interface
	calls int
}

var errBroken = errors.New("store broken")

func (f *failingList) List(ctx context.Context, prefix, cursor string, limit int) ([]admin.Record, string, error) {
	if f.calls++; f.calls == 2 {
		return nil, "", errBroken
	}
	return f.Interface.List(ctx, prefix, cursor, limit)
}

func TestSummarizeErrors(t *testing.T) {
	s, _ := summaryStore(t)
	for _, opts := range []admin.SummaryOptions{{PageSize: -1}, {PageSize: admin.MaxListLimit + 1}, {Pace: -time.Second}} {
		if _, err := admin.Summarize(context.Background(), s, "", opts); !errors.Is(err, admin.ErrInvalidSummaryOptions) {
			t.Errorf("%+v: %v, want ErrInvalidSummaryOptions", opts, err)
		}
	}
	sum, err := admin.Summarize(context.Background(), &failingList{Interface: s}, "", admin.SummaryOptions{PageSize: 1})
	if !errors.Is(err, errBroken) || sum.Pages != 1 {
		t.Errorf("failing second page: %d pages, %v", sum.Pages, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := admin.Summarize(ctx, s, "", admin.SummaryOptions{PageSize: 1, Pace: time.Hour}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
}
