package dedup_test

import (
	"context"
	"fmt"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// Shadow mode: every copy runs, as if dedup were off; the record is kept as
// usual, and the copy dedup would have skipped is told so by its context
// (and logged would_skip). Turn Shadow off and the second copy is skipped.
func ExampleOutcomeFromContext() {
	store, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		panic(err)
	}
	shadow, err := dedup.NewEngine(dedup.Config{Store: store, Shadow: true})
	if err != nil {
		panic(err)
	}
	charge := func(ctx context.Context) ([]byte, error) {
		outcome, _ := dedup.OutcomeFromContext(ctx)
		fmt.Println("charging ORDER-003; dedup found:", outcome)
		return []byte("receipt-7"), nil
	}
	call := dedup.Call{Scope: "charge-orders", Key: "ORDER-003"}
	for range 2 {
		if _, err := shadow.Do(context.Background(), call, charge); err != nil {
			panic(err)
		}
	}

	enforcing, err := dedup.NewEngine(dedup.Config{Store: store})
	if err != nil {
		panic(err)
	}
	res, err := enforcing.Do(context.Background(), call, charge)
	if err != nil {
		panic(err)
	}
	fmt.Printf("shadow off: %s, %s\n", res.Outcome, res.Result)
	// Output:
	// charging ORDER-003; dedup found: acquired
	// charging ORDER-003; dedup found: duplicate
	// shadow off: duplicate, receipt-7
}
