package dedup

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/internal/defaultlog"
	"github.com/watermill-dedup/watermill-dedup/internal/keys"
)

// transportIDMetadata names the metadata entries that carry transport ids
// by default: the SQS MessageId as this module's SQS adapters and Lambda
// adapter set it, and the names other adapters commonly use.
var transportIDMetadata = []string{"sqs_message_id", "MessageId", "message_id", "sns_message_id"}

// Defaults applied to zero fields of Config (each field's doc says its own).
const (
	defaultLease             = 30 * time.Second
	defaultRetention         = 24 * time.Hour
	defaultStoreTimeout      = 5 * time.Second
	defaultMaxKeyLength      = keys.DefaultMaxLength
	defaultCompleteRetries   = 3
	defaultCompleteBackoff   = 100 * time.Millisecond
	defaultMaxClaimsInFlight = 16
	defaultInProgressPoll    = 20 * time.Millisecond
	// maxInProgressPoll caps the doubling pause between the claims of a
	// wait (unless InProgressPoll itself is longer).
	maxInProgressPoll = time.Second
)

// minLease is the shortest Config.Lease accepted: one second. A lease must
// outlast a claim's round trip and then give the heartbeat time to extend
// it: with the default heartbeat (Lease/3) and deadline margin (Lease/10),
// the first extension has 0.57×Lease to reach the store, and a store round
// trip under load (a DynamoDB write, a Redis failover, a garbage
// collection pause, a CPU-starved container) takes tens to hundreds of
// milliseconds. Below a second the work's context is cancelled at the
// lease deadline before an extension lands, and every copy runs and loses
// its claim (a 1ms lease gave 258 cancelled runs for a few copies).
const minLease = time.Second

// Config configures a Deduplicator. It is passed by value; New never writes
// to the caller's copy. Durations left at zero take their defaults; negative
// durations are configuration errors, never "forever".
type Config struct {
	// Store keeps the records. Required. It must be shared by every process
	// that consumes the same messages (Redis, DynamoDB, PostgreSQL); a
	// memory.Store (stores/memory) only deduplicates within one process.
	Store Store

	// Key returns the business key of a message: an order id, a payment
	// id, a client's Idempotency-Key. It must not return the transport id
	// (the Watermill UUID, an SQS MessageId): those differ between copies
	// of the same fact. When the message carries no usable key it returns
	// an error wrapping ErrNoKey (see [KeyError]). Package keyfuncs has
	// ready-made ones (keyfuncs.JSON("order_id"), keyfuncs.Metadata(...));
	// a keyfuncs.Func or any function of this signature fits. Required by
	// New; NewEngine does not use it (Engine.Do takes the key).
	Key func(msg *message.Message) (string, error)

	// Scope namespaces the keys, so two handlers consuming the same event
	// each perform their own effect once. Defaults to the Watermill handler
	// name taken from the message context (message.HandlerNameFromCtx); a
	// message with neither is refused with an error (nacked). Engine.Do
	// takes it for a Call that names no Scope. Set it
	// explicitly to share records between handlers, or when renaming a
	// handler must not reset deduplication.
	Scope string

	// Lease is how long a claim holds a key before it counts as abandoned
	// and another consumer may take it over: the longest a crashed
	// consumer delays a redelivered copy. Defaults to 30s; at least 1s (New
	// refuses less: a shorter lease ends before its heartbeat can extend it
	// under a store's worst round trips, and every copy's work is cancelled).
	// With the heartbeat on, a handler may run longer than the lease.
	Lease time.Duration

	// Retention is how long a completed key suppresses duplicates. It must
	// cover the broker's redelivery window (SQS retention, Kafka replay,
	// producer retries). Defaults to 24h; must not be shorter than Lease (a
	// completed record would vanish before a crashed claim's lease ends, and
	// the copies it was meant to stop would run).
	Retention time.Duration

	// Heartbeat is how often the lease is extended while the handler runs.
	// Defaults to Lease/3; must be shorter than Lease less min(Lease/10, 1s)
	// (the deadline margin), and left at zero with DisableHeartbeat. When an
	// extension
	// finds the claim lost (or the lease passes without a successful
	// extension), the handler's context is cancelled with ErrClaimLost as
	// its cause.
	Heartbeat time.Duration

	// DisableHeartbeat turns the heartbeat off: one round trip less per
	// lease period, but a handler that runs longer than Lease lets another
	// consumer take the key over and run the effect a second time.
	DisableHeartbeat bool

	// TransportIDs returns the ids the transport gave this copy of the
	// message, which differ between copies of one business fact; a key
	// equal to any of them is refused with ErrTransportKey, and so is a key
	// equal to the Watermill UUID, always. Defaults to the values of the
	// metadata entries sqs_message_id, MessageId, message_id and
	// sns_message_id (when present). The first non-empty one is the
	// Origin.MessageID the store keeps with the key's first claim (the
	// Watermill UUID is its Origin.TransportID).
	// For Kafka, whose partition and offset watermill-kafka puts in the
	// context, return them formatted as "partition/offset" (see README).
	TransportIDs func(msg *message.Message) []string

	// Fingerprint, when set, returns a digest of what the message asks for
	// (typically a hash of the payload). It is stored with the claim and
	// compared on every later claim of the key: a key recorded with another
	// fingerprint gives ErrKeyReuse instead of Duplicate, which catches a
	// producer reusing a key for a different request. Defaults to nil: no
	// check. keyfuncs.PayloadFingerprint hashes the payload.
	Fingerprint func(msg *message.Message) (string, error)

	// Replay stores the handler's output messages with the completed record
	// and returns them again for a duplicate, so the router re-publishes
	// output that was lost after the effect (e.g. Publish failed). Costs the
	// size of the outputs in the store. Defaults to false: a duplicate
	// produces no messages.
	Replay bool

	// MaxKeyLength bounds the business key in bytes; longer keys are refused
	// with ErrNoKey. Defaults to 1024.
	MaxKeyLength int

	// StoreTimeout bounds each store operation. Complete, Release and Extend
	// run even after the message's context is cancelled, within this
	// timeout. Defaults to 5s.
	StoreTimeout time.Duration

	// CompleteRetries is how many times Complete is retried after a store
	// error (not after ErrClaimLost). Defaults to 3. If Complete still fails
	// the message is acked anyway and an error logged: nacking would run the
	// effect again once the lease ends.
	CompleteRetries int

	// CompleteBackoff is the wait before the first Complete retry, doubled
	// for each further retry. Defaults to 100ms.
	CompleteBackoff time.Duration

	// FailOpen runs the handler without a claim when the store cannot be
	// reached for Claim, logging store_error and fail_open. It trades
	// exactly-once effects for availability: duplicates arriving while the
	// store is down are processed again. Defaults to false (fail closed:
	// the message is nacked and redelivered later).
	FailOpen bool

	// Shadow runs the handler for every message, as if the middleware were
	// not there, while claiming, completing and releasing records as usual:
	// a team turns dedup on in production and sees what it would do before
	// it changes anything. A copy that dedup would have skipped (the key is
	// completed, or held by another claim) runs without a claim and is
	// logged would_skip; one it would have refused (key reused with another
	// fingerprint, no usable key) runs without a claim and is logged
	// would_reject. Such unclaimed runs never touch the record, so the
	// first copy's completed record and stored result stay as they are, and
	// OutcomeFromContext tells the handler what dedup would have done. A
	// claim the store cannot answer runs the handler too (as FailOpen).
	// InProgressWait does not apply: nothing waits. What still differs from
	// no middleware: the store round trips, and the lease deadline of a
	// copy that won its claim cancels its context as usual. Defaults to
	// false.
	Shadow bool

	// InProgressWait, when positive, is how long a copy that finds its key
	// held by another claim (InProgress) waits for that claim to end
	// instead of failing at once with ErrInProgress (a nack, logged by the
	// Watermill router as an error, and a redelivery later). It claims the
	// key again after InProgressPoll, doubling the pause after each claim
	// (up to 1s): once the holder completes it is a duplicate (acked, with
	// the stored result for replay); once the holder releases the key (its
	// handler failed) or its lease ends, the copy wins the claim and runs
	// the handler. When the wait ends without either, the context ends, or
	// a claim of the wait fails (the holder is known to exist: never a
	// fail-open run), it fails with ErrInProgress as without the option. Cost: a blocked
	// handler goroutine and one claim round trip per pause, for copies in
	// flight only. With a store that wakes waiters (see
	// InProgressFallback) the copy claims when the holder completes or
	// releases the key instead, within about one round trip, at about two
	// claims per wait. Keep it well below the broker's redelivery timeout (SQS
	// visibility timeout, ack deadline). Defaults to 0: no wait.
	InProgressWait time.Duration

	// InProgressPoll is the first pause between two claims of an
	// InProgressWait. Defaults to 20ms.
	InProgressPoll time.Duration

	// InProgressFallback is, with a store that wakes waiting copies when a
	// key is completed or released (stores/redis, stores/postgres with
	// Notify; a store has this capability by its WatchKey method, see
	// docs/waiting.md), the pause between the claims of an InProgressWait
	// that no wake prompted, instead of InProgressPoll's doubling pauses.
	// The waiting copy watches the key and claims once when the watch is in
	// place, once per wake, and once per InProgressFallback: about two
	// claims per wait for a holder that ends within InProgressFallback, one
	// more per InProgressFallback it takes beyond. It is the safety net for
	// a change that no wake announces (a holder that crashed, whose lease
	// ended; a completion by a process that does not announce it): such a
	// change is noticed up to InProgressFallback late. See docs/waiting.md.
	// Defaults to 1s.
	InProgressFallback time.Duration

	// Tracer, when set, follows each call from its start with its context
	// (see Tracer; package oteldedup makes trace spans). Defaults to nil.
	Tracer Tracer

	// Logger receives one line per decision, at the level package event
	// gives each event. Defaults to DefaultLogger(): the decisions at
	// error level (key_missing, transport_key, key_reuse, store_error,
	// claim_lost, fail_open) and the panics recovered on a lease's
	// goroutine go to log/slog's default logger (slog.Default() at each
	// line, so slog.SetDefault applies) at slog.LevelError; the others
	// (claim_won, completed, skip_duplicate, in_progress, released,
	// would_skip, would_reject) are neither logged nor built, so a message
	// that goes well costs what it costs without a logger. Set it to
	// watermill.NopLogger{} to log nothing at all. With any Logger, a
	// message refused for good again and again (a router without a poison
	// queue) is logged once, with a hint, and then counted: a line every
	// 30s at most, with the count (see docs/router.md).
	Logger watermill.LoggerAdapter

	// Observer, when set, is told of every decision and every store
	// operation's latency (for metrics). Defaults to nil.
	Observer Observer

	// MaxClaimsInFlight bounds the Claim requests one Deduplicator or
	// Engine has in flight at once; more wait for a slot (within their
	// context). Complete, Release and Extend are never bounded, so under a
	// backlog of new messages they still reach the store's connections
	// quickly and a finished handler's record is completed within its
	// lease. Defaults to 16, or to the store's own default: a store that
	// sends concurrent calls in a bounded number of batches, where a
	// backlog of claims cannot hold Complete, Release and Extend back,
	// admits more, so that the claims of every handler running at once
	// share batches (stores/redis with Config.AutoPipeline: 256). A value
	// set here always wins.
	MaxClaimsInFlight int

	// Clock drives leases, heartbeats and retry backoff. Defaults to the
	// wall clock; tests pass a fakeclock.
	Clock Clock
}

func (c *Config) setDefaults() {
	if c.Lease == 0 {
		c.Lease = defaultLease
	}
	if c.Retention == 0 {
		c.Retention = defaultRetention
	}
	if c.Heartbeat == 0 && c.Lease > 0 {
		c.Heartbeat = c.Lease / 3
	}
	if c.MaxKeyLength == 0 {
		c.MaxKeyLength = defaultMaxKeyLength
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = defaultStoreTimeout
	}
	if c.CompleteRetries == 0 {
		c.CompleteRetries = defaultCompleteRetries
	}
	if c.CompleteBackoff == 0 {
		c.CompleteBackoff = defaultCompleteBackoff
	}
	if c.MaxClaimsInFlight == 0 {
		c.MaxClaimsInFlight = defaultMaxClaimsInFlight
		if n := claimAdmission(c.Store); n > 0 {
			c.MaxClaimsInFlight = n
		}
	}
	if c.InProgressPoll == 0 {
		c.InProgressPoll = defaultInProgressPoll
	}
	if c.InProgressFallback == 0 {
		c.InProgressFallback = defaultInProgressFallback
	}
	if c.Logger == nil {
		c.Logger = defaultlog.New()
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
}

// validate reports every problem in the configuration at once (joined with
// errors.Join), after applying defaults to a copy: New and NewEngine return
// it. Zero values are not problems: they take their defaults. The Engine
// alone needs no key function.
func (c Config) validate(needKey bool) error {
	heartbeatSet := c.Heartbeat != 0
	c.setDefaults()
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("dedup: Config.Store is required"))
	}
	if needKey && c.Key == nil {
		errs = append(errs, errors.New("dedup: Config.Key is required (package keyfuncs has key functions: keyfuncs.JSON(\"order_id\"), keyfuncs.Metadata(...))"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"Lease", c.Lease}, {"Retention", c.Retention}, {"Heartbeat", c.Heartbeat},
		{"StoreTimeout", c.StoreTimeout}, {"CompleteBackoff", c.CompleteBackoff},
		{"InProgressWait", c.InProgressWait}, {"InProgressPoll", c.InProgressPoll},
		{"InProgressFallback", c.InProgressFallback},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%w: Config.%s must not be negative, got %v (leave it at zero for its default)", ErrInvalidDuration, d.name, d.v))
		}
	}
	errs = append(errs, checkLease(c.Lease, c.Retention, c.Heartbeat, heartbeatSet, c.DisableHeartbeat)...)
	if c.MaxKeyLength < 0 {
		errs = append(errs, fmt.Errorf("dedup: Config.MaxKeyLength must not be negative, got %d", c.MaxKeyLength))
	}
	if c.MaxClaimsInFlight < 0 {
		errs = append(errs, fmt.Errorf("dedup: Config.MaxClaimsInFlight must not be negative, got %d", c.MaxClaimsInFlight))
	}
	if c.CompleteRetries < 0 {
		errs = append(errs, fmt.Errorf("dedup: Config.CompleteRetries must not be negative, got %d", c.CompleteRetries))
	}
	return errors.Join(errs...)
}

// checkLease states the rules of the lease, the retention and the
// heartbeat (after defaults; heartbeatSet: the caller set Heartbeat),
// which every entry point's Config shares: a problem each, saying what to
// change.
func checkLease(lease, retention, heartbeat time.Duration, heartbeatSet, disabled bool) []error {
	var errs []error
	if lease > 0 && lease < minLease {
		errs = append(errs, fmt.Errorf("%w: Config.Lease (%v) must be at least %v: a shorter lease ends before its heartbeat can extend it, and every copy's work is cancelled; "+
			"set the longest time a crashed consumer may hold a key (seconds to minutes)", ErrInvalidDuration, lease, minLease))
	}
	if lease > 0 && retention > 0 && retention < lease {
		errs = append(errs, fmt.Errorf("%w: Config.Retention (%v) must not be shorter than Config.Lease (%v): a completed key would be forgotten before a crashed claim's lease ends; "+
			"set Retention to cover the broker's redelivery window (hours to days)", ErrInvalidDuration, retention, lease))
	}
	if disabled && heartbeatSet {
		errs = append(errs, fmt.Errorf("%w: Config.Heartbeat (%v) is set together with Config.DisableHeartbeat: leave Heartbeat at zero to run without a heartbeat, or unset DisableHeartbeat",
			ErrInvalidDuration, heartbeat))
	}
	if !disabled && heartbeat > 0 && lease > 0 && heartbeat >= lease-deadlineMargin(lease) {
		errs = append(errs, fmt.Errorf("%w: Config.Heartbeat (%v) must be shorter than Config.Lease (%v) less the deadline margin min(Lease/10, 1s) (%v): the work's context is cancelled at that deadline unless an extension succeeded before it; "+
			"leave Heartbeat at zero (Lease/3) or lengthen Lease", ErrInvalidDuration, heartbeat, lease, deadlineMargin(lease)))
	}
	return errs
}
