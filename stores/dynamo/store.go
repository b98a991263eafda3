package dynamo

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

// Record states as stored in the State attribute.
const (
	stateInProgress = "in_progress"
	stateCompleted  = "completed"
	stateReleased   = "released"
)

// timeLayout is the form of the ClaimedAt and CompletedAt attributes:
// RFC 3339 in UTC with milliseconds, as long as every such time.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// formatTime is a Unix millisecond time in timeLayout.
func formatTime(ms int64) string { return time.UnixMilli(ms).UTC().Format(timeLayout) }

const (
	// MaxItemBytes is DynamoDB's item size limit (400 KB), attribute names
	// included.
	MaxItemBytes = 400 * 1024

	// maxNumberBytes bounds the stored size of a number attribute (DynamoDB:
	// one byte per two significant digits plus one; an int64 has at most 19
	// digits, and a sign).
	maxNumberBytes = 21

	// tokenBytes is the length of storekit.NewToken's tokens.
	tokenBytes = 32

	// maxClaimAttempts bounds Claim's writes: the first, and those after a
	// failed one that found a record no longer live, or none.
	maxClaimAttempts = 4
)

// Store is a [dedup.Store] on one DynamoDB table. Create it with New; it is
// safe for concurrent use and holds no connection of its own (the Client
// does).
//
// Every write is conditional, decided by DynamoDB: a
// Claim a conditional PutItem (then, for a record no longer live, a
// conditional UpdateItem or PutItem), Complete, Extend and Release
// conditional UpdateItems. Expiry is decided inside those
// conditions by comparing the record's Deadline attribute with the calling
// client's clock, never by DynamoDB TTL (see Config.ClockSkewMargin and the
// package documentation).
type Store struct {
	client    Client
	table     string
	attr      AttributeNames
	marginMs  int64
	clock     dedup.Clock
	maxResult int
	st        statements
	// oldItems: the server has returned the old item with a failed
	// condition (ALL_OLD), as DynamoDB does and dynalite does not; a
	// failure without one then means there is no item.
	oldItems atomic.Bool
	// strongReplicas: New found a global table with multi-Region strong
	// consistency, which has no transactions (RunInTx refuses to start).
	strongReplicas bool
	// pt is the layout of FormatPowertools; nil for FormatNative. Its
	// attributes stand in attr for the partition key (PartitionKey), the
	// status (State), expiration (TTL), in_progress_expiration (Deadline)
	// and validation (Fingerprint).
	pt *PowertoolsLayout
}

var _ dedup.Store = (*Store)(nil)

// New validates config, checks the table once and returns a Store. The
// check, as redis.New checks its server, refuses a table that cannot hold
// the store's records safely, with an error that says what to change: a
// missing table (ErrTableNotFound), a key schema other than a string
// partition key named AttributeNames.PartitionKey without a sort key
// (ErrTableSchema), a global table replicated with multi-Region eventual
// consistency, where a claim is not atomic (a *ReplicasError matching
// ErrEventuallyConsistentReplicas, unless
// Config.AllowEventuallyConsistentReplicas), Time to Live not enabled on
// AttributeNames.TTL (ErrTTLDisabled, unless Config.SkipTTL; a global
// table with multi-Region strong consistency has no TTL: it needs
// SkipTTL, and RunInTx then refuses to start, as such a table has no
// transactions). A region or credentials failure
// of the AWS SDK is an *AWSConfigError (ErrAWSConfig), not a DynamoDB that
// does not answer. Cost: one DescribeTable and one DescribeTimeToLive
// (none with Config.SkipTableCheck, no DescribeTimeToLive with SkipTTL),
// within ctx.
func New(ctx context.Context, config Config) (*Store, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config.setDefaults()
	s := &Store{
		client:   config.Client,
		table:    config.Table,
		attr:     config.Attributes,
		marginMs: ceilMillis(config.ClockSkewMargin),
		clock:    config.Clock,
	}
	var (
		st  statements
		err error
	)
	if config.Format == FormatPowertools {
		pt := config.Powertools
		s.pt = &pt
		st, err = preparePowertoolsStatements(s.attr, pt.DataAttr)
	} else {
		st, err = prepareStatements(s.attr)
	}
	if err != nil {
		return nil, err
	}
	s.st = st
	overhead := maxPartitionKeyBytes + tokenBytes + len(stateInProgress) + maxStoredFingerprintBytes + 4*maxNumberBytes +
		2*len("2006-01-02T15:04:05.000Z") + 2*dedup.MaxOriginIDLength
	for _, n := range s.attr.list() {
		overhead += len(n)
	}
	if s.pt != nil {
		overhead += len(s.pt.DataAttr)
	}
	s.maxResult = MaxItemBytes - overhead
	if !config.SkipTableCheck {
		if err := s.checkTable(ctx, &config); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// MaxResultSize is the largest result, in bytes, that Complete accepts: 400
// KB less the largest possible rest of the item (attribute names, the
// longest partition key, token, state, fingerprint digest, four numbers,
// two times and two ids of dedup.MaxOriginIDLength).
// With the default attribute names it is 408472 bytes.
func (s *Store) MaxResultSize() int { return s.maxResult }

// record is a decoded item.
type record struct {
	state       string
	token       string
	fingerprint string
	deadline    int64 // Unix milliseconds
	result      []byte
	fence       uint64 // 0 in items written before fencing

	// Who and when; zero in items of earlier versions.
	claimedAt, completedAt time.Time
	origin                 dedup.Origin
	claims                 int

	// FormatPowertools only: expiration (epoch seconds), the
	// in_progress_expiration (epoch milliseconds) when the item has one,
	// and whether this store wrote the item (it has a token).
	expiry int64
	ipe    int64
	hasIPE bool
	ours   bool
}

// Claim implements [dedup.Store.Claim]. Its first write is a PutItem of the
// new in-progress item under the cheapest condition, attribute_not_exists(pk):
// a key without a record, the usual case, costs that one request. Every
// write asks for the old item on failure (ReturnValuesOnConditionCheckFailure
// = ALL_OLD), so that real DynamoDB answers Duplicate, InProgress or
// Conflict in the same round trip. When the failure carries no item, as with
// dynalite, one strongly consistent GetItem reads the record. A record that
// is no longer live calls for a second write, chosen by what was found:
//
//   - released, or in progress with its lease ended: a conditional UpdateItem,
//     attribute_not_exists(pk) OR (deadline < now - ClockSkewMargin AND
//     state <> completed AND the stored fence is below the new one), that
//     takes it over keeping its who-and-when;
//   - completed and past its retention: a conditional PutItem,
//     attribute_not_exists(pk) OR (deadline < now - ClockSkewMargin AND the
//     stored fence is below the new one), that starts it afresh.
//
// If the record is gone, or has changed, by the time that write runs, the
// claim decides again on what its failure returns, at most four writes in
// all before ErrContended. A record carrying the token this claim just wrote
// (the SDK retried a request whose response was lost) is recognised as
// Acquired.
//
// Fencing: every write that acquires the record stores the claim's fence
// (AttributeNames.Fence), storekit.NextFence of the record's fence and the
// store's Clock (microseconds since the epoch, or the record's fence plus
// one): 0 for a key without an item, so a fresh key's claim stays the one
// PutItem. Both takeover writes also require the stored fence to be below
// the new one (or absent), so that a write computed from an item read
// earlier never lowers a fence another claim wrote meanwhile. While the
// item exists each winner's fence is therefore larger than the last by
// construction; once DynamoDB TTL (or Evict) deleted it, the next fence is
// the claiming client's clock, larger than the last as long as that clock
// is not behind the last claimer's by more than the time since (at least
// the lease or retention that let TTL delete the item, ClockSkewMargin and
// TTL's own delay). An item without the attribute reads as fence 0.
//
// Who and when: the item keeps the claim's dedup.Origin, the time of the
// claim (by the store's Clock) and a claim count of 1. The UpdateItem that
// takes over a released item, or one whose lease ended, keeps them
// (if_not_exists) and adds 1 to the count; the PutItem after a completed
// record's retention starts them afresh.
//
// Errors: ErrInvalidDuration for a lease <= 0, ErrInvalidKey for an empty or
// non-UTF-8 key, ErrMalformedRecord when the item under the key was not
// written by this store, and otherwise the SDK's error, wrapped (use
// errors.As), when DynamoDB could not be asked; the claim's effect is then
// unknown. Cost: one round trip for a key without a record or with a live
// one (two on servers that ignore ALL_OLD); one more to take over a record
// that is no longer live.
func (s *Store) Claim(ctx context.Context, key, fingerprint string, lease time.Duration) (dedup.ClaimResult, error) {
	if err := storekit.CheckDuration("lease", lease); err != nil {
		return dedup.ClaimResult{}, err
	}
	pk, err := s.partitionKey(key)
	if err != nil {
		return dedup.ClaimResult{}, err
	}
	if fingerprint != "" {
		fingerprint = storedFingerprint(fingerprint)
	}
	origin, _ := dedup.OriginFromContext(ctx)
	write := writeCreate // what the last record found calls for; none yet
	var fence uint64     // the largest fence found under the key, 0 for none
	for attempt := 1; ; attempt++ {
		clock := s.clock.Now()
		now := clock.UnixMilli()
		token := storekit.NewToken()
		c := claimWrite{pk: pk, token: token, fingerprint: fingerprint, origin: origin, now: now, deadline: now + ceilMillis(lease),
			fence: storekit.NextFence(fence, clock)}
		var (
			old map[string]types.AttributeValue
			err error
		)
		switch write {
		case writeCreate:
			old, err = s.put(ctx, &c, &s.st.create)
		case writeTakeOver:
			old, err = s.takeOver(ctx, &c)
		default:
			old, err = s.put(ctx, &c, &s.st.claim)
		}
		if len(old) > 0 {
			s.oldItems.Store(true)
		}
		if err != nil {
			return dedup.ClaimResult{}, err
		}
		if old == nil {
			return dedup.ClaimResult{Outcome: dedup.Acquired, Claim: dedup.Claim{Key: key, Token: token, Fence: c.fence}}, nil
		}
		if len(old) == 0 { // the condition failed without the old item
			if old, err = s.get(ctx, pk); err != nil {
				return dedup.ClaimResult{}, err
			}
		}
		write = writeCreate // gone by the time it was read
		if len(old) > 0 {
			rec, err := s.decode(old)
			if err != nil {
				return dedup.ClaimResult{}, err
			}
			if rec.token == token {
				// Our own write: the SDK retried a request whose first
				// attempt succeeded but whose response was lost.
				return dedup.ClaimResult{Outcome: dedup.Acquired, Claim: dedup.Claim{Key: key, Token: token, Fence: c.fence}}, nil
			}
			fence = max(fence, rec.fence)
			if s.live(rec, now) { // the reason the condition failed
				return outcome(rec, fingerprint), nil
			}
			write = writeTakeOver // released, or its lease ended
			if rec.state == stateCompleted {
				write = writeAfresh // past its retention
			}
		}
		if attempt == maxClaimAttempts {
			return dedup.ClaimResult{}, fmt.Errorf("%w (%d attempts)", ErrContended, attempt)
		}
	}
}

// The writes of a claim's attempt, chosen by what the previous attempt found.
const (
	writeCreate   = iota // no record: PutItem if attribute_not_exists(pk)
	writeTakeOver        // a released record or one whose lease ended: UpdateItem keeping its provenance
	writeAfresh          // a completed record past its retention: PutItem if it is still so
)

// outcome decides a claim that found the live record rec.
func outcome(rec record, fingerprint string) dedup.ClaimResult {
	if fingerprint != "" && rec.fingerprint != "" && fingerprint != rec.fingerprint {
		return dedup.ClaimResult{Outcome: dedup.Conflict}
	}
	if rec.state == stateCompleted {
		var result []byte
		if len(rec.result) > 0 {
			result = rec.result
		}
		return dedup.ClaimResult{Outcome: dedup.Duplicate, Result: result}
	}
	return dedup.ClaimResult{Outcome: dedup.InProgress}
}

// claimWrite is what one attempt of a claim writes.
type claimWrite struct {
	pk, token, fingerprint string
	origin                 dedup.Origin
	now, deadline          int64 // Unix milliseconds
	fence                  uint64
}

// put issues the conditional PutItem of a claim that starts a record,
// under the condition of p: statements.create for a key without a record,
// statements.claim after a completed record's retention. It returns nil
// when the item was written, and the old item (empty but non-nil when the
// server did not return it) when the condition failed.
func (s *Store) put(ctx context.Context, c *claimWrite, p *prepared) (map[string]types.AttributeValue, error) {
	item := make(map[string]types.AttributeValue, 11)
	item[s.attr.PartitionKey] = str(c.pk)
	item[s.attr.Token] = str(c.token)
	item[s.attr.TTL] = number(s.ttl(c.deadline))
	if s.pt != nil {
		// Powertools' own claim refuses the item until one of these
		// passes: the lease deadline plus the margin, in both.
		item[s.attr.State] = str(ptInProgress)
		item[s.attr.Deadline] = number(c.deadline + s.marginMs)
	} else {
		item[s.attr.State] = str(stateInProgress)
		item[s.attr.Deadline] = number(c.deadline)
	}
	item[s.attr.ClaimedAt] = str(formatTime(c.now))
	item[s.attr.Claims] = number(1)
	item[s.attr.Fence] = unsigned(c.fence)
	if c.fingerprint != "" {
		item[s.attr.Fingerprint] = str(c.fingerprint)
	}
	if c.origin.TransportID != "" {
		item[s.attr.TransportID] = str(c.origin.TransportID)
	}
	if c.origin.MessageID != "" {
		item[s.attr.MessageID] = str(c.origin.MessageID)
	}
	var values map[string]types.AttributeValue // DynamoDB refuses an empty map
	switch {
	case len(p.keys) == 0: // statements.create
	case s.pt != nil:
		values = p.values(s.ptClock(c)...)
	default:
		// statements.claim: now - margin, and the new fence.
		values = p.values(number(c.now-s.marginMs), unsigned(c.fence))
	}
	_, err := s.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           &s.table,
		Item:                                item,
		ConditionExpression:                 p.condition,
		ExpressionAttributeNames:            p.names,
		ExpressionAttributeValues:           values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	return failedItem("PutItem", err)
}

// takeOver issues the conditional UpdateItem of a claim (statements.
// takeOver): it creates the record, or takes over a released one or one
// whose lease ended, keeping its provenance. Returns as put.
func (s *Store) takeOver(ctx context.Context, c *claimWrite) (map[string]types.AttributeValue, error) {
	variant := 0
	var vals []types.AttributeValue
	if s.pt != nil {
		vals = append(make([]types.AttributeValue, 0, 11), s.ptClock(c)...)
		vals = append(vals, str(c.token), number(c.deadline+s.marginMs), number(s.ttl(c.deadline)), str(formatTime(c.now)))
	} else {
		vals = make([]types.AttributeValue, 6, 9)
		vals[0], vals[1], vals[2] = number(c.now-s.marginMs), str(c.token), number(c.deadline)
		vals[3], vals[4], vals[5] = number(s.ttl(c.deadline)), str(formatTime(c.now)), unsigned(c.fence)
	}
	if c.fingerprint != "" {
		variant |= withFingerprint
		vals = append(vals, str(c.fingerprint))
	}
	if c.origin.TransportID != "" {
		variant |= withTransportID
		vals = append(vals, str(c.origin.TransportID))
	}
	if c.origin.MessageID != "" {
		variant |= withMessageID
		vals = append(vals, str(c.origin.MessageID))
	}
	p := &s.st.takeOver[variant]
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           &s.table,
		Key:                                 s.key(c.pk),
		UpdateExpression:                    p.update,
		ConditionExpression:                 p.condition,
		ExpressionAttributeNames:            p.names,
		ExpressionAttributeValues:           p.values(vals...),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	return failedItem("UpdateItem", err)
}

// failedItem reads the answer of a claim's write: nil when it was
// written, the old item (empty but non-nil when the server did not return
// it) when the condition failed.
func failedItem(call string, err error) (map[string]types.AttributeValue, error) {
	if err == nil {
		return nil, nil
	}
	var failed *types.ConditionalCheckFailedException
	if !errors.As(err, &failed) {
		return nil, fmt.Errorf("dynamo: claim: %s: %w", call, err)
	}
	if failed.Item == nil {
		return map[string]types.AttributeValue{}, nil
	}
	return failed.Item, nil
}

// get reads the record with a strongly consistent GetItem; an empty map
// means there is none.
func (s *Store) get(ctx context.Context, pk string) (map[string]types.AttributeValue, error) {
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.table),
		Key:            s.key(pk),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, fmt.Errorf("dynamo: claim: GetItem: %w", err)
	}
	return out.Item, nil
}

// ptClock are the first values of FormatPowertools' claim statements:
// (now - margin) in seconds and in milliseconds, now, and the new fence.
func (s *Store) ptClock(c *claimWrite) []types.AttributeValue {
	return []types.AttributeValue{seconds(c.now - s.marginMs), number(c.now - s.marginMs), number(c.now), unsigned(c.fence)}
}

// partitionKey is the partition-key value of key in the store's format
// (PartitionKey, PowertoolsPartitionKey).
func (s *Store) partitionKey(key string) (string, error) {
	if s.pt != nil {
		return PowertoolsPartitionKey(key)
	}
	return PartitionKey(key)
}

// listedKey is the key List reports for an item's partition key.
func (s *Store) listedKey(pk string) string {
	if s.pt != nil {
		return powertoolsKey(pk)
	}
	return pk
}

// live reports whether rec still holds its key at now (Unix
// milliseconds), as the claim's conditions decide it: its deadline has not
// passed by more than the margin.
func (s *Store) live(rec record, now int64) bool {
	if s.pt != nil {
		return s.ptLive(rec, now)
	}
	return rec.deadline >= now-s.marginMs
}

// decode reads an item written by this store (or, in FormatPowertools, by
// a Powertools function).
func (s *Store) decode(item map[string]types.AttributeValue) (record, error) {
	if s.pt != nil {
		return s.decodePowertools(item)
	}
	var rec record
	str := func(name string, required bool) (string, error) {
		v, ok := item[name]
		if !ok && !required {
			return "", nil
		}
		sv, ok := v.(*types.AttributeValueMemberS)
		if !ok {
			return "", fmt.Errorf("%w: attribute %q is missing or not a string", ErrMalformedRecord, name)
		}
		return sv.Value, nil
	}
	var err error
	if rec.state, err = str(s.attr.State, true); err != nil {
		return record{}, err
	}
	if rec.state != stateInProgress && rec.state != stateCompleted && rec.state != stateReleased {
		return record{}, fmt.Errorf("%w: unknown state %q", ErrMalformedRecord, rec.state)
	}
	if rec.token, err = str(s.attr.Token, true); err != nil {
		return record{}, err
	}
	if rec.fingerprint, err = str(s.attr.Fingerprint, false); err != nil {
		return record{}, err
	}
	n, ok := item[s.attr.Deadline].(*types.AttributeValueMemberN)
	if !ok {
		return record{}, fmt.Errorf("%w: attribute %q is missing or not a number", ErrMalformedRecord, s.attr.Deadline)
	}
	if rec.deadline, err = strconv.ParseInt(n.Value, 10, 64); err != nil {
		return record{}, fmt.Errorf("%w: attribute %q: %w", ErrMalformedRecord, s.attr.Deadline, err)
	}
	if v, ok := item[s.attr.Result]; ok {
		b, ok := v.(*types.AttributeValueMemberB)
		if !ok {
			return record{}, fmt.Errorf("%w: attribute %q is not binary", ErrMalformedRecord, s.attr.Result)
		}
		rec.result = b.Value
	}
	if err := s.decodeFenceAndProvenance(item, &rec, str); err != nil {
		return record{}, err
	}
	return rec, nil
}

// decodeFenceAndProvenance reads the attributes both layouts share, each
// optional: the fence, and who claimed and when.
func (s *Store) decodeFenceAndProvenance(item map[string]types.AttributeValue, rec *record, str func(string, bool) (string, error)) error {
	if v, ok := item[s.attr.Fence]; ok {
		n, ok := v.(*types.AttributeValueMemberN)
		if !ok {
			return fmt.Errorf("%w: attribute %q is not a number", ErrMalformedRecord, s.attr.Fence)
		}
		f, err := strconv.ParseUint(n.Value, 10, 64)
		if err != nil {
			return fmt.Errorf("%w: attribute %q: %w", ErrMalformedRecord, s.attr.Fence, err)
		}
		rec.fence = f
	}
	return s.decodeProvenance(item, rec, str)
}

// decodeProvenance reads the who-and-when attributes, each optional.
func (s *Store) decodeProvenance(item map[string]types.AttributeValue, rec *record, str func(string, bool) (string, error)) error {
	var err error
	if rec.origin.TransportID, err = str(s.attr.TransportID, false); err != nil {
		return err
	}
	if rec.origin.MessageID, err = str(s.attr.MessageID, false); err != nil {
		return err
	}
	for _, t := range []struct {
		name string
		to   *time.Time
	}{{s.attr.ClaimedAt, &rec.claimedAt}, {s.attr.CompletedAt, &rec.completedAt}} {
		v, err := str(t.name, false)
		if err != nil {
			return err
		}
		if v == "" {
			continue
		}
		if *t.to, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return fmt.Errorf("%w: attribute %q: %w", ErrMalformedRecord, t.name, err)
		}
	}
	if v, ok := item[s.attr.Claims]; ok {
		n, ok := v.(*types.AttributeValueMemberN)
		if !ok {
			return fmt.Errorf("%w: attribute %q is not a number", ErrMalformedRecord, s.attr.Claims)
		}
		if rec.claims, err = strconv.Atoi(n.Value); err != nil {
			return fmt.Errorf("%w: attribute %q: %w", ErrMalformedRecord, s.attr.Claims, err)
		}
	}
	return nil
}

// The condition of Complete, Release and Extend (statements.owned) is that
// the record still carries the claim's token, is in progress, and its lease
// has not ended by this client's clock (no margin: the owner gives up
// first).

// Complete implements [dedup.Store.Complete] with one conditional
// UpdateItem that sets the state to completed, the deadline to
// now+retention and stores result (removing the attribute when result is
// empty). The condition is that the record carries the claim's token, is
// in_progress and its lease has not ended by this client's clock; when it
// fails, Complete returns an error matching both dedup.ErrClaimLost and (with
// errors.As) *types.ConditionalCheckFailedException, and nothing changed;
// when the record is the one this claim completed (a retried Complete
// whose first response was lost), the error matches
// dedup.ErrAlreadyCompleted too. It tells from the old item that real
// DynamoDB returns with the failure (ALL_OLD), or else from one strongly
// consistent GetItem (dynalite); when that read fails, the outcome is
// unknown and the error is the read's, not ErrClaimLost. It records the
// time of completion (by the store's Clock) in CompletedAt.
// A result longer than MaxResultSize is refused with ErrResultTooLarge
// before any request; so is, after the request, a result the server
// refuses for the item's size (a server whose limit is lower, as moto's).
// Cost: one round trip (two for a failed condition on
// a server that ignores ALL_OLD).
func (s *Store) Complete(ctx context.Context, claim dedup.Claim, result []byte, retention time.Duration) error {
	if err := storekit.CheckDuration("retention", retention); err != nil {
		return err
	}
	if len(result) > s.maxResult {
		return fmt.Errorf("%w: %d bytes, at most %d fit in one item", ErrResultTooLarge, len(result), s.maxResult)
	}
	pk, err := s.partitionKey(claim.Key)
	if err != nil {
		return err
	}
	p, values := s.completeWrite(claim, result, retention)
	err = s.update(ctx, "complete", pk, p, values)
	if errors.Is(err, dedup.ErrClaimLost) {
		return s.completedByClaim(ctx, pk, claim, err)
	}
	if len(result) > 0 && itemTooLarge(err) {
		// The server's limit is below the one MaxResultSize assumes
		// (moto's is): nothing was written, as with the check above.
		return fmt.Errorf("%w: %d bytes: the server refused the item's size: %w", ErrResultTooLarge, len(result), err)
	}
	return err
}

// completeWrite is the completing UpdateItem of claim, Complete's and
// RunInTx's: its prepared expression and values.
func (s *Store) completeWrite(claim dedup.Claim, result []byte, retention time.Duration) (*prepared, map[string]types.AttributeValue) {
	now := s.clock.Now().UnixMilli()
	expiry := now + ceilMillis(retention)
	if s.pt != nil {
		// The retention ends on a whole second, as Powertools counts it.
		vals := []types.AttributeValue{str(claim.Token), number(now + s.marginMs), number((expiry + 999) / 1000), str(formatTime(now))}
		r := s.pt.encodeResult(result, s.maxResult)
		variant := 0
		if r.data != nil {
			variant |= withData
			vals = append(vals, r.data)
		}
		if r.raw != nil {
			variant |= withRaw
			vals = append(vals, &types.AttributeValueMemberB{Value: r.raw})
		}
		p := &s.st.ptComplete[variant]
		return p, p.values(vals...)
	}
	if len(result) > 0 {
		return &s.st.complete, s.st.complete.values(str(claim.Token), number(now), number(expiry), number(s.ttl(expiry)), str(formatTime(now)), &types.AttributeValueMemberB{Value: result})
	}
	return &s.st.completeNoResult, s.st.completeNoResult.values(str(claim.Token), number(now), number(expiry), number(s.ttl(expiry)), str(formatTime(now)))
}

// itemTooLarge reports whether err is DynamoDB's refusal of an item over
// its size limit: a ValidationException "Item size has exceeded the
// maximum allowed size" (PutItem) or "Item size to update has exceeded the
// maximum allowed size" (UpdateItem). The request wrote nothing.
func itemTooLarge(err error) bool {
	var api smithy.APIError
	if err == nil || !errors.As(err, &api) || api.ErrorCode() != "ValidationException" {
		return false
	}
	msg := api.ErrorMessage()
	return strings.HasPrefix(msg, "Item size") && strings.Contains(msg, "exceeded the maximum allowed size")
}

// completedByClaim is the error of a Complete whose condition failed:
// err, also matching dedup.ErrAlreadyCompleted when the item is the live
// completed record of this very claim (read from the failure's ALL_OLD
// item, else with one strongly consistent GetItem). When that read fails
// the answer is unknown, and so is the error: not ErrClaimLost, which
// would say the record was not completed when an earlier attempt may
// have completed it (TestCompleteWhoseCheckCannotReadIsNotClaimLost); the
// engine sends the completion again, as after any store error.
func (s *Store) completedByClaim(ctx context.Context, pk string, claim dedup.Claim, err error) error {
	var failed *types.ConditionalCheckFailedException
	var item map[string]types.AttributeValue
	switch {
	case errors.As(err, &failed) && failed.Item != nil:
		item = failed.Item
		s.oldItems.Store(true)
	case s.oldItems.Load():
		return err // no item
	default:
		got, gerr := s.get(ctx, pk)
		if gerr != nil {
			return fmt.Errorf("dynamo: complete: the condition failed (%v) and the record could not be read to tell whether an earlier attempt of this claim completed it: %w", err, gerr)
		}
		item = got
	}
	if len(item) == 0 {
		return err
	}
	if !s.completedByToken(item, claim.Token) {
		return err
	}
	return fmt.Errorf("%w: %w", dedup.ErrAlreadyCompleted, err)
}

// Extend implements [dedup.Store.Extend] with one conditional UpdateItem
// that sets the deadline to now+lease, under the same condition as
// Complete: an expired lease cannot be revived. Failure modes as Complete.
// Cost: one round trip.
func (s *Store) Extend(ctx context.Context, claim dedup.Claim, lease time.Duration) error {
	if err := storekit.CheckDuration("lease", lease); err != nil {
		return err
	}
	pk, err := s.partitionKey(claim.Key)
	if err != nil {
		return err
	}
	now := s.clock.Now().UnixMilli()
	deadline := now + ceilMillis(lease)
	if s.pt != nil {
		return s.update(ctx, "extend", pk, &s.st.extend,
			s.st.extend.values(str(claim.Token), number(now+s.marginMs), number(deadline+s.marginMs), number(s.ttl(deadline))))
	}
	return s.update(ctx, "extend", pk, &s.st.extend,
		s.st.extend.values(str(claim.Token), number(now), number(deadline), number(s.ttl(deadline))))
}

func (s *Store) update(ctx context.Context, op, pk string, p *prepared, values map[string]types.AttributeValue) error {
	in := &dynamodb.UpdateItemInput{
		TableName:                 &s.table,
		Key:                       s.key(pk),
		UpdateExpression:          p.update,
		ConditionExpression:       p.condition,
		ExpressionAttributeNames:  p.names,
		ExpressionAttributeValues: values,
	}
	if op == "complete" {
		in.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	}
	_, err := s.client.UpdateItem(ctx, in)
	return s.ownerError(op, "UpdateItem", err)
}

// Release implements [dedup.Store.Release] with one conditional UpdateItem
// under the same condition as Complete, so it never touches a record that
// another claim now owns, nor a completed one: the item becomes released
// (State "released", Deadline 0, its TTL attribute and provenance kept),
// which every operation treats as no record but the next Claim, which
// counts it. Failure modes as Complete (without ErrAlreadyCompleted).
// Cost: one round trip.
func (s *Store) Release(ctx context.Context, claim dedup.Claim) error {
	pk, err := s.partitionKey(claim.Key)
	if err != nil {
		return err
	}
	now := s.clock.Now().UnixMilli()
	if s.pt != nil {
		now += s.marginMs // the in_progress_expiration is the deadline plus the margin
	}
	return s.update(ctx, "release", pk, &s.st.release, s.st.release.values(str(claim.Token), number(now)))
}

// ownerError translates the error of an owner-conditioned write: a failed
// condition is ErrClaimLost (keeping the SDK's exception for errors.As),
// anything else keeps its cause.
func (s *Store) ownerError(op, call string, err error) error {
	if err == nil {
		return nil
	}
	var failed *types.ConditionalCheckFailedException
	if errors.As(err, &failed) {
		return fmt.Errorf("%w: %w", dedup.ErrClaimLost, err)
	}
	return fmt.Errorf("dynamo: %s: %s: %w", op, call, err)
}

func (s *Store) key(pk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{s.attr.PartitionKey: &types.AttributeValueMemberS{Value: pk}}
}

// ttl returns the epoch second for DynamoDB TTL of a record with the given
// deadline: never before deadline + margin, so that TTL cannot delete a
// record that a claim would still consider live.
func (s *Store) ttl(deadlineMs int64) int64 {
	end := deadlineMs + s.marginMs
	return (end + 999) / 1000
}

func number(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

func unsigned(n uint64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatUint(n, 10)}
}

// ceilMillis rounds d up to whole milliseconds, so that a positive lease
// never becomes zero. The longest durations, where rounding up would
// overflow (into a deadline in the past), are rounded down.
func ceilMillis(d time.Duration) int64 {
	if d > math.MaxInt64-time.Millisecond {
		return int64(d / time.Millisecond)
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
