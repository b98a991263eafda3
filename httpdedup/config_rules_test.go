package httpdedup_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// TestNewRefusesWhatCannotWork: the engine's rules, stated once in package
// dedup, refuse at New what would fail on every request: a Retention
// shorter than the Lease, a Lease below 1s (the engine's minimum), a
// Heartbeat with DisableHeartbeat.
func TestNewRefusesWhatCannotWork(t *testing.T) {
	base := httpdedup.Config{Dedup: dedup.Config{Store: memstore.New(nil)}, Identity: httpdedup.StaticIdentity("acct")}
	for name, mutate := range map[string]func(*httpdedup.Config){
		"retention shorter than lease": func(c *httpdedup.Config) { c.Dedup.Lease, c.Dedup.Retention = time.Hour, time.Minute },
		"lease below 1s":               func(c *httpdedup.Config) { c.Dedup.Lease = time.Millisecond },
		"heartbeat with disable":       func(c *httpdedup.Config) { c.Dedup.Heartbeat, c.Dedup.DisableHeartbeat = time.Second, true },
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

// TestNewRefusesMessageFields: the fields of dedup.Config that take a
// message's key (Key, Fingerprint, TransportIDs) and the Scope, which
// httpdedup builds for each request, are refused at New, each with an
// error naming it; Replay, unused, is not.
func TestNewRefusesMessageFields(t *testing.T) {
	base := httpdedup.Config{Dedup: dedup.Config{Store: memstore.New(nil)}, Identity: httpdedup.StaticIdentity("acct")}
	for name, mutate := range map[string]func(*dedup.Config){
		"Scope":        func(c *dedup.Config) { c.Scope = "payments" },
		"Key":          func(c *dedup.Config) { c.Key = func(*message.Message) (string, error) { return "k", nil } },
		"Fingerprint":  func(c *dedup.Config) { c.Fingerprint = keyfuncs.PayloadFingerprint },
		"TransportIDs": func(c *dedup.Config) { c.TransportIDs = func(*message.Message) []string { return nil } },
	} {
		cfg := base
		mutate(&cfg.Dedup)
		_, err := httpdedup.New(cfg)
		if err == nil || !strings.Contains(err.Error(), "Config.Dedup."+name) {
			t.Errorf("Dedup.%s set: New returned %v, want an error naming Config.Dedup.%s", name, err, name)
		}
	}
	cfg := base
	cfg.Dedup.Replay = true
	if _, err := httpdedup.New(cfg); err != nil {
		t.Errorf("Dedup.Replay set: %v", err)
	}
}
