package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/watermill-dedup/watermill-dedup/dev/harness/routerbench"
)

// runBatch is -batch: the batch claim benchmark (routerbench.RunBatch).
func runBatch(ctx context.Context, sizes, stores string, reps int, stdout, stderr io.Writer, quiet bool, fs *flag.FlagSet) int {
	ns, err := ints(sizes)
	if err == nil {
		for _, n := range ns {
			if n < 1 {
				err = fmt.Errorf("batch sizes must be at least 1, got %d", n)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "dedup-bench: -batch:", err)
		return 2
	}
	opts := routerbench.BatchOptions{Sizes: ns, Repetitions: reps, Out: stdout, Progress: stderr}
	storesSet := false
	fs.Visit(func(f *flag.Flag) { storesSet = storesSet || f.Name == "stores" })
	if storesSet {
		opts.Stores = split(stores)
	}
	if quiet {
		opts.Progress = nil
	}
	if err := routerbench.RunBatch(ctx, opts); err != nil {
		fmt.Fprintln(stderr, "dedup-bench:", err)
		return 1
	}
	return 0
}

// runKafkaBatch is -kafka-batch: the Kafka batch consumer benchmark
// (routerbench.RunKafkaBatch), on Redis.
func runKafkaBatch(ctx context.Context, withBatch bool, records, partitions, reps int, stdout, stderr io.Writer, quiet bool) int {
	var err error
	switch {
	case withBatch:
		err = fmt.Errorf("-kafka-batch and -batch are two benchmarks: run one at a time")
	case records < 1:
		err = fmt.Errorf("-kafka-records must be at least 1, got %d", records)
	case partitions < 1:
		err = fmt.Errorf("-kafka-partitions must be at least 1, got %d", partitions)
	}
	if err != nil {
		fmt.Fprintln(stderr, "dedup-bench:", err)
		return 2
	}
	opts := routerbench.KafkaBatchOptions{Records: records, Partitions: partitions, Repetitions: reps, Out: stdout, Progress: stderr}
	if quiet {
		opts.Progress = nil
	}
	if err := routerbench.RunKafkaBatch(ctx, opts); err != nil {
		fmt.Fprintln(stderr, "dedup-bench:", err)
		return 1
	}
	return 0
}
