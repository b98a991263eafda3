package routerbench

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

type report struct {
	opts               Options
	suites             []*suite
	loadStart, loadEnd string
	took               time.Duration
	mem                []memPoint
	memDescribe        string
}

// ratioCols are the ratio columns: numerator / denominator, both variant
// names, each ratio taken within one repetition.
var ratioCols = []struct{ num, den, title string }{
	{vStore, vRaw, "claim+complete/raw"},
	{vFloor, vRaw, "raw pair/raw"},
	{vStore, vFloor, "claim+complete/raw pair"},
	{vCASFloor, vRaw, "raw CAS pair/raw"},
	{vStore, vCASFloor, "claim+complete/raw CAS pair"},
	{vRouter, vRaw, "router/raw"},
	{vHappy, vRaw, "router+dedup/raw"},
	{vRouterFloor, vRaw, "router+raw pair/raw"},
	{vHappy, vRouterFloor, "router+dedup/router+raw pair"},
	{vHappy, vRouterCASFloor, "router+dedup/router+raw CAS pair"},
	{vRouterStore, vRouterCASFloor, "router+claim+complete/router+raw CAS pair"},
	{vHappy, vRouterStore, "router+dedup/router+claim+complete"},
	{vDup, vRaw, "dup/raw"},
	{vHappy, vRouter, "router+dedup/router"},
	{vDup, vRouter, "dup/router"},
	{vHappy, vWMHappy, "dedup/wm-dedup"},
	{vDup, vWMDup, "dup/wm-dup"},
}

var allVariants = []string{vRaw, vStore, vFloor, vCASFloor, vRouter, vHappy, vRouterFloor, vRouterCASFloor, vRouterStore, vDup, vWMHappy, vWMDup}

func (r report) print(w io.Writer) {
	o := r.opts
	wm := "?"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/ThreeDotsLabs/watermill" {
				wm = d.Version
			}
		}
	}
	fmt.Fprintf(w, "dedup-bench: %d repetitions × %v per variant, all variants of all stores interleaved in each; took %v\n",
		o.Repetitions, o.Duration, r.took.Round(time.Second))
	fmt.Fprintf(w, "machine: nproc %d, GOMAXPROCS %d, %s %s/%s; /proc/loadavg at start %s, at end %s\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH, r.loadStart, r.loadEnd)
	fmt.Fprintf(w, "router: Watermill %s Router on GoChannel (BlockPublishUntilSubscriberAck): c consumer handlers on c topics, one publisher each,\n"+
		"  so c messages are in flight; a message counts when Publish returns, after the ack\n", wm)
	claims := "MaxClaimsInFlight left at zero (16; 256 on redis-ap, the store's default)"
	if o.MaxClaimsInFlight > 0 {
		claims = fmt.Sprintf("MaxClaimsInFlight %d (-max-claims-in-flight)", o.MaxClaimsInFlight)
	}
	fmt.Fprintf(w, "dedup: dedup.New with Key keyfuncs.Metadata(%q), Scope %q, %s, every other field its default (Lease 30s, heartbeat on)\n",
		keyMetadata, scope, claims)
	fmt.Fprintf(w, "wm-dedup: Watermill's middleware.Deduplicator, NewMessageHasherFromMetadataField(%q), map repository with a 24h window\n", keyMetadata)
	fmt.Fprintf(w, "dup: every message a copy of one of %d already completed keys\n", dupKeys)

	// Only the variants some store has.
	var variants []string
	for _, v := range allVariants {
		for _, s := range r.suites {
			if _, ok := s.ops[v]; ok {
				variants = append(variants, v)
				break
			}
		}
	}
	if slices.Contains(variants, vRouterFloor) || slices.Contains(variants, vRouterCASFloor) {
		fmt.Fprintf(w, "router+raw pair, router+raw CAS pair: the router, no middleware, whose handler runs the raw pair or the raw CAS pair (below) on the message's scoped key\n")
	}
	if slices.Contains(variants, vRouterStore) {
		fmt.Fprintf(w, "router+claim+complete: the router, no middleware, whose handler calls the store's Claim (lease 30s) and Complete (retention 24h) on the message's scoped key: router+dedup without the engine\n")
	}
	for _, s := range r.suites {
		fmt.Fprintf(w, "%s: %s\n", s.b.name, s.b.describe)
	}

	fmt.Fprintf(w, "\nthroughput: msg/s (router variants) or op/s (raw, claim+complete), median of %d repetitions [min-max]\n", o.Repetitions)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "store\tc\t%s\t\n", strings.Join(variants, "\t"))
	for _, s := range r.suites {
		for _, c := range o.Concurrency {
			fmt.Fprintf(tw, "%s\t%d\t", s.b.name, c)
			for _, v := range variants {
				rates, ok := s.rates[c][v]
				if !ok {
					fmt.Fprintf(tw, "-\t")
					continue
				}
				fmt.Fprintf(tw, "%s [%s-%s]\t", num(median(rates)), num(slices.Min(rates)), num(slices.Max(rates)))
			}
			fmt.Fprintln(tw)
		}
	}
	_ = tw.Flush()

	fmt.Fprintf(w, "\nCPU time of this process per message or op, µs (publisher, router, middleware, store client; not the servers), median of %d repetitions\n", o.Repetitions)
	cpuTable(w, r.suites, o.Concurrency, variants, func(s *suite) map[int]map[string][]float64 { return s.cpu })

	var srvSuites []*suite
	for _, s := range r.suites {
		for _, byVariant := range s.srv {
			if len(byVariant) > 0 {
				srvSuites = append(srvSuites, s)
				break
			}
		}
	}
	if len(srvSuites) > 0 {
		fmt.Fprintf(w, "\nCPU time of the Redis server per message or op, µs (INFO cpu, user + system, its network I/O included), median of %d repetitions\n", o.Repetitions)
		cpuTable(w, srvSuites, o.Concurrency, variants, func(s *suite) map[int]map[string][]float64 { return s.srv })
	}

	fmt.Fprintf(w, "\nratios: median over the %d repetitions of the ratio within each repetition (same store, same c)\n", o.Repetitions)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	var cols []int
	for i, rc := range ratioCols {
		for _, s := range r.suites {
			_, a := s.ops[rc.num]
			_, b := s.ops[rc.den]
			if a && b {
				cols = append(cols, i)
				break
			}
		}
	}
	fmt.Fprintf(tw, "store\tc\t")
	for _, i := range cols {
		fmt.Fprintf(tw, "%s\t", ratioCols[i].title)
	}
	fmt.Fprintln(tw)
	for _, s := range r.suites {
		for _, c := range o.Concurrency {
			fmt.Fprintf(tw, "%s\t%d\t", s.b.name, c)
			for _, i := range cols {
				rc := ratioCols[i]
				num, den := s.rates[c][rc.num], s.rates[c][rc.den]
				if len(num) == 0 || len(num) != len(den) {
					fmt.Fprintf(tw, "-\t")
					continue
				}
				ratios := make([]float64, len(num))
				for k := range num {
					ratios[k] = num[k] / den[k]
				}
				fmt.Fprintf(tw, "%.2f\t", median(ratios))
			}
			fmt.Fprintln(tw)
		}
	}
	_ = tw.Flush()

	if o.AllocMessages > 0 {
		fmt.Fprintf(w, "\nallocations per message: runtime.MemStats (whole process: router, middleware, store client) over %d messages at c=%d, median of 3 samples;\n"+
			"  +dedup, +dup and +wm-dedup are added by the middleware and its store: router with it minus router without;\n"+
			"  +raw pair: added by a handler that runs the raw pair (router+raw pair minus router), the floor of +dedup;\n"+
			"  +raw CAS pair: the same with the raw CAS pair (router+raw CAS pair minus router), the floor of +dedup with the same commands;\n"+
			"  +claim+complete: added by a handler that calls the store's Claim and Complete (router+claim+complete minus router): +dedup without the engine;\n"+
			"  raw pair, claim+complete, raw: per operation, no router\n", o.AllocMessages, o.AllocConcurrency)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		type col struct {
			title, v string
			delta    bool
		}
		acols := []col{
			{"router", vRouter, false}, {"+dedup", vHappy, true}, {"+raw pair", vRouterFloor, true}, {"+raw CAS pair", vRouterCASFloor, true},
			{"+claim+complete", vRouterStore, true}, {"+dedup dup", vDup, true},
			{"+wm-dedup", vWMHappy, true}, {"+wm-dedup dup", vWMDup, true},
			{"claim+complete", vStore, false}, {"raw pair", vFloor, false}, {"raw CAS pair", vCASFloor, false}, {"raw", vRaw, false},
		}
		fmt.Fprintf(tw, "store\t")
		for _, c := range acols {
			if slices.Contains(variants, c.v) {
				fmt.Fprintf(tw, "%s allocs\t%s B\t", c.title, c.title)
			}
		}
		fmt.Fprintln(tw)
		for _, s := range r.suites {
			fmt.Fprintf(tw, "%s\t", s.b.name)
			base := allocMedian(s.allocs[vRouter])
			for _, c := range acols {
				if !slices.Contains(variants, c.v) {
					continue
				}
				samples, ok := s.allocs[c.v]
				if !ok {
					fmt.Fprintf(tw, "-\t-\t")
					continue
				}
				m := allocMedian(samples)
				if c.delta {
					m = [2]float64{m[0] - base[0], m[1] - base[1]}
				}
				fmt.Fprintf(tw, "%.1f\t%.0f\t", m[0], m[1])
			}
			fmt.Fprintln(tw)
		}
		_ = tw.Flush()
	}

	if o.Lines {
		fmt.Fprintln(w)
		for _, s := range r.suites {
			for _, c := range o.Concurrency {
				for _, v := range variants {
					for k, rate := range s.rates[c][v] {
						fmt.Fprintf(w, "rate\t%s\t%d\t%s\t%d\t%.0f\n", s.b.name, c, v, k, rate)
						fmt.Fprintf(w, "cpu\t%s\t%d\t%s\t%d\t%.2f\n", s.b.name, c, v, k, s.cpu[c][v][k])
						if srv := s.srv[c][v]; k < len(srv) {
							fmt.Fprintf(w, "srvcpu\t%s\t%d\t%s\t%d\t%.2f\n", s.b.name, c, v, k, srv[k])
						}
					}
				}
			}
			for _, v := range variants {
				for k, a := range s.allocs[v] {
					fmt.Fprintf(w, "allocs\t%s\t%d\t%s\t%d\t%.2f\t%.0f\n", s.b.name, o.AllocConcurrency, v, k, a[0], a[1])
				}
			}
		}
	}

	if len(r.mem) > 0 {
		fmt.Fprintf(w, "\nRedis used_memory growth per completed record: %s\n", r.memDescribe)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(w, "  with fields: the same keys holding version 2 completed records with one %d-byte field more (what issue 18's fields will cost), written with SET PX\n", extraFieldBytes)
		fmt.Fprintf(tw, "records\tbytes/record\twith fields\ttook\t\n")
		for _, p := range r.mem {
			fmt.Fprintf(tw, "%d\t%.1f\t%.1f\t%v\t\n", p.records, p.perRecord, p.perRecordFields, p.took.Round(100*time.Millisecond))
		}
		_ = tw.Flush()
	}
}

func allocMedian(samples [][2]float64) [2]float64 {
	var a, b []float64
	for _, s := range samples {
		a, b = append(a, s[0]), append(b, s[1])
	}
	if len(a) == 0 {
		return [2]float64{}
	}
	return [2]float64{median(a), median(b)}
}

// median of v (the mean of the middle two for an even count); v is not
// modified.
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// num prints a rate with three significant digits at most.
func num(v float64) string {
	switch {
	case v >= 100_000:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 10_000:
		return fmt.Sprintf("%.1fk", v/1000)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

// cpuTable prints one row per suite and concurrency: the median of the
// samples of of(suite)[c][variant] for each variant, "-" where there are
// none.
func cpuTable(w io.Writer, suites []*suite, concurrency []int, variants []string, of func(*suite) map[int]map[string][]float64) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "store\tc\t%s\t\n", strings.Join(variants, "\t"))
	for _, s := range suites {
		for _, c := range concurrency {
			fmt.Fprintf(tw, "%s\t%d\t", s.b.name, c)
			for _, v := range variants {
				samples, ok := of(s)[c][v]
				if !ok {
					fmt.Fprintf(tw, "-\t")
					continue
				}
				fmt.Fprintf(tw, "%.1f\t", median(samples))
			}
			fmt.Fprintln(tw)
		}
	}
	_ = tw.Flush()
}
