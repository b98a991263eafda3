package routerbench

import (
	"context"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// sharedPipe sends the commands of concurrent callers together, by the
// rule of the Redis store's Config.AutoPipeline batcher (stores/redis
// pipeline.go, unexported there): with nothing in flight a command is sent
// at once, alone; while a command or batch is in flight, the commands that
// arrive queue and are then sent as one go-redis pipeline (at most
// pipeMaxBatch per batch, at most pipeMaxInFlight commands or batches in
// flight). It carries the raw pair of the redis-ap floor, so that the
// floor batches exactly as the store does, without the store's work.
type sharedPipe struct {
	client *goredis.Client

	mu       sync.Mutex
	queue    []*pipeCall
	inFlight int // commands or batches being sent, flushers included
}

// The store's batcher's limits.
const (
	pipeMaxBatch    = 256
	pipeMaxInFlight = 2
)

type pipeCall struct {
	cmd  goredis.Cmder
	done chan struct{}
}

var pipeCalls = sync.Pool{New: func() any { return &pipeCall{done: make(chan struct{}, 1)} }}

// process sends cmd, batched with others when something is in flight, and
// returns its error.
func (p *sharedPipe) process(ctx context.Context, cmd goredis.Cmder) error {
	p.mu.Lock()
	if p.inFlight == 0 && len(p.queue) == 0 {
		p.inFlight++
		p.mu.Unlock()
		err := p.client.Process(ctx, cmd)
		p.mu.Lock()
		p.inFlight--
		p.startFlusher()
		p.mu.Unlock()
		return err
	}
	call := pipeCalls.Get().(*pipeCall)
	call.cmd = cmd
	p.queue = append(p.queue, call)
	p.startFlusher()
	p.mu.Unlock()
	<-call.done
	call.cmd = nil
	pipeCalls.Put(call)
	return cmd.Err()
}

// startFlusher starts a goroutine that sends the queue when commands wait
// and fewer than pipeMaxInFlight are in flight. Called with p.mu held.
func (p *sharedPipe) startFlusher() {
	if len(p.queue) > 0 && p.inFlight < pipeMaxInFlight {
		p.inFlight++
		go p.flush()
	}
}

// flush sends batches until the queue is empty.
func (p *sharedPipe) flush() {
	var (
		batch []*pipeCall
		cmds  []goredis.Cmder
	)
	for {
		p.mu.Lock()
		n := min(len(p.queue), pipeMaxBatch)
		if n == 0 {
			p.inFlight--
			p.mu.Unlock()
			return
		}
		batch = append(batch[:0], p.queue[:n]...)
		rest := copy(p.queue, p.queue[n:])
		clear(p.queue[rest:])
		p.queue = p.queue[:rest]
		p.startFlusher()
		p.mu.Unlock()

		cmds = cmds[:0]
		for _, c := range batch {
			cmds = append(cmds, c.cmd)
		}
		pipe := p.client.Pipeline()
		_ = pipe.BatchProcess(context.Background(), cmds...)
		_, _ = pipe.Exec(context.Background()) // each command keeps its own error
		for _, c := range batch {
			c.done <- struct{}{}
		}
	}
}
