package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/internal/keys"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// txClient counts the store's requests and can cancel the first
// TransactWriteItems calls as DynamoDB does on a conflict with another
// transaction (the request is not sent then).
type txClient struct {
	*dynamodb.Client
	updates, transacts atomic.Int64
	conflicts          atomic.Int64 // cancel this many more calls
	// lostAnswer: send the next call twice and answer the second's
	// outcome, as if the first's answer was lost and the call made again.
	lostAnswer atomic.Bool
}

func (c *txClient) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	c.updates.Add(1)
	return c.Client.UpdateItem(ctx, in, opts...)
}

func (c *txClient) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	c.transacts.Add(1)
	if c.conflicts.Add(-1) >= 0 {
		reasons := make([]types.CancellationReason, len(in.TransactItems))
		for i := range reasons {
			reasons[i].Code = aws.String("None")
		}
		reasons[len(reasons)-1].Code = aws.String("TransactionConflict")
		return nil, &types.TransactionCanceledException{Message: aws.String("Transaction cancelled"), CancellationReasons: reasons}
	}
	if c.lostAnswer.CompareAndSwap(true, false) {
		if _, err := c.Client.TransactWriteItems(ctx, in, opts...); err != nil {
			return nil, err
		}
		in.ClientRequestToken = nil // a new request, not the SDK's retry
	}
	return c.Client.TransactWriteItems(ctx, in, opts...)
}

// dynalite has no TransactWriteItems: RunInTx says so with
// ErrNoTransactions, and every other case of this file runs on moto.
func TestRunInTxDynalite(t *testing.T) {
	s := newStore(t, dynamo.Config{})
	e := newTxEngine(t, s)
	_, err := e.Do(context.Background(), dedup.Call{Scope: "tx-dynalite", Key: "k"}, func(ctx context.Context) ([]byte, error) {
		return s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) { return nil, nil })
	})
	if !errors.Is(err, dynamo.ErrNoTransactions) {
		t.Fatalf("RunInTx on dynalite: %v; want ErrNoTransactions (dynalite has no transactions)", err)
	}
}

// TestRunInTxMoto runs RunInTx on moto, which has TransactWriteItems
// (testserver serves it one request at a time: moto applies a
// transaction's items one by one, and is atomic only because nothing else
// runs meanwhile).
func TestRunInTxMoto(t *testing.T) {
	m, err := testserver.StartMoto()
	if errors.Is(err, testserver.ErrMotoMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	c := &txClient{Client: newClient(m.Endpoint, 0)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dynamo.CreateTable(ctx, c.Client, dynamo.TableConfig{Table: testTable}); err != nil {
		t.Fatalf("CreateTable on moto: %v", err)
	}
	if err := dynamo.CreateTable(ctx, c.Client, dynamo.TableConfig{Table: "charges", SkipTTL: true}); err != nil {
		t.Fatalf("CreateTable charges: %v", err)
	}
	s := newStore(t, dynamo.Config{Client: c})
	e := newTxEngine(t, s)

	t.Run("commit", func(t *testing.T) {
		u0, x0 := c.updates.Load(), c.transacts.Load()
		res, err := e.Do(ctx, dedup.Call{Scope: "tx", Key: "commit"}, func(ctx context.Context) ([]byte, error) {
			return s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
				tx, ok := dynamo.TxFromContext(ctx)
				if !ok {
					return nil, errors.New("no Tx in the work's context")
				}
				return []byte("receipt"), tx.Add(charge("commit", 42))
			})
		})
		if err != nil || res.Outcome != dedup.Acquired || string(res.Result) != "receipt" {
			t.Fatalf("Do: %v, %v, %q", res.Outcome, err, res.Result)
		}
		if got := chargeOf(t, c.Client, "commit"); got != 42 {
			t.Fatalf("charge = %d; want 42", got)
		}
		if n := c.transacts.Load() - x0; n != 1 {
			t.Fatalf("%d TransactWriteItems; want 1", n)
		}
		if n := c.updates.Load() - u0; n != 0 {
			t.Fatalf("%d UpdateItem calls after the transaction; want 0 (the engine must not complete again)", n)
		}
		again, err := e.Do(ctx, dedup.Call{Scope: "tx", Key: "commit"}, func(context.Context) ([]byte, error) {
			t.Error("work ran for a completed key")
			return nil, nil
		})
		if err != nil || again.Outcome != dedup.Duplicate || string(again.Result) != "receipt" {
			t.Fatalf("second Do: %v, %v, %q; want a duplicate with the receipt", again.Outcome, err, again.Result)
		}
	})

	t.Run("claim-lost", func(t *testing.T) {
		_, err := e.Do(ctx, dedup.Call{Scope: "tx", Key: "lost"}, func(ctx context.Context) ([]byte, error) {
			return s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
				tx, _ := dynamo.TxFromContext(ctx)
				// Another consumer takes the record over meanwhile.
				if _, err := s.Evict(ctx, keys.Scoped("tx", "lost")); err != nil {
					return nil, err
				}
				if r, err := s.Claim(ctx, keys.Scoped("tx", "lost"), "", time.Minute); err != nil || r.Outcome != dedup.Acquired {
					return nil, fmt.Errorf("the other claim: %v, %v", r.Outcome, err)
				}
				return nil, tx.Add(charge("lost", 7))
			})
		})
		if !errors.Is(err, dedup.ErrClaimLost) {
			t.Fatalf("Do: %v; want ErrClaimLost", err)
		}
		if got := chargeOf(t, c.Client, "lost"); got != 0 {
			t.Fatalf("charge = %d; want none (the claim was lost)", got)
		}
	})

	t.Run("handler-condition", func(t *testing.T) {
		put := charge("cond", 1)
		if _, err := c.Client.PutItem(ctx, &dynamodb.PutItemInput{TableName: put.Put.TableName, Item: put.Put.Item}); err != nil {
			t.Fatal(err)
		}
		_, err := e.Do(ctx, dedup.Call{Scope: "tx", Key: "cond"}, func(ctx context.Context) ([]byte, error) {
			return s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
				tx, _ := dynamo.TxFromContext(ctx)
				w := charge("cond", 2)
				w.Put.ConditionExpression = aws.String("attribute_not_exists(pk)")
				w.Put.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
				return nil, tx.Add(charge("cond-other", 5), w)
			})
		})
		var ce *dynamo.TxConditionError
		if !errors.Is(err, dynamo.ErrTxConditionFailed) || !errors.As(err, &ce) {
			t.Fatalf("Do: %v; want a *TxConditionError", err)
		}
		var canceled *types.TransactionCanceledException
		if ce.Index != 1 || !errors.As(err, &canceled) {
			t.Fatalf("TxConditionError.Index = %d (want 1), SDK exception kept: %v", ce.Index, errors.As(err, &canceled))
		}
		if got := chargeOf(t, c.Client, "cond"); got != 1 {
			t.Fatalf("charge = %d; want 1, as before", got)
		}
		if got := chargeOf(t, c.Client, "cond-other"); got != 0 {
			t.Fatalf("the other write happened (%d): the transaction was not atomic", got)
		}
		// Released as for any handler error: a retry runs.
		res, err := e.Do(ctx, dedup.Call{Scope: "tx", Key: "cond"}, func(context.Context) ([]byte, error) { return nil, nil })
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("retry: %v, %v; want Acquired (the claim released)", res.Outcome, err)
		}
	})

	t.Run("conflict-retried", func(t *testing.T) {
		c.conflicts.Store(2)
		x0 := c.transacts.Load()
		res, err := e.Do(ctx, dedup.Call{Scope: "tx", Key: "conflict"}, func(ctx context.Context) ([]byte, error) {
			return s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
				tx, _ := dynamo.TxFromContext(ctx)
				return nil, tx.Add(charge("conflict", 3))
			})
		})
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("Do: %v, %v", res.Outcome, err)
		}
		if n := c.transacts.Load() - x0; n != 3 {
			t.Fatalf("%d TransactWriteItems; want 3 (two cancelled for conflicts)", n)
		}
		if got := chargeOf(t, c.Client, "conflict"); got != 3 {
			t.Fatalf("charge = %d; want 3", got)
		}
	})

	t.Run("conflict-exhausted", func(t *testing.T) {
		c.conflicts.Store(100)
		defer c.conflicts.Store(0)
		_, err := e.Do(ctx, dedup.Call{Scope: "tx", Key: "conflicts"}, func(ctx context.Context) ([]byte, error) {
			return s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
				tx, _ := dynamo.TxFromContext(ctx)
				return nil, tx.Add(charge("conflicts", 3))
			})
		})
		if !errors.Is(err, dynamo.ErrTxConflict) {
			t.Fatalf("Do: %v; want ErrTxConflict", err)
		}
		c.conflicts.Store(0)
		res, err := e.Do(ctx, dedup.Call{Scope: "tx", Key: "conflicts"}, func(context.Context) ([]byte, error) { return nil, nil })
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("retry: %v, %v; want Acquired (the claim released)", res.Outcome, err)
		}
	})

	// The transaction committed but its answer was lost, and it was sent
	// again: the record's condition fails on the record this very claim
	// completed (the old item comes back with the reason), which is the
	// commit of the first: success, the charge once.
	t.Run("answer-lost", func(t *testing.T) {
		c.lostAnswer.Store(true)
		res, err := e.Do(ctx, dedup.Call{Scope: "tx", Key: "lost-answer"}, func(ctx context.Context) ([]byte, error) {
			return s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
				tx, _ := dynamo.TxFromContext(ctx)
				w := charge("lost-answer", 9)
				w.Put.ConditionExpression = aws.String("attribute_not_exists(pk)")
				return nil, tx.Add(w)
			})
		})
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("Do: %v, %v; want success (the first send committed)", res.Outcome, err)
		}
		if got := chargeOf(t, c.Client, "lost-answer"); got != 9 {
			t.Fatalf("charge = %d; want 9", got)
		}
	})

	// A run dedup.Config.Shadow lets through without a claim sends the
	// handler's writes alone and completes nothing.
	t.Run("shadow", func(t *testing.T) {
		shadow, err := dedup.NewEngine(dedup.Config{Store: s, Lease: time.Minute, Retention: time.Hour, Shadow: true})
		if err != nil {
			t.Fatal(err)
		}
		res, err := shadow.Do(ctx, dedup.Call{Scope: "tx", Key: "commit"}, func(ctx context.Context) ([]byte, error) {
			return s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
				tx, _ := dynamo.TxFromContext(ctx)
				return nil, tx.Add(charge("shadow", 4))
			})
		})
		if err != nil || res.Outcome != 0 {
			t.Fatalf("shadow Do of a completed key: %v, %v; want an unclaimed run", res.Outcome, err)
		}
		if got := chargeOf(t, c.Client, "shadow"); got != 4 {
			t.Fatalf("charge = %d; want 4", got)
		}
	})

	// httpdedup with InTransaction: store.RunInTx: the handler's write,
	// the stored response and the completed key in one transaction; the
	// retry gets the stored response.
	t.Run("http", func(t *testing.T) {
		idem, err := httpdedup.New(httpdedup.Config{Dedup: dedup.Config{Store: s, Lease: time.Minute, Retention: time.Hour},
			InTransaction: s.RunInTx, Identity: httpdedup.StaticIdentity("acct_42")})
		if err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int64
		srv := httptest.NewServer(idem.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			tx, ok := dynamo.TxFromContext(r.Context())
			if !ok {
				http.Error(w, "no transaction", http.StatusInternalServerError)
				return
			}
			if err := tx.Add(charge("http", 6)); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"payment":"p-1"}`)
		})))
		defer srv.Close()
		for i := range 2 {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":6}`))
			req.Header.Set("Idempotency-Key", "key-1")
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusCreated || string(body) != `{"payment":"p-1"}` {
				t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
			}
		}
		if n := calls.Load(); n != 1 {
			t.Fatalf("the handler ran %d times; want once", n)
		}
		if got := chargeOf(t, c.Client, "http"); got != 6 {
			t.Fatalf("charge = %d; want 6", got)
		}
	})

	t.Run("limits", func(t *testing.T) { testTxLimits(t, e, s) })
	t.Run("nested", func(t *testing.T) { testNestedRunInTx(t, c.Client, e, s) })

	t.Run("no-claim", func(t *testing.T) {
		ran := false
		_, err := s.RunInTx(ctx, func(context.Context) ([]byte, error) { ran = true; return nil, nil })
		if !errors.Is(err, dynamo.ErrNoClaim) || ran {
			t.Fatalf("RunInTx without a claim: %v (work ran: %v); want ErrNoClaim before work", err, ran)
		}
	})
}

// testTxLimits: what TransactWriteItems would refuse is refused by Add,
// before any request, with ErrTxLimit.
func testTxLimits(t *testing.T, e *dedup.Engine, s *dynamo.Store) {
	cases := map[string]func(tx *dynamo.Tx) error{
		"too-many": func(tx *dynamo.Tx) error {
			ws := make([]types.TransactWriteItem, dynamo.MaxTxItems)
			for i := range ws {
				ws[i] = charge("many-"+strconv.Itoa(i), 1)
			}
			if err := tx.Add(ws[:dynamo.MaxTxItems-1]...); err != nil {
				return fmt.Errorf("99 writes refused: %v", err)
			}
			return tx.Add(ws[dynamo.MaxTxItems-1])
		},
		"same-item": func(tx *dynamo.Tx) error {
			u := types.TransactWriteItem{Update: &types.Update{TableName: aws.String("charges"),
				Key:              map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "same"}},
				UpdateExpression: aws.String("SET amount = :a"), ExpressionAttributeValues: map[string]types.AttributeValue{":a": &types.AttributeValueMemberN{Value: "1"}}}}
			return tx.Add(charge("same", 1), u)
		},
		"record-item": func(tx *dynamo.Tx) error {
			return tx.Add(types.TransactWriteItem{Delete: &types.Delete{TableName: aws.String(testTable),
				Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: keys.Scoped("tx-limits", "record-item")}}}})
		},
		"too-large": func(tx *dynamo.Tx) error {
			w := charge("large", 1)
			w.Put.Item["blob"] = &types.AttributeValueMemberB{Value: make([]byte, dynamo.MaxItemBytes)}
			return tx.Add(w)
		},
		"no-operation": func(tx *dynamo.Tx) error { return tx.Add(types.TransactWriteItem{}) },
		"no-table": func(tx *dynamo.Tx) error {
			return tx.Add(types.TransactWriteItem{Put: &types.Put{Item: charge("x", 1).Put.Item}})
		},
	}
	for name, add := range cases {
		t.Run(name, func(t *testing.T) {
			var addErr error
			_, err := e.Do(context.Background(), dedup.Call{Scope: "tx-limits", Key: name}, func(ctx context.Context) ([]byte, error) {
				return s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
					tx, _ := dynamo.TxFromContext(ctx)
					addErr = add(tx)
					return nil, addErr
				})
			})
			var le *dynamo.TxLimitError
			if !errors.Is(addErr, dynamo.ErrTxLimit) || !errors.As(addErr, &le) || le.Reason == "" {
				t.Fatalf("Add: %v; want a *TxLimitError", addErr)
			}
			if !errors.Is(err, dynamo.ErrTxLimit) {
				t.Fatalf("Do: %v; want the handler's ErrTxLimit", err)
			}
		})
	}
}

// testNestedRunInTx: a RunInTx inside the RunInTx, or the TxMiddleware, of
// the same claim (a helper that opens its own). The outer writes are
// written with the completion, or the call fails; never a nil error with
// the outer writes missing.
func testNestedRunInTx(t *testing.T, c *dynamodb.Client, e *dedup.Engine, s *dynamo.Store) {
	ctx := context.Background()
	d, err := dedup.New(dedup.Config{Store: s, Scope: "nested", Lease: time.Minute, Retention: time.Hour,
		Key: func(msg *message.Message) (string, error) { return msg.Metadata.Get("key"), nil }})
	if err != nil {
		t.Fatal(err)
	}
	for _, viaMiddleware := range []bool{false, true} {
		for _, passOn := range []bool{false, true} {
			key := fmt.Sprintf("middleware=%v/pass-on=%v", viaMiddleware, passOn)
			t.Run(key, func(t *testing.T) {
				outer, inner := "nested-outer:"+key, "nested-inner:"+key
				var innerErr error
				innerRan := false
				// body is the outer work: it adds its write, then calls the
				// helper, and passes its error on or not.
				body := func(ctx context.Context) error {
					tx, ok := dynamo.TxFromContext(ctx)
					if !ok {
						return errors.New("no Tx in the work's context")
					}
					if err := tx.Add(charge(outer, 1)); err != nil {
						return err
					}
					_, innerErr = s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
						innerRan = true
						tx, _ := dynamo.TxFromContext(ctx)
						return nil, tx.Add(charge(inner, 1))
					})
					if passOn {
						return innerErr
					}
					return nil
				}
				var err error
				if viaMiddleware {
					h := d.Middleware(s.TxMiddleware(func(msg *message.Message) ([]*message.Message, error) {
						return nil, body(msg.Context())
					}))
					msg := message.NewMessage(watermill.NewUUID(), nil)
					msg.Metadata.Set("key", key)
					msg.SetContext(ctx)
					_, err = h(msg)
				} else {
					_, err = e.Do(ctx, dedup.Call{Scope: "nested", Key: key}, func(ctx context.Context) ([]byte, error) {
						return s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) { return nil, body(ctx) })
					})
				}
				outerWritten := chargeOf(t, c, outer) == 1
				switch {
				case err == nil && !outerWritten:
					t.Fatalf("the call returned nil, but the outer write was not written (the nested RunInTx: %v, work ran: %v)", innerErr, innerRan)
				case err != nil && outerWritten:
					t.Fatalf("the call failed (%v), but the outer write was written", err)
				}
				// The nested call is refused before its work runs; the
				// outer one writes with the completion, or fails with the
				// refusal and writes nothing.
				if !errors.Is(innerErr, dynamo.ErrNestedTx) || innerRan || chargeOf(t, c, inner) != 0 {
					t.Fatalf("the nested RunInTx: %v (work ran: %v, its write written: %v); want ErrNestedTx before its work", innerErr, innerRan, chargeOf(t, c, inner) != 0)
				}
				if passOn != errors.Is(err, dynamo.ErrNestedTx) || passOn == outerWritten {
					t.Fatalf("the call: %v, outer write written: %v; want ErrNestedTx and nothing written when the work passes the error on, else nil and the write written", err, outerWritten)
				}
				// A failed call released the claim (the redelivery runs); a
				// call that succeeded completed the record.
				want := dedup.Duplicate
				if passOn {
					want = dedup.Acquired
				}
				if again, err := e.Do(ctx, dedup.Call{Scope: "nested", Key: key}, func(context.Context) ([]byte, error) { return nil, nil }); err != nil || again.Outcome != want {
					t.Fatalf("the redelivery: %v, %v; want %v", again.Outcome, err, want)
				}
			})
		}
	}
}

func newTxEngine(t *testing.T, s *dynamo.Store) *dedup.Engine {
	t.Helper()
	e, err := dedup.NewEngine(dedup.Config{Store: s, Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// charge is the handler's effect: a Put of an item of the charges table.
func charge(order string, amount int) types.TransactWriteItem {
	return types.TransactWriteItem{Put: &types.Put{TableName: aws.String("charges"), Item: map[string]types.AttributeValue{
		"pk":     &types.AttributeValueMemberS{Value: order},
		"amount": &types.AttributeValueMemberN{Value: strconv.Itoa(amount)},
	}}}
}

// chargeOf reads the amount charged for order, 0 when none.
func chargeOf(t *testing.T, c *dynamodb.Client, order string) int {
	t.Helper()
	out, err := c.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String("charges"), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: order}}})
	if err != nil {
		t.Fatal(err)
	}
	n, ok := out.Item["amount"].(*types.AttributeValueMemberN)
	if !ok {
		return 0
	}
	v, _ := strconv.Atoi(n.Value)
	return v
}
