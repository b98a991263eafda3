package dynamo

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

var _ admin.Interface = (*Store)(nil)

// ScanClient is what List needs on top of Client: the Scan call, with the
// SDK's own signature, so *dynamodb.Client satisfies it. List finds it on
// Config.Client with a type assertion; a Client wrapper that lacks Scan
// makes List fail with ErrScanUnsupported (Inspect and Evict still work).
type ScanClient interface {
	Scan(ctx context.Context, params *dynamodb.ScanInput, optFns ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
}

// ErrScanUnsupported: List was called on a store whose Config.Client has no
// Scan method (see ScanClient).
var ErrScanUnsupported = errors.New("dynamo: List needs a client with Scan (*dynamodb.Client has it)")

var _ ScanClient = (*dynamodb.Client)(nil)

// List's Scan tuning: at most maxScanCalls Scan requests per List call,
// each evaluating between the page size and maxScanItems items (the Limit
// doubles after a request that found no match).
const (
	maxScanCalls = 16
	maxScanItems = 1000
)

// Inspect implements admin.Interface.Inspect with one strongly consistent
// GetItem on PartitionKey(key), so long keys are found under their hashed
// partition key. A record whose deadline has passed by the store's Clock is
// reported as ErrNotFound, although the item may still exist (TTL deletes
// late, and a claim takes it over only ClockSkewMargin later), and so is a
// released record. Created is always zero; ClaimedAt and CompletedAt are
// the items' attributes (the claiming and completing clients' clocks). Fingerprint is as stored: verbatim
// up to 64 bytes, "sha256:<hex>" beyond. An item this store did not write
// gives an error wrapping ErrMalformedRecord. Cost: one read of the item
// (one strongly consistent read unit per 4 KB).
func (s *Store) Inspect(ctx context.Context, key string) (admin.Record, error) {
	pk, err := s.partitionKey(key)
	if err != nil {
		return admin.Record{}, err
	}
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.table),
		Key:            s.key(pk),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return admin.Record{}, fmt.Errorf("dynamo: inspect: GetItem: %w", err)
	}
	if len(out.Item) == 0 {
		return admin.Record{}, fmt.Errorf("%w: %.200q", admin.ErrNotFound, key)
	}
	rec, err := s.decode(out.Item)
	if err != nil {
		return admin.Record{}, fmt.Errorf("dynamo: inspect %.200q: %w", key, err)
	}
	info, live := s.info(key, rec, s.clock.Now())
	if !live {
		return admin.Record{}, fmt.Errorf("%w: %.200q (its item is expired)", admin.ErrNotFound, key)
	}
	return info, nil
}

// info converts a decoded item; live is false once its deadline has passed.
func (s *Store) info(key string, rec record, now time.Time) (admin.Record, bool) {
	remaining := time.Duration(rec.deadline-now.UnixMilli()) * time.Millisecond
	info := admin.Record{
		Key:         key,
		State:       admin.StateInProgress,
		Fingerprint: rec.fingerprint,
		ResultSize:  len(rec.result),
		Remaining:   remaining,
		ClaimedAt:   rec.claimedAt,
		CompletedAt: rec.completedAt,
		TransportID: rec.origin.TransportID,
		MessageID:   rec.origin.MessageID,
		Claims:      rec.claims,
	}
	if rec.state == stateCompleted {
		info.State = admin.StateCompleted
	}
	if rec.claimedAt.IsZero() {
		// Claimed by a version that kept no who-and-when: a completion time
		// alone would read as measured from the zero time.
		info.CompletedAt = time.Time{}
	}
	return info, remaining > 0 && rec.state != stateReleased
}

// Evict implements admin.Interface.Evict with one unconditional DeleteItem on
// PartitionKey(key) that returns the old item: it reports true when that
// item was a live record (or an item this store cannot read). An expired
// item is deleted too, and reported as false. Cost: one write.
func (s *Store) Evict(ctx context.Context, key string) (bool, error) {
	pk, err := s.partitionKey(key)
	if err != nil {
		return false, err
	}
	out, err := s.client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:    aws.String(s.table),
		Key:          s.key(pk),
		ReturnValues: types.ReturnValueAllOld,
	})
	if err != nil {
		return false, fmt.Errorf("dynamo: evict: DeleteItem: %w", err)
	}
	if len(out.Attributes) == 0 {
		return false, nil
	}
	rec, err := s.decode(out.Attributes)
	if err != nil {
		return true, nil
	}
	_, live := s.info(key, rec, s.clock.Now())
	return live, nil
}

// scanCursor is List's position, sent to the caller as base64url JSON.
type scanCursor struct {
	// Prefix is a hash of the listed prefix: a cursor only continues the
	// listing it came from.
	Prefix uint32 `json:"h"`
	// After is the partition key to continue after (ExclusiveStartKey).
	After string `json:"k"`
}

func prefixHash(prefix string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(prefix))
	return h.Sum32()
}

// List implements admin.Interface.List with Scan requests filtered by
// begins_with(pk, prefix), eventually consistent. Records are in the
// table's internal (hash) order; Key is the partition key, so a key longer
// than MaxVerbatimKeyBytes shows as its first 512 bytes followed by
// "…#sha256:<digest>" (see PartitionKey), and a prefix longer than 512
// bytes does not match such keys. Pass that partition key to Inspect or
// Evict as it is: it is 584 bytes or longer, so it is hashed again rather
// than found (use the original key).
//
// Cost: the table has no index on key prefixes, so a listing reads the
// whole table over its pages, whatever the prefix: DynamoDB charges read
// capacity for every item a Scan evaluates (0.5 read unit per 4 KB,
// eventually consistent), matching or not; the filter only trims the
// response. Each List call makes at most 16 Scan requests, each evaluating
// between the page size and 1000 items, so a rare prefix in a large table
// gives short or empty pages with a cursor. Items whose deadline has
// passed are skipped (they are read and paid for); items this store cannot
// read are listed as admin.StateUnreadable.
func (s *Store) List(ctx context.Context, prefix, cursor string, limit int) ([]admin.Record, string, error) {
	return s.list(ctx, prefix, cursor, limit, false)
}

var _ admin.AbandonedLister = (*Store)(nil)

// ListWithAbandoned implements admin.AbandonedLister: List, plus the items
// in progress whose lease deadline has passed (by the store's Clock) and
// that no claim has taken over or released yet; DynamoDB TTL deletes them
// days later. Same Scan requests, cost and cursor as List.
func (s *Store) ListWithAbandoned(ctx context.Context, prefix, cursor string, limit int) ([]admin.Record, string, error) {
	return s.list(ctx, prefix, cursor, limit, true)
}

func (s *Store) list(ctx context.Context, prefix, cursor string, limit int, withAbandoned bool) ([]admin.Record, string, error) {
	if err := storekit.CheckListLimit(limit); err != nil {
		return nil, "", err
	}
	scanner, ok := s.client.(ScanClient)
	if !ok {
		return nil, "", ErrScanUnsupported
	}
	c := scanCursor{Prefix: prefixHash(prefix)}
	if cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(cursor)
		if err == nil {
			err = json.Unmarshal(b, &c)
		}
		if err == nil && c.Prefix != prefixHash(prefix) {
			err = errors.New("it was issued for another prefix")
		}
		if err == nil && c.After == "" {
			err = errors.New("it holds no position")
		}
		if err != nil {
			return nil, "", fmt.Errorf("%w: %v", admin.ErrInvalidCursor, err)
		}
	}
	input := &dynamodb.ScanInput{TableName: aws.String(s.table)}
	if prefix != "" {
		expr, err := expression.NewBuilder().WithFilter(
			expression.Name(s.attr.PartitionKey).BeginsWith(s.listPrefix(prefix))).Build()
		if err != nil {
			return nil, "", fmt.Errorf("dynamo: list: building the filter: %w", err)
		}
		input.FilterExpression = expr.Filter()
		input.ExpressionAttributeNames = expr.Names()
		input.ExpressionAttributeValues = expr.Values()
	}
	if c.After != "" {
		input.ExclusiveStartKey = s.key(c.After)
	}

	records := make([]admin.Record, 0, limit)
	evaluate := int32(limit)
	for calls := 0; calls < maxScanCalls; calls++ {
		input.Limit = aws.Int32(evaluate)
		out, err := scanner.Scan(ctx, input)
		if err != nil {
			return nil, "", fmt.Errorf("dynamo: list: Scan: %w", err)
		}
		now := s.clock.Now()
		for _, item := range out.Items {
			pkv, _ := item[s.attr.PartitionKey].(*types.AttributeValueMemberS)
			if pkv == nil {
				continue // cannot happen: the table's partition key is a string
			}
			rec, err := s.decode(item)
			if err != nil {
				records = append(records, admin.Record{Key: s.listedKey(pkv.Value), State: admin.StateUnreadable, Problem: err.Error()})
			} else if info, live := s.info(s.listedKey(pkv.Value), rec, now); live || withAbandoned && rec.state == stateInProgress {
				records = append(records, info) // in progress and not live: abandoned
			}
			if len(records) == limit {
				// Continue right after this item next time, even if the
				// response holds more matches: they are scanned again.
				return records, encodeScanCursor(c.Prefix, pkv.Value), nil
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			return records, "", nil
		}
		last, ok := out.LastEvaluatedKey[s.attr.PartitionKey].(*types.AttributeValueMemberS)
		if !ok {
			return nil, "", fmt.Errorf("dynamo: list: Scan returned a LastEvaluatedKey without a string %q", s.attr.PartitionKey)
		}
		input.ExclusiveStartKey = s.key(last.Value)
		c.After = last.Value
		if len(out.Items) == 0 {
			evaluate = min(2*evaluate, maxScanItems)
		}
	}
	return records, encodeScanCursor(c.Prefix, c.After), nil
}

// listPrefix is the partition-key prefix of the keys that start with
// prefix: prefix itself, or in FormatPowertools its escaped form (the
// escaping of PowertoolsPartitionKey maps a key's prefix to a prefix of
// its partition key).
func (s *Store) listPrefix(prefix string) string {
	if s.pt == nil {
		return prefix
	}
	scope, rest, scoped := strings.Cut(prefix, ":")
	if !scoped {
		return ptEscaper.Replace(prefix)
	}
	return ptEscaper.Replace(scope) + "#" + rest
}

func encodeScanCursor(prefix uint32, after string) string {
	b, _ := json.Marshal(scanCursor{Prefix: prefix, After: after}) // cannot fail
	return base64.RawURLEncoding.EncodeToString(b)
}
