package redis_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/internal/keys"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// scriptCounter counts the scripts a client runs (EVALSHA and EVAL; not an
// EVALSHA the server answers NOSCRIPT, which go-redis follows with EVAL).
type scriptCounter struct{ n atomic.Int64 }

func (h *scriptCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *scriptCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		if n := cmd.Name(); (n == "evalsha" || n == "eval") && !goredis.HasErrorPrefix(err, "NOSCRIPT") {
			h.n.Add(1)
		}
		return err
	}
}
func (h *scriptCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// replyLoser, armed, sends the next script command (but one answered
// NOSCRIPT) twice and answers the second's reply, as go-redis does when
// the first reply was lost.
type replyLoser struct{ armed atomic.Bool }

func (h *replyLoser) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *replyLoser) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if n := cmd.Name(); (n == "evalsha" || n == "eval") && h.armed.Load() {
			if err := next(ctx, cmd); goredis.HasErrorPrefix(err, "NOSCRIPT") {
				return err
			}
			h.armed.Store(false)
		}
		return next(ctx, cmd)
	}
}
func (h *replyLoser) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

func newTxEngine(t *testing.T, s *redis.Store) *dedup.Engine {
	t.Helper()
	e, err := dedup.NewEngine(dedup.Config{Store: s, Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// charge runs Do with RunInTx queuing INCRBY amount on chargeKey (the
// record's hash tag + ":charge" when chargeKey is empty); it returns the
// queued command.
func charge(ctx context.Context, e *dedup.Engine, s *redis.Store, key, chargeKey string, amount int, before func(ctx context.Context) error) (*goredis.Cmd, dedup.ClaimResult, error) {
	var cmd *goredis.Cmd
	res, err := e.Do(ctx, dedup.Call{Scope: "tx", Key: key}, func(ctx context.Context) ([]byte, error) {
		return s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
			tx, ok := redis.TxFromContext(ctx)
			if !ok {
				return nil, errors.New("no Tx in the work's context")
			}
			if before != nil {
				if err := before(ctx); err != nil {
					return nil, err
				}
			}
			k := chargeKey
			if k == "" {
				k = tx.HashTag() + ":charge"
			}
			var err error
			cmd, err = tx.Queue([]string{k}, "incrby", k, amount)
			return []byte("receipt"), err
		})
	})
	return cmd, res, err
}

func TestRunInTx(t *testing.T) {
	ctx := context.Background()
	client := newClient(t)
	scripts := &scriptCounter{}
	client.AddHook(scripts)
	s := newStore(t, client, redis.Config{KeyPrefix: "tx-test:"})
	e := newTxEngine(t, s)

	t.Run("commit", func(t *testing.T) {
		n0 := scripts.n.Load()
		cmd, res, err := charge(ctx, e, s, "commit", "tx-test-charge:commit", 42, nil)
		if err != nil || res.Outcome != dedup.Acquired || string(res.Result) != "receipt" {
			t.Fatalf("Do: %v, %v, %q", res.Outcome, err, res.Result)
		}
		if v, err := cmd.Int64(); v != 42 || err != nil {
			t.Fatalf("the queued INCRBY replied %d, %v; want 42", v, err)
		}
		if n := scripts.n.Load() - n0; n != 1 {
			t.Fatalf("%d scripts run; want 1 (the engine must not complete again)", n)
		}
		if v, _ := client.Get(ctx, "tx-test-charge:commit").Int(); v != 42 {
			t.Fatalf("charge = %d; want 42", v)
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
		cmd, _, err := charge(ctx, e, s, "lost", "tx-test-charge:lost", 7, func(ctx context.Context) error {
			// Another consumer takes the record over meanwhile.
			key := keys.Scoped("tx", "lost")
			if _, err := s.Evict(ctx, key); err != nil {
				return err
			}
			if r, err := s.Claim(ctx, key, "", time.Minute); err != nil || r.Outcome != dedup.Acquired {
				return fmt.Errorf("the other claim: %v, %v", r.Outcome, err)
			}
			return nil
		})
		if !errors.Is(err, dedup.ErrClaimLost) || !errors.Is(err, redis.ErrNotOwner) {
			t.Fatalf("Do: %v; want ErrClaimLost, ErrNotOwner", err)
		}
		if cmd.Err() == nil {
			t.Fatalf("the queued command has a reply although it did not run")
		}
		if n, _ := client.Exists(ctx, "tx-test-charge:lost").Result(); n != 0 {
			t.Fatalf("the charge was written although the claim was lost")
		}
	})

	t.Run("command-refused", func(t *testing.T) {
		if err := client.HSet(ctx, "tx-test-hash", "f", "v").Err(); err != nil {
			t.Fatal(err)
		}
		var ok *goredis.Cmd
		_, err := e.Do(ctx, dedup.Call{Scope: "tx", Key: "refused"}, func(ctx context.Context) ([]byte, error) {
			return s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
				tx, _ := redis.TxFromContext(ctx)
				if _, err := tx.Queue([]string{"tx-test-hash"}, "incr", "tx-test-hash"); err != nil {
					return nil, err
				}
				var err error
				ok, err = tx.Queue([]string{"tx-test-charge:refused"}, "incr", "tx-test-charge:refused")
				return nil, err
			})
		})
		var ce *redis.CommandError
		if !errors.Is(err, redis.ErrCommandFailed) || !errors.As(err, &ce) || ce.Index != 0 {
			t.Fatalf("Do: %v; want a *CommandError for command 0", err)
		}
		if v, err := ok.Int64(); v != 1 || err != nil {
			t.Fatalf("the other command replied %d, %v; want 1", v, err)
		}
		res, err := e.Do(ctx, dedup.Call{Scope: "tx", Key: "refused"}, func(context.Context) ([]byte, error) { return nil, nil })
		if err != nil || res.Outcome != dedup.Duplicate {
			t.Fatalf("second Do: %v, %v; want a duplicate (completed with the commands that ran)", res.Outcome, err)
		}
	})

	t.Run("refused-before-sending", func(t *testing.T) {
		_, err := e.Do(ctx, dedup.Call{Scope: "tx", Key: "record"}, func(ctx context.Context) ([]byte, error) {
			return s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
				tx, _ := redis.TxFromContext(ctx)
				if _, err := tx.Queue(nil); !errors.Is(err, redis.ErrTxKey) {
					return nil, fmt.Errorf("an empty command: %v; want ErrTxKey", err)
				}
				k := s.RedisKey(keys.Scoped("tx", "record"))
				_, err := tx.Queue([]string{k}, "del", k)
				return nil, err
			})
		})
		if !errors.Is(err, redis.ErrTxKey) {
			t.Fatalf("Do: %v; want ErrTxKey for the record's own key", err)
		}
	})

	// The script ran but its reply was lost, and go-redis sent it again:
	// the second run finds the record completed by this claim and runs
	// nothing, which RunInTx takes for the first run's success.
	t.Run("reply-lost", func(t *testing.T) {
		lostClient := newClient(t)
		lost := &replyLoser{}
		lostClient.AddHook(lost)
		ls := newStore(t, lostClient, redis.Config{KeyPrefix: "tx-test:"})
		lost.armed.Store(true)
		cmd, res, err := charge(ctx, newTxEngine(t, ls), ls, "reply-lost", "tx-test-charge:reply-lost", 4, nil)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("Do: %v, %v; want success (the first run completed)", res.Outcome, err)
		}
		if lost.armed.Load() {
			t.Fatal("no script was sent twice")
		}
		if cmd.Err() == nil {
			t.Fatalf("the command's reply %v was set; want it unknown (lost)", cmd.Val())
		}
		if v, _ := client.Get(ctx, "tx-test-charge:reply-lost").Int(); v != 4 {
			t.Fatalf("charge = %d; want 4 (run once)", v)
		}
	})

	t.Run("no-claim", func(t *testing.T) {
		ran := false
		_, err := s.RunInTx(ctx, func(context.Context) ([]byte, error) { ran = true; return nil, nil })
		if !errors.Is(err, redis.ErrNoClaim) || ran {
			t.Fatalf("RunInTx without a claim: %v (work ran: %v); want ErrNoClaim before work", err, ran)
		}
	})
}

// On a Cluster the handler's keys must share the record's slot: a key with
// the record's hash tag runs with the completion, any other is refused
// before anything is sent.
func TestRunInTxCluster(t *testing.T) {
	cluster, err := testserver.StartRedisCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Close() })
	client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cluster.Addrs})
	t.Cleanup(func() { _ = client.Close() })
	s := newStore(t, client, redis.Config{})
	e := newTxEngine(t, s)
	ctx := context.Background()
	t.Run("hash-tags", func(t *testing.T) { testHashTagsOnCluster(t, cluster, client) })
	t.Run("nested", func(t *testing.T) { testNestedRunInTx(t, client, s) })

	for _, key := range []string{"order-1", "{account-7}:payment-9"} {
		cmd, res, err := charge(ctx, e, s, key, "", 5, nil)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("Do %q: %v, %v", key, res.Outcome, err)
		}
		if v, err := cmd.Int64(); v != 5 || err != nil {
			t.Fatalf("INCRBY of %q replied %d, %v", key, v, err)
		}
	}
	if v, err := client.Get(ctx, "{account-7}:charge").Int(); v != 5 || err != nil {
		t.Fatalf("the account's charge = %d, %v; want 5 (the business key's own hash tag)", v, err)
	}
	_, _, err = charge(ctx, e, s, "order-2", "charges:order-2", 5, nil)
	if !errors.Is(err, redis.ErrCrossSlot) {
		t.Fatalf("a key of another slot: %v; want ErrCrossSlot", err)
	}
	if n, _ := client.Exists(ctx, "charges:order-2").Result(); n != 0 {
		t.Fatalf("the key of another slot was written")
	}
	var slots []int64
	for _, k := range []string{"{account-7}:charge", s.RedisKey(keys.Scoped("tx", "{account-7}:payment-9"))} {
		n, err := client.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, n)
	}
	if slots[0] != slots[1] {
		t.Fatalf("slots %v: the account's key and its record are not together", slots)
	}
}

// testHashTagsOnCluster: the server's CLUSTER KEYSLOT agrees with the
// store's slots, and a key beginning with Tx.HashTag is in its record's
// slot, for records with braces anywhere; RunInTx and TxMiddleware write
// such keys with the completion.
func testHashTagsOnCluster(t *testing.T, cluster *testserver.RedisCluster, client *goredis.ClusterClient) {
	ctx := context.Background()
	node := goredis.NewClient(&goredis.Options{Addr: cluster.Addrs[0]})
	t.Cleanup(func() { _ = node.Close() })
	records := redis.TrickyRecordKeys()
	p := node.Pipeline()
	slots := make([][2]*goredis.IntCmd, len(records))
	for i, r := range records {
		slots[i] = [2]*goredis.IntCmd{p.ClusterKeySlot(ctx, r), p.ClusterKeySlot(ctx, redis.HashTagOf(r)+":charge")}
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for i, r := range records {
		own := redis.KeySlot(r)
		if got := slots[i][0].Val(); got != int64(own) {
			t.Errorf("CLUSTER KEYSLOT %q = %d; the store computes %d", r, got, own)
		}
		if got := slots[i][1].Val(); got != int64(own) {
			t.Errorf("CLUSTER KEYSLOT %q = %d; want the record's slot %d", redis.HashTagOf(r)+":charge", got, own)
		}
	}

	for _, prefix := range []string{"dedup-braces:", "x}{y}:"} {
		s := newStore(t, client, redis.Config{KeyPrefix: prefix})
		e := newTxEngine(t, s)
		for _, key := range []string{"a}b", "{x}y", "{}x", "x}y{z}", "}{"} {
			var written string
			res, err := e.Do(ctx, dedup.Call{Scope: "tx", Key: key}, func(ctx context.Context) ([]byte, error) {
				return s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
					tx, _ := redis.TxFromContext(ctx)
					written = tx.HashTag() + ":paid:" + key
					_, err := tx.Queue([]string{written}, "set", written, key)
					return nil, err
				})
			})
			if err != nil || res.Outcome != dedup.Acquired {
				t.Fatalf("prefix %q, key %q: Do: %v, %v; want the command written with the completion", prefix, key, res.Outcome, err)
			}
			if v, err := client.Get(ctx, written).Result(); v != key || err != nil {
				t.Fatalf("prefix %q: %q = %q, %v; want %q", prefix, written, v, err, key)
			}
		}

		// TxMiddleware: the handler queues a command on tx.HashTag()+":x".
		d, err := dedup.New(dedup.Config{Store: s, Scope: "mw", Lease: time.Minute, Retention: time.Hour,
			Key: func(msg *message.Message) (string, error) { return msg.Metadata.Get("key"), nil }})
		if err != nil {
			t.Fatal(err)
		}
		var written string
		h := d.Middleware(s.TxMiddleware(func(msg *message.Message) ([]*message.Message, error) {
			tx, ok := redis.TxFromContext(msg.Context())
			if !ok {
				return nil, errors.New("no Tx in the handler's context")
			}
			written = tx.HashTag() + ":x"
			_, err := tx.Queue([]string{written}, "set", written, "done")
			return nil, err
		}))
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set("key", "{}a}b{")
		msg.SetContext(ctx)
		if _, err := h(msg); err != nil {
			t.Fatalf("prefix %q: TxMiddleware: %v; want the command written with the completion", prefix, err)
		}
		if v, err := client.Get(ctx, written).Result(); v != "done" || err != nil {
			t.Fatalf("prefix %q: %q = %q, %v; want done", prefix, written, v, err)
		}
		r, err := s.Inspect(ctx, keys.Scoped("mw", "{}a}b{"))
		if err != nil || r.State != admin.StateCompleted {
			t.Fatalf("prefix %q: the record: %+v, %v; want completed", prefix, r, err)
		}
	}
}

// testNestedRunInTx: a RunInTx inside the RunInTx, or the TxMiddleware, of
// the same claim (a helper that opens its own). The outer commands are
// written with the completion, or the call fails; never a nil error with
// the outer commands missing.
func testNestedRunInTx(t *testing.T, client goredis.UniversalClient, s *redis.Store) {
	ctx := context.Background()
	e := newTxEngine(t, s)
	d, err := dedup.New(dedup.Config{Store: s, Scope: "nested", Lease: time.Minute, Retention: time.Hour,
		Key: func(msg *message.Message) (string, error) { return msg.Metadata.Get("key"), nil }})
	if err != nil {
		t.Fatal(err)
	}
	for _, viaMiddleware := range []bool{false, true} {
		for _, passOn := range []bool{false, true} {
			key := fmt.Sprintf("middleware=%v/pass-on=%v", viaMiddleware, passOn)
			t.Run(key, func(t *testing.T) {
				var outer, inner string
				var innerErr error
				innerRan := false
				// body is the outer work: it queues its command, then calls
				// the helper, and passes its error on or not.
				body := func(ctx context.Context) error {
					tx, ok := redis.TxFromContext(ctx)
					if !ok {
						return errors.New("no Tx in the work's context")
					}
					outer = tx.HashTag() + ":outer"
					if _, err := tx.Queue([]string{outer}, "set", outer, "written"); err != nil {
						return err
					}
					_, innerErr = s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
						innerRan = true
						tx, _ := redis.TxFromContext(ctx)
						inner = tx.HashTag() + ":inner"
						_, err := tx.Queue([]string{inner}, "set", inner, "written")
						return nil, err
					})
					if passOn {
						return innerErr
					}
					return nil
				}
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
				n, xerr := client.Exists(ctx, outer).Result()
				if xerr != nil {
					t.Fatal(xerr)
				}
				outerWritten := n == 1
				switch {
				case err == nil && !outerWritten:
					t.Fatalf("the call returned nil, but the outer command %q was not written (the nested RunInTx: %v, work ran: %v)", outer, innerErr, innerRan)
				case err != nil && outerWritten:
					t.Fatalf("the call failed (%v), but the outer command was written", err)
				}
				// The nested call is refused before its work runs; the
				// outer one writes its command with the completion, or
				// fails with the refusal and writes nothing.
				if !errors.Is(innerErr, redis.ErrNestedTx) || innerRan {
					t.Fatalf("the nested RunInTx: %v (work ran: %v); want ErrNestedTx before its work", innerErr, innerRan)
				}
				if passOn != errors.Is(err, redis.ErrNestedTx) || passOn == outerWritten {
					t.Fatalf("the call: %v, outer command written: %v; want ErrNestedTx and nothing written when the work passes the error on, else nil and the command written", err, outerWritten)
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
