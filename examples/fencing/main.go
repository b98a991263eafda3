// Command fencing shows what a fence does that a lease cannot
// (docs/fencing.md). Two consumers share one store. A claims ORDER-003
// and freezes before it charges (a GC pause, a frozen VM: its heartbeat
// freezes with it) until its lease has ended; B then takes the order over
// and charges it; A wakes and charges too. The charges table keeps the
// fence of the write that set each row and refuses a write with a smaller
// one, so A's late charge is refused and the order is charged once; A's
// handler returns the refusal, the message is nacked, and its redelivery
// is a duplicate. The same run against a table that does not check the
// fence charges the order twice.
//
// The store is stores/memory and the charges table a map that applies the
// SQL condition of docs/fencing.md: nothing to run.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

const (
	order  = "ORDER-003"
	amount = 150
	// lease is both consumers' Config.Lease: the shortest dedup accepts,
	// so that the run is short.
	lease = time.Second
)

func main() {
	for _, checked := range []bool{true, false} {
		if err := run(context.Background(), checked); err != nil {
			log.Fatal(err)
		}
	}
}

// charges is the payment side's table, one row per order:
//
//	INSERT INTO charges (order_id, amount, fence) VALUES ($1, $2, $3)
//	ON CONFLICT (order_id) DO UPDATE SET amount = EXCLUDED.amount, fence = EXCLUDED.fence
//	WHERE charges.fence <= EXCLUDED.fence
//
// (without the WHERE when checkFence is false). Every write it accepts
// charges the card.
type charges struct {
	checkFence bool

	mu     sync.Mutex
	fences map[string]uint64 // the fence of the write that set each row
	times  map[string]int    // the charges made, per order
}

// write applies the statement above and reports whether it changed the
// row (pgx: CommandTag.RowsAffected() == 1).
func (c *charges) write(orderID string, amount int, fence uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if last, ok := c.fences[orderID]; ok && c.checkFence && last > fence {
		return false
	}
	c.fences[orderID] = fence
	c.times[orderID]++
	return true
}

// errStale is the handler's error when the table refused its write: a
// later claim's fence is there. It wraps dedup.ErrClaimLost: the message
// is nacked (not poisoned), and its redelivery finds the successor's
// completed record, a duplicate.
var errStale = fmt.Errorf("the charges table holds a larger fence: %w", dedup.ErrClaimLost)

// chargeOrder is the handler of both consumers: it charges the order with
// its claim's fence. before runs between reading the fence and the write.
func chargeOrder(table *charges, before func(fence uint64)) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		fence, ok := dedup.FenceFromContext(msg.Context())
		if !ok {
			return nil, errors.New("no fence: the store does not fence, and a write without one cannot be refused")
		}
		before(fence)
		if !table.write(order, amount, fence) {
			return nil, fmt.Errorf("charging %s with fence %d: %w", order, fence, errStale)
		}
		return nil, nil
	}
}

// frozen is a consumer's view of the store while its process is frozen:
// its heartbeat's extensions are held until it wakes (or their context,
// bounded by the lease, ends). A frozen process sends nothing.
type frozen struct {
	dedup.Store
	awake <-chan struct{}
}

func (f frozen) Extend(ctx context.Context, claim dedup.Claim, lease time.Duration) error {
	select {
	case <-f.awake:
		return f.Store.Extend(ctx, claim, lease)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func run(ctx context.Context, checkFence bool) error {
	if checkFence {
		fmt.Println("The charges table checks the fence:")
	} else {
		fmt.Println("The charges table does not check the fence:")
	}
	table := &charges{checkFence: checkFence, fences: map[string]uint64{}, times: map[string]int{}}
	store, err := memory.New(ctx, memory.Config{}) // shared by A and B; Redis, DynamoDB or PostgreSQL across processes
	if err != nil {
		return err
	}
	config := dedup.Config{Store: store, Scope: "charge-orders", Key: keyfuncs.Metadata("order_id"), Lease: lease}

	// A: claims, reads its fence, and freezes until B has charged.
	awake, held := make(chan struct{}), make(chan struct{})
	configA := config
	configA.Store = frozen{Store: store, awake: awake}
	a, err := dedup.New(configA)
	if err != nil {
		return err
	}
	var fenceA, fenceB uint64
	runsA := 0
	handlerA := a.Middleware(chargeOrder(table, func(fence uint64) {
		if runsA++; runsA > 1 {
			return // not frozen again
		}
		fenceA = fence
		close(held)
		<-awake
	}))
	msg := newOrderMessage()
	aDone := make(chan error, 1)
	go func() {
		_, err := handlerA(msg)
		aDone <- err
	}()
	<-held
	fmt.Printf("  A claims %s and freezes before it charges (a GC pause, a frozen VM)\n", order)

	// B: the same order (a redelivery), once A's lease has ended.
	configB := config
	configB.InProgressWait, configB.InProgressPoll = 5*lease, 50*time.Millisecond
	b, err := dedup.New(configB)
	if err != nil {
		return err
	}
	handlerB := b.Middleware(chargeOrder(table, func(fence uint64) { fenceB = fence }))
	if _, err := handlerB(newOrderMessage()); err != nil {
		return fmt.Errorf("B: %w", err)
	}
	if fenceB <= fenceA {
		return fmt.Errorf("B's fence %d is not larger than A's %d", fenceB, fenceA)
	}
	fmt.Printf("  A's lease ends; B takes %s over with a larger fence and charges %d: accepted\n", order, amount)

	// A wakes and charges.
	close(awake)
	errA := <-aDone
	switch {
	case errA == nil:
		fmt.Printf("  A wakes and charges %d with its smaller fence: accepted\n", amount)
		fmt.Println("  A's handler returns nil; its Complete is refused (B completed the order)")
	case errors.Is(errA, errStale) && errors.Is(errA, dedup.ErrClaimLost):
		fmt.Printf("  A wakes and charges %d with its smaller fence: refused\n", amount)
		fmt.Println("  A's handler returns the refusal, matching dedup.ErrClaimLost: the message is nacked")
		// The nacked message comes back: B completed the order.
		if _, err := handlerA(msg.Copy()); err != nil || runsA != 1 {
			return fmt.Errorf("A, the redelivery: %v, its handler run %d times in all; want a duplicate", err, runsA)
		}
		fmt.Println("  the message comes back to A: a duplicate, acked")
	default:
		return fmt.Errorf("A: %w", errA)
	}
	fmt.Printf("  %s charged %d time(s)\n", order, table.times[order])
	return nil
}

// newOrderMessage is a copy of the order's message: each delivery gets a
// new message id, the business key stays.
func newOrderMessage() *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":150}`))
	msg.Metadata.Set("order_id", order)
	return msg
}
