package lambdadedup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
)

const queueARN = "arn:aws:sqs:us-east-1:000000000000:orders"

func record(id, body string) events.SQSMessage {
	return events.SQSMessage{MessageId: id, Body: body, EventSource: "aws:sqs", EventSourceARN: queueARN, AWSRegion: "us-east-1"}
}

func order(id string) string { return fmt.Sprintf(`{"order_id":%q,"amount":150}`, id) }

// invoke runs the handler the way the Lambda runtime does: the event as
// JSON through lambda.NewHandler, the response decoded from JSON. It returns
// the failed MessageIds.
func invoke(t *testing.T, ctx context.Context, h *lambdadedup.Handler, records ...events.SQSMessage) []string {
	t.Helper()
	payload, err := json.Marshal(events.SQSEvent{Records: records})
	if err != nil {
		t.Fatal(err)
	}
	out, err := lambda.NewHandler(h.Handle).Invoke(ctx, payload)
	if errors.Is(err, lambdadedup.ErrBatchFailed) { // every record failed
		var failed []string
		for _, r := range records {
			failed = append(failed, r.MessageId)
		}
		return failed
	}
	if err != nil {
		t.Fatalf("Invoke: %v", err)
	}
	var resp events.SQSEventResponse
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatalf("response %s: %v", out, err)
	}
	var failed []string
	for _, f := range resp.BatchItemFailures {
		failed = append(failed, f.ItemIdentifier)
	}
	return failed
}

// charger counts the charges per order and can fail or block chosen calls.
type charger struct {
	mu      sync.Mutex
	charges map[string]int
	calls   []string // MessageIds, in call order
	fail    func(orderID string, call int) error
}

func newCharger() *charger { return &charger{charges: map[string]int{}} }

func (c *charger) handle(msg *message.Message) error {
	id, err := keyfuncs.JSON("order_id")(msg)
	if err != nil {
		return err
	}
	rec, _ := lambdadedup.RecordFromContext(msg.Context())
	c.mu.Lock()
	c.calls = append(c.calls, rec.MessageId)
	n := len(c.calls)
	fail := c.fail
	c.mu.Unlock()
	if fail != nil {
		if err := fail(id, n); err != nil {
			return err
		}
	}
	c.mu.Lock()
	c.charges[id]++
	c.mu.Unlock()
	return nil
}

func (c *charger) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.charges {
		n += v
	}
	return n
}

func newHandler(t *testing.T, cfg lambdadedup.Config, h message.NoPublishHandlerFunc) *lambdadedup.Handler {
	t.Helper()
	if cfg.Dedup.Store == nil {
		cfg.Dedup.Store = memstore.New(cfg.Dedup.Clock)
	}
	if cfg.Dedup.Key == nil {
		cfg.Dedup.Key = keyfuncs.JSON("order_id")
	}
	if cfg.Dedup.Scope == "" {
		cfg.Dedup.Scope = "charge-orders"
	}
	lh, err := lambdadedup.New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	return lh
}

// failingStore is a store that cannot be reached.
type failingStore struct{ dedup.Store }

var errUnreachable = errors.New("store unreachable")

func (failingStore) Claim(context.Context, string, string, time.Duration) (dedup.ClaimResult, error) {
	return dedup.ClaimResult{}, errUnreachable
}

func TestNewRefusesBadConfig(t *testing.T) {
	store := memstore.New(nil)
	h := func(*message.Message) error { return nil }
	for name, cfg := range map[string]lambdadedup.Config{
		"no scope":        {Dedup: dedup.Config{Store: store, Key: keyfuncs.JSON("id")}},
		"no store":        {Dedup: dedup.Config{Scope: "s", Key: keyfuncs.JSON("id")}},
		"no key":          {Dedup: dedup.Config{Scope: "s", Store: store}},
		"negative margin": {DeadlineMargin: -time.Second, Dedup: dedup.Config{Scope: "s", Store: store, Key: keyfuncs.JSON("id")}},
	} {
		if _, err := lambdadedup.New(cfg, h); err == nil {
			t.Errorf("%s: New accepted the configuration", name)
		}
	}
	if _, err := lambdadedup.New(lambdadedup.Config{Dedup: dedup.Config{Scope: "s", Store: store, Key: keyfuncs.JSON("id")}}, nil); err == nil {
		t.Error("New accepted a nil handler")
	}
	_, err := lambdadedup.New(lambdadedup.Config{Dedup: dedup.Config{Store: store, Key: keyfuncs.JSON("id")}}, h)
	if !errors.Is(err, dedup.ErrNoScope) {
		t.Errorf("no scope: %v, want ErrNoScope", err)
	}
	if err == nil || !strings.Contains(err.Error(), "Config.Dedup.Scope") {
		t.Errorf("no scope: %v does not name Config.Dedup.Scope", err)
	}
}

// Every per-record outcome of the table in the package doc.
func TestOutcomes(t *testing.T) {
	ctx := context.Background()
	t.Run("acquired, duplicate", func(t *testing.T) {
		c := newCharger()
		h := newHandler(t, lambdadedup.Config{}, c.handle)
		if f := invoke(t, ctx, h, record("m1", order("A")), record("m2", order("A")), record("m3", order("B"))); len(f) != 0 {
			t.Errorf("failures %v, want none", f)
		}
		if f := invoke(t, ctx, h, record("m4", order("A"))); len(f) != 0 {
			t.Errorf("duplicate: failures %v, want none", f)
		}
		if c.charges["A"] != 1 || c.charges["B"] != 1 {
			t.Errorf("charges %v, want A:1 B:1", c.charges)
		}
	})
	t.Run("handler error releases", func(t *testing.T) {
		c := newCharger()
		c.fail = func(_ string, call int) error {
			if call == 1 {
				return errors.New("gateway down")
			}
			return nil
		}
		h := newHandler(t, lambdadedup.Config{}, c.handle)
		if f := invoke(t, ctx, h, record("m1", order("A"))); !slices.Equal(f, []string{"m1"}) {
			t.Errorf("failures %v, want [m1]", f)
		}
		if f := invoke(t, ctx, h, record("m1", order("A"))); len(f) != 0 {
			t.Errorf("retry: failures %v, want none", f)
		}
		if c.charges["A"] != 1 {
			t.Errorf("charges %v, want A:1", c.charges)
		}
	})
	t.Run("in progress fails", func(t *testing.T) {
		store := memstore.New(nil)
		if _, err := store.Claim(ctx, admin.ScopedKey("charge-orders", "A"), "", time.Minute); err != nil {
			t.Fatal(err)
		}
		c := newCharger()
		h := newHandler(t, lambdadedup.Config{Dedup: dedup.Config{Store: store}}, c.handle)
		if f := invoke(t, ctx, h, record("m1", order("A")), record("m2", order("B"))); !slices.Equal(f, []string{"m1"}) {
			t.Errorf("failures %v, want [m1]", f)
		}
		if c.total() != 1 {
			t.Errorf("charges %v, want B only", c.charges)
		}
	})
	permanent := map[string]events.SQSMessage{
		"no key":        record("m1", `{"amount":1}`),
		"malformed":     record("m1", `{not json`),
		"transport key": record("m1", `{"order_id":"m1"}`),
		"watermill uuid": func() events.SQSMessage {
			r := record("m1", `{"order_id":"wm-uuid"}`)
			s := "wm-uuid"
			r.MessageAttributes = map[string]events.SQSMessageAttribute{lambdadedup.UUIDAttribute: {DataType: "String", StringValue: &s}}
			return r
		}(),
	}
	for name, rec := range permanent {
		t.Run(name+" fails by default, dropped with DropPermanent", func(t *testing.T) {
			c := newCharger()
			h := newHandler(t, lambdadedup.Config{}, c.handle)
			if f := invoke(t, ctx, h, rec); !slices.Equal(f, []string{"m1"}) {
				t.Errorf("failures %v, want [m1]", f)
			}
			h = newHandler(t, lambdadedup.Config{DropPermanent: true}, c.handle)
			if f := invoke(t, ctx, h, rec); len(f) != 0 {
				t.Errorf("DropPermanent: failures %v, want none", f)
			}
			if c.total() != 0 {
				t.Errorf("charged %v", c.charges)
			}
		})
	}
	t.Run("key reuse fails by default, dropped with DropPermanent", func(t *testing.T) {
		c := newCharger()
		store := memstore.New(nil)
		for _, drop := range []bool{false, true} {
			h := newHandler(t, lambdadedup.Config{DropPermanent: drop, Dedup: dedup.Config{Store: store, Fingerprint: keyfuncs.PayloadFingerprint}}, c.handle)
			if f := invoke(t, ctx, h, record("m1", order("A"))); len(f) != 0 {
				t.Fatalf("failures %v", f)
			}
			f := invoke(t, ctx, h, record("m2", `{"order_id":"A","amount":999}`))
			if want := []string{"m2"}; drop {
				want = nil
				if len(f) != 0 {
					t.Errorf("DropPermanent: failures %v, want none", f)
				}
			} else if !slices.Equal(f, want) {
				t.Errorf("failures %v, want %v", f, want)
			}
		}
		if c.charges["A"] != 1 {
			t.Errorf("charges %v, want A:1", c.charges)
		}
	})
	t.Run("store unreachable fails closed, or opens", func(t *testing.T) {
		c := newCharger()
		h := newHandler(t, lambdadedup.Config{Dedup: dedup.Config{Store: failingStore{}}}, c.handle)
		if f := invoke(t, ctx, h, record("m1", order("A"))); !slices.Equal(f, []string{"m1"}) {
			t.Errorf("failures %v, want [m1]", f)
		}
		if c.total() != 0 {
			t.Errorf("fail closed charged %v", c.charges)
		}
		h = newHandler(t, lambdadedup.Config{Dedup: dedup.Config{Store: failingStore{}, FailOpen: true}}, c.handle)
		if f := invoke(t, ctx, h, record("m1", order("A"))); len(f) != 0 {
			t.Errorf("FailOpen: failures %v, want none", f)
		}
		if c.total() != 1 {
			t.Errorf("FailOpen: charges %v, want A:1", c.charges)
		}
	})
	t.Run("panic fails its record only and releases", func(t *testing.T) {
		c := newCharger()
		var panicked atomic.Bool
		c.fail = func(id string, _ int) error {
			if id == "P" && !panicked.Swap(true) {
				panic("boom")
			}
			return nil
		}
		h := newHandler(t, lambdadedup.Config{Concurrency: 2}, c.handle)
		if f := invoke(t, ctx, h, record("m1", order("A")), record("m2", order("P")), record("m3", order("B"))); !slices.Equal(f, []string{"m2"}) {
			t.Errorf("failures %v, want [m2]", f)
		}
		if f := invoke(t, ctx, h, record("m2", order("P"))); len(f) != 0 {
			t.Errorf("retry: failures %v, want none (the claim was released)", f)
		}
		if c.charges["P"] != 1 || c.total() != 3 {
			t.Errorf("charges %v, want A, B, P once each", c.charges)
		}
	})
}

// A record is not started when less than DeadlineMargin is left; it stays
// unclaimed, so the next invocation runs it.
func TestDeadlineMargin(t *testing.T) {
	clock := fakeclock.New(time.Now())
	c := newCharger()
	c.fail = func(string, int) error { clock.Advance(4 * time.Second); return nil } // each charge takes 4s
	h := newHandler(t, lambdadedup.Config{DeadlineMargin: 3 * time.Second, Dedup: dedup.Config{Clock: clock}}, c.handle)

	ctx, cancel := context.WithDeadline(context.Background(), clock.Now().Add(10*time.Second))
	defer cancel()
	f := invoke(t, ctx, h, record("m1", order("A")), record("m2", order("B")), record("m3", order("C")))
	// m1 starts with 10s left, m2 with 6s, m3 would start with 2s < 3s.
	if !slices.Equal(f, []string{"m3"}) {
		t.Errorf("failures %v, want [m3]", f)
	}
	if c.total() != 2 {
		t.Errorf("charges %v, want A and B", c.charges)
	}
	ctx2, cancel2 := context.WithDeadline(context.Background(), clock.Now().Add(10*time.Second))
	defer cancel2()
	if f := invoke(t, ctx2, h, record("m3", order("C"))); len(f) != 0 {
		t.Errorf("next invocation: failures %v, want none", f)
	}
	if c.charges["C"] != 1 {
		t.Errorf("charges %v, want C:1", c.charges)
	}
}

// extendCounter counts the store's extensions.
type extendCounter struct{ extends atomic.Int64 }

func (o *extendCounter) ObserveDecision(dedup.Decision) {}
func (o *extendCounter) ObserveStoreOp(op string, _ time.Duration, err error) {
	if op == "extend" && err == nil {
		o.extends.Add(1)
	}
}

// The lease of a record never outlives the invocation: a record whose
// invocation died at its deadline can be taken over right after it, though
// Dedup.Lease is 30s. The lease is cut to end at the deadline, where no
// extension may move it, so none is sent (each would be a write that
// changes nothing).
func TestLeaseEndsAtDeadline(t *testing.T) {
	clock := fakeclock.New(time.Now())
	store := memstore.New(clock)
	obs := &extendCounter{}
	started, hang := make(chan struct{}), make(chan struct{})
	defer close(hang)
	var calls atomic.Int64
	hung := func(msg *message.Message) error {
		if calls.Add(1) == 1 {
			close(started)
			<-hang // a handler that ignores its context: the invocation times out
		}
		return nil
	}
	cfg := lambdadedup.Config{DeadlineMargin: time.Second, Dedup: dedup.Config{Store: store, Clock: clock, Lease: 30 * time.Second, Observer: obs}}
	h := newHandler(t, cfg, hung)

	ctx, cancel := context.WithDeadline(context.Background(), clock.Now().Add(6*time.Second))
	defer cancel()
	go func() {
		payload, _ := json.Marshal(events.SQSEvent{Records: []events.SQSMessage{record("m1", order("A"))}})
		_, _ = lambda.NewHandler(h.Handle).Invoke(ctx, payload)
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("timed out after 10s waiting for the first handler to start")
	}
	// Lease 6s, ending at the deadline: past two heartbeats' worth of
	// time (2s each), then past the deadline.
	clock.Advance(2100 * time.Millisecond)
	clock.Advance(2100 * time.Millisecond)
	clock.Advance(2 * time.Second) // 6.2s: past the deadline

	h2 := newHandler(t, cfg, hung)
	if f := invoke(t, context.Background(), h2, record("m2", order("A"))); len(f) != 0 {
		t.Errorf("after the deadline: failures %v, want none (the record's lease ended with the invocation)", f)
	}
	if calls.Load() != 2 {
		t.Errorf("handler calls %d, want 2", calls.Load())
	}
	if n := obs.extends.Load(); n != 0 {
		t.Errorf("%d extensions of a lease that ends at the deadline, want none", n)
	}
}

// FIFO: after a failure in a message group, the group's later records are
// failures too, unstarted; other groups go on.
func TestFIFOGroup(t *testing.T) {
	rec := fifoRecord
	for _, concurrency := range []int{1, 4} {
		t.Run(fmt.Sprint("concurrency ", concurrency), func(t *testing.T) {
			c := newCharger()
			c.fail = func(id string, _ int) error {
				if id == "A1" {
					return errors.New("declined")
				}
				return nil
			}
			h := newHandler(t, lambdadedup.Config{Concurrency: concurrency}, c.handle)
			f := invoke(t, context.Background(), h,
				rec("a1", "A", "A1"), rec("b1", "B", "B1"), rec("a2", "A", "A2"), rec("b2", "B", "B2"), rec("a3", "A", "A3"))
			if !slices.Equal(f, []string{"a1", "a2", "a3"}) {
				t.Errorf("failures %v, want [a1 a2 a3]", f)
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.charges["B1"] != 1 || c.charges["B2"] != 1 || c.charges["A2"]+c.charges["A3"] != 0 {
				t.Errorf("charges %v, want B1 and B2 only", c.charges)
			}
			if slices.Contains(c.calls, "a2") || slices.Contains(c.calls, "a3") {
				t.Errorf("calls %v: a2 and a3 must not start after a1 failed", c.calls)
			}
			if i, j := slices.Index(c.calls, "b1"), slices.Index(c.calls, "b2"); i < 0 || j < i {
				t.Errorf("calls %v: b1 must run before b2", c.calls)
			}
		})
	}
	t.Run("a standard queue's group ids do not chain records", func(t *testing.T) {
		c := newCharger()
		c.fail = func(id string, _ int) error {
			if id == "A1" {
				return errors.New("declined")
			}
			return nil
		}
		h := newHandler(t, lambdadedup.Config{}, c.handle)
		r1, r2 := record("a1", order("A1")), record("a2", order("A2"))
		r1.Attributes = map[string]string{"MessageGroupId": "A"} // fair queues
		r2.Attributes = map[string]string{"MessageGroupId": "A"}
		if f := invoke(t, context.Background(), h, r1, r2); !slices.Equal(f, []string{"a1"}) {
			t.Errorf("failures %v, want [a1]", f)
		}
	})
}

// Concurrency bounds the records running at once, and is reached.
func TestConcurrency(t *testing.T) {
	const limit = 3
	var active, peak atomic.Int64
	full := make(chan struct{})
	var once sync.Once
	h := newHandler(t, lambdadedup.Config{Concurrency: limit}, func(msg *message.Message) error {
		n := active.Add(1)
		defer active.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		if n == limit {
			once.Do(func() { close(full) })
		}
		select { // the first records wait until limit run at once
		case <-full:
		case <-time.After(10 * time.Second):
			return errors.New("timed out after 10s waiting for 3 records to run at once")
		}
		return nil
	})
	var recs []events.SQSMessage
	for i := range 10 {
		recs = append(recs, record(fmt.Sprint("m", i), order(fmt.Sprint("O", i))))
	}
	if f := invoke(t, context.Background(), h, recs...); len(f) != 0 {
		t.Errorf("failures %v, want none", f)
	}
	if peak.Load() != limit {
		t.Errorf("peak concurrency %d, want %d", peak.Load(), limit)
	}
}

// skipObserver records, by message id, the lambdadedup decisions of records
// that did not start.
type skipObserver struct {
	mu     sync.Mutex
	events map[string][]event.Event
}

func (o *skipObserver) ObserveDecision(d dedup.Decision) {
	if d.Event != lambdadedup.EventDeadline && d.Event != lambdadedup.EventGroupSkipped {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events[d.MessageUUID] = append(o.events[d.MessageUUID], d.Event)
}
func (o *skipObserver) ObserveStoreOp(string, time.Duration, error) {}

// FIFO: a record of a group that does not start because its group failed
// before it is group_skipped; one that took its turn after the invocation's
// time ran short (StartBy) is deadline_skipped, though both end with
// dedup.ErrNotStarted.
func TestFIFOSkipsTellGroupFromDeadline(t *testing.T) {
	rec := fifoRecord
	clock := fakeclock.New(time.Now())
	c := newCharger()
	c.fail = func(id string, _ int) error {
		if id == "A1" {
			return errors.New("declined")
		}
		clock.Advance(4 * time.Second) // each charge of group B takes 4s
		return nil
	}
	obs := &skipObserver{events: map[string][]event.Event{}}
	h := newHandler(t, lambdadedup.Config{DeadlineMargin: 3 * time.Second, Dedup: dedup.Config{Clock: clock, Observer: obs}}, c.handle)
	ctx, cancel := context.WithDeadline(context.Background(), clock.Now().Add(10*time.Second))
	defer cancel()
	// a1 fails: a2 does not start. b1 starts with 10s left, b2 with 6s, b3
	// would start with 2s < 3s.
	f := invoke(t, ctx, h, rec("a1", "A", "A1"), rec("a2", "A", "A2"), rec("b1", "B", "B1"), rec("b2", "B", "B2"), rec("b3", "B", "B3"))
	if !slices.Equal(f, []string{"a1", "a2", "b3"}) {
		t.Errorf("failures %v, want [a1 a2 b3]", f)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if got := obs.events["a2"]; !slices.Equal(got, []event.Event{lambdadedup.EventGroupSkipped}) {
		t.Errorf("a2: decisions %v, want [group_skipped]", got)
	}
	if got := obs.events["b3"]; !slices.Equal(got, []event.Event{lambdadedup.EventDeadline}) {
		t.Errorf("b3: decisions %v, want [deadline_skipped]", got)
	}
	if len(obs.events) != 2 {
		t.Errorf("skip decisions %v, want a2's and b3's only", obs.events)
	}
}

// fifoRecord is a record of a FIFO queue's message group.
func fifoRecord(id, group, orderID string) events.SQSMessage {
	r := record(id, order(orderID))
	r.EventSourceARN = "arn:aws:sqs:us-east-1:000000000000:orders.fifo"
	r.Attributes = map[string]string{"MessageGroupId": group}
	return r
}
