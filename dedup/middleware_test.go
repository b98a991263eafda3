package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/replay"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/faultstore"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// faultStore wraps a store and injects errors per operation (see
// internal/testsupport/faultstore).
type faultStore = faultstore.Store

func newFaultStore(s dedup.Store) *faultStore { return faultstore.New(s) }

var (
	errReplyLost = faultstore.ErrReplyLost
	errNetwork   = faultstore.ErrNetwork
)

// recv receives from ch within a minute, or fails the test naming what it
// awaited: no wait in a test is unbounded.
func recv[T any](t testing.TB, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("waited a minute for %s", what)
		panic("unreachable")
	}
}

var epoch = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// hasEvent reports whether logs hold the event at the level.
func hasEvent(logs *watermill.CaptureLoggerAdapter, level watermill.LogLevel, e event.Event) bool {
	for _, m := range logs.Captured()[level] {
		if m.Fields["dedup_event"] == string(e) {
			return true
		}
	}
	return false
}

func order(id string) *message.Message {
	return message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"`+id+`","amount":150}`))
}

func newDedup(t *testing.T, cfg dedup.Config) *dedup.Deduplicator {
	t.Helper()
	if cfg.Key == nil {
		cfg.Key = keyfuncs.JSON("order_id")
	}
	if cfg.Scope == "" {
		cfg.Scope = "charge"
	}
	d, err := dedup.New(cfg)
	if err != nil {
		t.Fatalf("dedup.New: %v", err)
	}
	return d
}

func TestNewValidatesEverything(t *testing.T) {
	_, err := dedup.New(dedup.Config{})
	if err == nil || !strings.Contains(err.Error(), "Store is required") || !strings.Contains(err.Error(), "Key is required") {
		t.Fatalf("empty config: got %v, want both Store and Key reported", err)
	}
	base := dedup.Config{Store: memstore.New(nil), Key: keyfuncs.JSON("id")}
	for name, mutate := range map[string]func(*dedup.Config){
		"negative lease":         func(c *dedup.Config) { c.Lease = -time.Second },
		"negative retention":     func(c *dedup.Config) { c.Retention = -1 },
		"heartbeat over lease":   func(c *dedup.Config) { c.Lease = time.Second; c.Heartbeat = time.Second },
		"negative heartbeat":     func(c *dedup.Config) { c.Heartbeat = -time.Second },
		"negative store timeout": func(c *dedup.Config) { c.StoreTimeout = -time.Second },
	} {
		cfg := base
		mutate(&cfg)
		if _, err := dedup.New(cfg); !errors.Is(err, dedup.ErrInvalidDuration) {
			t.Errorf("%s: got %v, want ErrInvalidDuration", name, err)
		}
	}
	cfg := base
	cfg.Lease = time.Second
	cfg.DisableHeartbeat = true
	if _, err := dedup.New(cfg); err != nil {
		t.Fatalf("heartbeat disabled: %v", err)
	}
	if _, err := dedup.New(base); err != nil {
		t.Fatalf("zero durations take defaults: %v", err)
	}
	if base.Lease != 0 {
		t.Fatalf("New wrote defaults into the caller's config")
	}
}

func TestDuplicateIsAckedWithoutHandler(t *testing.T) {
	store := memstore.New(nil)
	d := newDedup(t, dedup.Config{Store: store})
	var calls atomic.Int32
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) { calls.Add(1); return nil, nil })
	for i := range 3 {
		if _, err := h(order("ORDER-003")); err != nil {
			t.Fatalf("copy %d: %v", i, err)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times for three copies, want 1", calls.Load())
	}
}

// TestKeyProblemsAreTypedAndTouchNothing: a message without a usable key
// is refused, permanently, before the store is touched. The rules of the
// key function's errors and panics and of transport ids are TestTakeKey's.
func TestKeyProblemsAreTypedAndTouchNothing(t *testing.T) {
	store := memstore.New(nil)
	called := false
	handler := func(*message.Message) ([]*message.Message, error) { called = true; return nil, nil }
	uuidMsg := message.NewMessage("7c1d9e4a-uuid", nil)
	uuidMsg.Payload = []byte(`{"order_id":"7c1d9e4a-uuid"}`)
	cases := []struct {
		name string
		key  keyfuncs.Func
		msg  *message.Message
		want error
	}{
		{"malformed JSON", keyfuncs.JSON("order_id"), message.NewMessage("u1", []byte(`{"order_id":`)), dedup.ErrNoKey},
		{"payload null", keyfuncs.JSON("order_id"), message.NewMessage("u2", []byte(`null`)), dedup.ErrNoKey},
		{"missing field", keyfuncs.JSON("order_id"), message.NewMessage("u3", []byte(`{"id":"x"}`)), dedup.ErrNoKey},
		{"empty key", keyfuncs.JSON("order_id"), message.NewMessage("u4", []byte(`{"order_id":""}`)), dedup.ErrNoKey},
		{"whitespace key from a custom func", func(*message.Message) (string, error) { return " \t", nil }, message.NewMessage("u5", nil), dedup.ErrNoKey},
		{"invalid UTF-8 from a custom func", func(*message.Message) (string, error) { return "a\xffb", nil }, message.NewMessage("u6", nil), dedup.ErrNoKey},
		{"10 KB key", func(*message.Message) (string, error) { return strings.Repeat("k", 10*1024), nil }, message.NewMessage("u7", nil), dedup.ErrNoKey},
		{"key equals UUID", keyfuncs.JSON("order_id"), uuidMsg, dedup.ErrTransportKey},
		{"number with fraction", keyfuncs.JSON("order_id"), message.NewMessage("u10", []byte(`{"order_id":1.5}`)), dedup.ErrNoKey},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			called = false
			d := newDedup(t, dedup.Config{Store: store, Key: tc.key})
			_, err := d.Middleware(handler)(tc.msg)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if !dedup.IsPermanent(err) {
				t.Fatalf("%v is not classified permanent", err)
			}
			if called {
				t.Fatalf("handler called")
			}
			if store.Len() != 0 {
				t.Fatalf("store holds %d records after a refused key", store.Len())
			}
		})
	}
}

func TestHandlerErrorReleasesAndRetrySucceeds(t *testing.T) {
	store := memstore.New(nil)
	d := newDedup(t, dedup.Config{Store: store})
	fail := errors.New("payment gateway timeout")
	var calls atomic.Int32
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		if calls.Add(1) == 1 {
			return nil, fail
		}
		return nil, nil
	})
	m := order("ORDER-1")
	if _, err := h(m); !errors.Is(err, fail) {
		t.Fatalf("first delivery: got %v, want the handler's error", err)
	}
	if dedup.IsPermanent(fail) {
		t.Fatalf("a handler error must not be classified permanent")
	}
	if store.Len() != 0 {
		t.Fatalf("failed handler left %d records: the claim was not released", store.Len())
	}
	if _, err := h(m); err != nil {
		t.Fatalf("redelivery: %v", err)
	}
	if _, err := h(order("ORDER-1")); err != nil {
		t.Fatalf("duplicate: %v", err)
	}
	if calls.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2 (failure + retry)", calls.Load())
	}
}

func TestPanicReleasesAndPanicContinues(t *testing.T) {
	store := memstore.New(nil)
	d := newDedup(t, dedup.Config{Store: store})
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) { panic("nil pointer in charge()") })
	got := func() (p any) {
		defer func() { p = recover() }()
		_, _ = h(order("ORDER-1"))
		return nil
	}()
	if got != "nil pointer in charge()" {
		t.Fatalf("recovered %v, want the handler's own panic value", got)
	}
	if store.Len() != 0 {
		t.Fatalf("panicking handler left %d records", store.Len())
	}
	ok := d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	if _, err := ok(order("ORDER-1")); err != nil {
		t.Fatalf("redelivery after panic: %v", err)
	}
}

func TestInProgressCopyIsNackedThenSkipped(t *testing.T) {
	store := memstore.New(nil)
	d := newDedup(t, dedup.Config{Store: store})
	entered, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls.Add(1)
		close(entered)
		<-release
		return nil, nil
	})
	first := make(chan error, 1)
	go func() { _, err := h(order("ORDER-1")); first <- err }()
	recv(t, "the handler to start", entered)
	cp := order("ORDER-1")
	_, err := h(cp)
	if !errors.Is(err, dedup.ErrInProgress) || dedup.IsPermanent(err) {
		t.Fatalf("copy while in progress: got %v, want retryable ErrInProgress", err)
	}
	close(release)
	if err := recv(t, "the first delivery to return", first); err != nil {
		t.Fatalf("first: %v", err)
	}
	if _, err := h(cp); err != nil {
		t.Fatalf("copy redelivered after completion: %v", err)
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", calls.Load())
	}
}

func TestConflictIsKeyReuse(t *testing.T) {
	store := memstore.New(nil)
	d := newDedup(t, dedup.Config{Store: store, Fingerprint: keyfuncs.PayloadFingerprint})
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	if _, err := h(order("ORDER-1")); err != nil {
		t.Fatal(err)
	}
	other := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"ORDER-1","amount":999}`))
	if _, err := h(other); !errors.Is(err, dedup.ErrKeyReuse) || !dedup.IsPermanent(err) {
		t.Fatalf("same key, other payload: got %v, want permanent ErrKeyReuse", err)
	}
	if _, err := h(order("ORDER-1")); err != nil {
		t.Fatalf("same payload again: %v", err)
	}
}

func TestReplayReturnsStoredOutput(t *testing.T) {
	store := memstore.New(nil)
	d := newDedup(t, dedup.Config{Store: store, Replay: true})
	var calls atomic.Int32
	h := d.Middleware(func(m *message.Message) ([]*message.Message, error) {
		calls.Add(1)
		out := message.NewMessage("out-"+m.UUID, []byte("charged\x00\xff"))
		out.Metadata.Set("order_id", "ORDER-1")
		return []*message.Message{out}, nil
	})
	first, err := h(order("ORDER-1"))
	if err != nil {
		t.Fatal(err)
	}
	replayed, err := h(order("ORDER-1"))
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times", calls.Load())
	}
	if len(replayed) != 1 || !replayed[0].Equals(first[0]) || replayed[0].UUID != first[0].UUID {
		t.Fatalf("replayed %v, want %v", replayed, first)
	}
	// A handler producing nothing replays nothing.
	none := d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	if _, err := none(order("ORDER-2")); err != nil {
		t.Fatal(err)
	}
	if out, err := none(order("ORDER-2")); err != nil || len(out) != 0 {
		t.Fatalf("replay of no output: %v, %v", out, err)
	}
}

func TestStoreErrorsFailClosed(t *testing.T) {
	store := newFaultStore(memstore.New(nil))
	store.Inject("claim", errNetwork)
	d := newDedup(t, dedup.Config{Store: store})
	var calls atomic.Int32
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) { calls.Add(1); return nil, nil })
	_, err := h(order("ORDER-1"))
	var se *dedup.StoreError
	if !errors.As(err, &se) || se.Op != "claim" || !errors.Is(err, errNetwork) || dedup.IsPermanent(err) {
		t.Fatalf("got %v, want a retryable *StoreError for claim wrapping the cause", err)
	}
	if calls.Load() != 0 {
		t.Fatalf("handler ran without a claim")
	}
	if _, err := h(order("ORDER-1")); err != nil || calls.Load() != 1 {
		t.Fatalf("after the store recovered: err %v, calls %d", err, calls.Load())
	}
}

func TestFailOpenRunsHandlerAndSaysSo(t *testing.T) {
	store := newFaultStore(memstore.New(nil))
	store.Inject("claim", errNetwork)
	logs := watermill.NewCaptureLogger()
	d := newDedup(t, dedup.Config{Store: store, FailOpen: true, Logger: logs})
	var calls atomic.Int32
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) { calls.Add(1); return nil, nil })
	if _, err := h(order("ORDER-1")); err != nil || calls.Load() != 1 {
		t.Fatalf("fail-open: err %v, calls %d", err, calls.Load())
	}
	if !hasEvent(logs, watermill.ErrorLogLevel, event.FailOpen) {
		t.Fatalf("fail_open was not logged at error level: %v", logs.Captured())
	}
}

func TestCompleteIsRetriedThenAckedAnyway(t *testing.T) {
	store := newFaultStore(memstore.New(nil))
	logs := watermill.NewCaptureLogger()
	d := newDedup(t, dedup.Config{Store: store, Logger: logs, CompleteRetries: 2, CompleteBackoff: time.Millisecond})
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })

	store.Inject("complete", errNetwork, errNetwork) // two failures, third attempt works
	if _, err := h(order("ORDER-1")); err != nil {
		t.Fatalf("got %v, want ack", err)
	}
	if n := store.Count("complete"); n != 3 {
		t.Fatalf("complete called %d times, want 3", n)
	}
	if _, err := h(order("ORDER-1")); err != nil {
		t.Fatal(err)
	}

	store.Inject("complete", errNetwork, errNetwork, errNetwork) // all attempts fail
	if _, err := h(order("ORDER-2")); err != nil {
		t.Fatalf("got %v, want ack even though Complete failed", err)
	}
	found := false
	for _, m := range logs.Captured()[watermill.ErrorLogLevel] {
		if m.Msg == "dedup: store_error" && m.Fields["op"] == "complete" && errors.Is(m.Err, errNetwork) {
			found = true
		}
	}
	if !found {
		t.Fatalf("failed Complete was not logged as store_error")
	}
	// The record stays in progress until its lease ends: a copy is retried, not run.
	if _, err := h(order("ORDER-2")); !errors.Is(err, dedup.ErrInProgress) {
		t.Fatalf("copy after failed Complete: got %v, want ErrInProgress", err)
	}
}

// runHandler calls h(msg) in a goroutine; the returned channel yields its
// error.
func runHandler(h message.HandlerFunc, msg *message.Message) chan error {
	done := make(chan error, 1)
	go func() { _, err := h(msg); done <- err }()
	return done
}

func TestHeartbeatKeepsLongHandlersClaim(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clock := fakeclock.New(epoch)
	store := memstore.New(clock)
	d := newDedup(t, dedup.Config{Store: store, Clock: clock, Lease: 30 * time.Second, Heartbeat: 10 * time.Second})
	release := make(chan struct{})
	var calls atomic.Int32
	h := d.Middleware(func(m *message.Message) ([]*message.Message, error) {
		calls.Add(1)
		select {
		case <-release:
			return nil, nil
		case <-m.Context().Done():
			return nil, context.Cause(m.Context())
		}
	})
	done := runHandler(h, order("ORDER-1"))
	// Run the handler for 3× the lease, one heartbeat at a time.
	for range 9 {
		if err := clock.WaitForTimerAt(ctx, clock.Now().Add(10*time.Second)); err != nil { // the next heartbeat is armed
			t.Fatal(err)
		}
		clock.Advance(10 * time.Second)
	}
	if err := clock.WaitForTimerAt(ctx, clock.Now().Add(10*time.Second)); err != nil { // the 9th extension is done
		t.Fatal(err)
	}
	other, err := store.Claim(ctx, admin.ScopedKey("charge", "ORDER-1"), "", time.Minute)
	if err != nil || other.Outcome != dedup.InProgress {
		t.Fatalf("another consumer after 90s of a 30s lease: %v %v, want in progress", other.Outcome, err)
	}
	close(release)
	if err := recv(t, "the handler to return", done); err != nil {
		t.Fatalf("long handler: %v", err)
	}
	if _, err := h(order("ORDER-1")); err != nil || calls.Load() != 1 {
		t.Fatalf("duplicate after long handler: err %v, calls %d", err, calls.Load())
	}
}

func TestWithoutHeartbeatALongHandlerIsTakenOver(t *testing.T) {
	clock := fakeclock.New(epoch)
	store := memstore.New(clock)
	logs := watermill.NewCaptureLogger()
	d := newDedup(t, dedup.Config{Store: store, Clock: clock, Lease: 30 * time.Second, DisableHeartbeat: true, Logger: logs})
	entered, release := make(chan struct{}, 2), make(chan struct{})
	var calls atomic.Int32
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		if calls.Add(1) == 1 {
			entered <- struct{}{}
			<-release
		}
		return nil, nil
	})
	done := runHandler(h, order("ORDER-1"))
	recv(t, "the handler to start", entered)
	clock.Advance(31 * time.Second)
	// The lease ended: a redelivered copy takes the key over and runs the
	// effect a second time. This is the documented limit.
	if _, err := h(order("ORDER-1")); err != nil {
		t.Fatalf("takeover: %v", err)
	}
	close(release)
	if err := recv(t, "the handler to return", done); err != nil {
		t.Fatalf("first handler is acked even though its claim was lost: %v", err)
	}
	if calls.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2 (the limit without heartbeat)", calls.Load())
	}
	if !hasEvent(logs, watermill.ErrorLogLevel, event.ClaimLost) {
		t.Fatalf("losing the claim was not logged as an error")
	}
}

func TestLostClaimCancelsHandler(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clock := fakeclock.New(epoch)
	store := newFaultStore(memstore.New(clock))
	logs := watermill.NewCaptureLogger()
	d := newDedup(t, dedup.Config{Store: store, Clock: clock, Lease: 30 * time.Second, Heartbeat: 10 * time.Second, Logger: logs})
	var cause error
	h := d.Middleware(func(m *message.Message) ([]*message.Message, error) {
		<-m.Context().Done()
		cause = context.Cause(m.Context())
		return nil, nil // a handler that ignores the cancellation and reports success
	})
	store.Inject("extend", dedup.ErrClaimLost)
	store.Inject("complete", dedup.ErrClaimLost)
	done := runHandler(h, order("ORDER-1"))
	if err := clock.WaitForTimers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(10 * time.Second)
	if err := recv(t, "the handler to return", done); err != nil {
		t.Fatalf("got %v, want ack (the effect was reported done)", err)
	}
	if !errors.Is(cause, dedup.ErrClaimLost) {
		t.Fatalf("handler context cause = %v, want ErrClaimLost", cause)
	}
	var lost []string
	for _, m := range logs.Captured()[watermill.ErrorLogLevel] {
		if m.Msg == "dedup: claim_lost" && errors.Is(m.Err, dedup.ErrClaimLost) {
			lost = append(lost, fmt.Sprint(m.Fields["op"]))
		}
	}
	if strings.Join(lost, ",") != "extend,complete" {
		t.Fatalf("claim_lost logged for ops %v, want extend then complete", lost)
	}
}

func TestHeartbeatGivesUpWhenStoreUnreachablePastLease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clock := fakeclock.New(epoch)
	store := newFaultStore(memstore.New(clock))
	d := newDedup(t, dedup.Config{Store: store, Clock: clock, Lease: 30 * time.Second, Heartbeat: 10 * time.Second})
	h := d.Middleware(func(m *message.Message) ([]*message.Message, error) {
		<-m.Context().Done()
		return nil, context.Cause(m.Context())
	})
	store.Inject("extend", errNetwork, errNetwork, errNetwork)
	done := runHandler(h, order("ORDER-1"))
	for range 3 {
		if err := clock.WaitForTimers(ctx, 1); err != nil {
			t.Fatal(err)
		}
		clock.Advance(10 * time.Second)
	}
	if err := recv(t, "the handler to return", done); !errors.Is(err, dedup.ErrClaimLost) {
		t.Fatalf("got %v, want the handler cancelled with ErrClaimLost once the lease passed unextended", err)
	}
}

func TestHandlerCanStopHeartbeatAndCompleteItself(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clock := fakeclock.New(epoch)
	store := newFaultStore(memstore.New(clock))
	d := newDedup(t, dedup.Config{Store: store, Clock: clock, Lease: 30 * time.Second, Heartbeat: 10 * time.Second, Replay: true})
	h := d.Middleware(func(m *message.Message) ([]*message.Message, error) {
		hc, ok := dedup.HeldClaimFromContext(m.Context())
		if !ok {
			return nil, errors.New("no claim in the handler's context")
		}
		if err := clock.WaitForTimers(ctx, 1); err != nil { // the heartbeat is armed
			return nil, err
		}
		hc.StopHeartbeat()
		hc.StopHeartbeat() // idempotent
		if n := clock.Timers(); n != 0 {
			return nil, fmt.Errorf("%d timers pending after StopHeartbeat", n)
		}
		out := []*message.Message{message.NewMessage("out-1", []byte("receipt"))}
		if err := store.Complete(m.Context(), hc.Claim(), replay.Encode(out), hc.Retention()); err != nil {
			return nil, err
		}
		hc.MarkCompleted()
		return out, nil
	})
	if _, err := h(order("ORDER-1")); err != nil {
		t.Fatal(err)
	}
	if n := store.Count("complete"); n != 1 {
		t.Fatalf("Complete called %d times, want once (by the handler)", n)
	}
	if n := store.Count("extend"); n != 0 {
		t.Fatalf("Extend called %d times after the heartbeat stopped", n)
	}
	replayed, err := h(order("ORDER-1"))
	if err != nil || len(replayed) != 1 || string(replayed[0].Payload) != "receipt" {
		t.Fatalf("duplicate after in-handler completion: %v, %v", replayed, err)
	}
}

func TestResultTooLargeCompletesWithoutReplay(t *testing.T) {
	store := newFaultStore(memstore.New(nil))
	logs := watermill.NewCaptureLogger()
	d := newDedup(t, dedup.Config{Store: store, Replay: true, Logger: logs})
	var calls atomic.Int32
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls.Add(1)
		return []*message.Message{message.NewMessage("out", make([]byte, 1<<20))}, nil
	})
	store.Inject("complete", fmt.Errorf("item too big: %w", dedup.ErrResultTooLarge))
	if _, err := h(order("ORDER-1")); err != nil {
		t.Fatal(err)
	}
	if n := store.Count("complete"); n != 2 {
		t.Fatalf("Complete called %d times, want 2 (with the result, then without)", n)
	}
	out, err := h(order("ORDER-1"))
	if err != nil || len(out) != 0 || calls.Load() != 1 {
		t.Fatalf("duplicate: out %d, err %v, handler calls %d; want a duplicate with no replay", len(out), err, calls.Load())
	}
	if !hasEvent(logs, watermill.ErrorLogLevel, event.StoreError) {
		t.Fatalf("the lost replay was not logged as an error")
	}
}

func TestCompleteWhoseReplyWasLostCountsAsCompleted(t *testing.T) {
	store := newFaultStore(memstore.New(nil))
	logs := watermill.NewCaptureLogger()
	d := newDedup(t, dedup.Config{Store: store, Logger: logs, CompleteBackoff: time.Millisecond})
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	store.Inject("complete", errReplyLost)
	if _, err := h(order("ORDER-1")); err != nil {
		t.Fatal(err)
	}
	if n := store.Count("complete"); n != 2 {
		t.Fatalf("Complete called %d times, want 2", n)
	}
	if hasEvent(logs, watermill.ErrorLogLevel, event.ClaimLost) {
		t.Fatalf("a retried Complete that found its own completed record was logged as claim_lost")
	}
	if _, err := h(order("ORDER-1")); err != nil {
		t.Fatal(err)
	}
}

func TestNoScopeOutsideARouter(t *testing.T) {
	store := memstore.New(nil)
	d, err := dedup.New(dedup.Config{Store: store, Key: keyfuncs.JSON("order_id")}) // no Scope, no router
	if err != nil {
		t.Fatal(err)
	}
	called := false
	_, err = d.Middleware(func(*message.Message) ([]*message.Message, error) { called = true; return nil, nil })(order("ORDER-1"))
	if !errors.Is(err, dedup.ErrNoScope) || called || store.Len() != 0 {
		t.Fatalf("got %v (handler called: %v, records: %d), want ErrNoScope and nothing done", err, called, store.Len())
	}
}
