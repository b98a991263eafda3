package metrics_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/metrics"
)

// Shadow mode: three copies of one order all run; the two that dedup would
// have skipped are counted as would_skip. With replay: a duplicate that
// got its output back counts in replays_total. A wait counts in
// in_progress_wait_seconds under the decision it ended in.
func TestShadowReplayAndWaitMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	obs, err := metrics.New(reg, metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New(nil)
	newDedup := func(scope string, cfg dedup.Config) message.HandlerFunc {
		cfg.Store, cfg.Key, cfg.Scope, cfg.Observer = store, keyfuncs.JSON("order_id"), scope, obs
		d, err := dedup.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return d.Middleware(func(*message.Message) ([]*message.Message, error) {
			return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("charged"))}, nil
		})
	}
	shadow := newDedup("shadow", dedup.Config{Shadow: true})
	replay := newDedup("replay", dedup.Config{Replay: true})
	for _, h := range []message.HandlerFunc{shadow, shadow, shadow, replay, replay} {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"ORDER-003"}`))
		if out, err := h(msg); err != nil || len(out) != 1 {
			t.Fatalf("handler: %d messages, %v; want the output (run or replayed)", len(out), err)
		}
	}
	for event, n := range map[string]float64{"would_skip": 2, "claim_won": 2, "completed": 2, "skip_duplicate": 1} {
		if got := counterSum(t, reg, "dedup_decisions_total", map[string]string{"event": event}); got != n {
			t.Errorf("decisions{event=%q} = %v, want %v", event, got, n)
		}
	}
	if got := counterSum(t, reg, "dedup_replays_total", nil); got != 1 {
		t.Errorf("replays = %v, want 1", got)
	}

	obs.ObserveDecision(dedup.Decision{Event: event.SkipDuplicate, Handler: "charge", Waited: 60 * time.Millisecond})
	obs.ObserveDecision(dedup.Decision{Event: event.InProgress, Handler: "charge", Waited: 30 * time.Second})
	waits := map[string]uint64{}
	for _, m := range gather(t, reg, "dedup_in_progress_wait_seconds") {
		waits[labels(m)["event"]] += m.GetHistogram().GetSampleCount()
	}
	if waits["skip_duplicate"] != 1 || waits["in_progress"] != 1 || len(waits) != 2 {
		t.Errorf("wait samples by event = %v, want one skip_duplicate, one in_progress", waits)
	}
}
