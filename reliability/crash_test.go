package reliability_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// childRoleEnv, when set, makes the test binary run as a child process in
// that role instead of running tests (see TestMain).
const childRoleEnv = "RELIABILITY_CHILD_ROLE"

// Settings passed to the crash scenario's child consumer.
const (
	childRedisEnv   = "RELIABILITY_CHILD_REDIS"
	childPrefixEnv  = "RELIABILITY_CHILD_PREFIX"
	childLeaseEnv   = "RELIABILITY_CHILD_LEASE"
	childUUIDEnv    = "RELIABILITY_CHILD_UUID"
	childPayloadEnv = "RELIABILITY_CHILD_PAYLOAD"
	childEffectEnv  = "RELIABILITY_CHILD_EFFECT_FIRST"

	// inHandlerLine is what the child prints once its handler runs under
	// the claim.
	inHandlerLine = "IN_HANDLER"
	crashScope    = "charge-orders"
)

func runChild(role string) int {
	switch role {
	case "crash-consumer":
		if err := crashConsumer(); err != nil {
			fmt.Fprintln(os.Stderr, "crash-consumer:", err)
		}
		return 1
	}
	fmt.Fprintf(os.Stderr, "unknown %s %q\n", childRoleEnv, role)
	return 2
}

// crashConsumer is the child: a consumer that claims the message's key in
// Redis (heartbeat on), optionally runs the effect (INCR of the shared
// effect counter), prints inHandlerLine and then hangs, as a handler waiting
// on a slow payment provider would, until the parent kills it.
func crashConsumer() error {
	lease, err := time.ParseDuration(os.Getenv(childLeaseEnv))
	if err != nil {
		return err
	}
	prefix := os.Getenv(childPrefixEnv)
	client := goredis.NewClient(&goredis.Options{Addr: os.Getenv(childRedisEnv)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := redis.New(ctx, redis.Config{Client: client, KeyPrefix: prefix})
	if err != nil {
		return err
	}
	d, err := dedup.New(dedup.Config{Store: store, Key: keyfuncs.JSON("order_id"), Scope: crashScope, Lease: lease})
	if err != nil {
		return err
	}
	effectFirst := os.Getenv(childEffectEnv) == "1"
	h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if effectFirst {
			if err := client.Incr(msg.Context(), prefix+"effects").Err(); err != nil {
				return nil, err
			}
		}
		fmt.Println(inHandlerLine)
		time.Sleep(time.Hour)
		return nil, nil
	})
	_, err = h(message.NewMessage(os.Getenv(childUUIDEnv), []byte(os.Getenv(childPayloadEnv))))
	return fmt.Errorf("the handler returned (%v) instead of hanging", err)
}

// Scenario 3, crash takeover: a consumer in a child process (this test
// binary, re-executed) claims a key in a real redis-server (lease 3s,
// heartbeat on) and is killed with SIGKILL while its handler holds the
// claim. A second consumer in this process gets the redelivered message:
// the broker is simulated by handing it the same message (same UUID and
// payload) every 100ms until it is acked, as SQS does when a visibility
// timeout ends. While the dead consumer's lease is live every redelivery is
// refused with ErrInProgress (nacked, never acked); once Redis expires the
// record, the second consumer takes over and runs the effect.
//
// Killed before its effect, the key's effect happens exactly once. Killed
// after its effect (arm "killed-after-effect"), the effect happens twice:
// the limit no dedup layer can lift, since nothing recorded that the dead
// handler had charged; only an idempotent or transactional effect closes it.
func TestCrashTakeover(t *testing.T) { eachAutoPipeline(t, crashTakeover) }

func crashTakeover(t *testing.T, autoPipeline bool) {
	for _, tc := range []struct {
		name        string
		effectFirst bool
		wantEffects int64
	}{
		{"killed-before-effect", false, 1},
		{"killed-after-effect", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) { runCrashTakeover(t, tc.effectFirst, tc.wantEffects, autoPipeline) })
	}
}

func runCrashTakeover(t *testing.T, effectFirst bool, wantEffects int64, autoPipeline bool) {
	const lease = 3 * time.Second
	ctx := context.Background()
	prefix := uniquePrefix("crash")
	rdb := newRedisClient(t, redisServer.Addr)
	orderID := fmt.Sprintf("ORDER-%d", time.Now().UnixNano())
	payload := fmt.Sprintf(`{"order_id":%q,"amount":150}`, orderID)
	uuid := watermill.NewUUID()
	recordKey := prefix + admin.ScopedKey(crashScope, orderID)
	effectKey := prefix + "effects"

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(),
		childRoleEnv+"=crash-consumer",
		childRedisEnv+"="+redisServer.Addr,
		childPrefixEnv+"="+prefix,
		childLeaseEnv+"="+lease.String(),
		childUUIDEnv+"="+uuid,
		childPayloadEnv+"="+payload,
		childEffectEnv+"="+map[bool]string{true: "1", false: "0"}[effectFirst],
	)
	child.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	child.Stderr = &stderr
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		_ = child.Process.Kill()
	})
	inHandler := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == inHandlerLine {
				close(inHandler)
				break
			}
		}
		for sc.Scan() { // drain
		}
		exited <- child.Wait()
	}()
	select {
	case <-inHandler:
	case err := <-exited:
		t.Fatalf("child exited before its handler ran: %v\n%s", err, stderr.String())
	case <-time.After(time.Minute):
		t.Fatalf("child did not reach its handler within a minute\n%s", stderr.String())
	}

	childRecord, err := rdb.Get(ctx, recordKey).Bytes()
	if err != nil || len(childRecord) < 2 || childRecord[1] != 'P' {
		t.Fatalf("record while the child's handler runs: %q, %v; want an in-progress record", childRecord, err)
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	if err := await(t, waitLimit, "the killed child's exit", exited); err == nil || !isKilled(err) {
		t.Fatalf("child: %v, want killed by SIGKILL", err)
	}

	// The second consumer.
	tl := newTally()
	d := newDedup(t, dedup.Config{
		Store:    newRedisStore(t, newRedisClient(t, redisServer.Addr), prefix, autoPipeline),
		Key:      keyfuncs.JSON("order_id"),
		Scope:    crashScope,
		Lease:    lease,
		Observer: tl,
	})
	h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		return nil, rdb.Incr(msg.Context(), effectKey).Err()
	})
	deliver := func() error {
		_, err := h(message.NewMessage(uuid, []byte(payload)))
		return err
	}
	var refusals, refusalsWhileChildRecordLive int
	var takeover time.Duration
	for attempt := 0; ; attempt++ {
		err := deliver()
		if err == nil {
			takeover = time.Since(killedAt)
			break
		}
		if !errors.Is(err, dedup.ErrInProgress) {
			t.Fatalf("redelivery %d: %v, want ErrInProgress or an ack", attempt, err)
		}
		refusals++
		// The refusal was due to the dead consumer's record: it is still
		// there, unchanged, after the attempt.
		if v, err := rdb.Get(ctx, recordKey).Bytes(); err == nil && bytes.Equal(v, childRecord) {
			refusalsWhileChildRecordLive++
		}
		if time.Since(killedAt) > time.Minute {
			t.Fatalf("no takeover a minute after the kill (lease %v)", lease)
		}
		time.Sleep(100 * time.Millisecond) // the simulated broker's redelivery delay
	}
	// One more copy, now a duplicate: acked, no effect.
	if err := deliver(); err != nil {
		t.Fatalf("copy after the takeover: %v, want an ack", err)
	}
	effects, err := rdb.Get(ctx, effectKey).Int64()
	if err != nil && !errors.Is(err, goredis.Nil) {
		t.Fatal(err)
	}
	final, _ := rdb.Get(ctx, recordKey).Bytes()
	state := "absent"
	if len(final) > 0 {
		state = map[byte]string{'P': "in_progress", 'C': "completed"}[redisRecordState(final)]
	}
	figures(t, "crash-takeover/"+map[bool]string{true: "killed-after-effect", false: "killed-before-effect"}[effectFirst],
		"lease", lease, "redeliveries_refused_in_progress", refusals,
		"refused_while_dead_consumers_record_live", refusalsWhileChildRecordLive,
		"takeover_after_kill", takeover.Round(10*time.Millisecond), "effects", effects,
		"duplicates_acked_after", tl.event("skip_duplicate"), "record", state)

	if refusals == 0 || refusalsWhileChildRecordLive == 0 {
		t.Errorf("%d refusals (%d while the dead consumer's record was live): the redelivery was never refused", refusals, refusalsWhileChildRecordLive)
	}
	if effects != wantEffects {
		t.Errorf("effects = %d, want %d", effects, wantEffects)
	}
	if state != "completed" {
		t.Errorf("record after the takeover: %s, want completed", state)
	}
	if n := tl.event("claim_won"); n != 1 {
		t.Errorf("the second consumer won %d claims, want 1", n)
	}
}

func isKilled(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}
