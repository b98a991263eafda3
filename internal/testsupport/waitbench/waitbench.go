// Package waitbench measures how copies waiting for a held key
// (dedup.Config.InProgressWait) learn of its completion, polling against
// being woken by the store (dedup.KeyWatcher), for the stores' benchmarks:
// for 1, 10 and 100 copies waiting on one held key, the time from the
// holder's Complete to each copy's answer (median, p99) and the claims
// each wait cost, the two interleaved round by round.
package waitbench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// Config is one benchmark run.
type Config struct {
	// Store wakes waiters (a dedup.KeyWatcher); the polling rounds use it
	// with its WatchKey hidden.
	Store dedup.Store
	// Waiters are the numbers of copies waiting on one key. Defaults to
	// 1, 10, 100.
	Waiters []int
	// Holds are how long the holder's work takes. Defaults to 50ms, 500ms.
	Holds []time.Duration
	// Rounds per (waiters, hold, mode). Defaults to 5.
	Rounds int
	// Prefix makes the keys of this run its own.
	Prefix string
}

// counting counts a store's claims and notes when Complete was sent.
type counting struct {
	dedup.Store
	claims      atomic.Int64
	completeAt  atomic.Int64 // UnixNano before the last Complete was sent
	watchStores dedup.KeyWatcher
}

func (c *counting) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	c.claims.Add(1)
	return c.Store.Claim(ctx, key, fp, lease)
}

func (c *counting) Complete(ctx context.Context, claim dedup.Claim, result []byte, retention time.Duration) error {
	c.completeAt.Store(time.Now().UnixNano())
	return c.Store.Complete(ctx, claim, result, retention)
}

// watching is counting with the store's WatchKey.
type watching struct{ *counting }

func (w watching) WatchKey(ctx context.Context, key string, since time.Time) (<-chan struct{}, func(), error) {
	return w.watchStores.WatchKey(ctx, key, since)
}

// result is what one mode measured for (waiters, hold).
type result struct {
	latencies []time.Duration // from Complete sent to each answer
	claims    int64           // by the copies after their first claim
	waits     int64
	errs      int
}

// Run runs the benchmark and writes the table to w.
func Run(ctx context.Context, w io.Writer, cfg Config) error {
	if len(cfg.Waiters) == 0 {
		cfg.Waiters = []int{1, 10, 100}
	}
	if len(cfg.Holds) == 0 {
		cfg.Holds = []time.Duration{50 * time.Millisecond, 500 * time.Millisecond}
	}
	if cfg.Rounds == 0 {
		cfg.Rounds = 5
	}
	watcher, ok := cfg.Store.(dedup.KeyWatcher)
	if !ok {
		return fmt.Errorf("waitbench: the store has no WatchKey method (dedup.KeyWatcher)")
	}
	rtt, err := roundTrip(ctx, cfg.Store, cfg.Prefix)
	if err != nil {
		return err
	}
	type cell struct {
		n    int
		hold time.Duration
	}
	results := map[cell][2]*result{}
	round := 0
	for _, n := range cfg.Waiters {
		for _, hold := range cfg.Holds {
			var r [2]*result
			r[0], r[1] = &result{}, &result{}
			for i := range cfg.Rounds {
				for k := range 2 {
					mode := (i + k) % 2 // alternate which mode goes first
					c := &counting{Store: cfg.Store, watchStores: watcher}
					var store dedup.Store = c
					if mode == 1 {
						store = watching{c}
					}
					round++
					key := fmt.Sprintf("%s%d", cfg.Prefix, round)
					if err := once(ctx, store, c, key, n, hold, r[mode]); err != nil {
						return err
					}
				}
			}
			results[cell{n, hold}] = r
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "waiters\thold\tmode\tmedian\tp99\tp99-rtt\tclaims/wait\terrors\t\n")
	for _, n := range cfg.Waiters {
		for _, hold := range cfg.Holds {
			for mode, name := range []string{"poll", "notify"} {
				r := results[cell{n, hold}][mode]
				slices.Sort(r.latencies)
				med, p99 := quantile(r.latencies, 0.5), quantile(r.latencies, 0.99)
				fmt.Fprintf(tw, "%d\t%v\t%s\t%s\t%s\t%s\t%.2f\t%d\t\n", n, hold, name, ms(med), ms(p99), ms(p99-rtt),
					float64(r.claims)/float64(max(r.waits, 1)), r.errs)
			}
		}
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "(latency: from the holder's Complete sent to each copy's answer, %d rounds per row, poll and notify rounds interleaved; "+
		"rtt: median claim round trip of a held key, %s; claims/wait: the copies' claims after their first, per copy; "+
		"notify adds one subscribe and one unsubscribe per key and round, shared by its copies)\n", cfg.Rounds, ms(rtt))
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// roundTrip is the median round trip of a claim that finds its key held.
func roundTrip(ctx context.Context, store dedup.Store, prefix string) (time.Duration, error) {
	key := prefix + "rtt"
	if _, err := store.Claim(ctx, key, "", time.Minute); err != nil {
		return 0, err
	}
	var d []time.Duration
	for range 201 {
		start := time.Now()
		if _, err := store.Claim(ctx, key, "", time.Minute); err != nil {
			return 0, err
		}
		d = append(d, time.Since(start))
	}
	slices.Sort(d)
	return d[len(d)/2], nil
}

// once runs one round: a holder of key whose work takes hold, and n copies
// waiting for it, started once the holder runs.
func once(ctx context.Context, store dedup.Store, c *counting, key string, n int, hold time.Duration, r *result) error {
	e, err := dedup.NewEngine(dedup.Config{Store: store, InProgressWait: time.Minute, DisableHeartbeat: true})
	if err != nil {
		return err
	}
	call := dedup.Call{Scope: "waitbench", Key: key}
	started := make(chan struct{})
	holderDone := make(chan error, 1)
	go func() {
		_, err := e.Do(ctx, call, func(context.Context) ([]byte, error) {
			close(started)
			time.Sleep(hold) // the work the copies wait for
			return []byte("done"), nil
		})
		holderDone <- err
	}()
	<-started
	first := c.claims.Load()
	answered := make([]int64, n)
	var wg sync.WaitGroup
	var errs atomic.Int64
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := e.Do(ctx, call, func(context.Context) ([]byte, error) { return nil, fmt.Errorf("a waiting copy ran") })
			answered[i] = time.Now().UnixNano()
			if err != nil || res.Outcome != dedup.Duplicate {
				errs.Add(1)
			}
		}()
	}
	wg.Wait()
	if err := <-holderDone; err != nil {
		return fmt.Errorf("waitbench: the holder: %w", err)
	}
	done := c.completeAt.Load()
	for _, at := range answered {
		r.latencies = append(r.latencies, time.Duration(at-done))
	}
	r.claims += c.claims.Load() - first - int64(n) // each copy's first claim is not part of its wait
	r.waits += int64(n)
	r.errs += int(errs.Load())
	return nil
}
