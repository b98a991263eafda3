package dynamo

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

// DynamoDB's TransactWriteItems limits, which Tx.Add checks before any
// request.
const (
	// MaxTxItems is the most items one TransactWriteItems may hold. The
	// completion of the record is one of them, so a handler may add
	// MaxTxItems-1.
	MaxTxItems = 100
	// MaxTxBytes is the most a TransactWriteItems may hold in all (4 MB).
	MaxTxBytes = 4 * 1024 * 1024
)

// txAttempts bounds RunInTx's TransactWriteItems calls when DynamoDB
// cancels the transaction for a conflict with another transaction or for
// throttling; txBackoff is the first pause between them, doubled each time,
// with jitter.
const (
	txAttempts = 4
	txBackoff  = 25 * time.Millisecond
	// txFinishTimeout bounds the completing transaction (its retries
	// included) once work has returned, even if ctx was cancelled meanwhile.
	txFinishTimeout = 30 * time.Second
)

var (
	// ErrNoClaim is dedup.ErrNoClaim: TxMiddleware got a message without
	// a dedup claim in its context (it was added before, outside, the
	// dedup middleware), or RunInTx was called outside the work of
	// dedup.Engine.Do. Nothing was written.
	ErrNoClaim = dedup.ErrNoClaim

	// ErrNestedTx is dedup.ErrNestedTx: RunInTx (or TxMiddleware) was
	// called for a claim whose RunInTx still runs, as when a helper that
	// opens its own RunInTx is called from a handler TxMiddleware already
	// wraps, or after a RunInTx of the claim completed the record. Its
	// work did not run and nothing was added or sent. The enclosing
	// RunInTx goes on: if its work returns the error, nothing is written
	// and the claim is released; if it swallows it, its own writes are
	// written with the completion. Add to the Tx already open instead:
	// call RunInTx only when TxFromContext finds none.
	ErrNestedTx = dedup.ErrNestedTx

	// ErrNoTransactions: Config.Client does not implement TransactClient
	// (a wrapper that hides TransactWriteItems), so RunInTx cannot send
	// the transaction. Nothing was written. Add the method to the wrapper;
	// *dynamodb.Client has it. Also returned when the server does not
	// know the operation (dynalite has no transactions), and before work
	// runs when New found a global table with multi-Region strong
	// consistency (MRSC), which DynamoDB gives no transactions.
	ErrNoTransactions = errors.New("dynamo: the client cannot send TransactWriteItems")

	// ErrTxLimit: the handler's writes break a limit of TransactWriteItems
	// (at most MaxTxItems items with the completion, MaxTxBytes in all,
	// MaxItemBytes per item, one item per key, the record's own key not
	// among them) or are malformed (no table, no key, not exactly one
	// operation). Tx.Add refuses the items with a *TxLimitError matching
	// it before any request, and adds none of them. Permanent for that
	// handler's writes: split them or write fewer.
	ErrTxLimit = errors.New("dynamo: transaction limit")

	// ErrTxConditionFailed: the condition of one of the handler's own
	// writes failed, so DynamoDB wrote nothing of the transaction: neither
	// the effect nor the completion. RunInTx returns a *TxConditionError
	// matching it, as the handler's error: the engine releases the claim
	// and a redelivery runs the handler again, as after any handler error.
	ErrTxConditionFailed = errors.New("dynamo: a condition of the handler's writes failed")

	// ErrTxConflict: DynamoDB cancelled the transaction every time RunInTx
	// sent it, for a conflict with another transaction on the same items or
	// for throttling. Nothing was written. Retryable: the engine releases
	// the claim and the message comes back.
	ErrTxConflict = errors.New("dynamo: transaction cancelled by conflicts or throttling")
)

// TransactClient is the part of the DynamoDB API that RunInTx uses besides
// Client, with the SDK's signature: *dynamodb.Client satisfies it. RunInTx
// finds it on Config.Client; a wrapper of the client that is to complete
// records in transactions must have the method too.
type TransactClient interface {
	TransactWriteItems(ctx context.Context, params *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
}

var _ TransactClient = (*dynamodb.Client)(nil)

// TxLimitError is the error of Tx.Add for writes that cannot be sent in
// one TransactWriteItems. It matches ErrTxLimit.
type TxLimitError struct {
	// Reason says which limit, and what to change.
	Reason string
}

func (e *TxLimitError) Error() string { return "dynamo: transaction limit: " + e.Reason }

// Unwrap makes the error match ErrTxLimit.
func (e *TxLimitError) Unwrap() error { return ErrTxLimit }

// TxConditionError is the error of RunInTx when DynamoDB cancelled the
// transaction because the condition of one of the handler's writes failed.
// Nothing was written. It matches ErrTxConditionFailed and keeps the
// SDK's *types.TransactionCanceledException for errors.As.
type TxConditionError struct {
	// Index is the position of the write among those the handler added
	// (0 is the first Tx.Add'ed item).
	Index int
	// Item is that write, as the handler added it.
	Item types.TransactWriteItem
	// Reason is DynamoDB's cancellation reason for it; Reason.Item holds
	// the item as it was when the write asked for it
	// (ReturnValuesOnConditionCheckFailure ALL_OLD).
	Reason types.CancellationReason

	cause error
}

func (e *TxConditionError) Error() string {
	table := ""
	switch {
	case e.Item.Put != nil && e.Item.Put.TableName != nil:
		table = *e.Item.Put.TableName
	case e.Item.Update != nil && e.Item.Update.TableName != nil:
		table = *e.Item.Update.TableName
	case e.Item.Delete != nil && e.Item.Delete.TableName != nil:
		table = *e.Item.Delete.TableName
	case e.Item.ConditionCheck != nil && e.Item.ConditionCheck.TableName != nil:
		table = *e.Item.ConditionCheck.TableName
	}
	return fmt.Sprintf("dynamo: the condition of the handler's write %d (table %q) failed; nothing of the transaction was written", e.Index, table)
}

// Unwrap makes the error match ErrTxConditionFailed and the SDK's
// exception.
func (e *TxConditionError) Unwrap() []error { return []error{ErrTxConditionFailed, e.cause} }

// Tx holds the writes a handler adds to the transaction that completes
// its claim's record (see RunInTx). Get it with TxFromContext. Safe for
// concurrent use.
type Tx struct {
	mu    sync.Mutex
	items []types.TransactWriteItem
	size  int
	// record identifies the record's item, which the handler may not write.
	table, pkAttr, pk string
}

type txKey struct{}

// TxFromContext returns the transaction RunInTx (or TxMiddleware) runs the
// handler in. Add the handler's writes to it: they are sent with the
// record's completion in one TransactWriteItems, after the handler
// returns, and written together with it or not at all.
func TxFromContext(ctx context.Context) (*Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*Tx)
	return tx, ok
}

// Add adds writes (each with exactly one of Put, Update, Delete or
// ConditionCheck, on any table) to the transaction. It checks what DynamoDB
// would refuse before any request: at most MaxTxItems-1 writes (the
// completion is one more), MaxTxBytes in all and MaxItemBytes per Put, as
// estimated from the request (attribute names and values, expressions),
// one write per item (keys compared as given: a Put is compared with the
// other writes of its table by the key attributes they name, and with
// the record, whose key is the store's partition key), no write of the
// record's own item. It returns a *TxLimitError matching ErrTxLimit and
// adds none of writes when one fails. Nothing is sent until the handler
// returns. To ask for the old item of a write whose condition fails, set
// its ReturnValuesOnConditionCheckFailure: it comes back in
// TxConditionError.Reason.Item.
func (t *Tx) Add(writes ...types.TransactWriteItem) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	all := append(t.items[:len(t.items):len(t.items)], writes...)
	if len(all) > MaxTxItems-1 {
		return &TxLimitError{Reason: fmt.Sprintf("%d writes; TransactWriteItems holds %d items and the record's completion is one of them", len(all), MaxTxItems)}
	}
	size := t.size
	for i, w := range writes {
		n, err := writeSize(w)
		if err != nil {
			return &TxLimitError{Reason: fmt.Sprintf("write %d: %s", len(t.items)+i, err)}
		}
		size += n
	}
	if size > MaxTxBytes-MaxItemBytes { // room for the completion
		return &TxLimitError{Reason: fmt.Sprintf("the writes come to about %d bytes; a transaction holds %d with the record's completion", size, MaxTxBytes)}
	}
	if err := t.checkKeys(all); err != nil {
		return err
	}
	t.items, t.size = all, size
	return nil
}

// writeSize checks one write's form and estimates its size in bytes.
func writeSize(w types.TransactWriteItem) (int, error) {
	ops, n := 0, 0
	check := func(table *string, key map[string]types.AttributeValue, exprs ...*string) error {
		ops++
		if table == nil || *table == "" {
			return errors.New("no TableName")
		}
		if key != nil && len(key) == 0 {
			return errors.New("an empty Key")
		}
		n += len(*table) + attributesSize(key)
		for _, e := range exprs {
			if e != nil {
				n += len(*e)
			}
		}
		return nil
	}
	var err error
	names := func(m map[string]string) {
		for k, v := range m {
			n += len(k) + len(v)
		}
	}
	if p := w.Put; p != nil {
		if len(p.Item) == 0 {
			return 0, errors.New("a Put without Item")
		}
		if is := attributesSize(p.Item); is > MaxItemBytes {
			return 0, fmt.Errorf("a Put of about %d bytes, over DynamoDB's item limit of %d", is, MaxItemBytes)
		}
		err = errors.Join(err, check(p.TableName, p.Item, p.ConditionExpression))
		names(p.ExpressionAttributeNames)
		n += attributesSize(p.ExpressionAttributeValues)
	}
	if u := w.Update; u != nil {
		if u.UpdateExpression == nil {
			return 0, errors.New("an Update without UpdateExpression")
		}
		err = errors.Join(err, check(u.TableName, nonNil(u.Key), u.UpdateExpression, u.ConditionExpression))
		names(u.ExpressionAttributeNames)
		n += attributesSize(u.ExpressionAttributeValues)
	}
	if d := w.Delete; d != nil {
		err = errors.Join(err, check(d.TableName, nonNil(d.Key), d.ConditionExpression))
		names(d.ExpressionAttributeNames)
		n += attributesSize(d.ExpressionAttributeValues)
	}
	if c := w.ConditionCheck; c != nil {
		if c.ConditionExpression == nil {
			return 0, errors.New("a ConditionCheck without ConditionExpression")
		}
		err = errors.Join(err, check(c.TableName, nonNil(c.Key), c.ConditionExpression))
		names(c.ExpressionAttributeNames)
		n += attributesSize(c.ExpressionAttributeValues)
	}
	if err != nil {
		return 0, err
	}
	if ops != 1 {
		return 0, fmt.Errorf("%d operations; set exactly one of Put, Update, Delete and ConditionCheck", ops)
	}
	return n, nil
}

// nonNil makes a nil key an empty one, which writeSize refuses.
func nonNil(m map[string]types.AttributeValue) map[string]types.AttributeValue {
	if m == nil {
		return map[string]types.AttributeValue{}
	}
	return m
}

// attributesSize estimates the stored size of attributes as DynamoDB counts
// it: names and values, lists and maps with a few bytes per element.
func attributesSize(m map[string]types.AttributeValue) int {
	n := 0
	for k, v := range m {
		n += len(k) + valueSize(v)
	}
	return n
}

func valueSize(v types.AttributeValue) int {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return len(v.Value)
	case *types.AttributeValueMemberN:
		return len(v.Value)/2 + 2
	case *types.AttributeValueMemberB:
		return len(v.Value)
	case *types.AttributeValueMemberSS:
		n := 0
		for _, s := range v.Value {
			n += len(s)
		}
		return n
	case *types.AttributeValueMemberNS:
		n := 0
		for _, s := range v.Value {
			n += len(s)/2 + 2
		}
		return n
	case *types.AttributeValueMemberBS:
		n := 0
		for _, b := range v.Value {
			n += len(b)
		}
		return n
	case *types.AttributeValueMemberL:
		n := 3
		for _, e := range v.Value {
			n += 1 + valueSize(e)
		}
		return n
	case *types.AttributeValueMemberM:
		return 3 + attributesSize(v.Value) + len(v.Value)
	default: // BOOL, NULL
		return 1
	}
}

// checkKeys refuses two writes of one item, and a write of the record's.
func (t *Tx) checkKeys(all []types.TransactWriteItem) error {
	keyNames := map[string][]string{t.table: {t.pkAttr}} // per table, as learned from explicit keys
	for _, w := range all {
		if table, key := explicitKey(w); key != nil {
			names := make([]string, 0, len(key))
			for k := range key {
				names = append(names, k)
			}
			sort.Strings(names)
			keyNames[*table] = names
		}
	}
	seen := make(map[string]int, len(all)+1)
	seen[keyID(t.table, []string{t.pkAttr}, map[string]types.AttributeValue{t.pkAttr: str(t.pk)})] = -1
	for i, w := range all {
		var table *string
		var key map[string]types.AttributeValue
		var names []string
		if w.Put != nil {
			table, key = w.Put.TableName, w.Put.Item
			if names = keyNames[*table]; names == nil {
				continue // the table's key attributes are unknown here: DynamoDB checks
			}
		} else {
			table, key = explicitKey(w)
			names = keyNames[*table]
		}
		id := keyID(*table, names, key)
		if id == "" {
			continue
		}
		if j, dup := seen[id]; dup {
			if j < 0 {
				return &TxLimitError{Reason: fmt.Sprintf("write %d is on the dedup record's own item (table %q); the completion writes it", i, *table)}
			}
			return &TxLimitError{Reason: fmt.Sprintf("writes %d and %d are on the same item of table %q; DynamoDB takes one write per item in a transaction", j, i, *table)}
		}
		seen[id] = i
	}
	return nil
}

// explicitKey returns the table and key of an Update, Delete or
// ConditionCheck (nil key for a Put).
func explicitKey(w types.TransactWriteItem) (*string, map[string]types.AttributeValue) {
	switch {
	case w.Update != nil:
		return w.Update.TableName, w.Update.Key
	case w.Delete != nil:
		return w.Delete.TableName, w.Delete.Key
	case w.ConditionCheck != nil:
		return w.ConditionCheck.TableName, w.ConditionCheck.Key
	}
	return nil, nil
}

// keyID identifies the item of table whose key attributes names have the
// values in item; "" when item lacks one of them.
func keyID(table string, names []string, item map[string]types.AttributeValue) string {
	var b strings.Builder
	b.WriteString(fmt.Sprintf("%d:%s", len(table), table))
	for _, n := range names {
		v, ok := item[n]
		if !ok {
			return ""
		}
		switch v := v.(type) {
		case *types.AttributeValueMemberS:
			fmt.Fprintf(&b, "|%d:%s=S%d:%s", len(n), n, len(v.Value), v.Value)
		case *types.AttributeValueMemberN:
			fmt.Fprintf(&b, "|%d:%s=N%d:%s", len(n), n, len(v.Value), v.Value)
		case *types.AttributeValueMemberB:
			fmt.Fprintf(&b, "|%d:%s=B%d:%x", len(n), n, len(v.Value), v.Value)
		default:
			return ""
		}
	}
	return b.String()
}

// TxMiddleware is a Watermill middleware that writes the handler's own
// DynamoDB writes and the completion of its dedup record in one
// TransactWriteItems: no window remains between the effect and its record.
// Add it after the dedup middleware (the first middleware added is the
// outermost), with this Store as the dedup middleware's store:
//
//	router.AddMiddleware(deduplicator.Middleware, store.TxMiddleware)
//
// The handler adds its writes with TxFromContext(msg.Context()) and
// Tx.Add instead of sending them; see RunInTx for what happens then. A
// RunInTx the handler calls for the message fails with ErrNestedTx: add
// to the middleware's Tx. Cost: one TransactWriteItems (two write units
// per item), replacing the dedup middleware's separate Complete.
func (s *Store) TxMiddleware(h message.HandlerFunc) message.HandlerFunc {
	return storekit.TxMiddleware(h, s.RunInTx)
}

// RunInTx runs work, then sends the writes work added to its Tx
// (TxFromContext) and the completion of the record of the claim work runs
// under in one TransactWriteItems, so that they are written together or
// not at all. Call it inside the work given to dedup.Engine.Do (its context
// carries the claim; lambdadedup's handlers run there too); TxMiddleware
// calls it for a Watermill handler.
//
//   - work returns nil: the completion is the UpdateItem of Complete, under
//     the same condition (the record carries the claim's token, is in
//     progress, and its lease has not ended by this client's clock),
//     storing work's bytes as the result (not stored when longer than
//     MaxResultSize, as the engine does after ErrResultTooLarge). When
//     DynamoDB commits, the claim is marked completed so that the engine
//     does not complete it again, and RunInTx returns work's bytes.
//   - the claim was lost (the record's condition failed): nothing is
//     written, and the error wraps dedup.ErrClaimLost.
//   - a condition of work's own writes failed: nothing is written; the
//     error is a *TxConditionError (ErrTxConditionFailed), and the engine
//     releases the claim as for any error of work.
//   - DynamoDB cancelled the transaction for a conflict with another
//     transaction, or for throttling: sent again, with a fresh "now", at
//     most four times in all with growing pauses, then ErrTxConflict.
//   - work returns an error or panics: nothing is sent; the error (or
//     panic) goes on, and the engine releases the claim.
//   - called inside a RunInTx of the same claim (a helper that opens its
//     own, called from a handler TxMiddleware wraps), or after one
//     completed the record: ErrNestedTx before work runs, nothing added
//     or sent. The enclosing RunInTx then writes its own writes with the
//     completion, or nothing if its work returns the error.
//   - the process dies before DynamoDB commits: nothing was written; the
//     record stays in progress until its lease ends, then a retry runs.
//   - the outcome is unknown (the connection was lost): the error is
//     returned. The SDK's retries reuse the request's idempotency token,
//     so a retry never writes twice. Either both were written (the
//     engine's release then finds the record completed and changes
//     nothing) or neither (the release frees it).
//
// On a global table with multi-Region strong consistency (MRSC), which
// has no transactions, RunInTx fails with ErrNoTransactions before work
// runs (when New checked the table; with Config.SkipTableCheck DynamoDB
// refuses the TransactWriteItems after work ran, and nothing is written).
//
// A context without a claim fails with ErrNoClaim before work runs, except
// a run the engine marks as unclaimed (dedup.Config.Shadow, or FailOpen
// while the store cannot be reached): work's writes are then sent alone,
// in one TransactWriteItems, and nothing is completed. Cost: one
// TransactWriteItems (two write units per item), replacing the engine's
// Complete; each retry one more. It runs within 30 seconds of work's
// return even if ctx was cancelled meanwhile. The IAM policy needs
// dynamodb:UpdateItem on the records' table and the handler's actions on
// its own tables (TransactWriteItems is authorised per item).
func (s *Store) RunInTx(ctx context.Context, work func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	return storekit.RunInTx(ctx, txFinishTimeout, s.beginTx, work)
}

// beginTx opens the Tx of a RunInTx (storekit.RunInTx) for claim (nil: a
// run without a claim, whose writes are sent alone).
func (s *Store) beginTx(ctx context.Context, claim *dedup.Claim) (context.Context, storekit.Tx, error) {
	tc, canTx := s.client.(TransactClient)
	if !canTx {
		return nil, nil, fmt.Errorf("%w: Config.Client (%T) has no TransactWriteItems method", ErrNoTransactions, s.client)
	}
	if s.strongReplicas {
		return nil, nil, fmt.Errorf("%w: table %q is a global table with multi-Region strong consistency, which has no transactions: "+
			"complete without RunInTx and TxMiddleware, or keep the records in a single-Region table", ErrNoTransactions, s.table)
	}
	tx := &Tx{table: s.table, pkAttr: s.attr.PartitionKey}
	if claim != nil {
		pk, err := s.partitionKey(claim.Key)
		if err != nil {
			return nil, nil, err
		}
		tx.pk = pk
	}
	return context.WithValue(ctx, txKey{}, tx), txRun{s: s, tc: tc, tx: tx}, nil
}

// txRun ends a Tx for storekit.RunInTx: its writes and the completion in
// one TransactWriteItems, or its writes alone; nothing was sent before,
// so nothing to undo.
type txRun struct {
	s  *Store
	tc TransactClient
	tx *Tx
}

func (r txRun) Complete(ctx context.Context, claim dedup.Claim, result []byte, retention time.Duration) (bool, error) {
	r.tx.mu.Lock()
	items := r.tx.items
	r.tx.mu.Unlock()
	if len(result) > r.s.maxResult {
		result = nil // not stored, as the engine does after ErrResultTooLarge
	}
	completion := func() types.TransactWriteItem { return r.s.completion(r.tx.pk, claim, result, retention) }
	if _, err := r.s.transact(ctx, r.tc, claim.Token, completion, items); err != nil {
		return false, err
	}
	return true, nil
}

func (r txRun) Commit(ctx context.Context) error {
	r.tx.mu.Lock()
	items := r.tx.items
	r.tx.mu.Unlock()
	if len(items) == 0 {
		return nil
	}
	_, err := r.s.transact(ctx, r.tc, "", nil, items)
	return err
}

func (txRun) Abort(context.Context) {}

// completion is the record's completing write: Complete's UpdateItem as a
// transaction item, asking for the old item when its condition fails.
func (s *Store) completion(pk string, claim dedup.Claim, result []byte, retention time.Duration) types.TransactWriteItem {
	p, values := s.completeWrite(claim, result, retention)
	return types.TransactWriteItem{Update: &types.Update{
		TableName:                           &s.table,
		Key:                                 s.key(pk),
		UpdateExpression:                    p.update,
		ConditionExpression:                 p.condition,
		ExpressionAttributeNames:            p.names,
		ExpressionAttributeValues:           values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}}
}

// transact sends the completion (first, when complete is not nil) and
// items in one TransactWriteItems, again after a cancellation for conflict
// or throttling. done reports that the record is completed by this claim:
// committed now, or by an earlier attempt whose answer was lost.
func (s *Store) transact(ctx context.Context, tc TransactClient, token string, complete func() types.TransactWriteItem, items []types.TransactWriteItem) (done bool, err error) {
	backoff := txBackoff
	for attempt := 1; ; attempt++ {
		all := make([]types.TransactWriteItem, 0, len(items)+1)
		if complete != nil {
			all = append(all, complete())
		}
		all = append(all, items...)
		_, err := tc.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: all})
		if err == nil {
			return complete != nil, nil
		}
		retry, err := s.txError(err, token, complete != nil, items)
		if errors.Is(err, errCompletedByUs) {
			return true, nil
		}
		if !retry {
			return false, err
		}
		if attempt == txAttempts {
			return false, fmt.Errorf("%w (%d attempts): %w", ErrTxConflict, attempt, err)
		}
		pause := backoff/2 + rand.N(backoff)
		backoff *= 2
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, fmt.Errorf("%w: %w", ErrTxConflict, ctx.Err())
		case <-t.C:
		}
	}
}

// errCompletedByUs: the record's condition failed because this very claim
// had completed it (an earlier attempt committed).
var errCompletedByUs = errors.New("completed by this claim")

// txError maps TransactWriteItems' error: retry for a cancellation that
// another attempt may not meet (conflict, throttling), else the error to
// return.
func (s *Store) txError(err error, token string, withRecord bool, items []types.TransactWriteItem) (retry bool, _ error) {
	var canceled *types.TransactionCanceledException
	if errors.As(err, &canceled) {
		reasons := canceled.CancellationReasons
		offset := 0
		if withRecord {
			offset = 1
			if len(reasons) > 0 && code(reasons[0]) == "ConditionalCheckFailed" {
				if s.completedByToken(reasons[0].Item, token) {
					return false, errCompletedByUs
				}
				return false, fmt.Errorf("%w: the handler's writes were not written: %w", dedup.ErrClaimLost, err)
			}
		}
		conflict := false
		for i, r := range reasons {
			switch code(r) {
			case "ConditionalCheckFailed":
				if i >= offset && i-offset < len(items) {
					return false, &TxConditionError{Index: i - offset, Item: items[i-offset], Reason: r, cause: err}
				}
			case "TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded", "RequestLimitExceeded":
				conflict = true
			}
		}
		if conflict {
			return true, err
		}
		return false, fmt.Errorf("dynamo: complete in transaction: %w", err)
	}
	var inProgress *types.TransactionInProgressException
	if errors.As(err, &inProgress) {
		return true, err
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch {
		case api.ErrorCode() == "UnknownOperationException":
			return false, fmt.Errorf("%w: the server does not know TransactWriteItems: %w", ErrNoTransactions, err)
		case api.ErrorCode() == "ValidationException" && strings.Contains(api.ErrorMessage(), "multiple operations on one item"):
			return false, fmt.Errorf("%w: two writes on one item (DynamoDB refused the transaction; nothing was written): %w",
				&TxLimitError{Reason: api.ErrorMessage()}, err)
		}
	}
	return false, fmt.Errorf("dynamo: complete in transaction: TransactWriteItems: %w", err)
}

// completedByToken reports whether item (the record as the failed
// condition found it) is the live record this claim completed. The
// record's token is only ever completed by its own transaction (a nested
// RunInTx of the claim is refused: ErrNestedTx), so the handler's writes
// were committed with it.
func (s *Store) completedByToken(item map[string]types.AttributeValue, token string) bool {
	if len(item) == 0 {
		return false
	}
	rec, err := s.decode(item)
	if s.pt != nil && rec.completedAt.IsZero() {
		// Powertools completes without a condition and leaves the token
		// of the claim it overwrote: only this store writes completed_at.
		return false
	}
	return err == nil && rec.state == stateCompleted && rec.token == token && rec.deadline > s.clock.Now().UnixMilli()
}

func code(r types.CancellationReason) string {
	if r.Code == nil {
		return ""
	}
	return *r.Code
}
