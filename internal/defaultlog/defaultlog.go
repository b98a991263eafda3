// Package defaultlog is the Logger of a configuration that sets none
// (dedup.DefaultLogger): what is logged at Error level goes to log/slog's
// default logger, the rest nowhere.
package defaultlog

import (
	"context"
	"log/slog"
	"slices"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/watermill-dedup/dedup/event"
)

// Logger writes Error to slog.Default() (read at each line, so that a
// later slog.SetDefault applies) at slog.LevelError, with the fields as
// attributes in the order of their names and the error as "error"; Info,
// Debug and Trace write nothing. The engine recognises it by its type and
// builds no decision below Error level for it.
type Logger struct {
	fields watermill.LogFields
	// except is an event (the field dedup_event) not written even at
	// Error level: httpdedup's key reuse, a client's problem.
	except event.Event
}

var root = &Logger{}

// New returns the Logger.
func New() *Logger { return root }

// Except returns l without the lines of event ev.
func (l *Logger) Except(ev event.Event) *Logger { return &Logger{fields: l.fields, except: ev} }

// Error writes msg to slog.Default() at slog.LevelError.
func (l *Logger) Error(msg string, err error, fields watermill.LogFields) {
	if l.except != "" && fields["dedup_event"] == string(l.except) {
		return
	}
	logger := slog.Default()
	ctx := context.Background()
	if !logger.Enabled(ctx, slog.LevelError) {
		return
	}
	all := fields
	if len(l.fields) > 0 {
		all = l.fields.Add(fields)
	}
	names := make([]string, 0, len(all))
	for name := range all {
		names = append(names, name)
	}
	slices.Sort(names)
	attrs := make([]slog.Attr, 0, len(names)+1)
	for _, name := range names {
		attrs = append(attrs, slog.Any(name, all[name]))
	}
	if err != nil {
		attrs = append(attrs, slog.Any("error", err))
	}
	logger.LogAttrs(ctx, slog.LevelError, msg, attrs...)
}

// Info writes nothing.
func (*Logger) Info(string, watermill.LogFields) {}

// Debug writes nothing.
func (*Logger) Debug(string, watermill.LogFields) {}

// Trace writes nothing.
func (*Logger) Trace(string, watermill.LogFields) {}

// With returns a Logger that adds fields to every line.
func (l *Logger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return &Logger{fields: l.fields.Add(fields), except: l.except}
}
