package dedup_test

import (
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
)

// decisions records the decisions an Engine reports.
type decisions struct {
	mu  sync.Mutex
	all []dedup.Decision
}

func newDecisions() *decisions { return &decisions{} }

func (d *decisions) ObserveDecision(dec dedup.Decision) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.all = append(d.all, dec)
}

func (d *decisions) ObserveStoreOp(string, time.Duration, error) {}

// of returns the decisions of one event.
func (d *decisions) of(e event.Event) []dedup.Decision {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []dedup.Decision
	for _, dec := range d.all {
		if dec.Event == e {
			out = append(out, dec)
		}
	}
	return out
}

func newEngine(t *testing.T, cfg dedup.Config) *dedup.Engine {
	t.Helper()
	e, err := dedup.NewEngine(cfg)
	if err != nil {
		t.Fatalf("NewEngine: %v", err)
	}
	return e
}
