package lab_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/lab"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

func goChannel(_ context.Context, run string) (*lab.Transport, error) {
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1 << 14}, watermill.NopLogger{})
	return &lab.Transport{Publisher: ps, Subscriber: ps, Topic: "orders-" + run, Close: ps.Close}, nil
}

func TestLabOnGoChannelAndMemory(t *testing.T) {
	cfg := lab.Config{
		Copies: 10, Orders: 300, MaxDuplicates: 4, Concurrency: 16, EffectTime: time.Millisecond,
		NewTransport: goChannel,
		NewStore:     func(context.Context) (dedup.Store, error) { return memstore.New(nil), nil },
	}
	results, err := lab.Run(context.Background(), cfg, true, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 {
		t.Fatalf("%d results, want 2", len(results))
	}
	off, on := results[0], results[1]
	if off.Idempotency || !on.Idempotency {
		t.Fatalf("runs out of order")
	}
	if off.Charges != off.Messages || off.Acked != off.Messages {
		t.Fatalf("off: %d charges, %d acked for %d messages", off.Charges, off.Acked, off.Messages)
	}
	if on.Charges != on.DistinctOrders || on.DistinctOrders != 301 || on.Acked != on.Messages {
		t.Fatalf("on: %d charges for %d orders, %d acked of %d", on.Charges, on.DistinctOrders, on.Acked, on.Messages)
	}
	if won := on.Outcomes[event.ClaimWon]; won != 301 {
		t.Fatalf("claim won %d times, want 301", won)
	}
	if dup, inprog := on.Outcomes[event.SkipDuplicate], on.Outcomes[event.InProgress]; dup+on.Outcomes[event.ClaimWon] != on.Messages {
		t.Fatalf("%d claims won + %d duplicates skipped != %d messages (in progress: %d)", on.Outcomes[event.ClaimWon], dup, on.Messages, inprog)
	}
	if !off.OK() || !on.OK() {
		t.Fatalf("OK() false")
	}
	var b strings.Builder
	lab.PrintTable(&b, results)
	t.Log("\n" + b.String())
}

func TestOrdersAreReproducible(t *testing.T) {
	a, n := lab.Orders(lab.Config{Copies: 10, Orders: 50, Seed: 7})
	b, _ := lab.Orders(lab.Config{Copies: 10, Orders: 50, Seed: 7})
	if n != 51 || len(a) != len(b) {
		t.Fatalf("distinct %d, lengths %d/%d", n, len(a), len(b))
	}
	copies := 0
	for i := range a {
		if string(a[i].Payload) != string(b[i].Payload) {
			t.Fatalf("message %d differs between runs with one seed", i)
		}
		if a[i].UUID == b[i].UUID {
			t.Fatalf("message %d reused a UUID", i)
		}
		if strings.Contains(string(a[i].Payload), `"ORDER-003"`) {
			copies++
		}
	}
	if copies != 10 {
		t.Fatalf("ORDER-003 published %d times, want 10", copies)
	}
}

func TestResultOK(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    lab.Result
		want bool
	}{
		{"off: every copy charged", lab.Result{Messages: 20, DistinctOrders: 5, Charges: 20, Acked: 20}, true},
		{"off: lost acks charged again", lab.Result{Messages: 20, DistinctOrders: 5, Charges: 23, Acked: 20, LostAcks: 3}, true},
		{"off: a copy not charged", lab.Result{Messages: 20, DistinctOrders: 5, Charges: 19, Acked: 20}, false},
		{"on: each order once", lab.Result{Idempotency: true, Messages: 20, DistinctOrders: 5, Charges: 5, Acked: 20, LostAcks: 3}, true},
		{"on: an order charged twice", lab.Result{Idempotency: true, Messages: 20, DistinctOrders: 5, Charges: 6, Acked: 20}, false},
		{"on: an order never charged", lab.Result{Idempotency: true, Messages: 20, DistinctOrders: 5, Charges: 4, Acked: 20}, false},
		{"on: a message not acked", lab.Result{Idempotency: true, Messages: 20, DistinctOrders: 5, Charges: 5, Acked: 19}, false},
		{"on: a message left in the broker", lab.Result{Idempotency: true, Messages: 20, DistinctOrders: 5, Charges: 5, Acked: 20, Pending: 1}, false},
		{"shadow: every copy charged, the rest would skip", lab.Result{Idempotency: true, Shadow: true, Messages: 20, DistinctOrders: 5, Charges: 23, WouldSkip: 18, Acked: 20, LostAcks: 3}, true},
		{"shadow: a copy skipped", lab.Result{Idempotency: true, Shadow: true, Messages: 20, DistinctOrders: 5, Charges: 19, WouldSkip: 15, Acked: 20}, false},
		{"shadow: would-skip miscounted", lab.Result{Idempotency: true, Shadow: true, Messages: 20, DistinctOrders: 5, Charges: 20, WouldSkip: 14, Acked: 20}, false},
	} {
		if got := tc.r.OK(); got != tc.want {
			t.Errorf("%s: OK() = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Lost acks are redelivered by the broker (GoChannel: at once) and charged
// again without idempotency, once with it.
func TestLabLostAcksOnGoChannel(t *testing.T) {
	cfg := lab.Config{
		Copies: 10, Orders: 50, Concurrency: 4, EffectTime: time.Millisecond, LoseAcks: 7,
		NewTransport: lab.GoChannel(),
		NewStore:     func(context.Context) (dedup.Store, error) { return memstore.New(nil), nil },
	}
	results, err := lab.Run(context.Background(), cfg, true, true)
	if err != nil {
		t.Fatal(err)
	}
	off, on := results[0], results[1]
	if off.LostAcks != 7 || off.Charges != off.Messages+7 || !off.OK() {
		t.Errorf("off: %d lost acks, %d charges for %d messages", off.LostAcks, off.Charges, off.Messages)
	}
	if on.LostAcks != 7 || on.Charges != on.DistinctOrders || on.Outcomes[event.SkipDuplicate]+on.Outcomes[event.ClaimWon] != on.Messages+7 || !on.OK() {
		t.Errorf("on: %d lost acks, %d charges for %d orders, outcomes %v", on.LostAcks, on.Charges, on.DistinctOrders, on.Outcomes)
	}
}

// Shadow mode: every copy charged, as without dedup; one claim won per
// order; every other copy counted as would_skip; nothing nacked.
func TestLabShadowOnGoChannelAndMemory(t *testing.T) {
	cfg := lab.Config{
		Copies: 10, Orders: 200, MaxDuplicates: 4, Concurrency: 16, EffectTime: time.Millisecond, Shadow: true,
		NewTransport: goChannel,
		NewStore:     func(context.Context) (dedup.Store, error) { return memstore.New(nil), nil },
	}
	results, err := lab.Run(context.Background(), cfg, false, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 1 || !results[0].Shadow {
		t.Fatalf("results %+v, want one shadow run", results)
	}
	r := results[0]
	if r.Charges != r.Messages || r.WouldSkip != r.Messages-r.DistinctOrders || r.Outcomes[event.ClaimWon] != r.DistinctOrders ||
		r.HandlerErrors != 0 || !r.OK() {
		t.Fatalf("shadow: %d charges, %d would skip, %d claims won, %d nacks for %d messages of %d orders",
			r.Charges, r.WouldSkip, r.Outcomes[event.ClaimWon], r.HandlerErrors, r.Messages, r.DistinctOrders)
	}
}
