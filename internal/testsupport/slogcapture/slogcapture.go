// Package slogcapture points slog's default logger at a handler that
// keeps its records, for tests of what the library logs when no Logger is
// configured.
package slogcapture

import (
	"context"
	"log"
	"log/slog"
	"sync"
	"testing"
)

// Records is a slog.Handler that keeps the records it is given.
type Records struct {
	mu   sync.Mutex
	recs []slog.Record
}

// Capture makes slog's default logger write to the returned Records until
// the test ends. slog.SetDefault also redirects package log; both are
// restored. A test that calls it must not run in parallel.
func Capture(t testing.TB) *Records {
	t.Helper()
	old, out, flags := slog.Default(), log.Writer(), log.Flags()
	c := &Records{}
	slog.SetDefault(slog.New(c))
	t.Cleanup(func() {
		slog.SetDefault(old)
		log.SetOutput(out)
		log.SetFlags(flags)
	})
	return c
}

func (c *Records) Enabled(context.Context, slog.Level) bool { return true }
func (c *Records) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *Records) WithGroup(string) slog.Handler            { return c }

func (c *Records) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recs = append(c.recs, r.Clone())
	return nil
}

// Take returns the records kept since the last Take.
func (c *Records) Take() []slog.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	recs := c.recs
	c.recs = nil
	return recs
}

// Attr is the value of a record's attribute, as text; "" when it has none.
func Attr(r slog.Record, name string) string {
	v := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == name {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}
