// Package fencing shows, on real stores, what a fence does that a lease
// cannot (docs/fencing.md): consumer A claims an order and freezes before
// its effect, past its lease; consumer B takes the order over and charges
// it with its fence; A wakes and charges too. The downstream, a PostgreSQL
// charges table that keeps the largest fence it accepted per order and
// refuses a smaller one, refuses A's charge: the order is charged once.
// The same run against the same table written without the fence condition
// charges it twice: the lease alone does not stop A.
//
// On Redis, DynamoDB (moto) and PostgreSQL, A is a child process stopped
// with SIGSTOP (its heartbeat frozen with it) and resumed with SIGCONT; on
// the memory store, which no two processes share, A is an engine of this
// process whose handler blocks and whose heartbeat cannot reach the store.
// Leases end by the stores' own clocks, in real time.
package fencing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/crashtest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/pgtest"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

const (
	scope  = "charge-orders"
	order  = "ORDER-003"
	amount = 150
	// lease of both consumers' claims: A freezes right after its claim,
	// and B takes the order over once the store finds the lease ended.
	lease = 2 * time.Second
	// takeoverWait bounds B's wait for A's lease to end (the store's
	// clock; DynamoDB adds its ClockSkewMargin).
	takeoverWait = 10 * time.Second
)

// errStale is what a consumer's handler returns when the downstream
// refused its write: a later claim's fence is there, this claim is lost.
// Wrapping dedup.ErrClaimLost, it nacks the message (the successor's
// completion makes the redelivery a duplicate), never poisons it.
var errStale = fmt.Errorf("the downstream holds a larger fence: %w", dedup.ErrClaimLost)

// downstream is the charges table: one row per order, the fence of the
// write that set it, and how many writes it accepted (each one a charge:
// a payment sent).
type downstream struct {
	pool    *pgxpool.Pool
	table   string // schema-qualified, quoted
	checked bool   // the write carries the fence condition
}

// create makes the table.
func (d downstream) create(ctx context.Context) error {
	_, err := d.pool.Exec(ctx, "CREATE TABLE "+d.table+` (
		order_id      text PRIMARY KEY,
		amount        bigint NOT NULL,
		fence         bigint NOT NULL,
		charged_by    text NOT NULL,
		times_charged int NOT NULL)`)
	return err
}

// charge writes the charge of order by consumer with fence, and reports
// whether the table accepted it. Checked, it is refused when the row holds
// a larger fence: the condition docs/fencing.md gives.
func (d downstream) charge(ctx context.Context, fence uint64, by string) (bool, error) {
	q := "INSERT INTO " + d.table + ` AS c (order_id, amount, fence, charged_by, times_charged)
		VALUES ($1, $2, $3, $4, 1)
		ON CONFLICT (order_id) DO UPDATE
		SET amount = EXCLUDED.amount, fence = EXCLUDED.fence, charged_by = EXCLUDED.charged_by,
		    times_charged = c.times_charged + 1`
	if d.checked {
		q += " WHERE c.fence <= EXCLUDED.fence"
	}
	tag, err := d.pool.Exec(ctx, q, order, amount, int64(fence), by)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// row is the order's row.
type row struct {
	fence uint64
	by    string
	times int
}

func (d downstream) read(ctx context.Context) (row, error) {
	var r row
	var fence int64
	err := d.pool.QueryRow(ctx, "SELECT fence, charged_by, times_charged FROM "+d.table+" WHERE order_id = $1", order).
		Scan(&fence, &r.by, &r.times)
	r.fence = uint64(fence)
	return r, err
}

// chargeOrder is both consumers' work: charge the order with the claim's
// fence; a refused charge is errStale.
func chargeOrder(ctx context.Context, d downstream, by string) (accepted bool, err error) {
	fence, _ := dedup.FenceFromContext(ctx) // 0 where the store does not fence: the checks below say so
	accepted, err = d.charge(ctx, fence, by)
	if err == nil && !accepted {
		err = fmt.Errorf("charging %s with fence %d: %w", order, fence, errStale)
	}
	return accepted, err
}

// consumerA is A's handler, through the dedup middleware: it reads its
// fence, pauses (pause blocks until A is awake again, past its lease),
// then charges. The charge is sent on a context the engine's cancellation
// does not reach: a request already on its way when the process froze, or
// one sent right after the wake-up before the engine's lease timer has run
// (the engine cancels the work at the lease deadline, but a frozen process
// runs no timer): the fence must stop it, whatever that race gives.
func consumerA(store dedup.Store, d downstream, pause func(fence uint64), told func(accepted bool)) (func(*message.Message) ([]*message.Message, error), error) {
	dd, err := dedup.New(dedup.Config{Store: store, Scope: scope, Key: keyfuncs.Metadata("order_id"), Lease: lease})
	if err != nil {
		return nil, err
	}
	return dd.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		fence, _ := dedup.FenceFromContext(ctx)
		pause(fence)
		accepted, err := chargeOrder(context.WithoutCancel(ctx), d, "A")
		told(accepted)
		return nil, err
	}), nil
}

// orderMessage is the message both consumers get (a redelivery: the same
// business key).
func orderMessage() *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":150}`))
	msg.Metadata.Set("order_id", order)
	return msg
}

// takeOver is B: it waits until A's lease ends (by the store's clock),
// takes the order over and charges it with its own fence.
func takeOver(t *testing.T, store dedup.Store, d downstream) dedup.ClaimResult {
	t.Helper()
	e, err := dedup.NewEngine(dedup.Config{Store: store, Scope: scope, Lease: lease,
		InProgressWait: takeoverWait, InProgressPoll: 50 * time.Millisecond, InProgressFallback: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*takeoverWait)
	defer cancel()
	res, err := e.Do(ctx, dedup.Call{Key: order}, func(ctx context.Context) ([]byte, error) {
		_, err := chargeOrder(ctx, d, "B")
		return nil, err
	})
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("B, the successor: %v, %v; want Acquired and its charge accepted", res.Outcome, err)
	}
	return res
}

// checkFences fails the test unless A's and B's claims carry fences, B's
// the larger.
func checkFences(t *testing.T, fenceA, fenceB uint64) {
	t.Helper()
	if fenceA == 0 || fenceB == 0 {
		t.Fatalf("the store returned fence 0: it does not fence (A's claim: fence %d, B's: %d)", fenceA, fenceB)
	}
	if fenceB <= fenceA {
		t.Fatalf("B's claim, which took the order over from A's, has fence %d, not larger than A's %d", fenceB, fenceA)
	}
}

// checkOutcome checks the table after A's late charge: checked, A was
// refused and the order charged once, by B, with B's fence; unchecked, A
// was accepted and the order charged twice.
func checkOutcome(t *testing.T, d downstream, storeName string, aAccepted bool, fenceA, fenceB uint64, frozen time.Duration) {
	t.Helper()
	r, err := d.read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURES %s, fence checked %v: A (fence %d) frozen %v past its claim; B (fence %d) took over and charged; A's late charge accepted %v; the order charged %d time(s), last by %s (fence %d)",
		storeName, d.checked, fenceA, frozen.Round(time.Millisecond), fenceB, aAccepted, r.times, r.by, r.fence)
	if d.checked {
		if aAccepted || r.times != 1 || r.by != "B" || r.fence != fenceB {
			t.Fatalf("with the fence checked: A's late charge accepted %v, the order charged %d time(s), last by %s with fence %d; want A refused, 1 charge, by B with fence %d",
				aAccepted, r.times, r.by, r.fence, fenceB)
		}
		return
	}
	if !aAccepted || r.times != 2 || r.by != "A" {
		t.Fatalf("without the fence check: A's late charge accepted %v, the order charged %d time(s), last by %s; want A accepted and 2 charges (the double charge a lease cannot stop)",
			aAccepted, r.times, r.by)
	}
}

func TestFencingRefusesPausedHolder(t *testing.T) {
	for _, storeName := range []string{"memory", "redis", "dynamo", "postgres"} {
		t.Run(storeName, func(t *testing.T) {
			for _, checked := range []bool{true, false} {
				name := "fence-checked"
				if !checked {
					name = "no-fence-check"
				}
				t.Run(name, func(t *testing.T) {
					if crashtest.IsChild(t) {
						runChild(t)
						return
					}
					if storeName == "memory" {
						inProcess(t, checked)
						return
					}
					withChild(t, storeName, checked)
				})
			}
		})
	}
}

// openDownstream makes the test's schema and charges table (the parent's
// job).
func openDownstream(t *testing.T, checked bool) (downstream, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, pgDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	schema := pgtest.Schema(t, pool.Exec, "fencing_")
	d := downstream{pool: pool, table: pgx.Identifier{schema, "charges"}.Sanitize(), checked: checked}
	if err := d.create(ctx); err != nil {
		t.Fatal(err)
	}
	return d, schema
}

// inProcess runs the scenario on the memory store: A is an engine of this
// process whose handler blocks on a channel, and whose heartbeat's
// extensions do not reach the store until A is awake again (a frozen
// process sends nothing).
func inProcess(t *testing.T, checked bool) {
	d, _ := openDownstream(t, checked)
	store, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	awake := make(chan struct{})
	held := make(chan uint64, 1)
	var aAccepted bool
	hA, err := consumerA(&frozenExtend{Store: store, awake: awake}, d,
		func(fence uint64) {
			held <- fence
			<-awake
		},
		func(accepted bool) { aAccepted = accepted })
	if err != nil {
		t.Fatal(err)
	}
	aDone := make(chan error, 1)
	go func() {
		_, err := hA(orderMessage())
		aDone <- err
	}()
	fenceA := <-held
	frozenAt := time.Now()
	if checked && fenceA == 0 {
		close(awake)
		t.Fatalf("the store returned fence 0: it does not fence")
	}
	res := takeOver(t, store, d)
	close(awake)
	errA := <-aDone
	frozen := time.Since(frozenAt)
	checkA(t, errA, aAccepted)
	if checked {
		checkFences(t, fenceA, res.Claim.Fence)
	}
	checkOutcome(t, d, "memory (in process)", aAccepted, fenceA, res.Claim.Fence, frozen)
}

// frozenExtend is A's view of the store while A is frozen: its heartbeat's
// extensions wait until A is awake again (or their context, bounded by the
// lease deadline, ends).
type frozenExtend struct {
	dedup.Store
	awake <-chan struct{}
}

func (f *frozenExtend) Extend(ctx context.Context, claim dedup.Claim, lease time.Duration) error {
	select {
	case <-f.awake:
		return f.Store.Extend(ctx, claim, lease)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// checkA checks what A's middleware returned: refused, an error matching
// dedup.ErrClaimLost (the message is nacked, and found a duplicate on
// redelivery); accepted, nothing (its Complete, refused, is only logged).
func checkA(t *testing.T, err error, accepted bool) {
	t.Helper()
	switch {
	case !accepted && !errors.Is(err, dedup.ErrClaimLost):
		t.Errorf("A's middleware returned %v after its charge was refused; want an error matching dedup.ErrClaimLost", err)
	case accepted && err != nil:
		t.Errorf("A's middleware returned %v after its charge was accepted; want nil", err)
	}
}

// withChild runs the scenario with A in a child process, stopped with
// SIGSTOP right after its claim and resumed with SIGCONT once B charged.
func withChild(t *testing.T, storeName string, checked bool) {
	if storeName == "dynamo" && motoSkip != nil {
		t.Skip(motoSkip)
	}
	d, schema := openDownstream(t, checked)
	ns, addr := schema, pgDSN
	switch storeName {
	case "redis":
		ns, addr = schema+":", redisAddr
	case "dynamo":
		addr = motoEndpoint
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := dynamo.CreateTable(ctx, dynamoClient(addr), dynamo.TableConfig{Table: ns}); err != nil {
			t.Fatal(err)
		}
	}
	store := openStore(t, storeName, addr, ns, true)
	env := []string{envStore + "=" + storeName, envAddr + "=" + addr, envNamespace + "=" + ns,
		envDSN + "=" + pgDSN, envCharges + "=" + d.table, envChecked + "=" + strconv.FormatBool(checked)}
	child := crashtest.Start(t, env)
	fenceA, err := strconv.ParseUint(child.Wait(t, "held"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	child.WaitStopped(t)
	frozenAt := time.Now()
	if checked && fenceA == 0 {
		t.Fatalf("the store returned fence 0: it does not fence")
	}
	res := takeOver(t, store, d)
	child.Continue(t)
	verdict := child.Wait(t, "charge")
	done := child.Wait(t, "done")
	frozen := time.Since(frozenAt)
	aAccepted := verdict == "accepted"
	switch {
	case !aAccepted && !strings.HasPrefix(done, "claim-lost"):
		t.Errorf("A's middleware returned %q after its charge was refused; want an error matching dedup.ErrClaimLost", done)
	case aAccepted && done != "nil":
		t.Errorf("A's middleware returned %q after its charge was accepted; want nil", done)
	}
	if checked {
		checkFences(t, fenceA, res.Claim.Fence)
	}
	checkOutcome(t, d, storeName, aAccepted, fenceA, res.Claim.Fence, frozen)
}

// runChild is A in a child process: it claims the order through the dedup
// middleware, reports its fence and stops itself (SIGSTOP) before its
// charge; resumed, it charges and reports what the table said and what
// its middleware returned.
func runChild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv(envDSN))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d := downstream{pool: pool, table: os.Getenv(envCharges), checked: os.Getenv(envChecked) == "true"}
	store := openStore(t, os.Getenv(envStore), os.Getenv(envAddr), os.Getenv(envNamespace), false)
	hA, err := consumerA(store, d,
		func(fence uint64) { crashtest.Pause("held", strconv.FormatUint(fence, 10)) },
		func(accepted bool) {
			crashtest.Say("charge", map[bool]string{true: "accepted", false: "refused"}[accepted])
		})
	if err != nil {
		t.Fatal(err)
	}
	_, err = hA(orderMessage())
	switch {
	case err == nil:
		crashtest.Say("done", "nil")
	case errors.Is(err, dedup.ErrClaimLost):
		crashtest.Say("done", "claim-lost: "+err.Error())
	default:
		crashtest.Say("done", "other: "+err.Error())
	}
}

// openStore opens a network store; create makes its tables where the
// store has a migration (the parent's job).
func openStore(t *testing.T, name, addr, ns string, create bool) dedup.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch name {
	case "redis":
		client := goredis.NewClient(&goredis.Options{Addr: addr})
		t.Cleanup(func() { _ = client.Close() })
		s, err := dedupredis.New(ctx, dedupredis.Config{Client: client, KeyPrefix: ns})
		if err != nil {
			t.Fatal(err)
		}
		return s
	case "dynamo":
		s, err := dynamo.New(ctx, dynamo.Config{Client: dynamoClient(addr), Table: ns, ClockSkewMargin: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return s
	case "postgres":
		pool, err := pgxpool.New(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		s, err := postgres.New(ctx, postgres.Config{DB: pool, Schema: ns})
		if err != nil {
			t.Fatal(err)
		}
		if create {
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return s
	}
	t.Fatalf("no store %q", name)
	return nil
}

// dynamoClient is a client of the endpoint with static credentials.
func dynamoClient(endpoint string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(endpoint),
	})
}
