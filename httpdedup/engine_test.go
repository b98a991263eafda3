package httpdedup_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
)

// lostReplyStore completes the record on the real store, then reports the
// first Complete as failed, as when the reply is lost on the way back.
type lostReplyStore struct {
	dedup.Store
	lost atomic.Bool
}

var errReplyLost = errors.New("reply lost")

func (s *lostReplyStore) Complete(ctx context.Context, c dedup.Claim, result []byte, retention time.Duration) error {
	err := s.Store.Complete(ctx, c, result, retention)
	if err == nil && s.lost.CompareAndSwap(false, true) {
		return errReplyLost
	}
	return err
}

// Issue 13, failure 2: when the first Complete succeeded but its reply was
// lost, the retry gets ErrAlreadyCompleted. The Watermill middleware counted
// it as completed; httpdedup logged an error-level claim_lost ("taken
// over"). Both now count it as completed, on a real redis-server (which
// tells that case apart).
func TestLostCompleteReplyCountsAsCompleted(t *testing.T) {
	store, _ := backends[0].new(t, nil) // redis
	rec := &recorder{}
	a := newAPI(t, &lostReplyStore{Store: store}, httpdedup.Config{Observer: rec, CompleteBackoff: time.Millisecond})
	if r := mustSend(t, a.srv, req{key: "k-lost-reply", body: "x"}); r.status != http.StatusCreated {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	var events []dedup.Event
	for _, d := range rec.all() {
		if d.Op == "complete" {
			events = append(events, d.Event)
		}
	}
	if len(events) != 1 || events[0] != dedup.EventCompleted {
		t.Fatalf("complete decisions %v, want one %q", events, dedup.EventCompleted)
	}
	if r := mustSend(t, a.srv, req{key: "k-lost-reply", body: "x"}); r.header.Get("Idempotent-Replayed") != "true" || a.pay.runs.Load() != 1 {
		t.Fatalf("retry: %d, replayed %q, runs %d; want a replay of the one run", r.status, r.header.Get("Idempotent-Replayed"), a.pay.runs.Load())
	}
}
