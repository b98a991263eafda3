package dedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

func newEngine(t *testing.T, cfg dedup.Config) *dedup.Engine {
	t.Helper()
	e, err := dedup.NewEngine(cfg)
	if err != nil {
		t.Fatalf("NewEngine: %v", err)
	}
	return e
}

// Shadow mode runs every copy, records the first, and never lets a shadow
// run touch the record: a later engine without shadow finds the first
// copy's completed record with its result, whatever the shadow runs did.
func TestShadowRunsEveryCopyAndLeavesTheRecord(t *testing.T) {
	forEachStore(t, nil, func(t *testing.T, store dedup.Store) {
		ctx := context.Background()
		seen := newDecisions()
		shadow := newEngine(t, dedup.Config{Store: store, Shadow: true, Observer: seen})
		runs := map[string]int{}
		work := func(name string, result string, err error) func(context.Context) ([]byte, error) {
			return func(ctx context.Context) ([]byte, error) {
				runs[name]++
				o, ok := dedup.OutcomeFromContext(ctx)
				runs[name+":"+o.String()] += map[bool]int{true: 1}[ok]
				return []byte(result), err
			}
		}
		call := dedup.Call{Scope: "charge", Key: "ORDER-003", Fingerprint: "fp-150"}

		res, err := shadow.Do(ctx, call, work("first", "charged 150", nil))
		if err != nil || res.Outcome != dedup.Acquired || runs["first:acquired"] != 1 {
			t.Fatalf("first copy: %+v, %v; runs %v", res, err, runs)
		}
		// A duplicate runs, unclaimed, and its result is not stored.
		res, err = shadow.Do(ctx, call, work("dup", "charged again", nil))
		if err != nil || res.Outcome != 0 || string(res.Result) != "charged again" || runs["dup:duplicate"] != 1 {
			t.Fatalf("duplicate in shadow mode: %+v, %v; runs %v", res, err, runs)
		}
		// A failing duplicate returns its error and releases nothing.
		gateway := errors.New("gateway timeout")
		if _, err := shadow.Do(ctx, call, work("dup-fails", "", gateway)); !errors.Is(err, gateway) {
			t.Fatalf("failing duplicate in shadow mode: %v, want the handler's error", err)
		}
		// Another fingerprint: refused without shadow, run with it.
		other := call
		other.Fingerprint = "fp-999"
		if _, err := shadow.Do(ctx, other, work("reuse", "", nil)); err != nil || runs["reuse:conflict"] != 1 {
			t.Fatalf("key reuse in shadow mode: %v; runs %v", err, runs)
		}
		// No usable key: refused without shadow, run with it.
		blank := call
		blank.Key = " "
		if _, err := shadow.Do(ctx, blank, work("nokey", "", nil)); err != nil || runs["nokey"] != 1 {
			t.Fatalf("blank key in shadow mode: %v; runs %v", err, runs)
		}

		// The record is the first copy's, completed, with its result.
		plain := newEngine(t, dedup.Config{Store: store})
		res, err = plain.Do(ctx, call, work("after", "", nil))
		if err != nil || res.Outcome != dedup.Duplicate || string(res.Result) != "charged 150" || runs["after"] != 0 {
			t.Fatalf("after the shadow runs: %+v (result %q), %v; want the first copy's completed record", res, res.Result, err)
		}

		if got := len(seen.of(event.WouldSkip)); got != 2 {
			t.Errorf("would_skip decided %d times, want 2", got)
		}
		for _, d := range seen.of(event.WouldSkip) {
			if d.Outcome != dedup.Duplicate || d.Op != "claim" || d.Key == "" {
				t.Errorf("would_skip decision %+v, want Outcome duplicate, op claim, a key", d)
			}
		}
		rejects := seen.of(event.WouldReject)
		if len(rejects) != 2 || rejects[0].Outcome != dedup.Conflict || !errors.Is(rejects[0].Err, dedup.ErrKeyReuse) ||
			!errors.Is(rejects[1].Err, dedup.ErrNoKey) {
			t.Errorf("would_reject decisions %+v, want key reuse then no key", rejects)
		}
		for _, e := range []event.Event{event.SkipDuplicate, event.KeyReuse, event.KeyMissing, event.Released} {
			if n := len(seen.of(e)); n != 0 {
				t.Errorf("%s decided %d times in shadow mode, want 0", e, n)
			}
		}
	})
}

// A copy that finds the key in progress runs at once in shadow mode (no
// nack, no wait, even with InProgressWait), and the holder's completion
// still lands.
func TestShadowInProgressCopyRunsAtOnce(t *testing.T) {
	forEachStore(t, nil, func(t *testing.T, store dedup.Store) {
		ctx := context.Background()
		seen := newDecisions()
		e := newEngine(t, dedup.Config{Store: store, Shadow: true, InProgressWait: time.Hour, Observer: seen})
		call := dedup.Call{Scope: "charge", Key: "ORDER-003"}
		entered, release := make(chan struct{}), make(chan struct{})
		first := make(chan error, 1)
		go func() {
			_, err := e.Do(ctx, call, func(context.Context) ([]byte, error) {
				close(entered)
				<-release
				return []byte("first"), nil
			})
			first <- err
		}()
		recv(t, "the first copy's work to start", entered)
		var outcome dedup.Outcome
		res, err := e.Do(ctx, call, func(ctx context.Context) ([]byte, error) {
			outcome, _ = dedup.OutcomeFromContext(ctx)
			return []byte("copy"), nil
		})
		if err != nil || outcome != dedup.InProgress || string(res.Result) != "copy" {
			t.Fatalf("copy while in progress: %+v, %v, outcome %v; want it run at once as would_skip (in_progress)", res, err, outcome)
		}
		close(release)
		if err := recv(t, "the first copy to finish", first); err != nil {
			t.Fatal(err)
		}
		res, err = newEngine(t, dedup.Config{Store: store}).Do(ctx, call, nil)
		if err != nil || res.Outcome != dedup.Duplicate || string(res.Result) != "first" {
			t.Fatalf("record after: %+v, %v; want the first copy's", res, err)
		}
		skips := seen.of(event.WouldSkip)
		if len(skips) != 1 || skips[0].Outcome != dedup.InProgress || skips[0].Waited != 0 {
			t.Fatalf("would_skip decisions %+v, want one with Outcome in_progress, no wait", skips)
		}
	})
}

// The middleware's own refusals (the key function finds no key) run the
// handler in shadow mode; without it they return ErrNoKey.
func TestShadowMiddlewareRunsMessagesWithoutKey(t *testing.T) {
	for _, shadow := range []bool{false, true} {
		logs := watermill.NewCaptureLogger()
		d := newDedup(t, dedup.Config{Store: memstore.New(nil), Shadow: shadow, Logger: logs, Key: keyfuncs.JSON("order_id")})
		ran := 0
		h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			ran++
			if _, ok := dedup.OutcomeFromContext(msg.Context()); ok {
				t.Errorf("a run without a key reports an outcome")
			}
			return nil, nil
		})
		_, err := h(message.NewMessage(watermill.NewUUID(), []byte(`{"amount":150}`)))
		switch {
		case shadow && (err != nil || ran != 1 || !hasEvent(logs, watermill.InfoLogLevel, event.WouldReject)):
			t.Errorf("shadow: err %v, handler ran %d times; want nil, 1, would_reject at info", err, ran)
		case !shadow && (!errors.Is(err, dedup.ErrNoKey) || ran != 0):
			t.Errorf("without shadow: err %v, handler ran %d times; want ErrNoKey, 0", err, ran)
		}
	}
}
