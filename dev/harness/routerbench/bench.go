// Package routerbench measures what users run: a Watermill router (on the
// in-process GoChannel) with the dedup middleware, on each store, against
// the same router without it, against the store's raw one-round-trip write,
// and against Watermill's own Deduplicator, all in one interleaved run. It
// is the engine of dev/bench (`make bench`); see that command's
// README for what each figure means.
//
// It starts its own servers through internal/testsupport/testserver (redis-server,
// dynalite, PostgreSQL) and keeps every key, table and schema unique to the
// run, so a shared server's other data is never touched.
package routerbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
)

// Options configure Run. Zero fields take the documented defaults.
type Options struct {
	// Stores to measure, any of AllStores. Defaults to AllStores.
	Stores []string
	// Concurrency levels: messages (or raw operations) in flight at once.
	// Defaults to 1, 16 and 64.
	Concurrency []int
	// Repetitions of the whole interleaved round. Defaults to 5; medians
	// need at least 3.
	Repetitions int
	// Duration each variant runs per store, concurrency and repetition.
	// Defaults to 1s.
	Duration time.Duration
	// Warmup each variant runs once per store at the highest concurrency
	// before the first repetition (connection pools, JIT-free but cache-
	// and allocator-warm). Defaults to 300ms; negative: none.
	Warmup time.Duration
	// AllocMessages is how many messages each allocation sample counts.
	// Defaults to 1000; negative: no allocation figures.
	AllocMessages int
	// AllocConcurrency is the concurrency of the allocation samples.
	// Defaults to 16.
	AllocConcurrency int
	// RedisRecords are the record counts at which Redis used_memory growth
	// per completed record is reported, measured on a fresh redis-server.
	// Defaults to 10 000, 100 000 and 1 000 000; set []int{} for none.
	RedisRecords []int
	// CPUProfile, when set, switches Run to profiling: it writes a CPU
	// profile of the Redis router happy path at ProfileConcurrency for
	// ProfileDuration to this file and measures nothing else.
	CPUProfile string
	// MemProfile, like CPUProfile, switches Run to profiling: it writes an
	// allocation profile (every allocation sampled) of the same path to this
	// file.
	MemProfile string
	// BlockProfile, like CPUProfile, switches Run to profiling: it writes
	// a profile of where goroutines blocked (every event,
	// runtime.SetBlockProfileRate(1)) on the same path to this file: the
	// admission bound (Config.MaxClaimsInFlight), the store's batching.
	BlockProfile string
	// Trace, like CPUProfile, switches Run to profiling: it writes a
	// runtime execution trace (runtime/trace) of the same path to this
	// file: when goroutines ran, waited to run, or waited on the network
	// (go tool trace -pprof=sched and -pprof=net of it).
	Trace string
	// ProfileStore is the store of the profiles. Defaults to redis.
	ProfileStore string
	// ProfileVariant is the router lane of the profiles and of Messages:
	// "router+dedup" (the default), "router", "router+raw pair",
	// "router+raw CAS pair" or "router+claim+complete", so that a floor
	// can be profiled, or counted in instructions, the same way as the
	// middleware.
	ProfileVariant string
	// ProfileDuration defaults to 10s; ProfileConcurrency to 16.
	ProfileDuration    time.Duration
	ProfileConcurrency int
	// MaxClaimsInFlight is the dedup.Config field of the router+dedup
	// lanes; 0 keeps its default (16, or the store's: 256 on redis-ap).
	MaxClaimsInFlight int
	// Variants, when set, restricts the measured variants to these names
	// (of the throughput table: "router", "router+dedup", "router+raw
	// pair", ...), to shorten runs that compare two builds
	// (scripts/paired.sh).
	Variants []string
	// Messages, when positive, switches Run to a fixed count: it sends
	// exactly Messages messages through the router happy path of
	// ProfileStore at ProfileConcurrency (after as many for warm-up)
	// and measures nothing else, for instruction counts per message
	// (valgrind --tool=callgrind; see scripts/paired.sh).
	Messages int
	// Lines adds one tab-separated line per repetition, store, c and
	// variant ("rate", "cpu") and per allocation sample ("allocs") after
	// the tables, for scripts.
	Lines bool
	// Out receives the tables; Progress one line per step. Default to
	// os.Stdout and io.Discard.
	Out, Progress io.Writer
}

func (o *Options) setDefaults() {
	if len(o.Stores) == 0 {
		o.Stores = AllStores
	}
	if len(o.Concurrency) == 0 {
		o.Concurrency = []int{1, 16, 64}
	}
	if o.Repetitions == 0 {
		o.Repetitions = 5
	}
	if o.Duration == 0 {
		o.Duration = time.Second
	}
	if o.Warmup == 0 {
		o.Warmup = 300 * time.Millisecond
	}
	if o.AllocMessages == 0 {
		o.AllocMessages = 1000
	}
	if o.AllocConcurrency == 0 {
		o.AllocConcurrency = 16
	}
	if o.RedisRecords == nil {
		o.RedisRecords = []int{10_000, 100_000, 1_000_000}
	}
	if o.ProfileStore == "" {
		o.ProfileStore = StoreRedis
	}
	if o.ProfileVariant == "" {
		o.ProfileVariant = vHappy
	}
	if o.ProfileDuration == 0 {
		o.ProfileDuration = 10 * time.Second
	}
	if o.ProfileConcurrency == 0 {
		o.ProfileConcurrency = 16
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
}

// Validate reports every problem in the options at once.
func (o Options) Validate() error {
	o.setDefaults()
	var errs []error
	for _, s := range o.Stores {
		if !slices.Contains(AllStores, s) {
			errs = append(errs, fmt.Errorf("routerbench: unknown store %q (one of %s)", s, strings.Join(AllStores, ", ")))
		}
	}
	for _, c := range o.Concurrency {
		if c < 1 {
			errs = append(errs, fmt.Errorf("routerbench: concurrency must be at least 1, got %d", c))
		}
	}
	if o.Repetitions < 1 {
		errs = append(errs, fmt.Errorf("routerbench: repetitions must be at least 1, got %d", o.Repetitions))
	}
	if o.Duration < 0 {
		errs = append(errs, fmt.Errorf("routerbench: duration must be positive, got %v", o.Duration))
	}
	for _, n := range o.RedisRecords {
		if n < 1 {
			errs = append(errs, fmt.Errorf("routerbench: Redis record counts must be positive, got %d", n))
		}
	}
	if !slices.Contains(AllStores, o.ProfileStore) {
		errs = append(errs, fmt.Errorf("routerbench: unknown profile store %q", o.ProfileStore))
	}
	if !slices.Contains(profileVariants, o.ProfileVariant) {
		errs = append(errs, fmt.Errorf("routerbench: profile variant %q is not one of %q", o.ProfileVariant, profileVariants))
	}
	if o.profiling() && (o.ProfileDuration < 0 || o.ProfileConcurrency < 1) {
		errs = append(errs, errors.New("routerbench: the profile needs a positive duration and concurrency"))
	}
	return errors.Join(errs...)
}

// variant is one measured path of a store at a concurrency: op is called
// in a loop by each of c workers.
type variant struct {
	name string
	lane *lane // router variants only
}

// suite is one store with its router and variants.
type suite struct {
	b        *backend
	rig      *rig
	variants []variant
	// rates[c][variant name] holds one rate (operations/s) per repetition,
	// cpu[c][variant name] this process's CPU time per operation (µs),
	// srv[c][variant name] the server's (µs; Redis only, see
	// backend.serverCPU).
	rates, cpu, srv map[int]map[string][]float64
	// lastSrv is the server's CPU time per operation (µs) of the last run,
	// or -1 when the backend cannot tell.
	lastSrv float64
	// allocs[variant name] holds per-sample allocations and bytes per op.
	allocs map[string][][2]float64
	// ops[variant name] is what one worker does once.
	ops map[string]func(ctx context.Context, worker int) error
	id  string
}

func newSuite(ctx context.Context, name, id string, maxC, maxClaims int, variants []string) (*suite, error) {
	b, err := openBackend(ctx, name, id)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	floors := []floorLane{{vRouterStore, "store", storePair(b.store)}}
	if b.floorInRouter {
		floors = append(floors, floorLane{vRouterFloor, "pair", b.floor})
		if b.casFloor != nil {
			floors = append(floors, floorLane{vRouterCASFloor, "cas", b.casFloor})
		}
	}
	r, err := newRig(ctx, b.store, id, maxC, maxClaims, name == StoreMemory, floors...)
	if err != nil {
		b.close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	s := &suite{b: b, rig: r, id: id, rates: map[int]map[string][]float64{}, cpu: map[int]map[string][]float64{}, srv: map[int]map[string][]float64{}, allocs: map[string][][2]float64{},
		ops: map[string]func(context.Context, int) error{}}
	s.variants = []variant{{name: vRaw}, {name: vStore}}
	if b.floor != nil {
		s.variants = append(s.variants, variant{name: vFloor})
	}
	if b.casFloor != nil {
		s.variants = append(s.variants, variant{name: vCASFloor})
	}
	for _, n := range []string{vRouter, vHappy, vRouterFloor, vRouterCASFloor, vRouterStore, vDup, vWMHappy, vWMDup} {
		if l, ok := r.lanes[n]; ok {
			s.variants = append(s.variants, variant{name: n, lane: l})
		}
	}
	if len(variants) > 0 {
		s.variants = slices.DeleteFunc(s.variants, func(v variant) bool { return !slices.Contains(variants, v.name) })
	}
	for _, v := range s.variants {
		s.ops[v.name] = s.workload(v)
	}
	return s, nil
}

func (s *suite) close() {
	_ = s.rig.stop()
	s.b.close()
}

// workload returns what one worker does once for v; each call of the
// returned function uses a new key (unless v is a duplicate path).
func (s *suite) workload(v variant) func(ctx context.Context, worker int) error {
	switch v.name {
	case vRaw:
		seq := newAtomicSeq("RAW-" + s.id + "-")
		return func(ctx context.Context, _ int) error { return s.b.raw(ctx, admin.ScopedKey(scope, seq())) }
	case vFloor:
		seq := newAtomicSeq("FLOOR-" + s.id + "-")
		return func(ctx context.Context, _ int) error { return s.b.floor(ctx, admin.ScopedKey(scope, seq())) }
	case vCASFloor:
		seq := newAtomicSeq("CAS-" + s.id + "-")
		return func(ctx context.Context, _ int) error { return s.b.casFloor(ctx, admin.ScopedKey(scope, seq())) }
	case vStore:
		seq := newAtomicSeq("STORE-" + s.id + "-")
		return func(ctx context.Context, _ int) error {
			res, err := s.b.store.Claim(ctx, admin.ScopedKey(scope, seq()), "", 30*time.Second)
			if err != nil {
				return err
			}
			if res.Outcome != dedup.Acquired {
				return fmt.Errorf("routerbench: claim of a fresh key: %v", res.Outcome)
			}
			return s.b.store.Complete(ctx, res.Claim, nil, 24*time.Hour)
		}
	default:
		return s.rig.publisher(v.lane)
	}
}

// measure runs v at c for d (or total operations) and returns its
// operations per second and this process's CPU time per operation in
// microseconds, after checking what the handlers saw.
func (s *suite) measure(ctx context.Context, v variant, c int, d time.Duration, total int64) (rate, cpu float64, err error) {
	if err := s.prepare(ctx); err != nil {
		return 0, 0, err
	}
	return s.run(ctx, v, c, d, total)
}

// prepare empties a store whose records live in this process (see
// backend.reset) before a measurement.
func (s *suite) prepare(ctx context.Context) error {
	if s.b.reset == nil {
		return nil
	}
	s.b.reset()
	if err := s.rig.reset(ctx, s.b.store); err != nil {
		return fmt.Errorf("%s: %w", s.b.name, err)
	}
	runtime.GC() // the dropped records go now, not during the measurement
	return nil
}

// run is measure without prepare.
func (s *suite) run(ctx context.Context, v variant, c int, d time.Duration, total int64) (rate, cpu float64, err error) {
	var (
		n       int64
		elapsed time.Duration
	)
	srv0, srvOK := s.b.serverCPU(ctx)
	cpu0 := processCPU()
	if v.lane != nil {
		n, elapsed, err = s.rig.checked(ctx, v.lane, c, d, total)
	} else {
		n, elapsed, err = drive(ctx, c, d, total, s.ops[v.name])
	}
	cpu1 := processCPU()
	srv1, srvOK1 := s.b.serverCPU(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("%s %s c=%d: %w", s.b.name, v.name, c, err)
	}
	if n == 0 {
		return 0, 0, fmt.Errorf("%s %s c=%d: no operation finished in %v", s.b.name, v.name, c, elapsed)
	}
	s.lastSrv = -1
	if srvOK && srvOK1 {
		s.lastSrv = float64(srv1-srv0) / float64(time.Microsecond) / float64(n)
	}
	return float64(n) / elapsed.Seconds(), float64(cpu1-cpu0) / float64(time.Microsecond) / float64(n), nil
}

// processCPU returns the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Run measures and prints the tables (see the package doc). It stops early,
// with ctx's error, when ctx is cancelled.
func Run(ctx context.Context, opts Options) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	opts.setDefaults()
	if opts.profiling() {
		return profile(ctx, opts)
	}
	if opts.Messages > 0 {
		return fixedCount(ctx, opts)
	}
	progress := func(format string, args ...any) { fmt.Fprintf(opts.Progress, format+"\n", args...) }
	loadStart := loadavg()
	started := time.Now()
	id := runID()
	maxC := slices.Max(opts.Concurrency)
	if opts.AllocMessages > 0 {
		maxC = max(maxC, opts.AllocConcurrency) // each router lane has maxC handlers
	}

	var suites []*suite
	defer func() {
		for _, s := range suites {
			s.close()
		}
	}()
	for _, name := range AllStores { // print order, whatever the flag's order
		if !slices.Contains(opts.Stores, name) {
			continue
		}
		progress("starting %s", name)
		s, err := newSuite(ctx, name, id, maxC, opts.MaxClaimsInFlight, opts.Variants)
		if err != nil {
			return err
		}
		suites = append(suites, s)
	}

	if opts.Warmup > 0 {
		for _, s := range suites {
			progress("warm-up %s", s.b.name)
			for _, v := range s.variants {
				if _, _, err := s.measure(ctx, v, slices.Max(opts.Concurrency), opts.Warmup, 0); err != nil {
					return err
				}
			}
		}
	}

	for rep := range opts.Repetitions {
		progress("repetition %d/%d (%s elapsed, load %s)", rep+1, opts.Repetitions, time.Since(started).Round(time.Second), loadavg())
		for _, c := range opts.Concurrency {
			for _, s := range suites {
				if s.rates[c] == nil {
					s.rates[c], s.cpu[c], s.srv[c] = map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
				}
				// Rotate the order so that no variant always runs first
				// (or right after a particular other one).
				for k := range s.variants {
					v := s.variants[(k+rep)%len(s.variants)]
					rate, cpu, err := s.measure(ctx, v, c, opts.Duration, 0)
					if err != nil {
						return err
					}
					s.rates[c][v.name] = append(s.rates[c][v.name], rate)
					s.cpu[c][v.name] = append(s.cpu[c][v.name], cpu)
					if s.lastSrv >= 0 {
						s.srv[c][v.name] = append(s.srv[c][v.name], s.lastSrv)
					}
				}
			}
		}
	}

	if opts.AllocMessages > 0 {
		for _, s := range suites {
			progress("allocations %s", s.b.name)
			if err := s.measureAllocs(ctx, opts.AllocConcurrency, int64(opts.AllocMessages)); err != nil {
				return err
			}
		}
	}

	var mem []memPoint
	var memDescribe string
	if len(opts.RedisRecords) > 0 && slices.Contains(opts.Stores, StoreRedis) {
		progress("Redis used_memory at %v records", opts.RedisRecords)
		var err error
		if mem, memDescribe, err = redisMemory(ctx, opts.RedisRecords); err != nil {
			return err
		}
	}

	rep := report{
		opts: opts, suites: suites, loadStart: loadStart, loadEnd: loadavg(),
		took: time.Since(started), mem: mem, memDescribe: memDescribe,
	}
	rep.print(opts.Out)
	return nil
}

// measureAllocs takes three samples of every variant, in rotating order,
// of total operations each at concurrency c, and keeps the allocations
// and bytes per operation (runtime.MemStats: the whole process, so the
// store's client and the router count too).
func (s *suite) measureAllocs(ctx context.Context, c int, total int64) error {
	const samples = 3
	for r := range samples {
		for k := range s.variants {
			v := s.variants[(k+r)%len(s.variants)]
			// Mallocs and TotalAlloc only grow, whenever the collector
			// runs: no runtime.GC() needed (with a heap of millions of
			// records it would take seconds per sample).
			if err := s.prepare(ctx); err != nil {
				return err
			}
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			if _, _, err := s.run(ctx, v, c, 0, total); err != nil {
				return err
			}
			runtime.ReadMemStats(&m1)
			s.allocs[v.name] = append(s.allocs[v.name], [2]float64{
				float64(m1.Mallocs-m0.Mallocs) / float64(total),
				float64(m1.TotalAlloc-m0.TotalAlloc) / float64(total),
			})
		}
	}
	return nil
}

// profiling reports whether Run writes profiles (or a trace) rather than
// measuring.
func (o *Options) profiling() bool {
	return o.CPUProfile != "" || o.MemProfile != "" || o.BlockProfile != "" || o.Trace != ""
}

// profile writes the CPU and/or allocation profile (or the trace) of the
// router happy path of opts.ProfileStore.
func profile(ctx context.Context, opts Options) error {
	fmt.Fprintf(opts.Progress, "starting %s\n", opts.ProfileStore)
	s, err := newSuite(ctx, opts.ProfileStore, runID(), opts.ProfileConcurrency, opts.MaxClaimsInFlight, nil)
	if err != nil {
		return err
	}
	defer s.close()
	v, err := s.profileVariant(opts)
	if err != nil {
		return err
	}
	if _, _, err := s.measure(ctx, v, opts.ProfileConcurrency, time.Second, 0); err != nil { // warm-up
		return err
	}
	var cpu, tf *os.File
	if opts.CPUProfile != "" {
		if cpu, err = startFile(opts.CPUProfile, pprof.StartCPUProfile); err != nil {
			return err
		}
	}
	if opts.MemProfile != "" {
		runtime.MemProfileRate = 1
	}
	if opts.BlockProfile != "" {
		runtime.SetBlockProfileRate(1)
	}
	if opts.Trace != "" {
		if tf, err = startFile(opts.Trace, trace.Start); err != nil {
			if cpu != nil {
				_ = stopFile(cpu, pprof.StopCPUProfile)
			}
			return err
		}
	}
	rate, _, err := s.measure(ctx, v, opts.ProfileConcurrency, opts.ProfileDuration, 0)
	if cpu != nil {
		err = errors.Join(err, stopFile(cpu, pprof.StopCPUProfile))
	}
	if tf != nil {
		err = errors.Join(err, stopFile(tf, trace.Stop))
	}
	if opts.MemProfile != "" && err == nil {
		runtime.GC() // the profile shows allocations up to the last GC
		err = writeProfile("allocs", opts.MemProfile)
	}
	if opts.BlockProfile != "" && err == nil {
		runtime.SetBlockProfileRate(0)
		err = writeProfile("block", opts.BlockProfile)
	}
	if err != nil {
		return err
	}
	sched := "go tool trace -pprof=sched " + opts.Trace + " > sched.pprof && go tool pprof -top sched.pprof"
	for _, o := range []struct{ path, what, inspect string }{
		{opts.CPUProfile, "profile", "go tool pprof -top " + opts.CPUProfile},
		{opts.MemProfile, "profile", "go tool pprof -top " + opts.MemProfile},
		{opts.BlockProfile, "profile", "go tool pprof -top " + opts.BlockProfile},
		{opts.Trace, "trace", sched},
	} {
		if o.path == "" {
			continue
		}
		fmt.Fprintf(opts.Out, "%s of the %s %s path at c=%d for %v: %.0f msg/s, written to %s (load %s, nproc %d)\n"+
			"inspect it with: %s\n",
			o.what, opts.ProfileStore, opts.ProfileVariant, opts.ProfileConcurrency, opts.ProfileDuration, rate, o.path, loadavg(), runtime.NumCPU(), o.inspect)
	}
	return nil
}

// startFile creates path and starts start (pprof.StartCPUProfile,
// trace.Start) writing to it.
func startFile(path string, start func(io.Writer) error) (*os.File, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := start(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// stopFile stops what startFile started and closes its file.
func stopFile(f *os.File, stop func()) error {
	stop()
	return f.Close()
}

// writeProfile writes the runtime/pprof profile name to path.
func writeProfile(name, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	err = pprof.Lookup(name).WriteTo(f, 0)
	return errors.Join(err, f.Close())
}

// profileVariants are the lanes ProfileVariant may name.
var profileVariants = []string{vHappy, vRouter, vRouterFloor, vRouterCASFloor, vRouterStore}

// profileVariant is the lane of opts.ProfileVariant, or an error naming the
// store when it has none (the memory store has no raw floors).
func (s *suite) profileVariant(opts Options) (variant, error) {
	l, ok := s.rig.lanes[opts.ProfileVariant]
	if !ok {
		return variant{}, fmt.Errorf("routerbench: store %s has no %q lane", opts.ProfileStore, opts.ProfileVariant)
	}
	return variant{name: opts.ProfileVariant, lane: l}, nil
}

// fixedCount sends opts.Messages messages through the router happy path of
// opts.ProfileStore (after as many for warm-up) and prints the count, the
// time and the allocations: under valgrind --tool=callgrind, two runs of
// different counts give the instructions per message.
func fixedCount(ctx context.Context, opts Options) error {
	s, err := newSuite(ctx, opts.ProfileStore, runID(), opts.ProfileConcurrency, opts.MaxClaimsInFlight, nil)
	if err != nil {
		return err
	}
	defer s.close()
	v, err := s.profileVariant(opts)
	if err != nil {
		return err
	}
	n := int64(opts.Messages)
	if _, _, err := s.measure(ctx, v, opts.ProfileConcurrency, 0, n); err != nil { // warm-up
		return err
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	rate, cpu, err := s.measure(ctx, v, opts.ProfileConcurrency, 0, n)
	if err != nil {
		return err
	}
	runtime.ReadMemStats(&m1)
	fmt.Fprintf(opts.Out, "fixed\t%s\t%d\t%d\t%.0f\t%.1f\t%.1f\t%.0f\n", opts.ProfileStore, opts.ProfileConcurrency, n, rate, cpu,
		float64(m1.Mallocs-m0.Mallocs)/float64(n), float64(m1.TotalAlloc-m0.TotalAlloc)/float64(n))
	return nil
}

// loadavg returns the first three fields of /proc/loadavg, or "?".
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
