// Package redisbatch sends the commands of concurrent go-redis callers
// together: the Batcher of the Redis store's Config.AutoPipeline, and of
// the benchmark floor that must batch exactly as the store does.
package redisbatch

import (
	"context"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// Batcher sends the commands of concurrent callers together (the Redis
// store's Config.AutoPipeline): while a command or batch is in flight, the commands that
// arrive wait and are then written as one pipeline, in one write, with one
// read of their replies. With nothing in flight a command is sent at once,
// alone, on the caller's goroutine: no delay is added when there is nothing
// to batch with. A waiting command is delayed by what the batches ahead of
// it take (one per maxBatch commands queued before it, up to maxInFlight
// of them at once), each bounded by the client's ReadTimeout and
// WriteTimeout (and its retries); the caller's context does not cut the
// wait short, it is only checked when the command's batch is taken.
//
// On a ClusterClient the pipeline is split per master by go-redis (the slot
// of each command's key) and each node's part runs on its own connection;
// a Ring splits per shard. Each command keeps its own reply or error: a
// batch that fails (its connection broke) fails its own commands only, and
// go-redis retries a batch after a network error as it retries a single
// command (MaxRetries).
//
// A Batcher holds no goroutine while idle: the goroutine that flushes the
// queue exits when it finds it empty.
type Batcher struct {
	client      goredis.UniversalClient
	maxBatch    int
	maxInFlight int

	mu       sync.Mutex
	queue    []*Pending
	inFlight int // commands or batches being sent, flushers included
	flushers int // goroutines flushing the queue
}

// Pending is a command waiting in the queue; callers keep it with the
// command's arguments (no allocation of its own).
type Pending struct {
	ctx  context.Context
	cmd  goredis.Cmder
	done chan struct{}
}

// DefaultMaxBatch and DefaultMaxInFlight are the store's limits: commands
// per pipeline, and batches (or lone commands) in flight at once.
const (
	DefaultMaxBatch    = 256
	DefaultMaxInFlight = 2
)

var doneChans = sync.Pool{New: func() any { return make(chan struct{}, 1) }}

func New(client goredis.UniversalClient, maxBatch, maxInFlight int) *Batcher {
	return &Batcher{client: client, maxBatch: maxBatch, maxInFlight: maxInFlight}
}

// Process sends cmd, batched with others when something is in flight, and
// returns the command's error. A command that waits is not abandoned when
// ctx ends (it is skipped if ctx ended before its batch is written): its
// wait is bounded by the batches ahead of it, as a command's wait for a
// reply is bounded by the client's timeouts; and the store asks nothing of
// ctx on this path (no Done channel, no timer).
func (b *Batcher) Process(ctx context.Context, cmd goredis.Cmder, p *Pending) error {
	b.mu.Lock()
	if b.inFlight == 0 && len(b.queue) == 0 {
		b.inFlight++
		b.mu.Unlock()
		err := b.client.Process(ctx, cmd)
		b.mu.Lock()
		b.inFlight--
		b.startFlusher()
		b.mu.Unlock()
		return err
	}
	p.ctx, p.cmd, p.done = ctx, cmd, doneChans.Get().(chan struct{})
	b.queue = append(b.queue, p)
	b.startFlusher()
	b.mu.Unlock()
	<-p.done
	doneChans.Put(p.done)
	return cmd.Err()
}

// startFlusher starts a goroutine to flush the queue when commands wait and
// fewer than maxInFlight commands or batches are in flight. Called with
// b.mu held.
func (b *Batcher) startFlusher() {
	if len(b.queue) > 0 && b.inFlight < b.maxInFlight && b.flushers < b.maxInFlight {
		b.inFlight++
		b.flushers++
		go b.flush()
	}
}

// flushBuffers are a flusher's slices, kept between flushers.
type flushBuffers struct {
	batch []*Pending
	cmds  []goredis.Cmder
}

var flushBufs sync.Pool

// flush sends batches until the queue is empty.
func (b *Batcher) flush() {
	buf, _ := flushBufs.Get().(*flushBuffers)
	if buf == nil {
		buf = &flushBuffers{}
	}
	defer flushBufs.Put(buf)
	for {
		b.mu.Lock()
		n := min(len(b.queue), b.maxBatch)
		if n == 0 {
			b.inFlight--
			b.flushers--
			b.mu.Unlock()
			return
		}
		batch := append(buf.batch[:0], b.queue[:n]...)
		rest := copy(b.queue, b.queue[n:])
		clear(b.queue[rest:])
		b.queue = b.queue[:rest]
		b.startFlusher() // more than a batch waits: another goroutine may take it
		b.mu.Unlock()

		cmds := buf.cmds[:0]
		for _, p := range batch {
			if err := p.ctx.Err(); err != nil {
				p.cmd.SetErr(err) // gave up before it was sent
				continue
			}
			cmds = append(cmds, p.cmd)
		}
		if len(cmds) > 0 {
			pipe := b.client.Pipeline()
			_ = pipe.BatchProcess(context.Background(), cmds...)
			// Each command carries its own error; Exec's is the first of them.
			_, _ = pipe.Exec(context.Background())
		}
		for _, p := range batch {
			p.done <- struct{}{}
		}
		clear(batch)
		clear(cmds)
		buf.batch, buf.cmds = batch, cmds
	}
}
