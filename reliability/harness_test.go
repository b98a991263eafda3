package reliability_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// mutation breaks one protection on purpose, so that a skeptical reader can
// watch the scenarios fail (README.md, "Seeing the tests fail"):
//
//	go test -race -v ./reliability/ -args -reliability.mutate=ignore-in-progress
var mutation = flag.String("reliability.mutate", "",
	"break one protection on purpose: no-dedup (handlers run without the middleware), "+
		"ignore-in-progress (a live claim of another consumer counts as acquired, like a check-then-write), "+
		"no-heartbeat (Config.DisableHeartbeat forced on), "+
		"ack-errors (every error is acked instead of nacked), "+
		"unescaped-keys (the store undoes the escaping of scopes and Join parts, as a naive concatenation would)")

// eachAutoPipeline runs a Redis scenario twice, as subtests: its Redis
// stores without Config.AutoPipeline and with it (batched commands).
func eachAutoPipeline(t *testing.T, scenario func(t *testing.T, autoPipeline bool)) {
	for _, autoPipeline := range []bool{false, true} {
		t.Run(fmt.Sprintf("AutoPipeline=%v", autoPipeline), func(t *testing.T) { scenario(t, autoPipeline) })
	}
}

// deduplicator is the middleware under test, with the mutation (if any)
// applied.
type deduplicator struct {
	d *dedup.Deduplicator
}

// newDedup builds the middleware from cfg; a configuration error fails the
// test.
func newDedup(t testing.TB, cfg dedup.Config) deduplicator {
	t.Helper()
	switch *mutation {
	case "no-heartbeat":
		cfg.DisableHeartbeat = true
	case "ignore-in-progress":
		cfg.Store = ignoreInProgress{cfg.Store}
	case "unescaped-keys":
		cfg.Store = unescapedKeys{cfg.Store}
	}
	d, err := dedup.New(cfg)
	if err != nil {
		t.Fatalf("dedup.New: %v", err)
	}
	return deduplicator{d}
}

// Middleware is the dedup middleware, or with -reliability.mutate=no-dedup
// the handler itself, and with ack-errors a middleware that swallows errors.
func (d deduplicator) Middleware(h message.HandlerFunc) message.HandlerFunc {
	switch *mutation {
	case "no-dedup":
		return h
	case "ack-errors":
		inner := d.d.Middleware(h)
		return func(msg *message.Message) ([]*message.Message, error) {
			out, _ := inner(msg)
			return out, nil
		}
	}
	return d.d.Middleware(h)
}

// ignoreInProgress is the mutation ignore-in-progress: a claim that finds a
// live in-progress record of another consumer is reported as acquired, as a
// check-then-write guard that only looks for completed records would.
type ignoreInProgress struct{ dedup.Store }

func (s ignoreInProgress) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, key, fp, lease)
	if err == nil && res.Outcome == dedup.InProgress {
		return dedup.ClaimResult{Outcome: dedup.Acquired, Claim: dedup.Claim{Key: key, Token: storekit.NewToken()}}, nil
	}
	return res, err
}

// unescapedKeys is the mutation unescaped-keys: the store sees scoped keys
// with the escaping of dedup.ScopedKey and keyfuncs.Join undone, as if
// scope and key, tenant and order had been concatenated naively.
type unescapedKeys struct{ dedup.Store }

var unescaper = strings.NewReplacer("%3A", ":", "%25", "%", `\:`, ":", `\`, `\`)

func (s unescapedKeys) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	return s.Store.Claim(ctx, unescaper.Replace(key), fp, lease)
}

// tally is a dedup.Observer: it counts every decision (by event, and by
// event and operation) and every store operation and store error (an error
// other than ErrClaimLost: the store could not answer).
type tally struct {
	mu        sync.Mutex
	events    map[string]int
	ops       map[string]int
	storeErrs map[string]int
	samples   []string // the first few store errors
	// alreadyCompleted counts store operations that found the record
	// completed by their own claim (dedup.ErrAlreadyCompleted): a Complete
	// whose earlier attempt's reply was lost.
	alreadyCompleted int
}

func newTally() *tally {
	return &tally{events: map[string]int{}, ops: map[string]int{}, storeErrs: map[string]int{}}
}

func (t *tally) ObserveDecision(d dedup.Decision) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.events[string(d.Event)]++
	if d.Op != "" {
		t.events[string(d.Event)+"/"+d.Op]++
	}
}

func (t *tally) ObserveStoreOp(op string, _ time.Duration, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ops[op]++
	if errors.Is(err, dedup.ErrAlreadyCompleted) {
		t.alreadyCompleted++
	}
	if err != nil && !errors.Is(err, dedup.ErrClaimLost) {
		t.storeErrs[op]++
		if len(t.samples) < 3 {
			t.samples = append(t.samples, op+": "+err.Error())
		}
	}
}

// event returns how many decisions had this name ("in_progress") or name
// and operation ("claim_lost/complete").
func (t *tally) event(name string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.events[name]
}

func (t *tally) op(name string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ops[name]
}

// storeErrors returns the store errors of every operation.
func (t *tally) storeErrors() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, v := range t.storeErrs {
		n += v
	}
	return n
}

// errorSamples returns the first few store errors, for the log.
func (t *tally) errorSamples() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.samples...)
}

// storeErrorsByOp renders the store errors per operation, e.g.
// "claim=12 complete=1".
func (t *tally) storeErrorsByOp() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return renderCounts(t.storeErrs)
}

func renderCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// logEntry is one captured log line.
type logEntry struct {
	level  string
	msg    string
	err    error
	fields watermill.LogFields
}

// logCapture is a watermill.LoggerAdapter keeping every Info and Error
// entry, to check what the middleware logs and at which level.
type logCapture struct {
	mu      sync.Mutex
	entries []logEntry
	fields  watermill.LogFields
	root    *logCapture
}

func newLogCapture() *logCapture {
	l := &logCapture{}
	l.root = l
	return l
}

func (l *logCapture) add(e logEntry) {
	r := l.root
	r.mu.Lock()
	defer r.mu.Unlock()
	r.entries = append(r.entries, e)
}

func (l *logCapture) Error(msg string, err error, fields watermill.LogFields) {
	l.add(logEntry{level: "error", msg: msg, err: err, fields: l.fields.Add(fields)})
}

func (l *logCapture) Info(msg string, fields watermill.LogFields) {
	l.add(logEntry{level: "info", msg: msg, fields: l.fields.Add(fields)})
}

func (l *logCapture) Debug(string, watermill.LogFields) {}
func (l *logCapture) Trace(string, watermill.LogFields) {}

func (l *logCapture) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return &logCapture{fields: l.fields.Add(fields), root: l.root}
}

// find returns the captured entries whose dedup_event (and op, if given)
// match.
func (l *logCapture) find(event, op string) []logEntry {
	r := l.root
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []logEntry
	for _, e := range r.entries {
		if e.fields["dedup_event"] != event {
			continue
		}
		if op != "" && e.fields["op"] != op {
			continue
		}
		out = append(out, e)
	}
	return out
}

// ackWatch sits between a Watermill subscriber and the router and records,
// for every delivered message, whether the router acked or nacked it: what
// the broker sees. GoChannel redelivers a nacked message (a fresh copy with
// the same UUID) until it is acked.
type ackWatch struct {
	done chan struct{}

	mu         sync.Mutex
	acks       map[string]int
	nacks      int
	deliveries int
}

func newAckWatch(t testing.TB) *ackWatch {
	w := &ackWatch{done: make(chan struct{}), acks: map[string]int{}}
	t.Cleanup(func() { close(w.done) })
	return w
}

// subscriber wraps inner.
func (w *ackWatch) subscriber(inner message.Subscriber) message.Subscriber {
	return watchedSubscriber{inner: inner, w: w}
}

type watchedSubscriber struct {
	inner message.Subscriber
	w     *ackWatch
}

func (s watchedSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.inner.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for msg := range in {
			s.w.mu.Lock()
			s.w.deliveries++
			s.w.mu.Unlock()
			go s.w.watch(msg)
			select {
			case out <- msg:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

func (s watchedSubscriber) Close() error { return s.inner.Close() }

func (w *ackWatch) watch(msg *message.Message) {
	select {
	case <-msg.Acked():
		w.mu.Lock()
		w.acks[msg.UUID]++
		w.mu.Unlock()
	case <-msg.Nacked():
		w.mu.Lock()
		w.nacks++
		w.mu.Unlock()
	case <-w.done:
	}
}

// acked returns how many distinct messages were acked.
func (w *ackWatch) acked() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acks)
}

func (w *ackWatch) counts() (deliveries, nacks int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deliveries, w.nacks
}

// checkEachAckedOnce fails the test unless every one of uuids was acked
// exactly once and nothing else was acked.
func (w *ackWatch) checkEachAckedOnce(t testing.TB, uuids []string) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	missing, twice := 0, 0
	for _, u := range uuids {
		switch n := w.acks[u]; {
		case n == 0:
			missing++
		case n > 1:
			twice++
		}
	}
	if missing > 0 || twice > 0 || len(w.acks) != len(uuids) {
		t.Errorf("acks: %d of %d messages never acked, %d acked more than once, %d distinct messages acked",
			missing, len(uuids), twice, len(w.acks))
	}
}

// waitFor polls cond every 5ms until it holds, and fails the test when it
// does not within limit. It waits for other goroutines or a real server to
// make progress; it is not a clock, and a slow machine only makes it wait
// longer.
func waitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	if !waitUntil(t, limit, what, cond) {
		t.FailNow()
	}
}

// waitLimit bounds a scenario's wait for a goroutine of its own (a
// handler, a middleware call, a publisher, a child process) to reach a
// point: far above what a busy machine needs, far below go test's timeout.
const waitLimit = time.Minute

// await returns the next value from ch (the zero value once ch is closed),
// and fails the test naming what it awaited when none comes within limit.
// Call it from the test's goroutine only.
func await[T any](t testing.TB, limit time.Duration, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(limit):
		t.Fatalf("%s did not happen within %v", what, limit)
		panic("unreachable")
	}
}

// awaitGroup waits for wg, and fails the test naming what it awaited when
// wg is not done within limit.
func awaitGroup(t testing.TB, limit time.Duration, what string, wg *sync.WaitGroup) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	await(t, limit, what, done)
}

// waitUntil is waitFor that reports the timeout with t.Errorf and returns
// false, so that the caller can print what it measured before stopping.
func waitUntil(t testing.TB, limit time.Duration, what string, cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Errorf("still waiting for %s after %v", what, limit)
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// figures prints the measured figures of a scenario in one line starting
// with "FIGURES", visible in `go test -v` output; README.md quotes them.
func figures(t testing.TB, scenario string, kv ...any) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "FIGURES %s:", scenario)
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, " %v=%v", kv[i], kv[i+1])
	}
	t.Log(b.String())
}

// uniquePrefix returns a Redis key prefix no other test run uses.
func uniquePrefix(name string) string {
	return fmt.Sprintf("rel-%s-%d:", name, time.Now().UnixNano())
}

// newRedisClient returns a client of its own (its own pool) for addr, that
// gives up dialling a stopped server quickly. Command retries keep go-redis'
// default (3 retries after network errors).
func newRedisClient(t testing.TB, addr string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{
		Addr:               addr,
		DialTimeout:        500 * time.Millisecond,
		DialerRetries:      1,
		DialerRetryTimeout: 10 * time.Millisecond,
		ReadTimeout:        2 * time.Second,
		WriteTimeout:       2 * time.Second,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newRedisStore returns a Redis store on client, with or without
// Config.AutoPipeline.
func newRedisStore(t testing.TB, client goredis.UniversalClient, prefix string, autoPipeline bool) *redis.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := redis.New(ctx, redis.Config{Client: client, KeyPrefix: prefix, AutoPipeline: autoPipeline})
	if err != nil {
		t.Fatalf("redis.New: %v", err)
	}
	return s
}

// scanCount returns how many Redis keys start with prefix.
func scanCount(t testing.TB, client *goredis.Client, prefix string) int {
	t.Helper()
	keys, err := client.Keys(context.Background(), escapeGlob(prefix)+"*").Result()
	if err != nil {
		t.Fatalf("KEYS %s*: %v", prefix, err)
	}
	return len(keys)
}

var globEscaper = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)

func escapeGlob(s string) string { return globEscaper.Replace(s) }

// workload is a stream of messages carrying keys duplicated 1 to maxCopies
// times, shuffled: the copies of one business fact get different UUIDs, as
// SNS fan-out or a producer's retry gives them.
type workload struct {
	uuids []string
	keys  []string // keys[i] is the business key of uuids[i]
	// distinct is the number of distinct keys.
	distinct int
}

func newWorkload(seed uint64, messages, maxCopies int, keyPrefix string) workload {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var w workload
	for k := 0; len(w.keys) < messages; k++ {
		copies := 1 + rng.IntN(maxCopies)
		for c := 0; c < copies && len(w.keys) < messages; c++ {
			w.keys = append(w.keys, fmt.Sprintf("%sORDER-%06d", keyPrefix, k))
		}
		w.distinct = k + 1
	}
	rng.Shuffle(len(w.keys), func(i, j int) { w.keys[i], w.keys[j] = w.keys[j], w.keys[i] })
	w.uuids = make([]string, len(w.keys))
	for i := range w.uuids {
		w.uuids[i] = watermill.NewUUID()
	}
	return w
}

// message returns the i-th message: the key in the JSON payload and, for
// bookkeeping only, in the metadata.
func (w workload) message(i int) *message.Message {
	msg := message.NewMessage(w.uuids[i], []byte(fmt.Sprintf(`{"order_id":%q,"amount":150}`, w.keys[i])))
	msg.Metadata.Set("order_id", w.keys[i])
	return msg
}

// sink is where the handlers' effects land (a payment provider, a ledger):
// it counts, per key, every time the effect ran and every handler call that
// succeeded or failed after the effect.
type sink struct {
	mu          sync.Mutex
	effects     map[string]int
	successes   map[string]int
	failedAfter map[string]int
	failBefore  int
	calls       int
	// work is how long the effect takes (a call to a payment provider), so
	// that faults also hit handlers between their claim and completion.
	work time.Duration
}

func newSink() *sink {
	return &sink{effects: map[string]int{}, successes: map[string]int{}, failedAfter: map[string]int{}}
}

// failurePlan decides, for each handler call, whether it fails before the
// effect, after it, or not at all, from a seeded generator.
type failurePlan struct {
	mu            sync.Mutex
	rng           *rand.Rand
	before, after float64
}

func newFailurePlan(seed uint64, before, after float64) *failurePlan {
	return &failurePlan{rng: rand.New(rand.NewPCG(seed, 7)), before: before, after: after}
}

type callFate int

const (
	succeed callFate = iota
	failBeforeEffect
	failAfterEffect
)

func (p *failurePlan) next() callFate {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch r := p.rng.Float64(); {
	case r < p.before:
		return failBeforeEffect
	case r < p.before+p.after:
		return failAfterEffect
	}
	return succeed
}

var (
	errBeforeEffect = errors.New("handler failed before its effect (e.g. the payment provider refused the connection)")
	errAfterEffect  = errors.New("handler failed after its effect (e.g. the charge went through, then writing the receipt failed)")
)

// handler returns the consumer's handler: it decides the call's fate, runs
// the effect (unless failing before it) and records everything in s.
func (s *sink) handler(plan *failurePlan) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		key := msg.Metadata.Get("order_id")
		fate := plan.next()
		if fate != failBeforeEffect && s.work > 0 {
			time.Sleep(s.work)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.calls++
		switch fate {
		case failBeforeEffect:
			s.failBefore++
			return errBeforeEffect
		case failAfterEffect:
			s.effects[key]++
			s.failedAfter[key]++
			return errAfterEffect
		}
		s.effects[key]++
		s.successes[key]++
		return nil
	}
}

// verdict checks the exactly-once invariants over keys and returns the
// totals. Exactly one handler call per key succeeded; the effect ran once
// for that call plus once for every call that failed after the effect
// (those extra runs are the documented limit: the effect happened, the
// handler reported failure, the claim was released and the retry ran it
// again). With no failures after the effect, every key's effect ran once.
func (s *sink) verdict(t testing.TB, keys []string) (effects, doubles, failedAfterCalls int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	distinct := map[string]bool{}
	for _, k := range keys {
		distinct[k] = true
	}
	var bad []string
	for k := range distinct {
		if s.successes[k] != 1 {
			bad = append(bad, fmt.Sprintf("%s: %d successful calls", k, s.successes[k]))
		}
		if want := 1 + s.failedAfter[k]; s.effects[k] != want {
			bad = append(bad, fmt.Sprintf("%s: effect ran %d times, want 1 + %d failed-after calls", k, s.effects[k], s.failedAfter[k]))
		}
		effects += s.effects[k]
		failedAfterCalls += s.failedAfter[k]
		if s.effects[k] > 1 {
			doubles += s.effects[k] - 1
		}
	}
	for k := range s.effects {
		if !distinct[k] {
			bad = append(bad, fmt.Sprintf("effect for unknown key %s", k))
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		if len(bad) > 10 {
			bad = append(bad[:10], fmt.Sprintf("… and %d more", len(bad)-10))
		}
		t.Errorf("exactly-once violated for %d keys:\n%s", len(bad), strings.Join(bad, "\n"))
	}
	return effects, doubles, failedAfterCalls
}

// clientLog replaces go-redis' logger (TestMain installs it): the scenarios
// that stop servers or break connections make go-redis log every failed
// dial, which would bury the figures. It counts the lines and keeps the
// last one; the figures show the count.
type clientLogger struct {
	lines atomic.Int64
	mu    sync.Mutex
	last  string
}

var clientLog = &clientLogger{}

func (l *clientLogger) Printf(_ context.Context, format string, v ...any) {
	l.lines.Add(1)
	l.mu.Lock()
	l.last = fmt.Sprintf(format, v...)
	l.mu.Unlock()
}

// lostCompleteReplies returns how many Complete calls found the record
// already completed by their own claim (an earlier attempt's reply was lost).
func (t *tally) lostCompleteReplies() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.alreadyCompleted
}
