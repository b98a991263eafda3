package lambdadedup_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// requestStore is a memory store that records the requests the handler
// sends it: batch requests with their sizes, and single ones.
type requestStore struct {
	*memory.Store
	mu       sync.Mutex
	requests []string // "claim_batch:10", "complete:1", …
}

func (s *requestStore) note(op string, n int) {
	s.mu.Lock()
	s.requests = append(s.requests, fmt.Sprintf("%s:%d", op, n))
	s.mu.Unlock()
}

func (s *requestStore) log() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

func (s *requestStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	s.note("claim", 1)
	return s.Store.Claim(ctx, key, fp, lease)
}

func (s *requestStore) Complete(ctx context.Context, c dedup.Claim, r []byte, ret time.Duration) error {
	s.note("complete", 1)
	return s.Store.Complete(ctx, c, r, ret)
}

func (s *requestStore) Release(ctx context.Context, c dedup.Claim) error {
	s.note("release", 1)
	return s.Store.Release(ctx, c)
}

func (s *requestStore) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.ClaimResult, []error) {
	s.note("claim_batch", len(reqs))
	return s.Store.ClaimBatch(ctx, reqs)
}

func (s *requestStore) CompleteBatch(ctx context.Context, reqs []dedup.CompleteRequest) []error {
	s.note("complete_batch", len(reqs))
	return s.Store.CompleteBatch(ctx, reqs)
}

func (s *requestStore) ReleaseBatch(ctx context.Context, claims []dedup.Claim) []error {
	s.note("release_batch", len(claims))
	return s.Store.ReleaseBatch(ctx, claims)
}

// sent sums the sizes of the requests of op in log, and counts the other
// requests that are not of the ops in also.
func sent(log []string, op string, also ...string) (records, others int) {
	for _, r := range log {
		name, n, _ := strings.Cut(r, ":")
		switch {
		case name == op:
			k, _ := strconv.Atoi(n)
			records += k
		case !slices.Contains(also, name):
			others++
		}
	}
	return records, others
}

// An SQS batch of nine new records is claimed in one request and completed
// in batch requests as the records end, never one by one; a batch of their
// copies and one new record costs one claim request and one completion.
func TestSQSBatchIsOneClaimAndBatchedCompletions(t *testing.T) {
	store := &requestStore{Store: memstore.New(nil)}
	c := newCharger()
	h := newHandler(t, lambdadedup.Config{Concurrency: 4, Dedup: dedup.Config{Store: store}}, c.handle)
	var recs []events.SQSMessage
	for i := range 9 {
		recs = append(recs, record(fmt.Sprint("m", i), order(fmt.Sprint("O", i))))
	}
	if f := invoke(t, context.Background(), h, recs...); len(f) != 0 {
		t.Fatalf("failures %v, want none", f)
	}
	log := store.log()
	if log[0] != "claim_batch:9" {
		t.Fatalf("requests %v, want claim_batch:9 first", log)
	}
	if completed, others := sent(log[1:], "complete_batch"); completed != 9 || others != 0 {
		t.Fatalf("requests %v: %d records completed, %d other requests; want 9 in complete_batch requests, nothing else", log, completed, others)
	}
	store.mu.Lock()
	store.requests = nil
	store.mu.Unlock()
	recs = append(recs, record("m9", order("O9")))
	if f := invoke(t, context.Background(), h, recs...); len(f) != 0 {
		t.Fatalf("copies: failures %v, want none", f)
	}
	if got, want := store.log(), []string{"claim_batch:10", "complete_batch:1"}; !slices.Equal(got, want) {
		t.Fatalf("copies: requests %v, want %v", got, want)
	}
	if c.total() != 10 {
		t.Fatalf("charges %v, want 10 orders once each", c.charges)
	}
}

// FIFO: the records of a group after a failed one do not start, and their
// claims are released, with the failed record's, in batch requests (one,
// or two when the failed record's was still in flight), never one by one.
func TestFIFOGroupReleasedTogether(t *testing.T) {
	rec := fifoRecord
	store := &requestStore{Store: memstore.New(nil)}
	c := newCharger()
	c.fail = func(id string, _ int) error {
		if id == "A1" {
			return errors.New("declined")
		}
		return nil
	}
	h := newHandler(t, lambdadedup.Config{Dedup: dedup.Config{Store: store}}, c.handle)
	f := invoke(t, context.Background(), h, rec("a1", "A", "A1"), rec("b1", "B", "B1"), rec("a2", "A", "A2"), rec("a3", "A", "A3"))
	if !slices.Equal(f, []string{"a1", "a2", "a3"}) {
		t.Fatalf("failures %v, want [a1 a2 a3]", f)
	}
	log := store.log()
	released, others := sent(log[1:], "release_batch", "complete_batch")
	completed, _ := sent(log[1:], "complete_batch", "release_batch")
	if log[0] != "claim_batch:4" || released != 3 || completed != 1 || others != 0 {
		t.Fatalf("requests %v, want claim_batch:4, then 3 records released and 1 completed in batch requests", log)
	}
	// Released: the retry of the group runs it.
	c.fail = nil
	if f := invoke(t, context.Background(), h, rec("a1", "A", "A1"), rec("a2", "A", "A2"), rec("a3", "A", "A3")); len(f) != 0 {
		t.Fatalf("retry: failures %v, want none", f)
	}
}

// A stream batch stops at its first failure: the records after it are not
// started, their claims are released with the failed record's in batch
// requests, and the first failure's sequence number is the one reported.
func TestStreamReleasedTogether(t *testing.T) {
	for _, s := range streams {
		t.Run(s.name, func(t *testing.T) {
			store := &requestStore{Store: memstore.New(nil)}
			c := newCharger()
			c.fail = func(id string, _ int) error {
				if id == "B" {
					return errors.New("gateway down")
				}
				return nil
			}
			h := newHandler(t, lambdadedup.Config{Dedup: dedup.Config{Store: store}}, c.handle)
			if f := s.invoke(t, context.Background(), h, recs("1", "A", "2", "B", "3", "C", "4", "D")...); !slices.Equal(f, []string{"2"}) {
				t.Fatalf("failures %v, want [2]", f)
			}
			log := store.log()
			released, others := sent(log[1:], "release_batch", "complete_batch")
			completed, _ := sent(log[1:], "complete_batch", "release_batch")
			if log[0] != "claim_batch:4" || released != 3 || completed != 1 || others != 0 {
				t.Fatalf("requests %v, want claim_batch:4, then 3 records released and 1 completed in batch requests", log)
			}
			if c.charges["C"]+c.charges["D"] != 0 {
				t.Fatalf("charges %v: C and D must not start", c.charges)
			}
		})
	}
}
