// Command dedup-bench measures what users run: a Watermill router with the
// dedup middleware on each store (memory, Redis, DynamoDB on dynalite,
// PostgreSQL), against the same router without it, against the store's raw
// one-round-trip write, and (memory) against Watermill's own
// middleware.Deduplicator, interleaved in one run, and prints medians and
// ratios with the machine's load. It starts its own servers; run it from
// the repository (`make bench`), see README.md.
//
//	go run ./dev/bench
//	go run ./dev/bench -stores memory,redis -c 16 -reps 3 -duration 2s
//	go run ./dev/bench -redis-records 10000,100000,1000000
//	go run ./dev/bench -cpuprofile redis-happy.pprof
//	go run ./dev/bench -memprofile redis-allocs.pprof -profile-store memory
//	go run ./dev/bench -batch 1,10,100                # batch claims (make bench-batch)
//	go run ./dev/bench -kafka-batch                    # a Kafka batch consumer on Redis (make bench)
//
// Exit status 1 when a run fails (a server does not start, a handler errs
// or a path does not deduplicate), 2 on bad flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/watermill-dedup/watermill-dedup/dev/harness/routerbench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dedup-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		stores      = fs.String("stores", strings.Join(routerbench.AllStores, ","), "stores to measure, comma-separated")
		conc        = fs.String("c", "1,16,64", "concurrency levels, comma-separated")
		reps        = fs.Int("reps", 5, "repetitions of the interleaved round (at least 3 for meaningful medians)")
		duration    = fs.Duration("duration", 0, "how long each variant runs per store, c and repetition (default 1s)")
		warmup      = fs.Duration("warmup", 0, "warm-up of each variant at the highest c (default 300ms; negative: none)")
		allocMsgs   = fs.Int("alloc-messages", 0, "messages per allocation sample (default 1000; negative: none)")
		allocC      = fs.Int("alloc-c", 0, "concurrency of the allocation samples (default 16)")
		redisRecs   = fs.String("redis-records", "10000,100000,1000000", "record counts for Redis used_memory growth, comma-separated (the 1M step takes about a minute); \"none\" to skip")
		cpuprofile  = fs.String("cpuprofile", "", "write a CPU profile of the router happy path (of -profile-store) to this file and measure nothing else")
		memprofile  = fs.String("memprofile", "", "write an allocation profile (every allocation) of the router happy path to this file and measure nothing else")
		blockprof   = fs.String("blockprofile", "", "write a block profile (every event) of the router happy path to this file and measure nothing else")
		traceFile   = fs.String("trace", "", "write a runtime execution trace of the router happy path to this file and measure nothing else (go tool trace -pprof=sched FILE: where goroutines waited to run)")
		profStore   = fs.String("profile-store", "redis", "the store of -cpuprofile, -memprofile, -blockprofile, -trace and -messages")
		profVariant = fs.String("profile-variant", "router+dedup", "the router lane of -cpuprofile, -memprofile, -blockprofile, -trace and -messages: router+dedup, router, \"router+raw pair\", \"router+raw CAS pair\" or router+claim+complete (a floor, profiled the same way)")
		profileDur  = fs.Duration("profile-duration", 0, "how long -cpuprofile, -memprofile, -blockprofile and -trace run (default 10s)")
		profileConc = fs.Int("profile-c", 0, "concurrency of -cpuprofile, -memprofile, -blockprofile, -trace and -messages (default 16)")
		maxClaims   = fs.Int("max-claims-in-flight", 0, "dedup.Config.MaxClaimsInFlight of the router+dedup lanes (default: the field's default, 16; 256 on redis-ap, the store's)")
		variants    = fs.String("variants", "", "measure only these variants, comma-separated (e.g. \"router,router+dedup,router+raw pair\"); default all")
		messages    = fs.Int("messages", 0, "send exactly this many messages through the router happy path of -profile-store at -profile-c (after as many for warm-up), print one line and measure nothing else (for valgrind --tool=callgrind)")
		lines       = fs.Bool("lines", false, "print tab-separated lines per repetition after the tables (rate, cpu, allocs), for scripts/paired.sh")
		quiet       = fs.Bool("q", false, "no progress lines on stderr")
		batch       = fs.String("batch", "", "measure batch claims instead, for these batch sizes, comma-separated (e.g. 1,10,100): per-record Engine.Do against Engine.DoBatch and the raw floor, per store of -stores (default memory,redis,postgres,dynamo)")
		kafkaBatch  = fs.Bool("kafka-batch", false, "measure a Kafka batch consumer instead (kfake, each poll one Engine.DoBatch on Redis) against the same consumer without dedup and against the raw floor, with -reps repetitions")
		kafkaRecs   = fs.Int("kafka-records", 20000, "records in the topic of -kafka-batch, copies included")
		kafkaParts  = fs.Int("kafka-partitions", 8, "partitions of the topic of -kafka-batch")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	usage := func(err error) int {
		fmt.Fprintln(stderr, "dedup-bench:", err)
		return 2
	}
	if *reps < 1 { // Options would take 0 for its default
		return usage(fmt.Errorf("-reps must be at least 1, got %d", *reps))
	}
	if *kafkaBatch {
		return runKafkaBatch(ctx, *batch != "", *kafkaRecs, *kafkaParts, *reps, stdout, stderr, *quiet)
	}
	if *batch != "" {
		return runBatch(ctx, *batch, *stores, *reps, stdout, stderr, *quiet, fs)
	}
	cs, err := ints(*conc)
	if err != nil {
		return usage(fmt.Errorf("-c: %w", err))
	}
	opts := routerbench.Options{
		Stores: split(*stores), Concurrency: cs, Repetitions: *reps, Duration: *duration, Warmup: *warmup,
		AllocMessages: *allocMsgs, AllocConcurrency: *allocC,
		CPUProfile: *cpuprofile, MemProfile: *memprofile, BlockProfile: *blockprof, Trace: *traceFile, ProfileStore: *profStore, ProfileVariant: *profVariant, ProfileDuration: *profileDur, ProfileConcurrency: *profileConc,
		MaxClaimsInFlight: *maxClaims, Variants: split(*variants), Messages: *messages, Lines: *lines,
		Out: stdout, Progress: stderr,
	}
	if *quiet {
		opts.Progress = io.Discard
	}
	if strings.TrimSpace(*redisRecs) == "none" {
		opts.RedisRecords = []int{}
	} else if opts.RedisRecords, err = ints(*redisRecs); err != nil {
		return usage(fmt.Errorf("-redis-records: %w", err))
	}
	if err := opts.Validate(); err != nil {
		return usage(err)
	}
	if err := routerbench.Run(ctx, opts); err != nil {
		fmt.Fprintln(stderr, "dedup-bench:", err)
		return 1
	}
	return 0
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range split(s) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}
