package dynamo

import (
	"errors"
	"fmt"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

// Defaults applied by New to zero fields of Config and AttributeNames.
const (
	// DefaultClockSkewMargin is how long past its deadline a record must be
	// before another client may take it over. See Config.ClockSkewMargin.
	DefaultClockSkewMargin = time.Second

	DefaultPartitionKey         = "pk"
	DefaultStateAttribute       = "state"
	DefaultTokenAttribute       = "token"
	DefaultFingerprintAttribute = "fingerprint"
	DefaultDeadlineAttribute    = "deadline"
	DefaultResultAttribute      = "result"
	DefaultTTLAttribute         = "ttl"
	DefaultClaimedAtAttribute   = "claimed_at"
	DefaultCompletedAtAttribute = "completed_at"
	DefaultTransportIDAttribute = "transport_id"
	DefaultMessageIDAttribute   = "message_id"
	DefaultClaimsAttribute      = "claims"
	DefaultFenceAttribute       = "fence"
)

// AttributeNames names the item's attributes. Every field defaults to the
// matching Default… constant; set them to share a table whose partition key
// or TTL attribute already has another name. Names must be distinct. They
// always reach DynamoDB as expression placeholders (#name), so reserved
// words such as "state" or "ttl" are fine.
type AttributeNames struct {
	// PartitionKey is the table's partition key, a string (S). It holds the
	// scoped key as given to Claim, or its hashed form for keys longer than
	// MaxVerbatimKeyBytes (see PartitionKey). The table must have no sort
	// key. Defaults to "pk".
	PartitionKey string
	// State is "in_progress", "completed" or "released" (S; a released
	// record has Deadline 0 and counts as none). Defaults to "state".
	State string
	// Token is the owner token written by Claim (S). Defaults to "token".
	Token string
	// Fingerprint is the claim's fingerprint (S), absent when empty.
	// Defaults to "fingerprint".
	Fingerprint string
	// Deadline is the lease deadline of an in_progress record, or the end of
	// the retention of a completed one, in Unix milliseconds (N) by the
	// writer's clock. Expiry is decided by comparing it in conditions.
	// Defaults to "deadline".
	Deadline string
	// Result is the result stored by Complete (B), absent when empty.
	// Defaults to "result".
	Result string
	// TTL is an epoch-seconds number (N) for DynamoDB Time to Live, written
	// at or after Deadline + ClockSkewMargin. Enable TTL on this attribute
	// so that storage is reclaimed; it is for cost, never for correctness.
	// Defaults to "ttl".
	TTL string

	// Who and when (see dedup.Store.Claim), kept from the first claim of a
	// record across releases and takeovers of its lease:
	//
	// ClaimedAt is when the first claim ran, by its client's clock, as
	// RFC 3339 UTC text with milliseconds (S), as "2006-01-02T15:04:05.000Z".
	// Defaults to "claimed_at".
	ClaimedAt string
	// CompletedAt is when the record was completed, in the same form (S);
	// absent while in progress. Defaults to "completed_at".
	CompletedAt string
	// TransportID and MessageID are the first claim's dedup.Origin (S),
	// absent when empty (an id the first claim lacked is the first that a
	// later claim of the record had). Default to "transport_id" and
	// "message_id".
	TransportID, MessageID string
	// Claims is how many claims acquired the record (N). Defaults to
	// "claims".
	Claims string

	// Fence is the fence of the claim that last acquired the record (N,
	// dedup.Claim.Fence): storekit.NextFence of the fence it replaced and
	// the claiming client's clock. Absent in items written before fencing,
	// which read as fence 0. Defaults to "fence".
	Fence string
}

func (a *AttributeNames) setDefaults() {
	set := func(p *string, d string) {
		if *p == "" {
			*p = d
		}
	}
	set(&a.PartitionKey, DefaultPartitionKey)
	set(&a.State, DefaultStateAttribute)
	set(&a.Token, DefaultTokenAttribute)
	set(&a.Fingerprint, DefaultFingerprintAttribute)
	set(&a.Deadline, DefaultDeadlineAttribute)
	set(&a.Result, DefaultResultAttribute)
	set(&a.TTL, DefaultTTLAttribute)
	set(&a.ClaimedAt, DefaultClaimedAtAttribute)
	set(&a.CompletedAt, DefaultCompletedAtAttribute)
	set(&a.TransportID, DefaultTransportIDAttribute)
	set(&a.MessageID, DefaultMessageIDAttribute)
	set(&a.Claims, DefaultClaimsAttribute)
	set(&a.Fence, DefaultFenceAttribute)
}

func (a AttributeNames) list() []string {
	return []string{a.PartitionKey, a.State, a.Token, a.Fingerprint, a.Deadline, a.Result, a.TTL,
		a.ClaimedAt, a.CompletedAt, a.TransportID, a.MessageID, a.Claims, a.Fence}
}

// Config configures a Store. It is passed by value; New never writes to the
// caller's copy.
type Config struct {
	// Client talks to DynamoDB. Required: New refuses a nil client (or a
	// nil *dynamodb.Client) with ErrNoClient. A *dynamodb.Client satisfies
	// it.
	Client Client

	// Table is the table name. Required. The table needs a string partition
	// key named AttributeNames.PartitionKey and no sort key; CreateTable
	// makes one.
	Table string

	// Attributes names the item's attributes. Zero fields take their
	// defaults ("pk", "state", "token", "fingerprint", "deadline", "result",
	// "ttl", "claimed_at", "completed_at", "transport_id", "message_id",
	// "claims", "fence").
	Attributes AttributeNames

	// ClockSkewMargin is how far past its deadline a record must be, by the
	// claiming client's clock, before that client may take it over.
	// DynamoDB conditions have no server clock, so deadlines are written and
	// compared with the clients' clocks: a consumer whose clock runs behind
	// believes its lease is live for longer, and a consumer whose clock runs
	// ahead sees it expire sooner. Takeover is safe when the margin covers
	// the largest clock difference between any two consumers; the owner
	// itself stops at the deadline without margin (Complete, Release and
	// Extend fail with ErrClaimLost once its clock passes it), so between
	// deadline and deadline+margin nobody owns the key. The margin delays
	// every takeover and every reuse of an expired completed key by this
	// much. Deadlines have millisecond resolution. Defaults to 1s, ample for
	// NTP-synchronised hosts (Amazon Time Sync keeps EC2 within a
	// millisecond); must not be negative.
	ClockSkewMargin time.Duration

	// SkipTTL does not require DynamoDB Time to Live on the table: New then
	// sends no DescribeTimeToLive. Set it for servers without TTL (dynalite)
	// or a table whose storage is reclaimed otherwise; without TTL,
	// expired records stay in the table (the store treats them as absent).
	// Defaults to false: New refuses a table without TTL on
	// AttributeNames.TTL (ErrTTLDisabled).
	SkipTTL bool

	// SkipTableCheck makes New send no request: for callers without the
	// dynamodb:DescribeTable and dynamodb:DescribeTimeToLive permissions. A
	// missing table or a wrong key schema then shows on the first claim,
	// as a store error on every message, and a global table replicated
	// with eventual consistency is not refused at all. Defaults to false:
	// New checks the table once (see New).
	SkipTableCheck bool

	// AllowEventuallyConsistentReplicas accepts a global table replicated
	// with multi-Region eventual consistency (MREC), which New otherwise
	// refuses with a *ReplicasError (ErrEventuallyConsistentReplicas).
	// There each Region decides a conditional write against its own copy
	// and replication keeps the last writer: consumers in two Regions can
	// both acquire one key, both run the effect, and take fences that do
	// not order them. Set it only when every consumer of the table writes
	// to one Region (the other replicas standing by for failover), knowing
	// that a failover may repeat effects and reorder fences for the keys
	// whose last writes had not replicated yet. A table replicated with
	// strong consistency (MRSC) needs no option. Defaults to false.
	AllowEventuallyConsistentReplicas bool

	// Clock supplies "now" for deadlines and expiry checks. Defaults to the
	// wall clock; tests pass a fakeclock.
	Clock dedup.Clock

	// Format is the layout of the items: FormatNative, the store's own
	// (see the package documentation), or FormatPowertools, the layout of
	// Powertools for AWS Lambda's DynamoDBPersistenceLayer, so that
	// functions using Powertools' idempotency utility and this store share
	// one table (see Powertools and docs/migrating-from-powertools.md).
	// Defaults to FormatNative. The two layouts cannot share a table.
	Format Format

	// Powertools names the attributes of FormatPowertools as
	// DynamoDBPersistenceLayer names them, and says which Powertools
	// runtime writes the table's results. Required with FormatPowertools
	// (its Runtime); must be zero with FormatNative.
	Powertools PowertoolsLayout
}

func (c *Config) setDefaults() {
	if c.Format == FormatPowertools {
		c.Powertools.setDefaults()
		// Powertools' attributes stand for the store's own: the partition
		// key, the status, the TTL (expiration) and the fingerprint
		// (validation). Validate refuses those set in Attributes.
		c.Attributes.PartitionKey = c.Powertools.KeyAttr
		c.Attributes.State = c.Powertools.StatusAttr
		c.Attributes.TTL = c.Powertools.ExpiryAttr
		c.Attributes.Fingerprint = c.Powertools.ValidationKeyAttr
		c.Attributes.Deadline = c.Powertools.InProgressExpiryAttr
	}
	c.Attributes.setDefaults()
	if c.ClockSkewMargin == 0 {
		c.ClockSkewMargin = DefaultClockSkewMargin
	}
	if c.Clock == nil {
		c.Clock = storekit.WallClock{}
	}
}

// Validate reports every problem in the configuration at once (joined with
// errors.Join), after applying defaults to a copy.
func (c Config) Validate() error {
	var errs []error
	switch c.Format {
	case FormatNative:
		if c.Powertools != (PowertoolsLayout{}) {
			errs = append(errs, errors.New("dynamo: Config.Powertools is set, but Config.Format is not FormatPowertools"))
		}
	case FormatPowertools:
		a := c.Attributes
		for _, f := range []struct{ field, value, instead string }{
			{"PartitionKey", a.PartitionKey, "KeyAttr"}, {"State", a.State, "StatusAttr"}, {"TTL", a.TTL, "ExpiryAttr"},
			{"Fingerprint", a.Fingerprint, "ValidationKeyAttr"}, {"Deadline", a.Deadline, "InProgressExpiryAttr"},
		} {
			if f.value != "" {
				errs = append(errs, fmt.Errorf("dynamo: Config.Attributes.%s is Powertools' with FormatPowertools: set Config.Powertools.%s instead", f.field, f.instead))
			}
		}
		if c.Powertools.Runtime != PowertoolsTypeScript && c.Powertools.Runtime != PowertoolsPython {
			errs = append(errs, fmt.Errorf("dynamo: Config.Powertools.Runtime is required with FormatPowertools: PowertoolsTypeScript or PowertoolsPython, got %d", c.Powertools.Runtime))
		}
	default:
		errs = append(errs, fmt.Errorf("dynamo: unknown Config.Format %d", c.Format))
	}
	c.setDefaults()
	if storekit.IsNil(c.Client) {
		errs = append(errs, fmt.Errorf("%w (a *dynamodb.Client)", ErrNoClient))
	}
	if c.Table == "" {
		errs = append(errs, errors.New("dynamo: Config.Table is required"))
	}
	if c.ClockSkewMargin < 0 {
		errs = append(errs, fmt.Errorf("%w: Config.ClockSkewMargin must not be negative, got %v", dedup.ErrInvalidDuration, c.ClockSkewMargin))
	}
	seen := map[string]bool{}
	names := c.Attributes.list()
	if c.Format == FormatPowertools {
		names = append(names, c.Powertools.DataAttr)
	}
	for _, n := range names {
		if len(n) > 255 {
			errs = append(errs, fmt.Errorf("dynamo: attribute name %.20q… is longer than DynamoDB's 255 bytes", n))
		}
		if seen[n] {
			errs = append(errs, fmt.Errorf("dynamo: attribute name %q is used twice in Config.Attributes", n))
		}
		seen[n] = true
	}
	return errors.Join(errs...)
}
