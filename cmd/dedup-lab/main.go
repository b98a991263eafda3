// Command dedup-lab runs the ORDER-003 lab: ten copies of one order (each
// with its own message id) plus other orders with random duplicates, through
// a Watermill router, with idempotency off and then on, and prints what was
// charged.
//
//	go run ./cmd/dedup-lab
//
// It needs no server: the defaults are Watermill's in-process GoChannel and
// the in-memory store. It exits with status 1 when a run does not show what
// it should (off: charges == messages; on: charges == distinct orders; every
// message acked).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"time"

	"github.com/watermill-dedup/watermill-dedup/internal/lab"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("dedup-lab", flag.ContinueOnError)
	var (
		copies      = fs.Int("copies", 10, "how many times ORDER-003 is published")
		orders      = fs.Int("orders", 100, "how many other orders are published")
		maxDup      = fs.Int("max-duplicates", 3, "each other order is published 1..N times")
		concurrency = fs.Int("concurrency", 8, "handler calls running at once")
		idem        = fs.String("idempotency", "both", "on, off or both")
		seed        = fs.Uint64("seed", 1, "random seed for duplicates and their order")
		effect      = fs.Duration("effect-time", 2*time.Millisecond, "how long one charge takes")
		timeout     = fs.Duration("timeout", 2*time.Minute, "give up a run after this long")
		brokerName  = fs.String("broker", "gochannel", "broker: "+strings.Join(names(brokers), ", "))
		storeName   = fs.String("store", "memory", "store: "+strings.Join(names(stores), ", "))
	)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: dedup-lab [flags]\n\nPublishes ORDER-003 -copies times plus -orders other orders with random duplicates,\nconsumes them with idempotency off and on, and prints the charges.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	off, on := false, false
	switch *idem {
	case "on":
		on = true
	case "off":
		off = true
	case "both":
		off, on = true, true
	default:
		fmt.Fprintf(os.Stderr, "dedup-lab: -idempotency must be on, off or both, not %q\n", *idem)
		return 2
	}
	if *copies < 1 || *orders < 0 || *maxDup < 1 || *concurrency < 1 {
		fmt.Fprintln(os.Stderr, "dedup-lab: -copies, -max-duplicates and -concurrency must be at least 1, -orders at least 0")
		return 2
	}
	newBroker, ok := brokers[*brokerName]
	if !ok {
		fmt.Fprintf(os.Stderr, "dedup-lab: unknown -broker %q (have %s)\n", *brokerName, strings.Join(names(brokers), ", "))
		return 2
	}
	newStore, ok := stores[*storeName]
	if !ok {
		fmt.Fprintf(os.Stderr, "dedup-lab: unknown -store %q (have %s)\n", *storeName, strings.Join(names(stores), ", "))
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	cfg := lab.Config{
		Copies: *copies, Orders: *orders, MaxDuplicates: *maxDup, Concurrency: *concurrency,
		EffectTime: *effect, Seed: *seed, Timeout: *timeout, Progress: os.Stderr,
		Broker: *brokerName, StoreName: *storeName,
	}
	broker, err := newBroker(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dedup-lab: broker %s: %v\n", *brokerName, err)
		return 1
	}
	defer broker.close()
	store, err := newStore(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dedup-lab: store %s: %v\n", *storeName, err)
		return 1
	}
	defer store.close()
	cfg.NewTransport = broker.transport
	cfg.NewStore = store.store

	fmt.Printf("dedup-lab: ORDER-003 x%d + %d other orders (1-%d copies each), broker %s, store %s, concurrency %d\n\n",
		*copies, *orders, *maxDup, *brokerName, *storeName, *concurrency)
	results, err := lab.Run(ctx, cfg, off, on)
	lab.PrintTable(os.Stdout, results)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dedup-lab: %v\n", err)
		return 1
	}
	status := 0
	fmt.Println()
	for _, r := range results {
		switch {
		case !r.OK():
			fmt.Printf("FAIL idempotency %s: %d charges for %d messages of %d orders, %d acked\n", onOff(r.Idempotency), r.Charges, r.Messages, r.DistinctOrders, r.Acked)
			status = 1
		case r.Idempotency:
			fmt.Printf("idempotency on:  %d charges for %d distinct orders: every order charged exactly once (%.2fs)\n", r.Charges, r.DistinctOrders, r.Elapsed.Seconds())
		default:
			fmt.Printf("idempotency off: %d charges for %d messages: every copy charged again (%.2fs)\n", r.Charges, r.Messages, r.Elapsed.Seconds())
		}
	}
	return status
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func names[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
