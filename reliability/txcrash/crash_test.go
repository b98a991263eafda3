// Package txcrash proves by crashing that the stores' effect-in-transaction
// helpers (redis RunInTx/TxMiddleware, dynamo RunInTx) leave no window
// between a handler's effect and its record: a consumer process is killed
// with SIGKILL at random points of its work while it handles 1,000 keys
// (500 on moto), every message is delivered again until each is done, and
// the effects are counted in the store. With the helper no key's effect is
// doubled or lost; without it (the effect written by the handler, the
// record completed after), some keys' effects are doubled.
package txcrash

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/internal/keys"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/crashtest"
)

// Settings of a run, passed to the child in its environment.
const (
	envAddr   = "TXCRASH_ADDR"    // the server: host:port(s) or endpoint
	envHelper = "TXCRASH_HELPER"  // "1": the effect in the record's transaction
	envKeys   = "TXCRASH_KEYS"    // how many keys
	envKillAt = "TXCRASH_KILL_AT" // the child reports "kill" when this many messages are handled
	envRun    = "TXCRASH_RUN"     // the run's id, in its keys' and tables' names
)

const (
	scope = "charge"
	// lease of every claim: a killed child's claims block their keys this
	// long (plus the DynamoDB store's clock-skew margin).
	lease = time.Second
	// workers handle messages at once in a child, so that a kill finds
	// several between their effect and its record.
	workers = 8
	// helperKills is how many times a run with the helper kills a child;
	// maxKills bounds the kills of a run without it, which stops at the
	// first that leaves an effect without its record.
	helperKills = 30
	maxKills    = 300
)

// keyName is the business key of message i.
func keyName(i int) string { return "order-" + strconv.Itoa(i) }

// consumer is a child's side of a store: handle delivers message i once
// (its error: not done yet, deliver again).
type consumer interface {
	handle(ctx context.Context, i int) error
}

// backend is the parent's side of a store.
type backend struct {
	name string
	env  []string // the child's settings but those run adds
	keys int
	// effects returns how many times each key's effect was applied.
	effects func(t *testing.T) []int
	// store lists the records (admin).
	store admin.Interface
}

// runIDs holds each running test's id (parent side).
var runIDs sync.Map // *testing.T → string

// runID is the id of the test's run, in the names of its keys and tables
// (runName): each run of a test (-count) starts from none. The parent
// makes it; its children read it from their environment.
func runID(t *testing.T) string {
	if crashtest.IsChild(t) {
		return os.Getenv(envRun)
	}
	v, loaded := runIDs.LoadOrStore(t, strconv.FormatUint(uint64(rand.Uint32()), 36))
	if !loaded {
		t.Cleanup(func() { runIDs.Delete(t) })
	}
	return v.(string)
}

// runName is the test's name and its run's id.
func runName(t *testing.T) string { return t.Name() + "-" + runID(t) }

// runChild is the child: it delivers every message that is not done yet,
// again and again (a key another child left in progress is refused until
// its lease ends), with workers at once, then reports "done" and waits to
// be killed. When killAt messages (counted as they return) are handled it
// reports "kill" and goes on: the parent's SIGKILL lands while the other
// workers are anywhere in their message.
func runChild(c consumer, keys, killAt int) {
	crashtest.Say("ready", "")
	ctx := context.Background()
	var handled atomic.Int64
	pending := rand.Perm(keys)
	for len(pending) > 0 {
		var (
			mu    sync.Mutex
			again []int
			wg    sync.WaitGroup
			next  = make(chan int)
		)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					err := c.handle(ctx, i)
					if handled.Add(1) == int64(killAt) {
						crashtest.Say("kill", "")
					}
					if err != nil {
						mu.Lock()
						again = append(again, i)
						mu.Unlock()
					}
				}
			}()
		}
		for _, i := range pending {
			next <- i
		}
		close(next)
		wg.Wait()
		pending = again
		if len(pending) > 0 {
			time.Sleep(lease / 10) // the keys of a killed child are held until their lease ends
		}
	}
	crashtest.Reach("done")
}

// result is what a run found.
type result struct {
	kills, interrupted, doubled, lost, orphans int
}

// run kills children of this test, each after a random number of handled
// messages (withHelper: helperKills times; without: until a kill has left
// an effect without its record, which redelivery then repeats, at most
// maxKills), then delivers every message once more in a last child that
// is not killed, and counts each key's effects. A child is killed at a
// point of its work, not after a time: a fast machine finishes every key
// before any delay worth waiting, and the run would prove nothing.
func run(t *testing.T, b backend, withHelper bool) result {
	t.Helper()
	helper := "0"
	if withHelper {
		helper = "1"
	}
	env := append([]string{envHelper + "=" + helper, envKeys + "=" + strconv.Itoa(b.keys), envRun + "=" + runID(t)}, b.env...)
	var res result
	limit := maxKills
	if withHelper {
		limit = helperKills
	}
	for res.kills < limit {
		// Within the first half of the child's first pass, which hands
		// every key out once: when the kill lands, at most half of the
		// keys and the workers' messages have been handed out, so no
		// killed child finishes every key and each kill can still find
		// claims to interrupt.
		killAt := 1 + rand.IntN(b.keys/2)
		c := crashtest.Start(t, append(slices.Clip(env), envKillAt+"="+strconv.Itoa(killAt)))
		c.Wait(t, "kill")
		c.Kill(t)
		res.kills++
		if withHelper && res.interrupted > 0 {
			continue // shown that kills interrupt claims; the listing is slow on moto
		}
		inProgress, orphans := b.inspect(t)
		res.interrupted += inProgress
		res.orphans += orphans
		if !withHelper && orphans > 0 {
			break // the limit is shown: redelivery will repeat that effect
		}
	}
	c := crashtest.Start(t, env)
	c.Wait(t, "done")
	c.Kill(t)
	for i, n := range b.effects(t) {
		switch {
		case n == 0:
			res.lost++
			if res.lost <= 5 {
				t.Logf("%s: lost: %s", b.name, keyName(i))
			}
		case n > 1:
			res.doubled++
		}
	}
	t.Logf("FIGURES %s, helper %v: %d keys, %d kills, %d claims found in progress after them, %d effects found without their record after a kill; %d doubled, %d lost",
		b.name, withHelper, b.keys, res.kills, res.interrupted, res.orphans, res.doubled, res.lost)
	return res
}

// inspect counts the records in progress (claims a kill interrupted) and
// the keys whose effect is applied but whose record is not completed
// (orphans: redelivery runs their effect again).
func (b backend) inspect(t *testing.T) (inProgress, orphans int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	completed := map[string]bool{}
	cursor := ""
	for {
		recs, next, err := b.store.List(ctx, admin.ScopePrefix(scope), cursor, admin.MaxListLimit)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		for _, r := range recs {
			switch r.State {
			case admin.StateCompleted:
				completed[r.Key] = true
			case admin.StateInProgress:
				inProgress++
			}
		}
		if next == "" {
			break
		}
		cursor = next
	}
	for i, n := range b.effects(t) {
		if n > 0 && !completed[keys.Scoped(scope, keyName(i))] {
			orphans++
		}
	}
	return inProgress, orphans
}

// checkHelper runs the scenario with the helper: no effect doubled, none
// lost.
func checkHelper(t *testing.T, b backend) {
	t.Helper()
	r := run(t, b, true)
	if r.doubled != 0 || r.lost != 0 {
		t.Fatalf("with the helper: %d keys doubled, %d lost; want none", r.doubled, r.lost)
	}
	if r.interrupted == 0 {
		t.Fatalf("no kill interrupted a claim: the run proves nothing")
	}
}

// checkWithout runs the scenario without the helper: a kill between the
// effect and the record's completion doubles the effect.
func checkWithout(t *testing.T, b backend) {
	t.Helper()
	r := run(t, b, false)
	if r.doubled == 0 {
		t.Fatalf("without the helper, after %d kills: no key doubled; want the doubles of the window between effect and record", r.kills)
	}
	if r.lost != 0 {
		t.Fatalf("without the helper: %d keys lost; want none", r.lost)
	}
}

// childMain runs the child of the running test when this process is one.
func childMain(t *testing.T, newConsumer func(addr string, helper bool) (consumer, error)) bool {
	if !crashtest.IsChild(t) {
		return false
	}
	keys, err := strconv.Atoi(os.Getenv(envKeys))
	if err != nil {
		t.Fatal(err)
	}
	killAt, _ := strconv.Atoi(os.Getenv(envKillAt)) // 0 (unset): the last child, never killed midway
	c, err := newConsumer(os.Getenv(envAddr), os.Getenv(envHelper) == "1")
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		t.Fatal(err)
	}
	runChild(c, keys, killAt)
	return true
}
