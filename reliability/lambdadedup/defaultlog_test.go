package lambdadedup_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/slogcapture"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
)

// TestNoLoggerWritesRefusalsToSlog: with Dedup.Logger unset, a record
// without a usable key, listed in BatchItemFailures, is also written to
// slog's default logger at error level, once for three deliveries, with a
// hint; a record that goes well writes nothing. With watermill.NopLogger{}
// nothing is written. Not parallel: it sets slog's default logger.
func TestNoLoggerWritesRefusalsToSlog(t *testing.T) {
	recs := slogcapture.Capture(t)
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
		if got := recs.Take(); len(got) != 0 {
			t.Errorf("nop %v: %d records for a record that went well, the first %q", nop, len(got), got[0].Message)
		}
		for range 3 {
			if f := invoke(t, ctx, h, record("m-bad", `{"orderId":"B"}`)); !slices.Equal(f, []string{"m-bad"}) {
				t.Fatalf("failures %v, want [m-bad]", f)
			}
		}
		got := recs.Take()
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
		if r.Level != slog.LevelError || slogcapture.Attr(r, "dedup_event") != "key_missing" || slogcapture.Attr(r, "message_uuid") != "m-bad" ||
			!strings.Contains(slogcapture.Attr(r, "hint"), "dead-letter") {
			t.Errorf("record %v %q dedup_event=%s message_uuid=%s hint=%q: want ERROR key_missing of m-bad with a hint",
				r.Level, r.Message, slogcapture.Attr(r, "dedup_event"), slogcapture.Attr(r, "message_uuid"), slogcapture.Attr(r, "hint"))
		}
	}
}
