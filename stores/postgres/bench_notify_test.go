package postgres_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/waitbench"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// BenchmarkWaitNotify compares, for 1, 10 and 100 copies waiting on one
// held key, polling (dedup.Config.InProgressPoll's doubling pauses) with
// being woken by the completing statement's pg_notify (Config.Notify):
// the time from the holder's Complete to each copy's answer (median, p99)
// and the claims per wait, rounds of the two interleaved. Run it with
//
//	go test -run '^$' -bench WaitNotify -benchtime 1x ./stores/postgres/
func BenchmarkWaitNotify(b *testing.B) {
	store := newStore(b, postgres.Config{Notify: true})
	b.Cleanup(func() { _ = store.Close() })
	for i := range b.N {
		fmt.Fprintln(os.Stdout, "\nPostgreSQL store, PostgreSQL on loopback:")
		if err := waitbench.Run(context.Background(), os.Stdout, waitbench.Config{Store: store, Prefix: fmt.Sprint("w", i, "-", randomHex(4), "-")}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNotifyCost measures what Config.Notify costs a new message:
// Claim + Complete of distinct keys on a store with it against one
// without (same table), at concurrency 1 and 16, in alternating chunks of
// 128 (which goes first alternates too), five times; it prints the median
// ratio of throughput with to without. The test server runs with
// fsync=off and synchronous_commit=off: the commit lock that notifying
// transactions share is held for no WAL flush here, so a durable server
// pays more. Run it with
//
//	go test -run '^$' -bench NotifyCost -benchtime 5000x ./stores/postgres/
func BenchmarkNotifyCost(b *testing.B) {
	ctx := testCtx(b)
	schema := newSchema(b)
	off := newStore(b, postgres.Config{Schema: schema})
	on := newStore(b, postgres.Config{Schema: schema, Notify: true})
	b.Cleanup(func() { _ = on.Close() })
	prefix := randomHex(4)
	stores := [2]*postgres.Store{off, on}
	for _, c := range []int{1, 16} {
		var rates [2][]float64
		var ratios []float64
		for rep := range 5 {
			var spent [2]time.Duration
			var done [2]int64
			for r := 0; done[0] < int64(b.N); r++ {
				n := min(128, int64(b.N)-done[0])
				for k := range 2 {
					mode := (k + r) % 2 // 0: without, 1: with
					base := done[mode]
					start := time.Now()
					err := runConcurrently(c, n, func(i int64) error {
						key := fmt.Sprintf("%s-%d-%d-%d-%d", prefix, c, rep, mode, base+i)
						res, err := stores[mode].Claim(ctx, key, "", time.Minute)
						if err != nil {
							return err
						}
						return stores[mode].Complete(ctx, res.Claim, nil, time.Minute)
					})
					spent[mode] += time.Since(start)
					done[mode] += n
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			for m := range 2 {
				rates[m] = append(rates[m], float64(done[m])/spent[m].Seconds())
			}
			ratios = append(ratios, rates[1][rep]/rates[0][rep])
		}
		b.ReportMetric(medianFloat(ratios), fmt.Sprintf("with/without-c%d", c))
		fmt.Printf("concurrency %d, N=%d: Claim+Complete/s without Notify %.0f, with %.0f: ratio %.3f (median of 5 interleaved runs)\n",
			c, b.N, medianFloat(rates[0]), medianFloat(rates[1]), medianFloat(ratios))
	}
}

// runConcurrently runs op n times (i from 0) on c goroutines and returns
// the first error.
func runConcurrently(c int, n int64, op func(i int64) error) error {
	var next atomic.Int64
	errs := make(chan error, c)
	for range c {
		go func() {
			for {
				i := next.Add(1) - 1
				if i >= n {
					errs <- nil
					return
				}
				if err := op(i); err != nil {
					next.Store(n)
					errs <- err
					return
				}
			}
		}()
	}
	var first error
	for range c {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// medianFloat returns the median of v (sorted in place).
func medianFloat(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}
