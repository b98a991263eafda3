package admin

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/watermill-dedup/watermill-dedup/internal/keys"
)

// AbandonedLister is implemented by the stores that keep an in-progress
// record past the end of its lease until a claim takes it over (the memory
// and DynamoDB stores). A Redis record expires with its lease, so it has
// none to list; a PostgreSQL row whose lease ended cannot be told apart
// from a released one (a release ends the lease), so that store does not
// implement it.
type AbandonedLister interface {
	// ListWithAbandoned is Interface.List that also returns the abandoned
	// records: in progress, their lease passed, neither released nor taken
	// over yet (the consumer that held the key stopped heartbeating:
	// crashed, or cut off from the store). Such a record has State
	// StateInProgress and a Remaining ≤ 0 (how long ago its lease ended);
	// the next claim of its key takes it over. Cursor, limit and cost are
	// those of List.
	ListWithAbandoned(ctx context.Context, prefix, cursor string, limit int) (records []Record, next string, err error)
}

// ScopeSummary counts the records of one scope.
type ScopeSummary struct {
	// Scope is the scope of the keys (unescaped, see ScopedKey).
	Scope string
	// InProgress, Completed and Unreadable count the live records by
	// state.
	InProgress, Completed, Unreadable int
	// Abandoned counts the in-progress records whose lease has passed
	// while no claim took them over; zero where the store cannot list them
	// (see Summary.AbandonedListed).
	Abandoned int
	// OldestInProgress is the live in-progress record whose first claim
	// ran earliest (Record.ClaimedAt): a handler that has been running (or
	// failing and retrying) longest, while its heartbeat keeps the lease.
	// Nil when no live in-progress record keeps its claim time.
	OldestInProgress *Record
	// OldestAbandoned is the abandoned record whose lease ended earliest;
	// nil when none.
	OldestAbandoned *Record
}

// Summary is what Summarize found.
type Summary struct {
	// Scopes has one entry per scope found, ordered by scope.
	Scopes []ScopeSummary
	// Records counts the records read, Pages the List calls made.
	Records, Pages int
	// AbandonedListed says whether the store listed abandoned records (it
	// implements AbandonedLister); when false, every Abandoned is zero
	// because the store does not show them.
	AbandonedListed bool
}

// SummaryOptions tunes Summarize.
type SummaryOptions struct {
	// PageSize is the limit of each List call. Defaults to MaxListLimit.
	PageSize int
	// Pace is the least time between the starts of two List calls: a bound
	// on the load (and, on DynamoDB, the read capacity per second) the
	// summary puts on the store. Defaults to 0: no pause.
	Pace time.Duration
}

// ErrInvalidSummaryOptions: Summarize was given a page size outside
// 1..MaxListLimit or a negative pace.
var ErrInvalidSummaryOptions = errors.New("dedup/admin: invalid summary options")

// Summarize pages through every record whose scoped key starts with prefix
// (ScopePrefix(scope) for one scope; "" for the whole store) and counts
// them per scope: live records by state, abandoned ones (where the store
// is an AbandonedLister, in the same pass), the oldest in progress and the
// oldest abandoned. It keeps counts, not records: its memory is one page
// plus one entry per scope.
//
// Cost: a full listing of the store (see each store's List: no store has
// an index on key prefixes, so the whole keyspace is read whatever the
// prefix, and DynamoDB charges read capacity for every item evaluated),
// in pages of PageSize, at most one page per Pace. A record created or
// deleted meanwhile may or may not be counted; Redis SCAN may count a
// record twice. It stops at the first error, which it returns with the
// number of pages read.
func Summarize(ctx context.Context, a Interface, prefix string, opts SummaryOptions) (Summary, error) {
	if opts.PageSize == 0 {
		opts.PageSize = MaxListLimit
	}
	if opts.PageSize < 1 || opts.PageSize > MaxListLimit || opts.Pace < 0 {
		return Summary{}, fmt.Errorf("%w: page size %d (1..%d), pace %v (not negative)",
			ErrInvalidSummaryOptions, opts.PageSize, MaxListLimit, opts.Pace)
	}
	list := a.List
	abandoned, ok := a.(AbandonedLister)
	if ok {
		list = abandoned.ListWithAbandoned
	}
	sum := Summary{AbandonedListed: ok}
	scopes := map[string]*ScopeSummary{}
	cursor := ""
	var pace *time.Timer
	for {
		if pace != nil {
			select {
			case <-pace.C:
			case <-ctx.Done():
				pace.Stop()
				return sum, fmt.Errorf("dedup/admin: summary after %d pages: %w", sum.Pages, ctx.Err())
			}
		}
		if opts.Pace > 0 {
			pace = time.NewTimer(opts.Pace)
		}
		page, next, err := list(ctx, prefix, cursor, opts.PageSize)
		if err != nil {
			if pace != nil {
				pace.Stop()
			}
			return sum, fmt.Errorf("dedup/admin: summary after %d pages: %w", sum.Pages, err)
		}
		sum.Pages++
		for _, r := range page {
			sum.Records++
			name, _ := keys.Split(r.Key)
			s := scopes[name]
			if s == nil {
				s = &ScopeSummary{Scope: name}
				scopes[name] = s
			}
			s.count(r)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if pace != nil {
		pace.Stop()
	}
	for _, s := range scopes {
		sum.Scopes = append(sum.Scopes, *s)
	}
	sort.Slice(sum.Scopes, func(i, j int) bool { return sum.Scopes[i].Scope < sum.Scopes[j].Scope })
	return sum, nil
}

// count adds one record to the summary of its scope.
func (s *ScopeSummary) count(r Record) {
	switch {
	case r.State == StateInProgress && r.Remaining <= 0:
		s.Abandoned++
		if s.OldestAbandoned == nil || r.Remaining < s.OldestAbandoned.Remaining {
			rec := r
			s.OldestAbandoned = &rec
		}
	case r.State == StateInProgress:
		s.InProgress++
		if !r.ClaimedAt.IsZero() && (s.OldestInProgress == nil || r.ClaimedAt.Before(s.OldestInProgress.ClaimedAt)) {
			rec := r
			s.OldestInProgress = &rec
		}
	case r.State == StateCompleted:
		s.Completed++
	default:
		s.Unreadable++
	}
}
