package redis_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/poll"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// countingObserver counts decisions by event and keeps their errors.
type countingObserver struct {
	mu        sync.Mutex
	decisions []dedup.Decision
	storeOps  map[string]int // op → failed calls
}

func (o *countingObserver) ObserveDecision(d dedup.Decision) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.decisions = append(o.decisions, d)
}

func (o *countingObserver) ObserveStoreOp(op string, _ time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		if o.storeOps == nil {
			o.storeOps = map[string]int{}
		}
		o.storeOps[op]++
	}
}

func (o *countingObserver) count(e event.Event) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, d := range o.decisions {
		if d.Event == e {
			n++
		}
	}
	return n
}

func (o *countingObserver) find(e event.Event) (dedup.Decision, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, d := range o.decisions {
		if d.Event == e {
			return d, true
		}
	}
	return dedup.Decision{}, false
}

// errorEvents returns the dedup_event field of every error-level log entry.
func errorEvents(l *watermill.CaptureLoggerAdapter) []string {
	var events []string
	for _, m := range l.Captured()[watermill.ErrorLogLevel] {
		if e, ok := m.Fields["dedup_event"].(string); ok {
			events = append(events, e)
		}
	}
	return events
}

// With a real redis-server stopped, Config.FailOpen runs the handler without
// a claim and says so loudly (store_error and fail_open at error level, both
// seen by the Observer); without it the message is nacked with a
// *dedup.StoreError and the handler does not run. Once the server is back
// the same Deduplicator claims again.
func TestFailOpenWithRedisDown(t *testing.T) {
	r, err := testserver.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	client := newOutageClient(r.Addr)
	t.Cleanup(func() { _ = client.Close() })
	store := newStore(t, client, redis.Config{})
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}

	key := func(msg *message.Message) (string, error) { return msg.Metadata.Get("order_id"), nil }
	newMsg := func() *message.Message {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":150}`))
		msg.Metadata.Set("order_id", "ORDER-003")
		return msg
	}

	for _, failOpen := range []bool{true, false} {
		name := map[bool]string{true: "fail open", false: "fail closed"}[failOpen]
		t.Run(name, func(t *testing.T) {
			logger := watermill.NewCaptureLogger()
			obs := &countingObserver{}
			d, err := dedup.New(dedup.Config{
				Store: store, Key: key, Scope: "charge-orders", FailOpen: failOpen,
				StoreTimeout: 5 * time.Second, Logger: logger, Observer: obs,
			})
			if err != nil {
				t.Fatal(err)
			}
			charges := 0
			handler := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				charges++
				return nil, nil
			})
			// The router acks a message whose handler returns nil and nacks
			// it otherwise; here the handler chain is called directly.
			_, err = handler(newMsg())

			if obs.storeOps["claim"] == 0 {
				t.Errorf("no failed claim observed: %v", obs.storeOps)
			}
			storeErr, ok := obs.find(event.StoreError)
			var se *dedup.StoreError
			if !ok || storeErr.Op != "claim" || !errors.As(storeErr.Err, &se) || se.Key != "charge-orders:ORDER-003" {
				t.Errorf("store_error decision = %+v (found %v)", storeErr, ok)
			}
			if failOpen {
				if err != nil || charges != 1 {
					t.Errorf("fail open: handler returned %v after %d charges; want nil (ack) after 1", err, charges)
				}
				if n := obs.count(event.FailOpen); n != 1 {
					t.Errorf("fail open: Observer saw %d fail_open decisions, want 1", n)
				}
				if got := errorEvents(logger); len(got) != 2 || got[0] != "store_error" || got[1] != "fail_open" {
					t.Errorf("fail open: error-level events %v, want [store_error fail_open]", got)
				}
			} else {
				if !errors.As(err, &se) || se.Op != "claim" {
					t.Errorf("fail closed: handler returned %v, want a *dedup.StoreError (nack)", err)
				}
				if charges != 0 {
					t.Errorf("fail closed: %d charges while the store is down", charges)
				}
				if n := obs.count(event.FailOpen); n != 0 {
					t.Errorf("fail closed: %d fail_open decisions", n)
				}
				if got := errorEvents(logger); len(got) != 1 || got[0] != "store_error" {
					t.Errorf("fail closed: error-level events %v, want [store_error]", got)
				}
			}
			if t.Failed() {
				logger.PrintCaptured(t)
			}
		})
	}

	// The server comes back: the next claim is a normal one.
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	obs := &countingObserver{}
	d, err := dedup.New(dedup.Config{Store: store, Key: key, Scope: "charge-orders", FailOpen: true, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, time.Minute, "the client to reconnect", func() bool { return client.Ping(context.Background()).Err() == nil })
	charges := 0
	handler := d.Middleware(func(*message.Message) ([]*message.Message, error) { charges++; return nil, nil })
	for range 2 {
		if _, err := handler(newMsg()); err != nil {
			t.Fatal(err)
		}
	}
	if charges != 1 || obs.count(event.FailOpen) != 0 || obs.count(event.SkipDuplicate) != 1 {
		t.Errorf("after the restart: %d charges, %d fail_open, %d skip_duplicate; want 1, 0, 1",
			charges, obs.count(event.FailOpen), obs.count(event.SkipDuplicate))
	}
}
