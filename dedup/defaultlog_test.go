package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/faultstore"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/slogcapture"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// TestNoLoggerWritesErrorsToSlog: with Config.Logger unset, the refusals
// (key_reuse, key_missing, transport_key) and store errors of the router's
// middleware reach slog's default logger at error level, one record each,
// and a message that goes well (a fresh run, a duplicate, a handler
// failure) writes nothing. slog.SetDefault after New applies. With
// watermill.NopLogger{} set, nothing is written at all.
func TestNoLoggerWritesErrorsToSlog(t *testing.T) {
	for _, nop := range []bool{false, true} {
		t.Run(fmt.Sprintf("nop=%v", nop), func(t *testing.T) {
			store := faultstore.New(memstore.New(nil))
			cfg := dedup.Config{Store: store, Key: keyfuncs.JSON("order_id"), Fingerprint: keyfuncs.PayloadFingerprint, Scope: "charge-orders"}
			if nop {
				cfg.Logger = watermill.NopLogger{}
			}
			d, err := dedup.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			recs := slogcapture.Capture(t) // after New: the default is read at each line
			h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				if msg.Metadata.Get("fail") != "" {
					return nil, errors.New("gateway timeout")
				}
				return nil, nil
			})
			send := func(uuid, payload string, fail bool) {
				msg := message.NewMessage(uuid, []byte(payload))
				if fail {
					msg.Metadata.Set("fail", "1")
				}
				_, _ = h(msg)
			}
			expect := func(what, event string) {
				t.Helper()
				got := recs.Take()
				if nop || event == "" {
					if len(got) != 0 {
						t.Errorf("%s: %d records, the first %q %s", what, len(got), got[0].Message, slogcapture.Attr(got[0], "dedup_event"))
					}
					return
				}
				if len(got) != 1 {
					t.Fatalf("%s: %d records, want 1 (%s)", what, len(got), event)
				}
				r := got[0]
				if r.Level != slog.LevelError || r.Message != "dedup: "+event || slogcapture.Attr(r, "dedup_event") != event || slogcapture.Attr(r, "error") == "" {
					t.Errorf("%s: %v %q dedup_event=%s error=%q, want ERROR %q with its error", what, r.Level, r.Message, slogcapture.Attr(r, "dedup_event"), slogcapture.Attr(r, "error"), "dedup: "+event)
				}
			}
			send("m-1", `{"order_id":"ORDER-1"}`, false)
			expect("a fresh run", "")
			send("m-2", `{"order_id":"ORDER-1"}`, false)
			expect("a duplicate", "")
			send("m-3", `{"order_id":"ORDER-2"}`, true)
			expect("a handler failure (released)", "")
			send("m-4", `{"order_id":"ORDER-1","amount":2}`, false)
			expect("a key reused with another payload", "key_reuse")
			send("m-5", `{"orderId":"ORDER-3"}`, false)
			expect("no key", "key_missing")
			send("m-6", `{"order_id":"m-6"}`, false)
			expect("the UUID as key", "transport_key")
			store.Inject("claim", errors.New("connection refused"))
			send("m-7", `{"order_id":"ORDER-4"}`, false)
			expect("a store error", "store_error")
		})
	}
}

// TestNoLoggerAllocatesAsTheNopLogger: with Config.Logger unset, a message
// that goes well allocates what it allocates with watermill.NopLogger{}:
// the fields of its lines (claim_won, completed) are not built. A logger
// that writes nothing but is not recognised costs more (the test can
// fail). TestQuietEngineReadsTheClockForTheLeaseOnly checks that the
// decisions themselves are not made. Each figure is the least of 5
// measurements (see TestOriginCostsNoAllocation).
func TestNoLoggerAllocatesAsTheNopLogger(t *testing.T) {
	allocs := func(logger watermill.LoggerAdapter) float64 {
		e, err := dedup.NewEngine(dedup.Config{Store: &nopStore{}, DisableHeartbeat: true, Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		call := dedup.Call{Scope: "s", Key: "k", MessageUUID: "0b9f8e3c-4d1a-4e2b-9c3d-5e6f7a8b9c0d"}
		work := func(context.Context) ([]byte, error) { return nil, nil }
		return testing.AllocsPerRun(200, func() {
			if _, err := e.Do(ctx, call, work); err != nil {
				t.Fatal(err)
			}
		})
	}
	least := func(logger watermill.LoggerAdapter) float64 {
		n := allocs(logger)
		for range 4 {
			n = min(n, allocs(logger))
		}
		return n
	}
	unset, nop, discard := least(nil), least(watermill.NopLogger{}), least(watermill.NewStdLoggerWithOut(io.Discard, false, false))
	if unset != nop {
		t.Errorf("Engine.Do allocates %v times with no Logger, %v with the NopLogger", unset, nop)
	}
	if discard <= nop {
		t.Errorf("Engine.Do allocates %v times with a logger that discards, %v with the NopLogger: the test cannot tell", discard, nop)
	}
}

// TestDefaultLoggerCountsRepeats: with Config.Logger unset, a keyless
// message that comes back is written to slog once, with the hint of the
// poison queue.
func TestDefaultLoggerCountsRepeats(t *testing.T) {
	d, err := dedup.New(dedup.Config{Store: memstore.New(nil), Key: keyfuncs.JSON("order_id"), Scope: "charge-orders"})
	if err != nil {
		t.Fatal(err)
	}
	recs := slogcapture.Capture(t)
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for range 100 {
		if _, err := h(message.NewMessage("m-1", []byte(`{}`))); !errors.Is(err, dedup.ErrNoKey) {
			t.Fatalf("got %v, want ErrNoKey", err)
		}
	}
	got := recs.Take()
	if len(got) != 1 {
		t.Fatalf("%d records for 100 refusals of one message, want 1", len(got))
	}
	if hint := slogcapture.Attr(got[0], "hint"); !strings.Contains(hint, "PoisonQueueWithFilter") {
		t.Errorf("the first record's hint is %q: it does not name the poison queue", hint)
	}
}
