package lambdadedup_test

import (
	"context"
	"log"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
)

// slogRecords is a slog.Handler that keeps its records.
type slogRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (c *slogRecords) Enabled(context.Context, slog.Level) bool { return true }
func (c *slogRecords) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *slogRecords) WithGroup(string) slog.Handler            { return c }
func (c *slogRecords) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recs = append(c.recs, r.Clone())
	return nil
}

func (c *slogRecords) take() []slog.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	recs := c.recs
	c.recs = nil
	return recs
}

func attrOf(r slog.Record, name string) string {
	v := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == name {
			v = a.Value.String()
		}
		return true
	})
	return v
}

// TestNoLoggerWritesRefusalsToSlog: with Dedup.Logger unset, a record
// without a usable key, listed in BatchItemFailures, is also written to
// slog's default logger at error level, once for three deliveries, with a
// hint; a record that goes well writes nothing. With watermill.NopLogger{}
// nothing is written. Not parallel: it sets slog's default logger.
func TestNoLoggerWritesRefusalsToSlog(t *testing.T) {
	old, out, flags := slog.Default(), log.Writer(), log.Flags()
	recs := &slogRecords{}
	slog.SetDefault(slog.New(recs))
	t.Cleanup(func() {
		slog.SetDefault(old)
		log.SetOutput(out)
		log.SetFlags(flags)
	})
	ctx := context.Background()
	for _, nop := range []bool{false, true} {
		cfg := lambdadedup.Config{}
		if nop {
			cfg.Dedup = dedup.Config{Logger: watermill.NopLogger{}}
		}
		h := newHandler(t, cfg, newCharger().handle)
		if f := invoke(t, ctx, h, record("m-ok", order("A"))); len(f) != 0 {
			t.Fatalf("failures %v, want none", f)
		}
		if got := recs.take(); len(got) != 0 {
			t.Errorf("nop %v: %d records for a record that went well, the first %q", nop, len(got), got[0].Message)
		}
		for range 3 {
			if f := invoke(t, ctx, h, record("m-bad", `{"orderId":"B"}`)); !slices.Equal(f, []string{"m-bad"}) {
				t.Fatalf("failures %v, want [m-bad]", f)
			}
		}
		got := recs.take()
		if nop {
			if len(got) != 0 {
				t.Errorf("NopLogger: %d records, want none", len(got))
			}
			continue
		}
		if len(got) != 1 {
			t.Fatalf("%d records for three deliveries of a keyless record, want 1", len(got))
		}
		r := got[0]
		if r.Level != slog.LevelError || attrOf(r, "dedup_event") != "key_missing" || attrOf(r, "message_uuid") != "m-bad" ||
			!strings.Contains(attrOf(r, "hint"), "dead-letter") {
			t.Errorf("record %v %q dedup_event=%s message_uuid=%s hint=%q: want ERROR key_missing of m-bad with a hint",
				r.Level, r.Message, attrOf(r, "dedup_event"), attrOf(r, "message_uuid"), attrOf(r, "hint"))
		}
	}
}
