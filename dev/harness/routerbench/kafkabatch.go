package routerbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync/atomic"
	"text/tabwriter"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/fanout"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// KafkaBatchOptions configures RunKafkaBatch. Zero fields take the
// documented defaults.
type KafkaBatchOptions struct {
	// Records is how many records the topic holds, copies included.
	// Defaults to 20000.
	Records int
	// Partitions of the topic. Defaults to 8.
	Partitions int
	// Repetitions of the interleaved round. Defaults to 5.
	Repetitions int
	// Out gets the table; Progress the progress lines (nil: none).
	Out, Progress io.Writer
}

// The shape of the Kafka batch consumer (examples/kafkabatch): the most
// records a poll returns (kgo's PollRecords), the calls of a poll that take
// their turn at once (dedup.Batch.Concurrency, and the consumer without
// dedup the same), the share of records that are copies of an earlier key
// and how far back that key is, and the effect of the lanes with one.
const (
	kafkaPollRecords = 500
	kafkaConcurrency = 16
	kafkaCopyShare   = 0.2
	kafkaCopyWindow  = 100 // a copy repeats one of the last 100 keys produced
	kafkaEffect      = time.Millisecond
	// kafkaFetchPartitionBytes bounds what one fetch takes of a partition
	// (kgo.FetchMaxPartitionBytes), and kafkaProduceRound is how many
	// records the producer sends at once (a record batch per partition of
	// each round), so that a poll holds records of every partition, as a
	// consumer keeping up with its topic sees them. With kgo's default of
	// 1 MiB a fetch of a backlog holds a whole partition, and a poll 500
	// records of one partition, run one after the other.
	kafkaFetchPartitionBytes = 4 << 10
	kafkaProduceRound        = 64
)

// The lanes of RunKafkaBatch, in print order.
const (
	laneKafkaDedup     = "consumer+dedup"
	laneKafkaPlain     = "consumer"
	laneKafkaDedupNoop = "consumer+dedup (no-op)"
	laneKafkaFloor     = "raw floor (no-op)"
)

// kafkaLane is one lane: how it processes a poll's records, before the
// commit. It returns how many effects ran (the floor: how many keys it
// won).
type kafkaLane struct {
	name string
	// redis reports whether the lane sends requests to Redis (counted).
	redis   bool
	process func(ctx context.Context, rep int, recs []*kgo.Record) (effects int, err error)
}

// kafkaSample is one lane's run in one repetition.
type kafkaSample struct {
	rate float64 // records per second
	// polls, the partitions of each poll summed, requests to Redis
	polls, partitions, requests int64
}

// RunKafkaBatch measures a plain-Go Kafka consumer (franz-go's kgo, the
// shape of examples/kafkabatch) on an in-process kfake cluster: it
// produces a topic of Records records on Partitions partitions, a fifth of
// them copies of a recent key (as a producer's retries make them), then
// consumes the whole topic once per lane and repetition, each time with a
// consumer group of its own: polls of up to 500 records, each poll's
// records grouped by partition (one partition's records in order), 16
// groups at once, the offsets committed after the poll. Lanes: the poll as
// one Engine.DoBatch on the Redis store, with an effect of 1 ms and with a
// no-op; the consumer without dedup, running the 1 ms effect for every
// record, copies included; and the raw floor of the no-op lane, two
// go-redis pipelines per poll. The lanes are interleaved in each
// repetition (rotating their order); it prints the median records per
// second, the median of the ratios within a repetition and the requests
// per poll sent to Redis.
func RunKafkaBatch(ctx context.Context, o KafkaBatchOptions) error {
	if o.Records <= 0 {
		o.Records = 20000
	}
	if o.Partitions <= 0 {
		o.Partitions = 8
	}
	if o.Repetitions <= 0 {
		o.Repetitions = 5
	}
	progress := func(format string, args ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "dedup-bench: "+format+"\n", args...)
		}
	}
	id := runID()
	loadStart := loadavg()

	topic := "kafka-batch-bench-" + id
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(o.Partitions), topic))
	if err != nil {
		return fmt.Errorf("routerbench: starting the kfake cluster: %w", err)
	}
	defer cluster.Close()
	seeds := cluster.ListenAddrs()
	keys, err := produceKafkaBatch(ctx, seeds, topic, o.Records)
	if err != nil {
		return err
	}

	srv, err := testserver.StartRedis()
	if err != nil {
		return err
	}
	defer func() { _ = srv.Close() }()
	client := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: redisPoolSize})
	defer func() { _ = client.Close() }()
	store, err := dedupredis.New(ctx, dedupredis.Config{Client: client, KeyPrefix: "dedup-kafka-bench-" + id + ":"})
	if err != nil {
		return err
	}
	requests := new(atomic.Int64)
	client.AddHook(requestHook{requests})
	engine, err := dedup.NewEngine(dedup.Config{Store: store}) // lease 30 s, retention 24 h
	if err != nil {
		return err
	}
	version := "?"
	if info, err := client.InfoMap(ctx, "server").Result(); err == nil {
		version = info["Server"]["redis_version"]
	}

	lanes := kafkaLanes(engine, client, "dedup-kafka-raw-"+id+":")
	samples := make(map[string][]kafkaSample, len(lanes))
	ratios := map[string][]float64{}
	for rep := range o.Repetitions {
		progress("kafka batch consumer: repetition %d/%d (load %s)", rep+1, o.Repetitions, loadavg())
		got := map[string]kafkaSample{}
		for k := range lanes {
			// Rotate the order so that no lane always runs first.
			lane := lanes[(k+rep)%len(lanes)]
			group := fmt.Sprintf("kafka-batch-bench-%s-%d-%d", id, rep, k)
			before := requests.Load()
			s, effects, err := consumeKafkaBatch(ctx, seeds, topic, group, o.Records, func(ctx context.Context, recs []*kgo.Record) (int, error) {
				return lane.process(ctx, rep, recs)
			})
			if err != nil {
				return fmt.Errorf("routerbench: %s: %w", lane.name, err)
			}
			want := len(keys)
			if lane.name == laneKafkaPlain {
				want = o.Records
			}
			if effects != want {
				return fmt.Errorf("routerbench: %s: %d effects (raw floor: keys won) for %d records of %d keys, want %d", lane.name, effects, o.Records, len(keys), want)
			}
			if lane.redis {
				s.requests = requests.Load() - before
			}
			got[lane.name] = s
			samples[lane.name] = append(samples[lane.name], s)
		}
		ratios[laneKafkaDedup] = append(ratios[laneKafkaDedup], got[laneKafkaDedup].rate/got[laneKafkaPlain].rate)
		ratios[laneKafkaDedupNoop] = append(ratios[laneKafkaDedupNoop], got[laneKafkaDedupNoop].rate/got[laneKafkaFloor].rate)
	}

	fmt.Fprintf(o.Out, "kafka batch consumer: %d records (%d keys, %d copies) on %d partitions (kfake), polls of up to %d records, each partition's records in order, %d at once, commit after each poll;\n",
		o.Records, len(keys), o.Records-len(keys), o.Partitions, kafkaPollRecords, kafkaConcurrency)
	fmt.Fprintf(o.Out, "records per second from the first poll's records to the last commit, median over %d interleaved repetitions; ratio: the median of the ratios within a repetition\n", o.Repetitions)
	tw := tabwriter.NewWriter(o.Out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "store\tlane\trecords/s\tratio\tof\trecords/poll\tpartitions/poll\trequests/poll\t")
	against := map[string]string{laneKafkaDedup: laneKafkaPlain, laneKafkaDedupNoop: laneKafkaFloor}
	for _, l := range lanes {
		ss := samples[l.name]
		rates := make([]float64, len(ss))
		var polls, parts, reqs int64
		for i, s := range ss {
			rates[i] = s.rate
			polls += s.polls
			parts += s.partitions
			reqs += s.requests
		}
		ratio, of := "", ""
		if a, ok := against[l.name]; ok {
			ratio, of = fmt.Sprintf("%.2f", median(ratios[l.name])), a
		}
		perPoll := "-"
		if l.redis {
			perPoll = strconv.FormatFloat(float64(reqs)/float64(polls), 'f', 1, 64)
		}
		fmt.Fprintf(tw, "redis\t%s\t%s\t%s\t%s\t%.0f\t%.1f\t%s\t\n", l.name, num(median(rates)), ratio, of,
			float64(o.Records)*float64(len(ss))/float64(polls), float64(parts)/float64(polls), perPoll)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(o.Out, "%s: Engine.DoBatch of the poll on the Redis store (its defaults; dedup.Config defaults: lease 30 s, retention 24 h), Concurrency %d, Group the partition, an effect of time.Sleep(%v) for each record won;\n",
		laneKafkaDedup, kafkaConcurrency, kafkaEffect)
	fmt.Fprintf(o.Out, "  %s: the same polls without dedup: the effect for every record, copies included, the same grouping, %d at once;\n", laneKafkaPlain, kafkaConcurrency)
	fmt.Fprintf(o.Out, "  %s: the DoBatch lane with an effect that does nothing;\n", laneKafkaDedupNoop)
	fmt.Fprintf(o.Out, "  %s: per poll one go-redis pipeline of SET key value NX PX %d for every record, then one of SET key value2 XX PX %d for the records won, with nothing of this library\n",
		laneKafkaFloor, rawLease.Milliseconds(), rawRetention.Milliseconds())
	fmt.Fprintf(o.Out, "requests/poll: requests to redis-server %s on %s per poll (a command or a pipeline is one: the store's claim pipeline of SET NX PX GET, then its completion pipelines of EVALSHA as the records end)\n",
		version, srv.Addr)
	fmt.Fprintf(o.Out, "machine: nproc %d, GOMAXPROCS %d, %s %s/%s; /proc/loadavg at start %s, at end %s\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH, loadStart, loadavg())
	return nil
}

// produceKafkaBatch writes n records to topic, each keyed (so that a key's
// copies land in its partition, after it) and carrying a small order; a
// share of kafkaCopyShare are copies of one of the last kafkaCopyWindow
// keys. It returns the distinct keys.
func produceKafkaBatch(ctx context.Context, seeds []string, topic string, n int) ([]string, error) {
	p, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		return nil, err
	}
	defer p.Close()
	rng := rand.New(rand.NewPCG(1, 2)) // the same topic every run
	var keys []string
	recs := make([]*kgo.Record, 0, n)
	for i := range n {
		var key string
		if len(keys) > 0 && rng.Float64() < kafkaCopyShare {
			key = keys[len(keys)-1-rng.IntN(min(len(keys), kafkaCopyWindow))]
		} else {
			key = fmt.Sprintf("ORDER-%07d", i)
			keys = append(keys, key)
		}
		recs = append(recs, &kgo.Record{Key: []byte(key), Value: fmt.Appendf(nil, `{"order_id":%q,"amount":%d,"currency":"BRL"}`, key, 100+i%900)})
	}
	for len(recs) > 0 {
		chunk := recs[:min(len(recs), kafkaProduceRound)]
		recs = recs[len(chunk):]
		if err := p.ProduceSync(ctx, chunk...).FirstErr(); err != nil {
			return nil, fmt.Errorf("routerbench: producing to %s: %w", topic, err)
		}
	}
	return keys, nil
}

// consumeKafkaBatch consumes topic from its start in a new consumer group
// until n records are committed: each poll's records go to process, then
// their offsets are committed. The time runs from the first poll's
// records (the group's join is not timed) to the last commit.
func consumeKafkaBatch(ctx context.Context, seeds []string, topic, group string, n int,
	process func(ctx context.Context, recs []*kgo.Record) (int, error)) (kafkaSample, int, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxPartitionBytes(kafkaFetchPartitionBytes))
	if err != nil {
		return kafkaSample{}, 0, err
	}
	defer cl.Close()
	var (
		s                  kafkaSample
		start              time.Time
		committed, effects int
	)
	for committed < n {
		fetches := cl.PollRecords(ctx, kafkaPollRecords)
		if err := ctx.Err(); err != nil {
			return s, 0, fmt.Errorf("after %d of %d records: %w", committed, n, err)
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			return s, 0, fmt.Errorf("polling: %w", errs[0].Err)
		}
		recs := fetches.Records()
		if len(recs) == 0 {
			continue
		}
		if start.IsZero() {
			start = time.Now()
		}
		e, err := process(ctx, recs)
		if err != nil {
			return s, 0, err
		}
		if err := cl.CommitRecords(ctx, recs...); err != nil {
			return s, 0, fmt.Errorf("committing: %w", err)
		}
		effects += e
		committed += len(recs)
		s.polls++
		s.partitions += int64(len(partitionGroups(recs)))
	}
	s.rate = float64(committed) / time.Since(start).Seconds()
	return s, effects, nil
}

// partitionGroups returns the indexes of recs by partition, each
// partition's in their order, the partitions in order of first record.
func partitionGroups(recs []*kgo.Record) [][]int {
	at := map[int32]int{}
	var groups [][]int
	for i, r := range recs {
		g, ok := at[r.Partition]
		if !ok {
			g = len(groups)
			at[r.Partition] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// kafkaLanes returns the lanes, in print order; floorPrefix prefixes the
// raw floor's keys.
func kafkaLanes(engine *dedup.Engine, client *goredis.Client, floorPrefix string) []kafkaLane {
	sleep := func() { time.Sleep(kafkaEffect) }
	return []kafkaLane{
		{name: laneKafkaDedup, redis: true, process: func(ctx context.Context, rep int, recs []*kgo.Record) (int, error) {
			return dedupPoll(ctx, engine, fmt.Sprintf("kafka-bench-effect-%d", rep), recs, sleep)
		}},
		{name: laneKafkaPlain, process: func(ctx context.Context, rep int, recs []*kgo.Record) (int, error) {
			groups := partitionGroups(recs)
			var effects atomic.Int64
			fanout.Each(len(groups), kafkaConcurrency, func(g int) {
				for range groups[g] {
					sleep()
					effects.Add(1)
				}
			})
			return int(effects.Load()), nil
		}},
		{name: laneKafkaDedupNoop, redis: true, process: func(ctx context.Context, rep int, recs []*kgo.Record) (int, error) {
			return dedupPoll(ctx, engine, fmt.Sprintf("kafka-bench-noop-%d", rep), recs, nil)
		}},
		{name: laneKafkaFloor, redis: true, process: func(ctx context.Context, rep int, recs []*kgo.Record) (int, error) {
			return floorPoll(ctx, client, fmt.Sprintf("%s%d:", floorPrefix, rep), recs)
		}},
	}
}

// dedupPoll is the poll as examples/kafkabatch processes it: one DoBatch,
// a call per record keyed on the record's key within scope, grouped by
// partition. Each call won runs effect (nil: nothing). It returns how
// many effects ran, and fails on any call that was neither won nor a
// duplicate.
func dedupPoll(ctx context.Context, engine *dedup.Engine, scope string, recs []*kgo.Record, effect func()) (int, error) {
	calls := make([]dedup.BatchCall, len(recs))
	for i, r := range recs {
		calls[i] = dedup.BatchCall{Group: fmt.Sprint(r.Topic, "/", r.Partition), Call: dedup.Call{
			Scope: scope, Key: string(r.Key), MessageUUID: fmt.Sprint(r.Topic, "/", r.Partition, "/", r.Offset)}}
	}
	var effects atomic.Int64
	results, errs := engine.DoBatch(ctx, dedup.Batch{Calls: calls, Concurrency: kafkaConcurrency}, func(context.Context, int) ([]byte, error) {
		if effect != nil {
			effect()
		}
		effects.Add(1)
		return nil, nil
	})
	for i, r := range results {
		if errs[i] != nil || r.Outcome != dedup.Acquired && r.Outcome != dedup.Duplicate {
			return 0, fmt.Errorf("DoBatch, record %d/%d (%s): %v %v", recs[i].Partition, recs[i].Offset, recs[i].Key, r.Outcome, errs[i])
		}
	}
	return int(effects.Load()), nil
}

// floorPoll claims and completes a poll's keys the least way Redis
// allows: one pipeline of SET NX PX for every record, then one of SET XX
// PX for the records won. It returns how many it won.
func floorPoll(ctx context.Context, client *goredis.Client, prefix string, recs []*kgo.Record) (int, error) {
	p := client.Pipeline()
	cmds := make([]*goredis.Cmd, len(recs))
	for i, r := range recs {
		cmds[i] = p.Do(ctx, "set", prefix+string(r.Key), rawToken, "nx", "px", rawLease.Milliseconds())
	}
	if _, err := p.Exec(ctx); err != nil && !errors.Is(err, goredis.Nil) { // Nil: a key taken already
		return 0, err
	}
	p = client.Pipeline()
	won := 0
	for i, c := range cmds {
		switch err := c.Err(); {
		case err == nil:
			p.Do(ctx, "set", prefix+string(recs[i].Key), rawDone, "xx", "px", rawRetention.Milliseconds())
			won++
		case !errors.Is(err, goredis.Nil):
			return 0, err
		}
	}
	if won > 0 {
		if _, err := p.Exec(ctx); err != nil {
			return 0, err
		}
	}
	return won, nil
}
