package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// order is the event: an order to charge.
type order struct {
	OrderID  string `json:"order_id"`
	Amount   int    `json:"amount"`
	Currency string `json:"currency"`
}

// orderKey is the one key function of the example: the order id in the
// JSON body, also when the body is an SNS notification envelope (an SNS
// subscription without raw message delivery). The same function serves the
// queue fed directly and the queue fed by SNS.
var orderKey = keyfuncs.SNSEnvelope(keyfuncs.JSON("order_id"))

// decodeOrder reads the order from a message body, unwrapping an SNS
// envelope like orderKey does.
func decodeOrder(payload []byte) (order, error) {
	var envelope struct {
		Type, TopicArn, Message string
	}
	if json.Unmarshal(payload, &envelope) == nil && envelope.Type == "Notification" && envelope.TopicArn != "" {
		payload = []byte(envelope.Message)
	}
	var o order
	if err := json.Unmarshal(payload, &o); err != nil {
		return order{}, fmt.Errorf("decoding order: %w", err)
	}
	return o, nil
}

// errGatewayTimeout is the payment gateway failing: the handler returns it,
// the middleware releases the claim, the message is nacked and SQS
// delivers it again.
var errGatewayTimeout = errors.New("payment gateway timed out")

// ledger is the effect: it charges orders and remembers what it charged.
type ledger struct {
	out io.Writer

	mu       sync.Mutex
	charges  map[string]int  // order id → charges
	failOnce map[string]bool // order ids whose first charge attempt fails
	total    int
	// block, when set, is called before charging; tests use it to hold a
	// charge while a copy arrives.
	block func(order)
}

func newLedger(out io.Writer) *ledger {
	return &ledger{out: out, charges: map[string]int{}, failOnce: map[string]bool{}}
}

// failFirst makes the first charge of orderID fail.
func (l *ledger) failFirst(orderID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failOnce[orderID] = true
}

// charge is the handler: the same function consumes the SQS queue and the
// queue subscribed to SNS.
func (l *ledger) charge(via string) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		o, err := decodeOrder(msg.Payload)
		if err != nil {
			return err
		}
		if l.block != nil {
			l.block(o)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.failOnce[o.OrderID] {
			delete(l.failOnce, o.OrderID)
			fmt.Fprintf(l.out, "failed   %-9s %s (via %s, SQS MessageId %s): retried later\n", o.OrderID, errGatewayTimeout, via, short(msg))
			return errGatewayTimeout
		}
		l.charges[o.OrderID]++
		l.total++
		fmt.Fprintf(l.out, "charged  %-9s %4d %s (via %s, SQS MessageId %s)\n", o.OrderID, o.Amount, o.Currency, via, short(msg))
		return nil
	}
}

// short returns the beginning of the message's SQS MessageId: a new one
// for every copy.
func short(msg *message.Message) string {
	id := msg.Metadata.Get(metaMessageID)
	if len(id) > 8 {
		return id[:8] + "…"
	}
	return id
}

// summary is "ORDER-001 x1, ORDER-003 x1" and the total.
func (l *ledger) summary() (string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]string, 0, len(l.charges))
	for id := range l.charges {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprintf("%s x%d", id, l.charges[id])
	}
	if len(parts) == 0 {
		return "none", 0
	}
	return strings.Join(parts, ", "), l.total
}

// printer is the dedup.Observer of the example: it prints the decisions
// that do not reach the handler, and counts every decision.
type printer struct {
	out io.Writer

	mu     sync.Mutex
	counts map[event.Event]int
	// seen, when set, is told of every decision (tests wait on it).
	seen func(dedup.Decision)
}

func newPrinter(out io.Writer) *printer {
	return &printer{out: out, counts: map[event.Event]int{}}
}

func (p *printer) ObserveDecision(d dedup.Decision) {
	p.mu.Lock()
	p.counts[d.Event]++
	switch d.Event {
	case event.SkipDuplicate:
		fmt.Fprintf(p.out, "skipped  %-9s already charged (%s)\n", businessKey(d.Key), d.Handler)
	case event.InProgress:
		fmt.Fprintf(p.out, "deferred %-9s being charged by another consumer (%s): retried later\n", businessKey(d.Key), d.Handler)
	case event.KeyMissing, event.TransportKey:
		fmt.Fprintf(p.out, "refused  message %s: %v\n", d.MessageUUID, d.Err)
	}
	seen := p.seen
	p.mu.Unlock()
	if seen != nil {
		seen(d)
	}
}

func (p *printer) ObserveStoreOp(string, time.Duration, error) {}

func (p *printer) count(e event.Event) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counts[e]
}

// businessKey drops the scope from a scoped key ("charge-order:ORDER-003"):
// the first ":" ends the (escaped) scope.
func businessKey(scoped string) string {
	if i := strings.IndexByte(scoped, ':'); i >= 0 {
		return scoped[i+1:]
	}
	return scoped
}

// lockedWriter serialises writes from the handlers, the observer and the
// main goroutine.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func lockWriter(w io.Writer) io.Writer { return &lockedWriter{w: w} }

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
