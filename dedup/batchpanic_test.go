package dedup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// batchPanicRun is one batch of a panic case: its clock and store, the
// works that ran, and the panic injected into what the engine calls (an
// Observer, a Logger, the store).
type batchPanicRun struct {
	clock *fakeclock.Clock
	mem   *memory.Store
	value error // the injected panic's value

	fired  atomic.Bool // the injected panic happened
	armed  atomic.Bool // a's work returned: its completion is due
	turned chan struct{}
	once   sync.Once

	mu  sync.Mutex
	ran map[string]int // key → how many times its work ran
}

func newBatchPanicRun(name string) *batchPanicRun {
	clock := fakeclock.New(batchEpoch)
	return &batchPanicRun{clock: clock, mem: memstore.New(clock), value: fmt.Errorf("injected panic (%s)", name),
		turned: make(chan struct{}), ran: map[string]int{}}
}

// inject panics with the run's value, once: the engine's next calls of
// the same hook return normally.
func (r *batchPanicRun) inject() {
	if r.fired.CompareAndSwap(false, true) {
		panic(r.value)
	}
}

// copyTurned notes that the copy (call m2 of the copy case) took its
// turn: it claimed, or the engine decided it.
func (r *batchPanicRun) copyTurned() { r.once.Do(func() { close(r.turned) }) }

// work is the batch's work: it counts the runs of each key and arms the
// run's hooks once a's work returns. The work of call m1 (the copy case's
// first call of k) runs until its copy took its turn, so that the copy
// finds it running.
func (r *batchPanicRun) work(b []dedup.BatchCall) func(context.Context, int) ([]byte, error) {
	return func(_ context.Context, i int) ([]byte, error) {
		key := b[i].Key
		r.mu.Lock()
		r.ran[key]++
		r.mu.Unlock()
		if b[i].MessageUUID == "m1" && key == "k" {
			select {
			case <-r.turned:
			case <-time.After(realTimeBound):
			}
		}
		if key == "a" {
			r.armed.Store(true)
		}
		return []byte(key + " done"), nil
	}
}

func (r *batchPanicRun) runs() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.ran))
	for k, n := range r.ran {
		out[k] = n
	}
	return out
}

// panickingBatchObserver panics (the run's injected panic) on the
// decision onDecision matches, or on the store operation onOp once a's
// work returned; it tells the run when call m2 is decided.
type panickingBatchObserver struct {
	run        *batchPanicRun
	onDecision func(dedup.Decision) bool
	onOp       string
}

func (o *panickingBatchObserver) ObserveDecision(d dedup.Decision) {
	if d.MessageUUID == "m2" {
		o.run.copyTurned()
	}
	if o.onDecision != nil && o.onDecision(d) {
		o.run.inject()
	}
}

func (o *panickingBatchObserver) ObserveStoreOp(op string, _ time.Duration, _ error) {
	if op == o.onOp && o.run.armed.Load() {
		o.run.inject()
	}
}

// panickingLogger panics (the run's injected panic) when it logs msg for
// key.
type panickingLogger struct {
	run      *batchPanicRun
	msg, key string
}

func (l panickingLogger) check(msg string, fields watermill.LogFields) {
	if msg == l.msg && fields["key"] == l.key {
		l.run.inject()
	}
}

func (l panickingLogger) Error(msg string, _ error, fields watermill.LogFields) { l.check(msg, fields) }
func (l panickingLogger) Info(msg string, fields watermill.LogFields)           { l.check(msg, fields) }
func (l panickingLogger) Debug(msg string, fields watermill.LogFields)          { l.check(msg, fields) }
func (l panickingLogger) Trace(msg string, fields watermill.LogFields)          { l.check(msg, fields) }
func (l panickingLogger) With(watermill.LogFields) watermill.LoggerAdapter      { return l }

// panickingTracer traces each call with a CallTrace that panics (the
// run's injected panic) on the decision ev of the call of key.
type panickingTracer struct {
	run *batchPanicRun
	key string
	ev  event.Event
}

func (tr panickingTracer) StartCall(ctx context.Context, call dedup.Call) (context.Context, dedup.CallTrace) {
	return ctx, panickingTrace{tr: tr, key: call.Key}
}

type panickingTrace struct {
	tr  panickingTracer
	key string
}

func (c panickingTrace) ObserveDecision(d dedup.Decision) {
	if c.key == c.tr.key && d.Event == c.tr.ev {
		c.tr.run.inject()
	}
}

func (panickingTrace) ObserveStoreOp(string, time.Duration, error) {}
func (panickingTrace) EndCall(dedup.ClaimResult, error)            {}

// secondClaimPanicStore is the memory store (with its batch capability,
// without its key watches: an InProgressWait polls on the run's clock)
// whose claim of key panics (the run's injected panic) from the key's
// second claim on, single or in a batch: the claim a copy makes while its
// first call runs, or the re-claim of an InProgressWait.
type secondClaimPanicStore struct {
	dedup.BatchStore
	run *batchPanicRun
	key string

	mu     sync.Mutex
	claims int
}

func (s *secondClaimPanicStore) claiming(key string) {
	if key != s.key {
		return
	}
	s.mu.Lock()
	s.claims++
	n := s.claims
	s.mu.Unlock()
	if n >= 2 {
		s.run.copyTurned()
		s.run.inject()
	}
}

func (s *secondClaimPanicStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	s.claiming(key)
	return s.BatchStore.Claim(ctx, key, fp, lease)
}

func (s *secondClaimPanicStore) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.ClaimResult, []error) {
	for _, rq := range reqs {
		s.claiming(rq.Key)
	}
	return s.BatchStore.ClaimBatch(ctx, reqs)
}

// polled is the memory store (with its batch capability) without its key
// watches (dedup.KeyWatcher): an InProgressWait on it polls, on the run's
// clock.
type polled struct{ dedup.BatchStore }

// waitPoll is the first pause of an InProgressWait in the panic cases.
const waitPoll = 100 * time.Millisecond

// holdK claims s:k for another consumer: a call of k in the batch finds
// it in progress.
func holdK(t *testing.T, r *batchPanicRun) {
	t.Helper()
	if res, err := r.mem.Claim(context.Background(), "s:k", "", time.Minute); err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("holding s:k: %v %v", res.Outcome, err)
	}
}

// passFirstPause moves the fake clock past the first pause of k's
// InProgressWait, so that it claims again.
func passFirstPause(t *testing.T, r *batchPanicRun) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), realTimeBound)
	defer cancel()
	if err := r.clock.WaitForTimerAt(ctx, batchEpoch.Add(waitPoll)); err != nil {
		t.Errorf("k's InProgressWait made no pause of InProgressPoll: %v", err)
		return
	}
	r.clock.Advance(waitPoll)
}

// batchPanicCase is a panic of something the engine calls on the path of
// a batch's turns, after a's work returned and its completion is due.
type batchPanicCase struct {
	name string
	// calls: a first, then the call whose turn panics, in one group (so
	// that a's work has returned when it panics, whatever the
	// concurrency), and an independent call in another group (so that
	// with Concurrency > 1 the turns run on goroutines).
	calls []dedup.BatchCall
	// setup prepares the store and returns the first engine's
	// configuration but its Clock, Lease, Retention and CompleteBackoff.
	setup func(t *testing.T, r *batchPanicRun) dedup.Config
	// drive moves the fake clock while the batch runs, if needed.
	drive func(t *testing.T, r *batchPanicRun)
	// mustReach: the panic point is on the path of any engine (else the
	// fixed engine may not reach it: then the batch must return normally).
	mustReach bool
}

func batchPanicCalls(spec ...string) []dedup.BatchCall {
	var b []dedup.BatchCall
	for i, s := range spec {
		group, key, _ := strings.Cut(s, ":")
		b = append(b, dedup.BatchCall{Group: group, Call: dedup.Call{Scope: "s", Key: key, MessageUUID: fmt.Sprint("m", i)}})
	}
	return b
}

var batchPanicCases = []batchPanicCase{
	{
		// b's claim_won, decided at its turn, on its turn's goroutine.
		name: "observer_decision", calls: batchPanicCalls("g1:a", "g1:b", "g2:c"), mustReach: true,
		setup: func(t *testing.T, r *batchPanicRun) dedup.Config {
			return dedup.Config{Store: r.mem, Observer: &panickingBatchObserver{run: r, onDecision: func(d dedup.Decision) bool {
				return d.Event == event.ClaimWon && d.Key == "s:b"
			}}}
		},
	},
	{
		// The re-claim of k's InProgressWait (k is held by another
		// consumer), observed on k's turn's goroutine.
		name: "observer_store_op", calls: batchPanicCalls("g1:a", "g1:k", "g2:c"), mustReach: true,
		setup: func(t *testing.T, r *batchPanicRun) dedup.Config {
			holdK(t, r)
			return dedup.Config{Store: polled{r.mem}, InProgressWait: time.Minute, InProgressPoll: waitPoll,
				Observer: &panickingBatchObserver{run: r, onOp: "claim"}}
		},
		drive: passFirstPause,
	},
	{
		// b's claim_won, told to b's trace (Config.Tracer) at its turn.
		name: "trace_decision", calls: batchPanicCalls("g1:a", "g1:b", "g2:c"), mustReach: true,
		setup: func(t *testing.T, r *batchPanicRun) dedup.Config {
			return dedup.Config{Store: r.mem, Tracer: panickingTracer{run: r, key: "b", ev: event.ClaimWon}}
		},
	},
	{
		// d's skip_duplicate (d was completed before the batch), logged at
		// its turn.
		name: "logger", calls: batchPanicCalls("g1:a", "g1:d", "g2:c"), mustReach: true,
		setup: func(t *testing.T, r *batchPanicRun) dedup.Config {
			ctx := context.Background()
			res, err := r.mem.Claim(ctx, "s:d", "", time.Minute)
			if err == nil {
				err = r.mem.Complete(ctx, res.Claim, []byte("d done"), time.Hour)
			}
			if err != nil {
				t.Fatalf("completing s:d: %v", err)
			}
			return dedup.Config{Store: r.mem, Logger: panickingLogger{run: r, msg: "dedup: " + string(event.SkipDuplicate), key: "s:d"}}
		},
	},
	{
		// The store's Claim of k's InProgressWait (k is held by another
		// consumer) panics.
		name: "store_claim_of_a_wait", calls: batchPanicCalls("g1:a", "g1:k", "g2:c"), mustReach: true,
		setup: func(t *testing.T, r *batchPanicRun) dedup.Config {
			holdK(t, r)
			return dedup.Config{Store: &secondClaimPanicStore{BatchStore: r.mem, run: r, key: "s:k"}, InProgressWait: time.Minute, InProgressPoll: waitPoll}
		},
		drive: passFirstPause,
	},
	{
		// The store's Claim of a copy (m2, after a in g1) made while the
		// first call of its key (m1, in g2) holds it panics. The fixed
		// engine may decide the copy without a claim (or run it, when its
		// turn comes first): then nothing panics.
		name: "store_claim_of_a_copy", calls: batchPanicCalls("g1:a", "g2:k", "g1:k"),
		setup: func(t *testing.T, r *batchPanicRun) dedup.Config {
			return dedup.Config{Store: &secondClaimPanicStore{BatchStore: r.mem, run: r, key: "s:k"}, Observer: &panickingBatchObserver{run: r}}
		},
	},
}

// TestDoBatchPanicSendsCompletions proves that every exit from DoBatch,
// panics included, sends the completions of the works that ran, and that
// a panic on a turn's goroutine reaches DoBatch's caller: a panicking
// Observer (a decision, a store operation), call trace (Config.Tracer),
// Logger or store call (the claim of an InProgressWait, or of a copy
// while its first call runs)
// on the path of a turn after a's work returned, with Batch.Concurrency 1
// and 4. The caller recovers the injected panic, and a redelivery of the
// batch on a fresh engine over the same store is a Duplicate for every
// key whose work ran. Concurrency 4 runs in a child process (this test
// binary, re-executed), which must exit 0: a panic on a goroutine of the
// batch's turns ends that process. (The completions were sent after every
// turn, and a panic left DoBatch through its cleanup without them; with
// Concurrency 4 the panic ended the process.)
func TestDoBatchPanicSendsCompletions(t *testing.T) {
	for _, tc := range batchPanicCases {
		for _, concurrency := range []int{1, 4} {
			t.Run(fmt.Sprintf("%s/concurrency=%d", tc.name, concurrency), func(t *testing.T) {
				if concurrency > 1 {
					t.Parallel() // in a child process: start them together
					if !inChildProcess(t) {
						return
					}
				}
				runBatchPanicCase(t, tc, concurrency)
			})
		}
	}
}

// batchPanicEnd is how a DoBatch ended: its results, or its panic.
type batchPanicEnd struct {
	res      []batchResult
	panicked bool
	value    any
}

func runBatchPanicCase(t *testing.T, tc batchPanicCase, concurrency int) {
	ctx := context.Background()
	r := newBatchPanicRun(tc.name)
	cfg := tc.setup(t, r)
	cfg.Clock, cfg.Lease, cfg.Retention, cfg.CompleteBackoff = r.clock, time.Minute, time.Hour, time.Millisecond
	e := newEngine(t, cfg)
	b := tc.calls

	ended := make(chan batchPanicEnd, 1)
	go func() { // the caller's goroutine
		var end batchPanicEnd
		defer func() {
			if p := recover(); p != nil {
				end.panicked, end.value = true, p
			}
			ended <- end
		}()
		end.res = doBatch(e, ctx, dedup.Batch{Calls: b, Concurrency: concurrency}, r.work(b))
	}()
	if tc.drive != nil {
		tc.drive(t, r)
	}
	var end batchPanicEnd
	select {
	case end = <-ended:
	case <-time.After(realTimeBound):
		t.Fatalf("DoBatch neither returned nor panicked within %v", realTimeBound)
	}

	fired := r.fired.Load()
	switch {
	case end.panicked && !isValue(end.value, r.value):
		t.Errorf("DoBatch panicked with %v, want the injected panic %q", end.value, r.value)
	case end.panicked:
	case fired:
		t.Errorf("the injected panic (%v) did not reach DoBatch's caller: DoBatch returned %+v", r.value, end.res)
	case tc.mustReach:
		t.Errorf("the injected panic's point was not reached: DoBatch returned %+v", end.res)
	default:
		t.Logf("the injected panic's point was not reached (the copy was decided without a claim): DoBatch returned %+v", end.res)
	}

	ran := r.runs()
	t.Logf("works that ran: %v", ran)
	for key, n := range ran {
		if n != 1 {
			t.Errorf("%s's work ran %d times in the batch, want once", key, n)
		}
	}
	// Redelivered to a fresh engine (no panic) over the same store: every
	// key whose work ran is a duplicate; the others may run.
	again := doBatch(newBatchEngine(t, r.mem, r.clock), ctx, dedup.Batch{Calls: b},
		func(_ context.Context, i int) ([]byte, error) {
			if ran[b[i].Key] > 0 {
				t.Errorf("redelivery: %s's work ran again", b[i].Key)
			}
			return nil, nil
		})
	for i, res := range again {
		if key := b[i].Key; ran[key] > 0 && (res.Err != nil || res.Outcome != dedup.Duplicate) {
			t.Errorf("redelivered call %d (%s), whose work ran before DoBatch ended: %v %v; want a duplicate (its completion sent)",
				i, key, res.Outcome, res.Err)
		}
	}
}

// isValue reports whether a recovered panic p is the injected value v (or
// an error wrapping it).
func isValue(p any, v error) bool {
	err, ok := p.(error)
	return ok && errors.Is(err, v)
}

// envChildTest names the (sub)test a child process started by
// inChildProcess runs.
const envChildTest = "DEDUP_TEST_CHILD"

// inChildProcess reports whether this process is the child running the
// calling test. In the parent it runs the test in a child process (this
// test binary, re-executed with the test's name) and fails the test unless
// the child passed it and exited 0: for a case that can end the process
// (a panic on a goroutine), which must then fail one test rather than
// kill the test binary.
func inChildProcess(t *testing.T) bool {
	t.Helper()
	if os.Getenv(envChildTest) == t.Name() {
		return true
	}
	var levels []string
	for _, name := range strings.Split(t.Name(), "/") {
		levels = append(levels, "^"+regexp.QuoteMeta(name)+"$")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+strings.Join(levels, "/"), "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envChildTest+"="+t.Name())
	out, err := cmd.CombinedOutput()
	switch {
	case err != nil:
		t.Errorf("the child process running %s failed: %v\n%s", t.Name(), err, out)
	case !bytes.Contains(out, []byte("--- PASS: "+t.Name())):
		t.Errorf("the child process did not pass %s:\n%s", t.Name(), out)
	}
	return false
}
