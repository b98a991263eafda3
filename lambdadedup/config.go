package lambdadedup

import (
	"errors"
	"fmt"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// Defaults applied by New to zero fields of Config.
const (
	// DefaultDeadlineMargin is the least invocation time a record needs to
	// be started: 2s, room for a short handler and its two store round
	// trips within the 3s default timeout of a Lambda function.
	DefaultDeadlineMargin = 2 * time.Second
	// DefaultConcurrency runs the records of a batch one by one.
	DefaultConcurrency = 1
)

// Config configures a Handler. It is passed by value; New never writes to
// the caller's copy.
type Config struct {
	// Dedup is the claim configuration, the same as the Watermill
	// middleware's (dedup.New): Store, Key and Scope are required. Scope
	// namespaces the keys and has no default here (a Lambda function has
	// no Watermill handler name to default to): New refuses an empty one
	// with an error matching dedup.ErrNoScope. Give it the Store, Scope
	// (the router's handler name, or its dedup.Config.Scope), Retention
	// (and Fingerprint) of the router that consumes the same messages
	// elsewhere, and a record written here is a duplicate there and the
	// other way round. Dedup.Replay is not used (an SQS handler publishes
	// no output messages).
	//
	// Dedup.Logger left nil is dedup.DefaultLogger(): what is logged at
	// error level reaches log/slog's default logger (slog.Default(), so
	// slog.SetDefault applies) at slog.LevelError: the records refused for
	// good (key_missing, transport_key, key_reuse; permanent_dropped with
	// DropPermanent), handler_panic, store_error, claim_lost and
	// fail_open. Nothing else is logged (not the info-level
	// deadline_skipped, group_skipped and the stream warning of
	// DropPermanent); watermill.NopLogger{} logs nothing at all. A record
	// refused again on each redelivery is logged once and then counted,
	// a line every 30s at most (see dedup.Config.Logger).
	Dedup dedup.Config

	// DropPermanent decides what becomes of a record that can never
	// succeed: no usable key (dedup.ErrNoKey), its transport id as key
	// (dedup.ErrTransportKey) or a key reused with another fingerprint
	// (dedup.ErrKeyReuse). Defaults to false: the record is listed as a
	// batch item failure every time, so the queue's redrive policy moves it
	// to the dead-letter queue after maxReceiveCount receives (a queue
	// without a redrive policy keeps it until its retention ends). True:
	// the record is reported processed (SQS deletes it) and an error is
	// logged: the message is lost, on purpose. On a stream (HandleKinesis,
	// HandleDynamoDB) such a record blocks its shard until the mapping's
	// retry limits (MaximumRetryAttempts, MaximumRecordAgeInSeconds, with an
	// OnFailure destination) end it: the first stream batch of a Handler
	// without DropPermanent logs a warning saying so.
	DropPermanent bool

	// DeadlineMargin is the least remaining invocation time (the context's
	// deadline) for a record to be started; a record reached later is
	// listed as a failure, not started (its claim, made with the batch's,
	// is released; an invocation that starts with less claims nothing),
	// and comes back after the queue's visibility timeout. A
	// Dedup.InProgressWait ends by the deadline less DeadlineMargin, and a
	// claim won after that is released unstarted too (dedup.Call.StartBy).
	// Set it above the handler's longest run plus two store round trips.
	// Defaults to 2s; negative is an error.
	DeadlineMargin time.Duration

	// Concurrency is how many records of one batch run at once. Records of
	// one FIFO message group always run one after the other, in order.
	// Defaults to 1.
	Concurrency int
}

func (c *Config) setDefaults() {
	if c.DeadlineMargin == 0 {
		c.DeadlineMargin = DefaultDeadlineMargin
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
}

// Validate reports every problem in the configuration at once (joined with
// errors.Join), after applying defaults to a copy.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if _, err := dedup.New(c.Dedup); err != nil { // dedup's own checks; nothing started
		if joined, ok := err.(interface{ Unwrap() []error }); ok {
			errs = append(errs, joined.Unwrap()...) // one list of problems
		} else {
			errs = append(errs, err)
		}
	}
	if c.Dedup.Scope == "" {
		errs = append(errs, fmt.Errorf("lambdadedup: Config.Dedup.Scope is required (a Lambda function has no Watermill handler name to default to): %w", dedup.ErrNoScope))
	}
	if c.DeadlineMargin < 0 {
		errs = append(errs, fmt.Errorf("%w: lambdadedup: Config.DeadlineMargin must not be negative, got %v", dedup.ErrInvalidDuration, c.DeadlineMargin))
	}
	if c.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("lambdadedup: Config.Concurrency must not be negative, got %d", c.Concurrency))
	}
	return errors.Join(errs...)
}
