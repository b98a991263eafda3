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

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
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

// orderHeader is the Kafka header some producers put the order id in.
const orderHeader = "order_id"

// orderKey takes the order id from the order_id header (Kafka headers
// arrive as Watermill metadata) when the producer set one, and from the
// JSON body otherwise: both give the same key for the same order.
var orderKey = keyfuncs.FirstOf(keyfuncs.Metadata(orderHeader), keyfuncs.JSON("order_id"))

// errGatewayTimeout is the payment gateway failing: the middleware releases
// the claim and the message is nacked; watermill-kafka offers it again from
// the same partition.
var errGatewayTimeout = errors.New("payment gateway timed out")

// ledger is the effect: it charges orders and remembers what it charged,
// and which group member saw which copies.
type ledger struct {
	out io.Writer

	mu       sync.Mutex
	charges  map[string]int  // order id → charges
	failOnce map[string]bool // order ids whose first charge attempt fails
	total    int
	byMember map[string]int // handler (group member) → charges
}

func newLedger(out io.Writer) *ledger {
	return &ledger{out: out, charges: map[string]int{}, failOnce: map[string]bool{}, byMember: map[string]int{}}
}

// where describes a delivery: the group member, partition and offset.
func where(msg *message.Message) string {
	p, _ := kafka.MessagePartitionFromCtx(msg.Context())
	o, _ := kafka.MessagePartitionOffsetFromCtx(msg.Context())
	keyFrom := "body"
	if msg.Metadata.Get(orderHeader) != "" {
		keyFrom = "header"
	}
	return fmt.Sprintf("%s, partition %d offset %d, key from %s", message.HandlerNameFromCtx(msg.Context()), p, o, keyFrom)
}

// failFirst makes the first charge of orderID fail.
func (l *ledger) failFirst(orderID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failOnce[orderID] = true
}

// charge is the handler of every group member.
func (l *ledger) charge(msg *message.Message) error {
	var o order
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return fmt.Errorf("decoding order: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failOnce[o.OrderID] {
		delete(l.failOnce, o.OrderID)
		fmt.Fprintf(l.out, "failed   %-9s %s (%s): retried\n", o.OrderID, errGatewayTimeout, where(msg))
		return errGatewayTimeout
	}
	l.charges[o.OrderID]++
	l.total++
	l.byMember[message.HandlerNameFromCtx(msg.Context())]++
	fmt.Fprintf(l.out, "charged  %-9s %4d %s (%s)\n", o.OrderID, o.Amount, o.Currency, where(msg))
	return nil
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
// that do not reach the handler, counts every decision, and remembers which
// members saw each key.
type printer struct {
	out io.Writer

	mu      sync.Mutex
	counts  map[event.Event]int
	members map[string]map[string]bool // business key → handlers that decided on a copy
}

func newPrinter(out io.Writer) *printer {
	return &printer{out: out, counts: map[event.Event]int{}, members: map[string]map[string]bool{}}
}

func (p *printer) ObserveDecision(d dedup.Decision) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.counts[d.Event]++
	key := businessKey(d.Key)
	if key != "" {
		if p.members[key] == nil {
			p.members[key] = map[string]bool{}
		}
		p.members[key][d.Handler] = true
	}
	switch d.Event {
	case event.SkipDuplicate:
		fmt.Fprintf(p.out, "skipped  %-9s already charged (%s)\n", key, d.Handler)
	case event.InProgress:
		fmt.Fprintf(p.out, "deferred %-9s being charged by another member (%s): retried\n", key, d.Handler)
	case event.KeyMissing, event.TransportKey:
		fmt.Fprintf(p.out, "refused  message %s: %v\n", d.MessageUUID, d.Err)
	}
}

func (p *printer) ObserveStoreOp(string, time.Duration, error) {}

func (p *printer) count(e event.Event) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counts[e]
}

// spread returns the keys whose copies were decided on by more than one
// group member.
func (p *printer) spread() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var keys []string
	for k, m := range p.members {
		if len(m) > 1 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
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
