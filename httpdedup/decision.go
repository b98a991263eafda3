package httpdedup

import (
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/internal/defaultlog"
)

// decide logs a decision and passes it to the Observer. Handler is
// "METHOD route", Topic "http"; MessageUUID stays empty.
func (m *Middleware) decide(info requestInfo, d dedup.Decision) {
	d.Handler, d.Topic = info.handler, "http"
	if d.Key == "" {
		d.Key = info.key
	}
	fields := watermill.LogFields{"dedup_event": string(d.Event), "handler": d.Handler, "topic": d.Topic}
	if d.Key != "" {
		fields["key"] = d.Key
	}
	if d.Op != "" {
		fields["op"] = d.Op
	}
	if d.Elapsed > 0 {
		fields["elapsed"] = d.Elapsed
	}
	msg := "httpdedup: " + string(d.Event)
	switch d.Event {
	case event.ClaimWon, event.Completed:
		m.cfg.Dedup.Logger.Debug(msg, fields)
	case event.SkipDuplicate, event.InProgress, event.Released, event.KeyMissing, event.KeyReuse,
		event.WouldSkip, event.WouldReject:
		// Client-side problems are not server errors.
		if d.Err != nil {
			fields["err"] = d.Err.Error()
		}
		m.cfg.Dedup.Logger.Info(msg, fields)
	default:
		m.cfg.Dedup.Logger.Error(msg, d.Err, fields)
	}
	if m.cfg.Dedup.Observer != nil {
		m.cfg.Dedup.Observer.ObserveDecision(d)
	}
}

func (m *Middleware) observeOp(op string, elapsed time.Duration, err error) {
	if m.cfg.Dedup.Observer != nil {
		m.cfg.Dedup.Observer.ObserveStoreOp(op, elapsed, err)
	}
}

// engineLogger is the Logger of the Engine for the middleware's Logger l:
// l with a client's key reuse at info level (for the default logger,
// which writes nothing at info level, not at all).
func engineLogger(l watermill.LoggerAdapter) watermill.LoggerAdapter {
	switch l := l.(type) {
	case watermill.NopLogger, *watermill.NopLogger:
		return l
	case *defaultlog.Logger:
		return l.Except(event.KeyReuse) // still the default logger: the engine builds no decision below error level
	}
	return clientProblemsAtInfo{l}
}

// clientProblemsAtInfo is the Logger of the Engine: the decisions it logs
// as errors that are the client's doing (a key reused for another request)
// are logged at info level, as the middleware's own are.
type clientProblemsAtInfo struct{ watermill.LoggerAdapter }

func (l clientProblemsAtInfo) Error(msg string, err error, fields watermill.LogFields) {
	if fields["dedup_event"] == string(event.KeyReuse) {
		l.Info(msg, fields.Add(watermill.LogFields{"err": err.Error()}))
		return
	}
	l.LoggerAdapter.Error(msg, err, fields)
}

func (l clientProblemsAtInfo) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return clientProblemsAtInfo{l.LoggerAdapter.With(fields)}
}
