package httpdedup_test

import (
	"errors"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/internal/memstore"
)

// TestNewRefusesWhatCannotWork: the engine's rules, stated once in package
// dedup, refuse at New what would fail on every request: a Retention
// shorter than the Lease, a Lease below 1s (the engine's minimum), a
// Heartbeat with DisableHeartbeat.
func TestNewRefusesWhatCannotWork(t *testing.T) {
	base := httpdedup.Config{Store: memstore.New(nil), Identity: httpdedup.StaticIdentity("acct")}
	for name, mutate := range map[string]func(*httpdedup.Config){
		"retention shorter than lease": func(c *httpdedup.Config) { c.Lease, c.Retention = time.Hour, time.Minute },
		"lease below 1s":               func(c *httpdedup.Config) { c.Lease = time.Millisecond },
		"heartbeat with disable":       func(c *httpdedup.Config) { c.Heartbeat, c.DisableHeartbeat = time.Second, true },
	} {
		cfg := base
		mutate(&cfg)
		if _, err := httpdedup.New(cfg); !errors.Is(err, dedup.ErrInvalidDuration) {
			t.Errorf("%s: New returned %v, want ErrInvalidDuration", name, err)
		}
	}
	if _, err := httpdedup.New(base); err != nil {
		t.Errorf("defaults: %v", err)
	}
}
