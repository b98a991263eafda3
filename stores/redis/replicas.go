package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// touchScript re-propagates a record this claim owns, in progress or
// completed (KEYS[1] the record, ARGV[1] the raw token, ARGV[2] the claim's
// compact completed record), by setting its TTL to what is left of it: a
// write that changes nothing but puts the record in the replication stream
// again, so that WAIT on this connection covers it. It is needed when
// go-redis retried a write on a new connection after the first attempt had
// reached the server: the retry then writes nothing, and WAIT would count
// replicas of this connection's earlier writes only.
var touchScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 1 end
local f = string.byte(v, 1) or 0
local s = string.sub(v, 2, 2)
if f == 2 and s == 'R' then return 1 end
if f == 2 and s == 'C' and string.len(v) >= 11 then
  if string.sub(v, 3, 10) ~= string.sub(ARGV[1], 1, 8) then return 2 end
elseif (f == 1 or f == 2) and string.len(v) >= 19 then
  if string.sub(v, 3, 18) ~= ARGV[1] then return 2 end
elseif f >= 48 and f <= 57 then
  if v ~= ARGV[2] then return 2 end
else
  return 4
end
local t = redis.call('PTTL', KEYS[1])
if t > 0 then redis.call('PEXPIRE', KEYS[1], t) end
return 0
`)

// checkWaitClient refuses a client the WAIT option cannot work with: a Ring
// (whose pipelines cannot send a keyless WAIT to a given shard), or a client
// whose ReadTimeout would cut a WAIT of timeout short.
func checkWaitClient(client goredis.UniversalClient, timeout time.Duration) error {
	var read time.Duration
	switch c := client.(type) {
	case *goredis.Ring:
		return errors.New("dedup/redis: Config.WaitReplicas is not supported with a Ring, whose shards have no replicas the store can wait for")
	case *goredis.Client:
		read = c.Options().ReadTimeout
	case *goredis.ClusterClient:
		read = c.Options().ReadTimeout
	}
	if read > 0 && timeout >= read {
		return fmt.Errorf("dedup/redis: Config.WaitTimeout (%v) must be shorter than the client's ReadTimeout (%v), which bounds the pipeline carrying the WAIT", timeout, read)
	}
	return nil
}

// masterFor returns the client whose pipelines run on one connection to the
// master holding key: the ClusterClient's node for the key's slot, or the
// client itself (a *redis.Client, Sentinel's included, pipelines on one
// connection).
func (s *Store) masterFor(ctx context.Context, key string) (goredis.UniversalClient, error) {
	if cc, ok := s.client.(*goredis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		return node, nil
	}
	return s.client, nil
}

// withWait sends the command write adds and WAIT in one pipeline to the
// master of key (one connection, one round trip) and returns WAIT's count,
// or an error when WAIT did not answer. The command's own reply or error is
// in the command. A script's NOSCRIPT is answered by loading it and sending
// the pipeline again. After a redirection or a network error a Cluster
// client is told to reload its slot map, so the next call finds the new
// master.
func (s *Store) withWait(ctx context.Context, key string, script *goredis.Script, write func(p goredis.Pipeliner) goredis.Cmder) (int64, error) {
	node, err := s.masterFor(ctx, key)
	if err != nil {
		return 0, err
	}
	for attempt := 0; ; attempt++ {
		pipe := node.Pipeline()
		cmd := write(pipe)
		wait := pipe.Do(ctx, "wait", s.waitReplicas, s.waitTimeout.Milliseconds())
		_, _ = pipe.Exec(ctx)
		if script != nil && attempt == 0 && goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			if err := script.Load(ctx, node).Err(); err != nil {
				return 0, err
			}
			continue
		}
		if err := cmd.Err(); err != nil && !errors.Is(err, goredis.Nil) {
			s.reloadOn(ctx, err)
			return 0, err
		}
		n, err := wait.Int64()
		if err != nil {
			s.reloadOn(ctx, err)
			return 0, fmt.Errorf("WAIT: %w", err)
		}
		return n, nil
	}
}

// reloadOn asks a Cluster client to reload its slot map after an error that
// may mean the key's master moved.
func (s *Store) reloadOn(ctx context.Context, err error) {
	cc, ok := s.client.(*goredis.ClusterClient)
	if !ok {
		return
	}
	var netErr net.Error
	_, moved := goredis.IsMovedError(err)
	_, ask := goredis.IsAskError(err)
	if moved || ask || goredis.IsClusterDownError(err) || goredis.HasErrorPrefix(err, "READONLY") ||
		errors.As(err, &netErr) || errors.Is(err, net.ErrClosed) || !isRedisReply(err) {
		cc.ReloadState(ctx)
	}
}

// isRedisReply reports whether err is an error reply of the server (as
// opposed to a connection or client error).
func isRedisReply(err error) bool {
	var re goredis.Error
	return errors.As(err, &re)
}

// confirm checks WAIT's count against Config.WaitReplicas.
func (s *Store) confirm(op, key string, got int64) error {
	if got < int64(s.waitReplicas) {
		return &ReplicationError{Op: op, Key: key, Want: int64(s.waitReplicas), Got: got}
	}
	return nil
}

// touch re-propagates the record a claim owns and waits for it (see
// touchScript). It returns nil when WaitReplicas replicas have it.
func (s *Store) touch(ctx context.Context, op, key string, raw *[tokenLen]byte) error {
	var cmd *goredis.Cmd
	n, err := s.withWait(ctx, s.prefix+key, touchScript, func(p goredis.Pipeliner) goredis.Cmder {
		cmd = touchScript.EvalSha(ctx, p, []string{s.prefix + key}, raw[:], appendCompact(nil, raw))
		return cmd
	})
	if err != nil {
		return fmt.Errorf("dedup/redis: %s: %w", op, err)
	}
	if r, err := cmd.Int(); err != nil || r != replyOK {
		return fmt.Errorf("dedup/redis: %s %.200q: re-propagating the record for WAIT: reply %d, %v", op, key, r, err)
	}
	return s.confirm(op, key, n)
}

// releaseRefused deletes a claim that WAIT did not confirm, best effort and
// bounded by WaitTimeout even when ctx is done: if it fails, the record
// stays until its lease ends, as after a crash.
func (s *Store) releaseRefused(ctx context.Context, key string, raw *[tokenLen]byte) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.waitTimeout)
	defer cancel()
	_ = discardScript.Run(ctx, s.client, []string{s.prefix + key}, raw[:], appendCompact(nil, raw)).Err()
}
