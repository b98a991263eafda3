package dedup_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// logLine is a line a logLines was given.
type logLine struct {
	level, msg string
	fields     watermill.LogFields
}

// logLines is a Watermill logger that keeps its lines.
type logLines struct {
	mu    sync.Mutex
	lines []logLine
}

func (l *logLines) add(level, msg string, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, logLine{level, msg, fields})
}

func (l *logLines) Error(msg string, err error, fields watermill.LogFields) {
	l.add("ERROR", msg, fields.Add(watermill.LogFields{"err": err}))
}
func (l *logLines) Info(msg string, fields watermill.LogFields)  { l.add("INFO", msg, fields) }
func (l *logLines) Debug(msg string, fields watermill.LogFields) { l.add("DEBUG", msg, fields) }
func (l *logLines) Trace(msg string, fields watermill.LogFields) { l.add("TRACE", msg, fields) }
func (l *logLines) With(watermill.LogFields) watermill.LoggerAdapter {
	return l
}

// of returns the lines of event ev.
func (l *logLines) of(ev string) []logLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logLine
	for _, line := range l.lines {
		if line.fields["dedup_event"] == ev {
			out = append(out, line)
		}
	}
	return out
}

// TestRefusalInANackLoopIsLoggedOnceThenCounted: a message refused for
// good, redelivered by a real router with no poison queue (GoChannel
// resends a nacked message at once), is logged once, with the hint of the
// poison queue, for 10,000 refusals; once 30s have passed on the engine's
// clock, the next refusal is logged with the count since (without the
// suppression, one line per refusal).
func TestRefusalInANackLoopIsLoggedOnceThenCounted(t *testing.T) {
	const copies, advanceAt = 10_000, 5_000
	for _, tc := range []struct {
		event string
		key   func(*message.Message) (string, error)
	}{
		{"key_missing", keyfuncs.JSON("order_id")},
		{"transport_key", func(msg *message.Message) (string, error) { return msg.UUID, nil }},
	} {
		t.Run(tc.event, func(t *testing.T) {
			t.Parallel()
			clock := fakeclock.New(time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC))
			logs := &logLines{}
			d, err := dedup.New(dedup.Config{Store: memstore.New(clock), Key: tc.key, Logger: logs, Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{}) // the router logs each nack too
			if err != nil {
				t.Fatal(err)
			}
			var n atomic.Int64
			done := make(chan struct{})
			count := func(h message.HandlerFunc) message.HandlerFunc {
				return func(msg *message.Message) ([]*message.Message, error) {
					switch i := n.Add(1); {
					case i == advanceAt:
						clock.Advance(30 * time.Second)
					case i == copies+1:
						close(done)
						return nil, nil // ack: the loop ends
					case i > copies+1:
						return nil, nil
					}
					return h(msg)
				}
			}
			handler := router.AddConsumerHandler("charge-orders", "orders", pubSub, func(*message.Message) error { return nil })
			handler.AddMiddleware(count, d.Middleware)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { _ = router.Run(ctx) }()
			recv(t, "the router to start", router.Running())
			if err := pubSub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(`{"amount":1}`))); err != nil {
				t.Fatal(err)
			}
			recv(t, fmt.Sprintf("%d refusals", copies), done)
			if err := router.Close(); err != nil {
				t.Fatal(err)
			}

			lines := logs.of(tc.event)
			if len(lines) != 2 {
				t.Fatalf("%d %s lines for %d refusals of one message, want 2 (the first, and one after 30s)", len(lines), tc.event, copies)
			}
			first, again := lines[0], lines[1]
			if hint, _ := first.fields["hint"].(string); first.level != "ERROR" || !containsAll(hint, "PoisonQueueWithFilter", "dedup.IsPermanent", "docs/router.md", "30s") {
				t.Errorf("first line at %s with hint %q: want ERROR, naming the poison queue", first.level, hint)
			}
			if again.fields["repeats"] != advanceAt-1 || again.fields["repeats_since"] != 30*time.Second || again.fields["hint"] != nil {
				t.Errorf("second line: repeats=%v repeats_since=%v hint=%v, want %d refusals in 30s, no hint",
					again.fields["repeats"], again.fields["repeats_since"], again.fields["hint"], advanceAt-1)
			}
		})
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestRefusalsRememberedAreBounded: the log of refusals remembers at most
// dedup.RepeatMessages messages. Past the bound, every new message's first
// refusal is still logged; the message remembered first is forgotten and
// logged again if it comes back, while a recent one stays counted. A call
// with neither MessageUUID nor MessageID is logged at every refusal.
func TestRefusalsRememberedAreBounded(t *testing.T) {
	const messages = 5 * dedup.RepeatMessages
	clock := fakeclock.New(time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC))
	logs := &logLines{}
	e := newEngine(t, dedup.Config{Store: memstore.New(clock), Logger: logs, Clock: clock})
	refuse := func(uuid string) {
		t.Helper()
		keyErr := &dedup.KeyError{Reason: "missing", MessageUUID: uuid}
		call := dedup.Call{Scope: "charge-orders", MessageUUID: uuid, KeyErr: keyErr}
		if _, err := e.Do(context.Background(), call, func(context.Context) ([]byte, error) { return nil, nil }); err != keyErr {
			t.Fatalf("Do = %v, want the KeyErr", err)
		}
	}
	for i := range messages {
		refuse(fmt.Sprint("m-", i))
		refuse(fmt.Sprint("m-", i))
		if got := dedup.RememberedRefusals(e); got > dedup.RepeatMessages {
			t.Fatalf("after %d messages, %d remembered, more than %d", i+1, got, dedup.RepeatMessages)
		}
	}
	if got := len(logs.of("key_missing")); got != messages {
		t.Fatalf("%d lines for %d messages refused twice each, want %d (every first one)", got, messages, messages)
	}
	refuse("m-0")
	refuse(fmt.Sprint("m-", messages-1))
	lines := logs.of("key_missing")
	if len(lines) != messages+1 || lines[messages].fields["message_uuid"] != "m-0" || lines[messages].fields["hint"] == nil {
		t.Errorf("%d lines, the last %v: want m-0, forgotten, logged again with its hint, and the last message still counted", len(lines), lines[len(lines)-1].fields)
	}
	for range 3 {
		refuse("")
	}
	if got := len(logs.of("key_missing")); got != messages+4 {
		t.Errorf("%d lines after 3 refusals of a call without ids, want %d", got, messages+4)
	}
}
