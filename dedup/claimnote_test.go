package dedup_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// notingStore notes something of each claim at Claim (dedup.HeldClaim.SetNote)
// and checks at Complete and Release that their contexts carry the same
// claim with that note, and the call's Origin (its MessageID is the end
// of the key in these tests).
type notingStore struct {
	dedup.Store
	ends chan string
	last context.Context // the context of the last Complete or Release
}

func (s *notingStore) Claim(ctx context.Context, key, fingerprint string, lease time.Duration) (dedup.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, key, fingerprint, lease)
	if hc, ok := dedup.HeldClaimFromContext(ctx); ok && hc.Claim().Token == "" && err == nil && res.Outcome == dedup.Acquired {
		hc.SetNote("noted " + res.Claim.Token)
	}
	return res, err
}

func (s *notingStore) end(ctx context.Context, op string, claim dedup.Claim) {
	s.last = ctx
	if o, _ := dedup.OriginFromContext(ctx); o.MessageID == "" || !strings.HasSuffix(claim.Key, o.MessageID) {
		s.ends <- op + ": origin " + o.MessageID
		return
	}
	hc, ok := dedup.HeldClaimFromContext(ctx)
	switch {
	case !ok:
		s.ends <- op + ": no claim in the context"
	case hc.Claim() != claim:
		s.ends <- op + ": another claim in the context"
	case hc.Note() != "noted "+claim.Token:
		s.ends <- op + ": note " + hc.Note()
	default:
		s.ends <- op + ": noted"
	}
}

func (s *notingStore) Complete(ctx context.Context, claim dedup.Claim, result []byte, retention time.Duration) error {
	s.end(ctx, "complete", claim)
	return s.Store.Complete(ctx, claim, result, retention)
}

func (s *notingStore) Release(ctx context.Context, claim dedup.Claim) error {
	s.end(ctx, "release", claim)
	return s.Store.Release(ctx, claim)
}

// TestStoreFindsItsNoteAtTheEnd: what a store notes of a claim on the
// claim's context (the Redis store: the record the claim wrote) is on the
// contexts of that claim's Complete and Release, with the call's Origin,
// also when the caller's
// context is cancelled by then and when an inner call runs under the
// outer one's claim.
func TestStoreFindsItsNoteAtTheEnd(t *testing.T) {
	store := &notingStore{Store: memstore.New(fakeclock.New(epoch)), ends: make(chan string, 4)}
	e, err := dedup.NewEngine(dedup.Config{Store: store, Lease: time.Minute, Retention: time.Hour, Clock: fakeclock.New(epoch)})
	if err != nil {
		t.Fatal(err)
	}
	want := func(what string) {
		t.Helper()
		if got := <-store.ends; got != what {
			t.Errorf("%s, want %q", got, what)
		}
	}
	ctx := context.Background()
	if _, err := e.Do(ctx, dedup.Call{Scope: "s", Key: "completed", MessageID: "completed"}, func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	want("complete: noted")
	failed := errors.New("failed")
	if _, err := e.Do(ctx, dedup.Call{Scope: "s", Key: "released", MessageID: "released"}, func(context.Context) ([]byte, error) { return nil, failed }); !errors.Is(err, failed) {
		t.Fatal(err)
	}
	want("release: noted")
	cctx, cancel := context.WithCancelCause(ctx)
	callerGone := errors.New("the caller went away")
	if _, err := e.Do(cctx, dedup.Call{Scope: "s", Key: "cancelled", MessageID: "cancelled"}, func(context.Context) ([]byte, error) { cancel(callerGone); return nil, nil }); err != nil {
		t.Fatal(err)
	}
	want("complete: noted")
	// Detached from the caller, as context.WithoutCancel is: once over,
	// the operation's context was cancelled by its end, not by the caller.
	if err := context.Cause(store.last); !errors.Is(err, context.Canceled) {
		t.Errorf("the cause of Complete's context after it returned is %v, want context.Canceled", err)
	}
	_, err = e.Do(ctx, dedup.Call{Scope: "s", Key: "outer", MessageID: "outer"}, func(ctx context.Context) ([]byte, error) {
		_, err := e.Do(ctx, dedup.Call{Scope: "s", Key: "inner", MessageID: "inner"}, func(context.Context) ([]byte, error) { return nil, nil })
		return nil, err
	})
	if err != nil {
		t.Fatal(err)
	}
	want("complete: noted") // inner
	want("complete: noted") // outer
}

// TestDeliverySizeClass: the middleware's one allocation per message (the
// flight, with the claim the work's context carries and the store's note)
// stays within Go's 704-byte size class, the next one being 768 bytes. An
// object of more than 512 bytes that holds pointers carries an 8-byte
// allocation header on the heap, so the struct may have 696 bytes.
func TestDeliverySizeClass(t *testing.T) {
	const header = 8
	if dedup.DeliverySize+header > 704 {
		t.Fatalf("the middleware allocates %d bytes per message (with the allocation header), past the 704-byte size class", dedup.DeliverySize+header)
	}
}
