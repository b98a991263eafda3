package memory_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// completeCounter counts the Complete calls the engine makes on the
// memory store.
type completeCounter struct {
	*memory.Store
	n atomic.Int64
}

func (c *completeCounter) Complete(ctx context.Context, claim dedup.Claim, result []byte, retention time.Duration) error {
	c.n.Add(1)
	return c.Store.Complete(ctx, claim, result, retention)
}

// txEnv is a memory store on a fake clock and an engine on it.
type txEnv struct {
	clock   *fakeclock.Clock
	store   *memory.Store
	engine  *dedup.Engine
	counted *completeCounter
}

func newTxEnv(t *testing.T, cfg dedup.Config) *txEnv {
	t.Helper()
	clock := fakeclock.New(epoch)
	s := memstore.New(clock)
	counted := &completeCounter{Store: s}
	cfg.Store, cfg.Clock, cfg.Lease, cfg.Retention, cfg.DisableHeartbeat = counted, clock, time.Minute, time.Hour, true
	e, err := dedup.NewEngine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &txEnv{clock: clock, store: s, engine: e, counted: counted}
}

// charge runs a Do of key whose work, in RunInTx, sets "charge:"+key to
// amount, after before (if any) has run inside the work.
func (x *txEnv) charge(ctx context.Context, key, amount string, before func(ctx context.Context) error) (dedup.ClaimResult, error) {
	return x.engine.Do(ctx, dedup.Call{Scope: "tx", Key: key}, func(ctx context.Context) ([]byte, error) {
		return x.store.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
			tx, ok := memory.TxFromContext(ctx)
			if !ok {
				return nil, errors.New("no Tx in the work's context")
			}
			if err := tx.Set("charge:"+key, []byte(amount)); err != nil {
				return nil, err
			}
			if before != nil {
				if err := before(ctx); err != nil {
					return nil, err
				}
			}
			return []byte("receipt " + amount), nil
		})
	})
}

func (x *txEnv) value(key string) string {
	v, ok := x.store.Get(key)
	if !ok {
		return "<none>"
	}
	return string(v)
}

func TestRunInTx(t *testing.T) {
	ctx := context.Background()

	// The writes and the completion in one step; the engine does not
	// complete again, and the duplicate gets the work's result.
	t.Run("commit", func(t *testing.T) {
		x := newTxEnv(t, dedup.Config{})
		res, err := x.charge(ctx, "k", "42", nil)
		if err != nil || res.Outcome != dedup.Acquired || string(res.Result) != "receipt 42" {
			t.Fatalf("Do: %v %q %v", res.Outcome, res.Result, err)
		}
		if v := x.value("charge:k"); v != "42" {
			t.Fatalf("charge:k = %s, want 42", v)
		}
		if n := x.counted.n.Load(); n != 0 {
			t.Fatalf("the engine called Complete %d times after RunInTx completed the record", n)
		}
		again, err := x.charge(ctx, "k", "43", nil)
		if err != nil || again.Outcome != dedup.Duplicate || string(again.Result) != "receipt 42" {
			t.Fatalf("second Do: %v %q %v, want the duplicate of the first", again.Outcome, again.Result, err)
		}
		if v := x.value("charge:k"); v != "42" {
			t.Fatalf("charge:k = %s after the duplicate, want 42", v)
		}
	})

	// The claim is lost before the commit: evicted and taken over by
	// another consumer (the engine does not know: the store's own check
	// refuses the completion), or its lease ended (the engine cancels the
	// work's context), then taken over or not. Nothing is written; the new
	// owner's record is untouched.
	for _, tc := range []struct {
		name            string
		evict, takeover bool
	}{{"evicted-taken-over", true, true}, {"lease-ended", false, false}, {"lease-ended-taken-over", false, true}} {
		t.Run("claim-lost/"+tc.name, func(t *testing.T) {
			x := newTxEnv(t, dedup.Config{})
			var other dedup.ClaimResult
			_, err := x.charge(ctx, "k", "7", func(ctx context.Context) error {
				if tc.evict {
					if _, err := x.store.Evict(ctx, "tx:k"); err != nil {
						return err
					}
				} else {
					x.clock.Advance(time.Minute)
				}
				if tc.takeover {
					var err error
					if other, err = x.store.Claim(context.Background(), "tx:k", "", time.Minute); err != nil || other.Outcome != dedup.Acquired {
						return fmt.Errorf("takeover: %v %v", other.Outcome, err)
					}
				}
				return nil
			})
			if !errors.Is(err, dedup.ErrClaimLost) {
				t.Fatalf("Do: %v, want ErrClaimLost", err)
			}
			if v := x.value("charge:k"); v != "<none>" {
				t.Fatalf("charge:k = %s although the claim was lost", v)
			}
			r, err := x.store.Inspect(ctx, "tx:k")
			switch {
			case tc.takeover && (err != nil || r.State != admin.StateInProgress):
				t.Fatalf("the new owner's record: %+v, %v; want it in progress", r, err)
			case tc.takeover:
				if err := x.store.Complete(ctx, other.Claim, nil, time.Hour); err != nil {
					t.Fatalf("the new owner's Complete: %v", err)
				}
			case !errors.Is(err, admin.ErrNotFound):
				t.Fatalf("the expired record: %+v, %v; want it gone", r, err)
			}
		})
	}

	// The work fails, or panics: nothing is written, and the engine
	// releases the claim (the next Do runs the work).
	t.Run("work-fails", func(t *testing.T) {
		x := newTxEnv(t, dedup.Config{})
		declined := errors.New("declined")
		if _, err := x.charge(ctx, "k", "1", func(context.Context) error { return declined }); !errors.Is(err, declined) {
			t.Fatalf("Do: %v, want the work's error", err)
		}
		func() {
			defer func() {
				if p := recover(); p != "boom" {
					t.Fatalf("recovered %v, want the work's panic", p)
				}
			}()
			_, _ = x.charge(ctx, "k", "2", func(context.Context) error { panic("boom") })
		}()
		if v := x.value("charge:k"); v != "<none>" {
			t.Fatalf("charge:k = %s after a failed and a panicking work", v)
		}
		if res, err := x.charge(ctx, "k", "3", nil); err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("Do after the release: %v %v, want acquired", res.Outcome, err)
		}
		if v := x.value("charge:k"); v != "3" {
			t.Fatalf("charge:k = %s, want 3", v)
		}
	})

	// A RunInTx inside the RunInTx of the same claim: refused before its
	// work runs; the outer writes are written with the completion when the
	// outer work swallows the error, and nothing is when it passes it on.
	for _, passOn := range []bool{false, true} {
		t.Run(fmt.Sprintf("nested/pass-on=%v", passOn), func(t *testing.T) {
			x := newTxEnv(t, dedup.Config{})
			innerRan := false
			var innerErr error
			_, err := x.charge(ctx, "k", "outer", func(ctx context.Context) error {
				_, innerErr = x.store.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
					innerRan = true
					return nil, nil
				})
				if passOn {
					return innerErr
				}
				return nil
			})
			if innerRan || !errors.Is(innerErr, memory.ErrNestedTx) || !errors.Is(innerErr, dedup.ErrNestedTx) {
				t.Fatalf("inner RunInTx: %v (its work ran: %v), want ErrNestedTx before its work", innerErr, innerRan)
			}
			want := "outer"
			if passOn {
				want = "<none>"
				if !errors.Is(err, dedup.ErrNestedTx) {
					t.Fatalf("Do: %v, want the inner ErrNestedTx", err)
				}
			} else if err != nil {
				t.Fatalf("Do: %v", err)
			}
			if v := x.value("charge:k"); v != want {
				t.Fatalf("charge:k = %s, want %s", v, want)
			}
		})
	}

	t.Run("no-claim", func(t *testing.T) {
		x := newTxEnv(t, dedup.Config{})
		ran := false
		_, err := x.store.RunInTx(ctx, func(context.Context) ([]byte, error) { ran = true; return nil, nil })
		if !errors.Is(err, memory.ErrNoClaim) || ran {
			t.Fatalf("RunInTx without a claim: %v (work ran: %v), want ErrNoClaim before the work", err, ran)
		}
	})

	// A run dedup.Config.Shadow lets through without a claim writes its
	// writes alone and completes nothing.
	t.Run("unclaimed", func(t *testing.T) {
		x := newTxEnv(t, dedup.Config{})
		if _, err := x.charge(ctx, "k", "1", nil); err != nil {
			t.Fatal(err)
		}
		e, err := dedup.NewEngine(dedup.Config{Store: x.store, Clock: x.clock, Lease: time.Minute, Retention: time.Hour, Shadow: true})
		if err != nil {
			t.Fatal(err)
		}
		shadow := &txEnv{clock: x.clock, store: x.store, engine: e}
		res, err := shadow.charge(ctx, "k", "2", nil)
		if err != nil || res.Outcome != 0 {
			t.Fatalf("shadow Do of a completed key: %v %v, want an unclaimed run", res.Outcome, err)
		}
		if v := x.value("charge:k"); v != "2" {
			t.Fatalf("charge:k = %s, want the unclaimed run's 2", v)
		}
		if r, err := x.store.Inspect(ctx, "tx:k"); err != nil || r.State != admin.StateCompleted || r.Claims != 1 {
			t.Fatalf("record %+v, %v; want completed once, by the first run", r, err)
		}
	})

	// A Tx is written once: writes after its RunInTx returned are refused;
	// Delete removes a value; concurrent writes are safe (-race).
	t.Run("tx-writes", func(t *testing.T) {
		x := newTxEnv(t, dedup.Config{})
		var kept *memory.Tx
		if _, err := x.charge(ctx, "a", "1", func(ctx context.Context) error {
			kept, _ = memory.TxFromContext(ctx)
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Go(func() { _ = kept.Set(fmt.Sprint("w", i), []byte("v")) })
			}
			wg.Wait()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := kept.Set("late", []byte("x")); !errors.Is(err, memory.ErrTxDone) {
			t.Fatalf("Set after RunInTx: %v, want ErrTxDone", err)
		}
		if err := kept.Delete("charge:a"); !errors.Is(err, memory.ErrTxDone) {
			t.Fatalf("Delete after RunInTx: %v, want ErrTxDone", err)
		}
		for i := range 8 {
			if v := x.value(fmt.Sprint("w", i)); v != "v" {
				t.Fatalf("w%d = %s, want v", i, v)
			}
		}
		if _, err := x.engine.Do(ctx, dedup.Call{Scope: "tx", Key: "b"}, func(ctx context.Context) ([]byte, error) {
			return x.store.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
				tx, _ := memory.TxFromContext(ctx)
				return nil, errors.Join(tx.Set("charge:a", []byte("overwritten")), tx.Delete("charge:a"), tx.Set("empty", nil))
			})
		}); err != nil {
			t.Fatal(err)
		}
		if v := x.value("charge:a"); v != "<none>" {
			t.Fatalf("charge:a = %s, want it deleted (the last write wins)", v)
		}
		if v, ok := x.store.Get("empty"); !ok || v == nil || len(v) != 0 {
			t.Fatalf("Get(empty) = %q, %v; want an empty value", v, ok)
		}
	})
}

// TxMiddleware inside the dedup middleware: the handler's write and the
// completion in one step; the duplicate replays the handler's output
// (Config.Replay) without running it; outside the dedup middleware, every
// message is refused with ErrNoClaim before the handler runs.
func TestTxMiddleware(t *testing.T) {
	s := memstore.New(nil)
	key := func(msg *message.Message) (string, error) { return msg.Metadata.Get("order_id"), nil }
	d, err := dedup.New(dedup.Config{Store: s, Key: key, Scope: "orders", Replay: true})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	handler := func(msg *message.Message) ([]*message.Message, error) {
		calls.Add(1)
		tx, ok := memory.TxFromContext(msg.Context())
		if !ok {
			return nil, errors.New("no Tx in the handler's context")
		}
		id := msg.Metadata.Get("order_id")
		if err := tx.Set("order:"+id, msg.Payload); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("charged "+id))}, nil
	}
	delivery := func(id string) *message.Message {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":5}`))
		msg.Metadata.Set("order_id", id)
		return msg
	}
	h := d.Middleware(s.TxMiddleware(handler))
	first, err := h(delivery("ORDER-1"))
	if err != nil || len(first) != 1 {
		t.Fatalf("first delivery: %d messages, %v", len(first), err)
	}
	again, err := h(delivery("ORDER-1"))
	if err != nil || len(again) != 1 || !again[0].Equals(first[0]) {
		t.Fatalf("duplicate: %v, %v; want the first output replayed", again, err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	if v, ok := s.Get("order:ORDER-1"); !ok || string(v) != `{"amount":5}` {
		t.Fatalf("order:ORDER-1 = %q, %v", v, ok)
	}
	for name, h := range map[string]message.HandlerFunc{
		"alone":      s.TxMiddleware(handler),
		"misordered": s.TxMiddleware(d.Middleware(handler)),
	} {
		if _, err := h(delivery("ORDER-2")); !errors.Is(err, memory.ErrNoClaim) {
			t.Fatalf("%s: %v, want ErrNoClaim", name, err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1 (refused without a claim)", n)
	}
}

// httpdedup keeps the response status with the record (dedup.RecordDetails),
// with its Complete and inside RunInTx (Config.InTransaction) alike; an
// operator sees it in admin.Record.ResponseStatus.
func TestResponseStatusKept(t *testing.T) {
	for _, inTx := range []bool{false, true} {
		t.Run(fmt.Sprintf("in-transaction=%v", inTx), func(t *testing.T) {
			s := memstore.New(nil)
			cfg := httpdedup.Config{Dedup: dedup.Config{Store: s, Lease: time.Minute, Retention: time.Hour}, Identity: httpdedup.StaticIdentity("acct_42")}
			if inTx {
				cfg.InTransaction = s.RunInTx
			}
			idem, err := httpdedup.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(idem.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tx, ok := memory.TxFromContext(r.Context()); ok {
					if err := tx.Set("payment:p-1", []byte("5")); err != nil {
						http.Error(w, err.Error(), http.StatusInternalServerError)
						return
					}
				} else if inTx {
					http.Error(w, "no transaction", http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, `{"payment":"p-1"}`)
			})))
			t.Cleanup(srv.Close)
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":5}`))
			req.Header.Set("Idempotency-Key", "key-1")
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("status %d, want 201", resp.StatusCode)
			}
			records, _, err := s.List(context.Background(), "", "", 10)
			if err != nil || len(records) != 1 {
				t.Fatalf("List: %+v, %v; want the request's record", records, err)
			}
			if r := records[0]; r.State != admin.StateCompleted || r.ResponseStatus != http.StatusCreated {
				t.Fatalf("record %+v, want completed with response status 201", r)
			}
			if _, ok := s.Get("payment:p-1"); ok != inTx {
				t.Fatalf("payment written: %v, want %v", ok, inTx)
			}
		})
	}
}
