// Package lab runs the ORDER-003 lab: one order published many times (each
// copy with a new message id, as SQS gives each SendMessage a new
// MessageId), plus other orders with random duplicates, consumed by a
// "charge order" handler with idempotency off and on. dev/lab is its
// command line; tests run it on every broker and store.
package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// Transport is one broker connection for one run: the publisher the lab
// sends orders with and the subscriber the consumer reads them from.
type Transport struct {
	Publisher  message.Publisher
	Subscriber message.Subscriber
	// Topic is where orders are published and consumed.
	Topic string
	// PoisonTopic is where messages without a usable key go. Defaults to
	// Topic + ".poison".
	PoisonTopic string
	// Consumers is how many router handlers subscribe to Topic, competing
	// for its messages (SQS receivers, members of one Kafka consumer
	// group). Defaults to 1; it must stay 1 for a subscriber that gives
	// every subscription every message, such as GoChannel.
	Consumers int
	// Middleware is added to the router before (outside) the lab's own
	// middleware, e.g. a shorter redelivery delay for nacked SQS messages.
	Middleware []message.HandlerMiddleware
	// Pending, when set, returns how many messages the broker still holds
	// for the consumer: waiting, in flight (received, not yet deleted) or
	// not committed. Once every message is acked the lab waits for it to
	// reach zero before closing the router, since an ack is confirmed to
	// the broker asynchronously (an SQS DeleteMessage, a Kafka offset
	// commit) and closing too early would lose it.
	Pending func(ctx context.Context) (int, error)
	// Close releases the transport's resources; may be nil.
	Close func() error
}

// Config describes one lab.
type Config struct {
	// Copies is how many times ORDER-003 is published. Defaults to 10.
	Copies int
	// Orders is how many other orders are published (zero: none).
	Orders int
	// MaxDuplicates bounds the copies of each other order (1..MaxDuplicates,
	// uniformly). Defaults to 3.
	MaxDuplicates int
	// Concurrency bounds how many handler calls run at once. Defaults to 8.
	Concurrency int
	// EffectTime is how long a charge takes (the payment gateway's
	// latency); it lets concurrent copies overlap. Defaults to 2ms.
	EffectTime time.Duration
	// Seed makes the duplicates, their order and the lost acks
	// reproducible. Defaults to 1.
	Seed uint64
	// LoseAcks is how many messages lose their first ack: the charge runs,
	// then the message is nacked as if the consumer had crashed before
	// acking, and the broker redelivers it (GoChannel at once, Kafka from
	// the same partition, SQS when the message becomes visible again).
	// Without idempotency each one is charged twice. Defaults to 0.
	LoseAcks int
	// Broker names the broker in the report.
	Broker string
	// StoreName names the store in the report.
	StoreName string
	// NewTransport returns a fresh transport for a run ("off" or "on").
	// Required.
	NewTransport func(ctx context.Context, run string) (*Transport, error)
	// NewStore returns the store for the "on" run. Required.
	NewStore func(ctx context.Context) (dedup.Store, error)
	// Timeout bounds each run. Defaults to 2 minutes.
	Timeout time.Duration
	// Progress, when set, receives a progress line every 2 seconds.
	Progress io.Writer
	// Logger is the router's logger. Defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter
	// Shadow runs the idempotent run in shadow mode (dedup.Config.Shadow):
	// records are claimed and completed, but every copy is charged; the
	// copies dedup would have skipped are counted as would_skip.
	Shadow bool
	// TxCharges, when set, makes the idempotent run's charge a write to
	// the store's own charges table, in the transaction that completes the
	// order's record (the store's TxMiddleware); its Charges are then
	// counted in that table (Result.Table). Not with Shadow.
	TxCharges TxCharges
}

func (c *Config) setDefaults() {
	if c.Copies == 0 {
		c.Copies = 10
	}
	if c.MaxDuplicates == 0 {
		c.MaxDuplicates = 3
	}
	if c.Concurrency == 0 {
		c.Concurrency = 8
	}
	if c.EffectTime == 0 {
		c.EffectTime = 2 * time.Millisecond
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

// Validate reports every problem in the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.Copies < 0 || c.Orders < 0 || c.MaxDuplicates < 0 || c.Concurrency < 0 || c.LoseAcks < 0 {
		errs = append(errs, errors.New("lab: copies, orders, max duplicates, concurrency and lost acks must not be negative"))
	}
	if c.EffectTime < 0 || c.Timeout < 0 {
		errs = append(errs, errors.New("lab: durations must not be negative"))
	}
	if c.NewTransport == nil {
		errs = append(errs, errors.New("lab: NewTransport is required"))
	}
	if c.NewStore == nil {
		errs = append(errs, errors.New("lab: NewStore is required"))
	}
	if c.TxCharges != nil && c.Shadow {
		errs = append(errs, errors.New("lab: the charge in the record's transaction needs the claim that shadow mode does not take"))
	}
	return errors.Join(errs...)
}

// Result is one run's figures.
type Result struct {
	Idempotency bool
	Shadow      bool // the idempotent run was in shadow mode
	// Scope is the dedup scope of an idempotent run (fresh per run): its
	// records are under admin.ScopedKey(Scope, order id), each kept for
	// Retention.
	Scope          string
	WouldSkip      int // shadow mode: copies charged that dedup would have skipped
	Messages       int // published copies
	DistinctOrders int
	Charges        int // effects performed
	Acked          int // messages acked by the consumer
	LostAcks       int // first acks turned into nacks (Config.LoseAcks), each redelivered
	Outcomes       map[event.Event]int
	HandlerErrors  int // nacks returned to the broker (in-progress copies, lost acks, store errors, ...)
	// Pending is what Transport.Pending reported last: messages the broker
	// still held when the run ended (0 when every ack reached the broker;
	// always 0 without Transport.Pending).
	Pending int
	Elapsed time.Duration
	// Table is the charges table of a run with Config.TxCharges: how many
	// times each order was charged, as the store holds it; nil otherwise.
	Table map[string]int
}

// OK reports whether the run shows what it should: every message acked and
// none left in the broker, and charges == messages (plus one per lost ack)
// without idempotency, charges == distinct orders with, and in shadow mode
// charges == messages and would-skip == messages − distinct orders (plus
// one each per lost ack).
func (r Result) OK() bool {
	if r.Acked != r.Messages || r.Pending != 0 {
		return false
	}
	if r.Shadow {
		return r.Charges == r.Messages+r.LostAcks && r.WouldSkip == r.Messages-r.DistinctOrders+r.LostAcks
	}
	if r.Idempotency {
		return r.Charges == r.DistinctOrders
	}
	return r.Charges == r.Messages+r.LostAcks
}

// Orders builds the lab's messages: ORDER-003 cfg.Copies times, then the
// other orders 1..MaxDuplicates times each, shuffled with the seed. Every
// copy has its own UUID.
func Orders(cfg Config) (msgs []*message.Message, distinct int) {
	cfg.setDefaults()
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x0de0003))
	add := func(id string, amount, copies int) {
		for range copies {
			body := fmt.Sprintf(`{"order_id":%q,"amount":%d,"currency":"BRL"}`, id, amount)
			m := message.NewMessage(watermill.NewUUID(), []byte(body))
			m.Metadata.Set("order_id", id)
			msgs = append(msgs, m)
		}
	}
	add("ORDER-003", 150, cfg.Copies)
	for i := range cfg.Orders {
		add(fmt.Sprintf("ORDER-%06d", 1000+i), 10+rng.IntN(490), 1+rng.IntN(cfg.MaxDuplicates))
	}
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	return msgs, 1 + cfg.Orders
}

// lostAcks picks cfg.LoseAcks of the messages (with the seed) whose first
// ack is lost.
func lostAcks(cfg Config, msgs []*message.Message) map[string]bool {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0xac4))
	lose := map[string]bool{}
	for _, i := range rng.Perm(len(msgs))[:min(cfg.LoseAcks, len(msgs))] {
		lose[msgs[i].UUID] = true
	}
	return lose
}

// errLostAck is the nack that stands for a consumer crashing after its
// effect and before its ack.
var errLostAck = errors.New("lab: ack lost after the charge (simulated crash before the ack)")

// Run runs the lab with idempotency off, on, or both (in that order).
func Run(ctx context.Context, cfg Config, off, on bool) ([]Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	var results []Result
	for _, idem := range []bool{false, true} {
		if idem && !on || !idem && !off {
			continue
		}
		r, err := runOnce(ctx, cfg, idem)
		if err != nil {
			return results, err
		}
		results = append(results, r)
	}
	return results, nil
}

// counter is the dedup.Observer of a run.
type counter struct {
	mu       sync.Mutex
	outcomes map[event.Event]int
}

func (c *counter) ObserveDecision(d dedup.Decision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.outcomes[d.Event]++
}

func (c *counter) ObserveStoreOp(string, time.Duration, error) {}

// run is one run of the lab: its messages, what the consumer did with
// them, and the progress line.
type run struct {
	cfg         Config
	name        string // "off", "on" or "shadow"
	idempotency bool
	scope       string // the dedup scope of an idempotent run, fresh per run
	msgs        []*message.Message
	distinct    int
	lose        map[string]bool // UUIDs whose first ack is lost

	charges, nacks, published atomic.Int64
	obs                       *counter

	mu       sync.Mutex
	acked    map[string]bool // UUIDs acked
	lost     map[string]bool // UUIDs whose first ack was lost
	allAcked chan struct{}   // closed when every message was acked once
	start    time.Time
}

func newRun(cfg Config, idempotency bool) *run {
	name := "off"
	switch {
	case idempotency && cfg.Shadow:
		name = "shadow"
	case idempotency:
		name = "on"
	}
	msgs, distinct := Orders(cfg)
	return &run{
		cfg: cfg, name: name, idempotency: idempotency,
		msgs: msgs, distinct: distinct, lose: lostAcks(cfg, msgs),
		obs:   &counter{outcomes: map[event.Event]int{}},
		acked: map[string]bool{}, lost: map[string]bool{}, allAcked: make(chan struct{}),
	}
}

func runOnce(ctx context.Context, cfg Config, idempotency bool) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	r := newRun(cfg, idempotency)
	tr, err := cfg.NewTransport(ctx, r.name)
	if err != nil {
		return r.result(0), fmt.Errorf("lab: broker %s: %w", cfg.Broker, err)
	}
	if tr.Close != nil {
		defer func() { _ = tr.Close() }()
	}
	router, err := r.newRouter(ctx, tr)
	if err != nil {
		return r.result(0), err
	}
	runErr, err := startRouter(ctx, router)
	if err != nil {
		return r.result(0), err
	}
	pending, publishing, waitErr := r.publishAndWait(ctx, tr, runErr)
	elapsed := time.Since(r.start)
	if err := router.Close(); err != nil && waitErr == nil {
		waitErr = err
	}
	if publishing != nil {
		// Stopped early: let the publisher finish (its calls are bounded
		// by the broker client's own timeouts) before the transport closes.
		<-publishing
	}
	res := r.result(pending)
	res.Elapsed = elapsed
	if r.inTx() && waitErr == nil {
		res.Table, waitErr = r.cfg.TxCharges.Table(ctx, r.scope, r.orders())
		res.Charges = 0
		for _, n := range res.Table {
			res.Charges += n
		}
	}
	return res, waitErr
}

// newRouter builds the consumer: the transport's middleware outermost, then
// the ack counter, the concurrency bound, dedup (on the "on" run) and the
// charge handler, subscribed Transport.Consumers times.
func (r *run) newRouter(ctx context.Context, tr *Transport) (*message.Router, error) {
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, r.cfg.Logger)
	if err != nil {
		return nil, err
	}
	router.AddMiddleware(tr.Middleware...)
	router.AddMiddleware(r.countAcks, r.bound())
	if r.idempotency {
		mw, err := r.dedupMiddleware(ctx, tr)
		if err != nil {
			return nil, err
		}
		router.AddMiddleware(mw...)
	}
	consumers := max(tr.Consumers, 1)
	for i := range consumers {
		name := "charge-orders"
		if consumers > 1 {
			name = fmt.Sprintf("charge-orders-%d", i+1)
		}
		router.AddConsumerHandler(name, tr.Topic, tr.Subscriber, r.charge)
	}
	return router, nil
}

// countAcks counts what the broker sees (ack or nack), and turns the chosen
// first acks into nacks (Config.LoseAcks).
func (r *run) countAcks(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err != nil {
			r.nacks.Add(1)
			return out, err
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.lose[msg.UUID] && !r.lost[msg.UUID] {
			r.lost[msg.UUID] = true
			r.nacks.Add(1)
			return nil, errLostAck
		}
		if !r.acked[msg.UUID] {
			r.acked[msg.UUID] = true
			if len(r.acked) == len(r.msgs) {
				close(r.allAcked)
			}
		}
		return out, nil
	}
}

// bound limits the handler calls running at once to Config.Concurrency and
// pauses an in-progress copy for Config.EffectTime before it is nacked (on
// a real broker: the redelivery delay).
func (r *run) bound() message.HandlerMiddleware {
	sem := make(chan struct{}, r.cfg.Concurrency)
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			sem <- struct{}{}
			out, err := h(msg)
			<-sem
			if errors.Is(err, dedup.ErrInProgress) {
				time.Sleep(r.cfg.EffectTime)
			}
			return out, err
		}
	}
}

// Retention is the dedup retention of the lab's records: what a run
// leaves in a shared store is kept this long (unless evicted).
const Retention = 24 * time.Hour

// newScope makes the run's fresh scope (a shared store may hold earlier
// runs) and keeps it for the Result.
func (r *run) newScope() string {
	r.scope = "charge-orders-" + watermill.NewShortUUID()
	return r.scope
}

// dedupMiddleware returns the poison queue for permanent errors and the
// Deduplicator, on a fresh scope (a shared store may hold earlier runs).
func (r *run) dedupMiddleware(ctx context.Context, tr *Transport) ([]message.HandlerMiddleware, error) {
	store, err := r.cfg.NewStore(ctx)
	if err != nil {
		return nil, fmt.Errorf("lab: store %s: %w", r.cfg.StoreName, err)
	}
	d, err := dedup.New(dedup.Config{
		Store:     store,
		Key:       keyfuncs.JSON("order_id"),
		Scope:     r.newScope(),
		Retention: Retention,
		Observer:  r.obs,
		Logger:    r.cfg.Logger,
		Shadow:    r.cfg.Shadow,
	})
	if err != nil {
		return nil, err
	}
	poisonTopic := tr.PoisonTopic
	if poisonTopic == "" {
		poisonTopic = tr.Topic + ".poison"
	}
	poison, err := middleware.PoisonQueueWithFilter(tr.Publisher, poisonTopic, dedup.IsPermanent)
	if err != nil {
		return nil, err
	}
	if r.inTx() {
		return []message.HandlerMiddleware{poison, d.Middleware, r.cfg.TxCharges.Middleware}, nil
	}
	return []message.HandlerMiddleware{poison, d.Middleware}, nil
}

// charge is the effect: a call to the payment gateway taking EffectTime.
// With Config.TxCharges (idempotent run), the charge is then written to
// the store's charges table in the transaction that completes the order's
// record, and counted from that table after the run.
func (r *run) charge(msg *message.Message) error {
	order, err := keyfuncs.JSON("order_id")(msg)
	if err != nil {
		return err
	}
	select {
	case <-time.After(r.cfg.EffectTime):
	case <-msg.Context().Done():
		return msg.Context().Err()
	}
	if r.inTx() {
		return r.cfg.TxCharges.Charge(msg, r.scope, order)
	}
	r.charges.Add(1)
	return nil
}

// inTx reports whether the run charges in the record's transaction.
func (r *run) inTx() bool { return r.idempotency && r.cfg.TxCharges != nil }

// orders are the run's distinct order ids.
func (r *run) orders() []string {
	seen := map[string]bool{}
	var ids []string
	for _, m := range r.msgs {
		id, err := keyfuncs.JSON("order_id")(m)
		if err == nil && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

// startRouter runs router until ctx ends and returns once it is running;
// the channel receives what Run returned.
func startRouter(ctx context.Context, router *message.Router) (<-chan error, error) {
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	select {
	case <-router.Running():
		return runErr, nil
	case err := <-runErr:
		return nil, fmt.Errorf("lab: router: %w", err)
	}
}

// publishAndWait publishes the messages while the router consumes them, as
// producers do, waits until every one was acked and, with
// Transport.Pending, until the broker holds none. It returns the last
// pending count and, when it stopped before the publisher did, the channel
// that receives the publisher's result.
func (r *run) publishAndWait(ctx context.Context, tr *Transport, runErr <-chan error) (int, <-chan error, error) {
	r.start = time.Now()
	pubDone := make(chan error, 1)
	go func() { pubDone <- publish(tr, r.msgs, r.cfg.Concurrency, &r.published) }()
	progress := time.NewTicker(2 * time.Second)
	defer progress.Stop()
	pubErr, err := r.waitAcked(ctx, pubDone, runErr, progress.C)
	pending := 0
	if err == nil && tr.Pending != nil {
		pending, err = drain(ctx, tr.Pending, progress.C, r.report)
		if err != nil {
			err = fmt.Errorf("lab: run %q: %d messages still in the broker after every ack: %w", r.name, pending, err)
		}
	}
	return pending, pubErr, err
}

// waitAcked waits until every message was acked, the publisher failed, the
// router stopped or ctx ended, printing progress. It returns pubDone, or
// nil once the publisher's result was received.
func (r *run) waitAcked(ctx context.Context, pubDone, runErr <-chan error, progress <-chan time.Time) (<-chan error, error) {
	for {
		select {
		case <-r.allAcked:
			return pubDone, nil
		case err := <-pubDone:
			pubDone = nil
			if err != nil {
				return nil, fmt.Errorf("lab: publish: %w", err)
			}
		case <-progress:
			r.report("")
		case <-ctx.Done():
			return pubDone, fmt.Errorf("lab: run %q timed out: %w", r.name, ctx.Err())
		case err := <-runErr:
			return pubDone, fmt.Errorf("lab: router stopped: %w", err)
		}
	}
}

// report writes a progress line to Config.Progress.
func (r *run) report(what string) {
	if r.cfg.Progress == nil {
		return
	}
	r.mu.Lock()
	n := len(r.acked)
	r.mu.Unlock()
	sent := ""
	if p := r.published.Load(); int(p) < len(r.msgs) {
		sent = fmt.Sprintf("%d/%d messages published, ", p, len(r.msgs))
	}
	fmt.Fprintf(r.cfg.Progress, "  idempotency %s: %s%d/%d messages acked, %d charges, %.0fs%s\n",
		r.name, sent, n, len(r.msgs), r.charges.Load(), time.Since(r.start).Seconds(), what)
}

// result collects the run's figures.
func (r *run) result(pending int) Result {
	res := Result{
		Idempotency: r.idempotency, Shadow: r.idempotency && r.cfg.Shadow, Scope: r.scope, Messages: len(r.msgs), DistinctOrders: r.distinct,
		Charges: int(r.charges.Load()), HandlerErrors: int(r.nacks.Load()), Pending: pending,
		Outcomes: map[event.Event]int{},
	}
	r.mu.Lock()
	res.Acked, res.LostAcks = len(r.acked), len(r.lost)
	r.mu.Unlock()
	r.obs.mu.Lock()
	for k, v := range r.obs.outcomes {
		res.Outcomes[k] = v
	}
	res.WouldSkip = r.obs.outcomes[event.WouldSkip]
	r.obs.mu.Unlock()
	return res
}

// publish sends msgs with up to workers concurrent Publish calls (as many
// producers would), so that brokers whose publishers send one request per
// message (SQS, SNS, a Kafka sync producer) are not the bottleneck.
func publish(tr *Transport, msgs []*message.Message, workers int, published *atomic.Int64) error {
	next := make(chan *message.Message)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range next {
				if err := tr.Publisher.Publish(tr.Topic, m); err != nil {
					errs <- err
					return
				}
				published.Add(1)
			}
		}()
	}
	var err error
send:
	for _, m := range msgs {
		select {
		case next <- m:
		case err = <-errs:
			break send
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	if err != nil {
		return err
	}
	return <-errs // nil when no worker failed
}

// drainPoll is how often drain asks the broker what it still holds.
const drainPoll = 50 * time.Millisecond

// drain waits until pending reports zero messages left in the broker, and
// returns the last count.
func drain(ctx context.Context, pending func(context.Context) (int, error), progress <-chan time.Time, report func(string)) (int, error) {
	poll := time.NewTicker(drainPoll)
	defer poll.Stop()
	for {
		n, err := pending(ctx)
		if err == nil && n == 0 {
			return 0, nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return n, errors.Join(ctx.Err(), err)
			}
			return n, ctx.Err()
		case <-progress:
			report(fmt.Sprintf(", waiting for the broker to confirm the acks (%d pending)", n))
		case <-poll.C:
		}
	}
}

// PrintTable writes the results as a table.
func PrintTable(w io.Writer, results []Result) {
	fmt.Fprintf(w, "%-12s %9s %16s %8s %10s %18s %20s %7s\n",
		"idempotency", "messages", "distinct orders", "charges", "claim won", "duplicate skipped", "in-progress retried", "nacks")
	for _, r := range results {
		state, won, dup, inprog := "off", "-", "-", "-"
		switch {
		case r.Shadow:
			state, won = "shadow", fmt.Sprint(r.Outcomes[event.ClaimWon])
		case r.Idempotency:
			state = "on"
			won = fmt.Sprint(r.Outcomes[event.ClaimWon])
			dup = fmt.Sprint(r.Outcomes[event.SkipDuplicate])
			inprog = fmt.Sprint(r.Outcomes[event.InProgress])
		}
		fmt.Fprintf(w, "%-12s %9d %16d %8d %10s %18s %20s %7d\n",
			state, r.Messages, r.DistinctOrders, r.Charges, won, dup, inprog, r.HandlerErrors)
	}
}
