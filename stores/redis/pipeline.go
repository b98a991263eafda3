package redis

import (
	"context"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// batcher sends the commands of concurrent callers together (Config.
// AutoPipeline): while a command or batch is in flight, the commands that
// arrive wait and are then written as one pipeline, in one write, with one
// read of their replies. With nothing in flight a command is sent at once,
// alone, on the caller's goroutine: no delay is added when there is nothing
// to batch with. A waiting command is delayed by at most what the batches
// ahead of it take (up to maxInFlight of them run at once), each bounded by
// the client's ReadTimeout and WriteTimeout.
//
// On a ClusterClient the pipeline is split per master by go-redis (the slot
// of each command's key) and each node's part runs on its own connection;
// a Ring splits per shard. Each command keeps its own reply or error: a
// batch that fails (its connection broke) fails its own commands only, and
// go-redis retries a batch after a network error as it retries a single
// command (MaxRetries).
//
// A batcher holds no goroutine while idle: the goroutine that flushes the
// queue exits when it finds it empty.
type batcher struct {
	client      goredis.UniversalClient
	maxBatch    int
	maxInFlight int

	mu       sync.Mutex
	queue    []*pending
	inFlight int // commands or batches being sent, flushers included
	flushers int // goroutines flushing the queue
}

// pending is a command waiting in the queue.
type pending struct {
	ctx  context.Context
	cmd  goredis.Cmder
	done chan struct{}
}

var doneChans = sync.Pool{New: func() any { return make(chan struct{}, 1) }}

func newBatcher(client goredis.UniversalClient, maxBatch, maxInFlight int) *batcher {
	return &batcher{client: client, maxBatch: maxBatch, maxInFlight: maxInFlight}
}

// process sends cmd, batched with others when something is in flight, and
// returns the command's error. It returns ctx's error early when ctx ends
// while the command waits (the command may still be sent, as a command
// whose caller gave up after writing it may still run).
func (b *batcher) process(ctx context.Context, cmd goredis.Cmder) error {
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
	p := &pending{ctx: ctx, cmd: cmd, done: doneChans.Get().(chan struct{})}
	b.queue = append(b.queue, p)
	b.startFlusher()
	b.mu.Unlock()
	select {
	case <-p.done:
		doneChans.Put(p.done)
		return cmd.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// startFlusher starts a goroutine to flush the queue when commands wait and
// fewer than maxInFlight commands or batches are in flight. Called with
// b.mu held.
func (b *batcher) startFlusher() {
	if len(b.queue) > 0 && b.inFlight < b.maxInFlight && b.flushers < b.maxInFlight {
		b.inFlight++
		b.flushers++
		go b.flush()
	}
}

// flush sends batches until the queue is empty.
func (b *batcher) flush() {
	var batch []*pending
	cmds := make([]goredis.Cmder, 0, b.maxBatch)
	for {
		b.mu.Lock()
		n := min(len(b.queue), b.maxBatch)
		if n == 0 {
			b.inFlight--
			b.flushers--
			b.mu.Unlock()
			return
		}
		batch = append(batch[:0], b.queue[:n]...)
		rest := copy(b.queue, b.queue[n:])
		clear(b.queue[rest:])
		b.queue = b.queue[:rest]
		b.startFlusher() // more than a batch waits: another goroutine may take it
		b.mu.Unlock()

		cmds = cmds[:0]
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
	}
}
