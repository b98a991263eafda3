package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// orders is a business table in the test's schema. It has no unique
// constraint on order_id on purpose: only deduplication keeps one row per
// order.
type orders struct {
	store *postgres.Store
	table string
	calls atomic.Int64 // handler invocations
}

func newOrders(t testing.TB) *orders {
	t.Helper()
	return newOrdersWith(t, postgres.Config{})
}

// newOrdersWith creates the orders table and a store configured with cfg in
// a fresh schema.
func newOrdersWith(t testing.TB, cfg postgres.Config) *orders {
	t.Helper()
	schema := newSchema(t)
	cfg.Schema = schema
	s := newStore(t, cfg)
	table := pgx.Identifier{schema, "orders"}.Sanitize()
	if _, err := pool.Exec(testCtx(t), "CREATE TABLE "+table+" (id bigserial PRIMARY KEY, order_id text NOT NULL)"); err != nil {
		t.Fatalf("create orders: %v", err)
	}
	return &orders{store: s, table: table}
}

// insert is the business write: one order row, through the message's
// transaction.
func (o *orders) insert(msg *message.Message) error {
	o.calls.Add(1)
	tx, ok := postgres.TxFromContext(msg.Context())
	if !ok {
		return errors.New("no transaction in the handler's context")
	}
	_, err := tx.Exec(msg.Context(), "INSERT INTO "+o.table+" (order_id) VALUES ($1)", msg.Metadata.Get("order_id"))
	return err
}

func (o *orders) count(t testing.TB, orderID string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(testCtx(t), "SELECT count(*) FROM "+o.table+" WHERE order_id = $1", orderID).Scan(&n); err != nil {
		t.Fatalf("count orders: %v", err)
	}
	return n
}

func orderKey(msg *message.Message) (string, error) {
	id := msg.Metadata.Get("order_id")
	if id == "" {
		return "", &dedup.KeyError{Field: "metadata:order_id", Reason: "missing"}
	}
	return id, nil
}

const scope = "orders"

// chain is the handler as a router would run it: the dedup middleware
// outside, TxMiddleware inside.
func (o *orders) chain(t testing.TB, cfg dedup.Config, h message.HandlerFunc) message.HandlerFunc {
	t.Helper()
	cfg.Store, cfg.Key, cfg.Scope = o.store, orderKey, scope
	d, err := dedup.New(cfg)
	if err != nil {
		t.Fatalf("dedup.New: %v", err)
	}
	return d.Middleware(o.store.TxMiddleware(h))
}

func delivery(ctx context.Context, orderID string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"`+orderID+`"}`))
	msg.Metadata.Set("order_id", orderID)
	msg.SetContext(ctx)
	return msg
}

// state is the state of the order's record as a claim sees it: "none" when
// there is no record, or a released or expired one.
func (o *orders) state(t testing.TB, orderID string) string {
	t.Helper()
	r, err := o.store.Inspect(testCtx(t), admin.ScopedKey(scope, orderID))
	if errors.Is(err, admin.ErrNotFound) {
		return "none"
	}
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	return r.State
}

func TestTxCommitsEffectWithCompletion(t *testing.T) {
	ctx := testCtx(t)
	o := newOrders(t)
	h := o.chain(t, dedup.Config{}, func(msg *message.Message) ([]*message.Message, error) {
		return nil, o.insert(msg)
	})
	for i := range 3 {
		if _, err := h(delivery(ctx, "ORDER-1")); err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
	}
	if n := o.count(t, "ORDER-1"); n != 1 {
		t.Fatalf("%d order rows, want 1", n)
	}
	if n := o.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if st := o.state(t, "ORDER-1"); st != "completed" {
		t.Fatalf("record is %s, want completed", st)
	}
}

// TestTxRollsBackFailedHandler: a handler that inserts its row and then
// fails leaves no row and no record; the redelivery commits both, once.
func TestTxRollsBackFailedHandler(t *testing.T) {
	ctx := testCtx(t)
	o := newOrders(t)
	errCharge := errors.New("charge declined")
	var fail atomic.Bool
	fail.Store(true)
	h := o.chain(t, dedup.Config{}, func(msg *message.Message) ([]*message.Message, error) {
		if err := o.insert(msg); err != nil {
			return nil, err
		}
		if fail.Load() {
			return nil, errCharge
		}
		return nil, nil
	})

	if _, err := h(delivery(ctx, "ORDER-1")); !errors.Is(err, errCharge) {
		t.Fatalf("first delivery: %v, want the handler's error", err)
	}
	if n := o.count(t, "ORDER-1"); n != 0 {
		t.Fatalf("%d order rows after the failed handler, want 0 (rolled back)", n)
	}
	if st := o.state(t, "ORDER-1"); st != "none" {
		t.Fatalf("record is %s after the failed handler, want none (released)", st)
	}

	fail.Store(false)
	for i := range 2 {
		if _, err := h(delivery(ctx, "ORDER-1")); err != nil {
			t.Fatalf("redelivery %d: %v", i, err)
		}
	}
	if n := o.count(t, "ORDER-1"); n != 1 {
		t.Fatalf("%d order rows after the redelivery, want 1", n)
	}
	if n := o.calls.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2 (failed, then committed)", n)
	}
	if st := o.state(t, "ORDER-1"); st != "completed" {
		t.Fatalf("record is %s, want completed", st)
	}
}

func TestTxRollsBackOnPanic(t *testing.T) {
	ctx := testCtx(t)
	o := newOrders(t)
	h := o.chain(t, dedup.Config{}, func(msg *message.Message) ([]*message.Message, error) {
		if err := o.insert(msg); err != nil {
			return nil, err
		}
		panic("boom")
	})
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Fatalf("recovered %v, want the handler's panic", p)
			}
		}()
		_, _ = h(delivery(ctx, "ORDER-1"))
	}()
	if n := o.count(t, "ORDER-1"); n != 0 {
		t.Fatalf("%d order rows after the panic, want 0", n)
	}
	if st := o.state(t, "ORDER-1"); st != "none" {
		t.Fatalf("record is %s after the panic, want none (released)", st)
	}
}

// TestTxSwallowedSQLErrorIsNotCompleted: a handler that ignores a failed
// statement and returns nil cannot mark the key completed: the aborted
// transaction refuses the completion.
func TestTxSwallowedSQLErrorIsNotCompleted(t *testing.T) {
	ctx := testCtx(t)
	o := newOrders(t)
	h := o.chain(t, dedup.Config{}, func(msg *message.Message) ([]*message.Message, error) {
		if err := o.insert(msg); err != nil {
			return nil, err
		}
		tx, _ := postgres.TxFromContext(msg.Context())
		_, _ = tx.Exec(msg.Context(), "SELECT 1/0") // ignored
		return nil, nil
	})
	if _, err := h(delivery(ctx, "ORDER-1")); err == nil {
		t.Fatal("delivery succeeded although its transaction was aborted")
	}
	if n := o.count(t, "ORDER-1"); n != 0 {
		t.Fatalf("%d order rows, want 0", n)
	}
	if st := o.state(t, "ORDER-1"); st != "none" {
		t.Fatalf("record is %s, want none (released)", st)
	}
}

// TestTxClaimLostRollsBack: when the lease ended while the handler ran
// (taken over by another consumer, or merely expired), the completion
// matches no row and the business writes are rolled back.
func TestTxClaimLostRollsBack(t *testing.T) {
	for _, takeover := range []bool{true, false} {
		t.Run(fmt.Sprintf("takeover=%v", takeover), func(t *testing.T) {
			ctx := testCtx(t)
			o := newOrders(t)
			key := admin.ScopedKey(scope, "ORDER-1")
			var other dedup.ClaimResult
			h := o.chain(t, dedup.Config{}, func(msg *message.Message) ([]*message.Message, error) {
				if err := o.insert(msg); err != nil {
					return nil, err
				}
				expire(t, o.store, key) // the lease ends while the handler runs
				if takeover {
					var err error
					if other, err = o.store.Claim(ctx, key, "", time.Hour); err != nil || other.Outcome != dedup.Acquired {
						return nil, fmt.Errorf("takeover: %v %v", other.Outcome, err)
					}
				}
				return nil, nil
			})
			_, err := h(delivery(ctx, "ORDER-1"))
			if !errors.Is(err, dedup.ErrClaimLost) {
				t.Fatalf("delivery: %v, want ErrClaimLost", err)
			}
			if n := o.count(t, "ORDER-1"); n != 0 {
				t.Fatalf("%d order rows, want 0 (rolled back)", n)
			}
			r, ok := readRecord(t, o.store, key)
			if takeover && (!ok || r.State != "in_progress" || r.Token != other.Claim.Token) {
				t.Fatalf("the new owner's record was changed: %+v %v", r, ok)
			}
			if !takeover && ok && r.State != "in_progress" {
				t.Fatalf("the expired record was completed: %+v", r)
			}
		})
	}
}

// TestTxCompletesAfterContextCancelled: once the handler returned
// successfully, the completion and commit run even if the message's context
// is cancelled meanwhile (router shutting down).
func TestTxCompletesAfterContextCancelled(t *testing.T) {
	o := newOrders(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	h := o.chain(t, dedup.Config{}, func(msg *message.Message) ([]*message.Message, error) {
		err := o.insert(msg)
		cancel()
		return nil, err
	})
	if _, err := h(delivery(ctx, "ORDER-1")); err != nil {
		t.Fatalf("delivery: %v", err)
	}
	if n := o.count(t, "ORDER-1"); n != 1 {
		t.Fatalf("%d order rows, want 1", n)
	}
	if st := o.state(t, "ORDER-1"); st != "completed" {
		t.Fatalf("record is %s, want completed", st)
	}
}

func TestTxReplaysOutput(t *testing.T) {
	ctx := testCtx(t)
	o := newOrders(t)
	h := o.chain(t, dedup.Config{Replay: true}, func(msg *message.Message) ([]*message.Message, error) {
		out := message.NewMessage(watermill.NewUUID(), []byte("charged "+msg.Metadata.Get("order_id")))
		out.Metadata.Set("kind", "receipt")
		return []*message.Message{out}, o.insert(msg)
	})
	first, err := h(delivery(ctx, "ORDER-1"))
	if err != nil || len(first) != 1 {
		t.Fatalf("first delivery: %d messages, %v", len(first), err)
	}
	again, err := h(delivery(ctx, "ORDER-1"))
	if err != nil || len(again) != 1 {
		t.Fatalf("duplicate: %d messages, %v", len(again), err)
	}
	if !again[0].Equals(first[0]) {
		t.Fatalf("replayed %q %v, want %q %v", again[0].Payload, again[0].Metadata, first[0].Payload, first[0].Metadata)
	}
	if n := o.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// TestTxWithoutClaim: TxMiddleware outside the dedup middleware (or alone)
// refuses every message before writing anything, instead of committing
// writes whose key the dedup middleware would complete separately.
func TestTxWithoutClaim(t *testing.T) {
	ctx := testCtx(t)
	o := newOrders(t)
	d, err := dedup.New(dedup.Config{Store: o.store, Key: orderKey, Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	handler := func(msg *message.Message) ([]*message.Message, error) { return nil, o.insert(msg) }
	for name, h := range map[string]message.HandlerFunc{
		"alone":      o.store.TxMiddleware(handler),
		"misordered": o.store.TxMiddleware(d.Middleware(handler)),
	} {
		if _, err := h(delivery(ctx, "ORDER-1")); !errors.Is(err, postgres.ErrNoClaim) {
			t.Fatalf("%s: %v, want ErrNoClaim", name, err)
		}
	}
	if n := o.calls.Load(); n != 0 {
		t.Fatalf("handler ran %d times, want 0", n)
	}
	if st := o.state(t, "ORDER-1"); st != "none" {
		t.Fatalf("record is %s, want none", st)
	}
}

// TestTxShadow: with dedup.Config.Shadow every copy runs: the first under
// its claim, completed in its transaction; the copies dedup would have
// skipped (completed, or held by the first) and a copy without a usable
// key run without a claim, in a transaction of their own that commits
// their writes without touching the record (on the old code they failed
// with ErrNoClaim and were nacked). A shadow copy whose handler fails is
// rolled back.
func TestTxShadow(t *testing.T) {
	ctx := testCtx(t)
	o := newOrders(t)
	fail := false
	h := o.chain(t, dedup.Config{Shadow: true}, func(msg *message.Message) ([]*message.Message, error) {
		if err := o.insert(msg); err != nil {
			return nil, err
		}
		if fail {
			return nil, errors.New("handler failed")
		}
		if outcome, ok := dedup.OutcomeFromContext(msg.Context()); ok && outcome != dedup.Acquired {
			if _, inTx := postgres.TxFromContext(msg.Context()); !inTx {
				return nil, errors.New("a shadow run without a transaction")
			}
		}
		return nil, nil
	})
	for i := range 3 {
		if _, err := h(delivery(ctx, "ORDER-1")); err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
	}
	if n := o.count(t, "ORDER-1"); n != 3 {
		t.Fatalf("%d order rows, want 3 (shadow runs every copy)", n)
	}
	rec, err := o.store.Inspect(ctx, admin.ScopedKey(scope, "ORDER-1"))
	if err != nil || rec.State != admin.StateCompleted || rec.Claims != 1 {
		t.Fatalf("record %+v (%v), want completed once, by the first copy", rec, err)
	}
	fail = true
	if _, err := h(delivery(ctx, "ORDER-1")); err == nil {
		t.Fatal("a failing shadow copy returned no error")
	}
	if n := o.count(t, "ORDER-1"); n != 3 {
		t.Fatalf("%d order rows after a failed shadow copy, want 3 (rolled back)", n)
	}
	fail = false
	noKey := delivery(ctx, "")
	if _, err := h(noKey); err != nil {
		t.Fatalf("a copy without a key in shadow mode: %v", err)
	}
	if n := o.count(t, ""); n != 1 {
		t.Fatalf("%d rows of the copy without a key, want 1", n)
	}
}

// TestTxConcurrentDeliveries: 1000 copies of one order delivered at once,
// each redelivered while it gets ErrInProgress, as a broker would: exactly
// one order row is committed and every copy is acked.
func TestTxConcurrentDeliveries(t *testing.T) {
	ctx := testCtx(t)
	o := newOrders(t)
	h := o.chain(t, dedup.Config{}, func(msg *message.Message) ([]*message.Message, error) {
		return nil, o.insert(msg)
	})
	const n = 1000
	var (
		wg          sync.WaitGroup
		start       = make(chan struct{})
		acked       atomic.Int64
		redelivered atomic.Int64
		mu          sync.Mutex
		errs        []error
	)
	for range n {
		wg.Go(func() {
			<-start
			for {
				_, err := h(delivery(ctx, "ORDER-1"))
				if err == nil {
					acked.Add(1)
					return
				}
				if !errors.Is(err, dedup.ErrInProgress) || ctx.Err() != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				redelivered.Add(1)
				select { // the broker's redelivery delay
				case <-time.After(5 * time.Millisecond):
				case <-ctx.Done():
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d deliveries failed, first: %v", len(errs), errs[0])
	}
	if got := acked.Load(); got != n {
		t.Fatalf("%d of %d deliveries acked", got, n)
	}
	if rows := o.count(t, "ORDER-1"); rows != 1 {
		t.Fatalf("%d order rows committed, want exactly 1", rows)
	}
	if calls := o.calls.Load(); calls != 1 {
		t.Fatalf("handler ran %d times, want 1", calls)
	}
	t.Logf("%d deliveries: 1 effect, %d redeliveries after ErrInProgress", n, redelivered.Load())
}

// TestCrashBeforeCommit: the consumer process dies after its business
// write and before the commit. Nothing is recorded: no order row, and the
// key stays in progress until its lease ends; then the redelivery commits
// the order once. The crash is real: a child process (this test binary)
// exits in the middle of the handler.
func TestCrashBeforeCommit(t *testing.T) {
	if schema := os.Getenv(envChildSchema); schema != "" {
		crashingConsumer(t, schema) // never returns
	}
	ctx := testCtx(t)
	o := newOrders(t)
	schema := strings.Trim(strings.SplitN(o.table, ".", 2)[0], `"`)

	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashBeforeCommit$", "-test.count=1")
	cmd.Env = append(os.Environ(), envChildDSN+"="+dsn, envChildSchema+"="+schema)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 || !strings.Contains(string(out), "inserted, now crashing") {
		t.Fatalf("child consumer did not crash after its write: %v\n%s", err, out)
	}

	if n := o.count(t, "ORDER-1"); n != 0 {
		t.Fatalf("%d order rows after the crash, want 0", n)
	}
	if st := o.state(t, "ORDER-1"); st != "in_progress" {
		t.Fatalf("record is %s after the crash, want in_progress (the lease holds the key)", st)
	}
	h := o.chain(t, dedup.Config{}, func(msg *message.Message) ([]*message.Message, error) {
		return nil, o.insert(msg)
	})
	if _, err := h(delivery(ctx, "ORDER-1")); !errors.Is(err, dedup.ErrInProgress) {
		t.Fatalf("redelivery during the crashed consumer's lease: %v, want ErrInProgress", err)
	}
	expire(t, o.store, admin.ScopedKey(scope, "ORDER-1")) // the lease ends
	for i := range 2 {
		if _, err := h(delivery(ctx, "ORDER-1")); err != nil {
			t.Fatalf("redelivery %d after the lease: %v", i, err)
		}
	}
	if n := o.count(t, "ORDER-1"); n != 1 {
		t.Fatalf("%d order rows, want 1", n)
	}
}

// crashingConsumer runs in the child process of TestCrashBeforeCommit.
func crashingConsumer(t *testing.T, schema string) {
	s, err := postgres.New(context.Background(), postgres.Config{DB: pool, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	o := &orders{store: s, table: pgx.Identifier{schema, "orders"}.Sanitize()}
	h := o.chain(t, dedup.Config{Lease: time.Hour}, func(msg *message.Message) ([]*message.Message, error) {
		if err := o.insert(msg); err != nil {
			return nil, err
		}
		fmt.Println("inserted, now crashing")
		os.Exit(3)
		return nil, nil
	})
	_, err = h(delivery(context.Background(), "ORDER-1"))
	t.Fatalf("the handler returned (%v) instead of crashing", err)
}

// TestTxRepeatableReadAndHeartbeat documents a limit of REPEATABLE READ and
// SERIALIZABLE transactions: a lease extension (the dedup middleware's
// heartbeat) committed after the transaction took its snapshot makes the
// completion UPDATE fail with a serialization error. Nothing is committed
// and the key is released, so the message is redelivered; a handler that
// always outlives the heartbeat interval would never complete. READ
// COMMITTED, the default, has no such limit.
func TestTxRepeatableReadAndHeartbeat(t *testing.T) {
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
		t.Run(string(iso), func(t *testing.T) {
			ctx := testCtx(t)
			o := newOrdersWith(t, postgres.Config{TxOptions: pgx.TxOptions{IsoLevel: iso}})
			s := o.store
			h := o.chain(t, dedup.Config{}, func(msg *message.Message) ([]*message.Message, error) {
				if err := o.insert(msg); err != nil { // takes the snapshot
					return nil, err
				}
				hc, _ := dedup.HeldClaimFromContext(msg.Context())
				return nil, s.Extend(msg.Context(), hc.Claim(), time.Minute) // a heartbeat
			})
			_, err := h(delivery(ctx, "ORDER-1"))
			var pgErr interface{ SQLState() string }
			if iso == pgx.ReadCommitted {
				if err != nil {
					t.Fatalf("delivery: %v", err)
				}
				if n := o.count(t, "ORDER-1"); n != 1 {
					t.Fatalf("%d order rows, want 1", n)
				}
				return
			}
			if !errors.As(err, &pgErr) || pgErr.SQLState() != "40001" {
				t.Fatalf("delivery: %v, want a serialization failure (40001)", err)
			}
			if n := o.count(t, "ORDER-1"); n != 0 {
				t.Fatalf("%d order rows, want 0", n)
			}
			if st := o.state(t, "ORDER-1"); st != "none" {
				t.Fatalf("record is %s, want none (released)", st)
			}
		})
	}
}

// TestTxNested: a RunInTx inside the RunInTx, or the TxMiddleware, of the
// same claim (a helper that opens its own). The outer writes are committed
// with the completion, or the call fails; never a nil error with the outer
// writes missing.
func TestTxNested(t *testing.T) {
	ctx := testCtx(t)
	o := newOrders(t)
	e, err := dedup.NewEngine(dedup.Config{Store: o.store, Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, viaMiddleware := range []bool{false, true} {
		for _, passOn := range []bool{false, true} {
			key := fmt.Sprintf("middleware=%v/pass-on=%v", viaMiddleware, passOn)
			t.Run(key, func(t *testing.T) {
				outer, inner := "outer:"+key, "inner:"+key
				var innerErr error
				innerRan := false
				insert := func(ctx context.Context, order string) error {
					tx, ok := postgres.TxFromContext(ctx)
					if !ok {
						return errors.New("no transaction in the work's context")
					}
					_, err := tx.Exec(ctx, "INSERT INTO "+o.table+" (order_id) VALUES ($1)", order)
					return err
				}
				// body is the outer work: it inserts its row, then calls the
				// helper, and passes its error on or not.
				body := func(ctx context.Context) error {
					if err := insert(ctx, outer); err != nil {
						return err
					}
					_, innerErr = o.store.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
						innerRan = true
						return nil, insert(ctx, inner)
					})
					if passOn {
						return innerErr
					}
					return nil
				}
				var err error
				if viaMiddleware {
					h := o.chain(t, dedup.Config{}, func(msg *message.Message) ([]*message.Message, error) {
						return nil, body(msg.Context())
					})
					_, err = h(delivery(ctx, key))
				} else {
					_, err = e.Do(ctx, dedup.Call{Scope: scope, Key: key}, func(ctx context.Context) ([]byte, error) {
						return o.store.RunInTx(ctx, func(ctx context.Context) ([]byte, error) { return nil, body(ctx) })
					})
				}
				outerWritten := o.count(t, outer) == 1
				switch {
				case err == nil && !outerWritten:
					t.Fatalf("the call returned nil, but the outer row was not written (the nested RunInTx: %v, work ran: %v)", innerErr, innerRan)
				case err != nil && outerWritten:
					t.Fatalf("the call failed (%v), but the outer row was written", err)
				}
				// The nested call is refused before it begins a transaction;
				// the outer one commits its row with the completion, or fails
				// with the refusal and writes nothing.
				if !errors.Is(innerErr, postgres.ErrNestedTx) || innerRan || o.count(t, inner) != 0 {
					t.Fatalf("the nested RunInTx: %v (work ran: %v, inner rows %d); want ErrNestedTx before its work", innerErr, innerRan, o.count(t, inner))
				}
				if passOn != errors.Is(err, postgres.ErrNestedTx) || passOn == outerWritten {
					t.Fatalf("the call: %v, outer row written: %v; want ErrNestedTx and nothing written when the work passes the error on, else nil and the row written", err, outerWritten)
				}
				want := "completed"
				if passOn {
					want = "none" // released: the redelivery runs
				}
				if st := o.state(t, key); st != want {
					t.Fatalf("the record is %s; want %s", st, want)
				}
			})
		}
	}
}
