package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

// Why one script and not WATCH + MULTI/EXEC: the token is checked by the
// server in the same atomic step that runs the handler's commands and
// writes the completion, in one round trip, with the completion written by
// the very code of Complete's script (completeSrc), and without a
// connection held from WATCH to EXEC (WATCH, GET, MULTI, the commands,
// EXEC: at least three round trips, a dedicated connection, and the
// completion rewritten as client-side commands).

// txCompleteSrc is Complete's script with the handler's commands run
// between the token check and the completion: KEYS[1] the record,
// KEYS[2...] the keys the commands declared; ARGV[1..6] as completeSrc,
// ARGV[7] the index of the first command in ARGV, then each command as its
// argument count followed by its arguments. Each command runs with
// redis.pcall, so that one Redis refuses (a wrong type) does not stop the
// others nor the completion (as in MULTI/EXEC, Redis undoes nothing). It
// replies with the prelude's code when the claim is not ours (nothing
// ran), else {completion reply, {each command's reply}}.
var txCompleteSrc = func() string {
	body, ok := strings.CutPrefix(completeSrc, ownedPrelude)
	if !ok {
		panic("dedup/redis: completeSrc does not start with ownedPrelude")
	}
	return ownedPrelude + `
local replies, c, i = {}, 0, tonumber(ARGV[7])
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  c = c + 1
  replies[c] = redis.pcall(unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
local function complete()
` + body + `
end
return {complete(), replies}
`
}()

var txCompleteScript = goredis.NewScript(txCompleteSrc)

// txArgBase is the ARGV index (from 1) of the first command in
// txCompleteSrc.
const txArgBase = 8

var (
	// ErrNoClaim is dedup.ErrNoClaim: TxMiddleware got a message without
	// a dedup claim in its context (it was added before, outside, the
	// dedup middleware), or RunInTx was called outside the work of
	// dedup.Engine.Do. Nothing was run.
	ErrNoClaim = dedup.ErrNoClaim

	// ErrNestedTx is dedup.ErrNestedTx: RunInTx (or TxMiddleware) was
	// called for a claim whose RunInTx still runs, as when a helper that
	// opens its own RunInTx is called from a handler TxMiddleware already
	// wraps, or after a RunInTx of the claim completed the record. Its
	// work did not run and nothing was queued or sent. The enclosing
	// RunInTx goes on: if its work returns the error, nothing is written
	// and the claim is released; if it swallows it, its own commands are
	// written with the completion. Queue on the Tx already open instead:
	// call RunInTx only when TxFromContext finds none.
	ErrNestedTx = dedup.ErrNestedTx

	// ErrCrossSlot: on a Redis Cluster, Tx.Queue was given a key that
	// does not hash to the slot of the claim's record, so the command
	// could not run in the record's atomic step. Nothing was queued. Put
	// the same hash tag in both: see Tx.HashTag and the package
	// documentation.
	ErrCrossSlot = errors.New("dedup/redis: the key is not in the slot of the dedup record")

	// ErrTxKey: Tx.Queue was given no command, or the record's own key
	// (the completion writes it). Nothing was queued.
	ErrTxKey = errors.New("dedup/redis: the command cannot run in the record's transaction")

	// ErrTxUnsupported: RunInTx was called with a Store on a go-redis
	// Ring, whose shards are chosen by go-redis: a script on the record's
	// shard cannot reach keys of another. Use a Cluster or one server.
	ErrTxUnsupported = errors.New("dedup/redis: RunInTx needs one server or a Cluster, not a Ring")

	// ErrCommandFailed: Redis refused one of the handler's queued commands
	// when it ran (a command on a key of the wrong type, a wrong number of
	// arguments). As in MULTI/EXEC Redis undoes nothing: the other
	// commands ran and the record was completed with them, so a
	// redelivery is a duplicate and the refused command is not run again.
	// RunInTx returns a *CommandError matching it; fix the command.
	ErrCommandFailed = errors.New("dedup/redis: a queued command failed")
)

// CommandError is RunInTx's error when Redis refused queued commands.
// It matches ErrCommandFailed. The record is completed.
type CommandError struct {
	// Index is the position of the first refused command among those
	// queued (0 is the first), Err Redis' error for it.
	Index int
	Err   error
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("dedup/redis: queued command %d failed (the record is completed with the other commands): %v", e.Index, e.Err)
}

// Unwrap makes the error match ErrCommandFailed and Redis' error.
func (e *CommandError) Unwrap() []error { return []error{ErrCommandFailed, e.Err} }

// Tx holds the commands a handler queues to run atomically with the
// completion of its claim's record (see RunInTx). Get it with
// TxFromContext. Safe for concurrent use.
type Tx struct {
	mu    sync.Mutex
	keys  []string
	args  []any
	cmds  []*goredis.Cmd
	ctx   context.Context
	check func(key string) error
	// recordKey is the Redis key of the record.
	recordKey string
}

type txKey struct{}

// TxFromContext returns the transaction RunInTx (or TxMiddleware) runs the
// handler in. Queue the handler's Redis writes on it: they run after the
// handler returns, in the same atomic step as the record's completion, and
// only if the claim is still this handler's.
func TxFromContext(ctx context.Context) (*Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*Tx)
	return tx, ok
}

// Queue queues one command, args as for goredis.Client.Do (the command's
// name, then its arguments), for the atomic step that completes the
// record. keys are every key the command reads or writes: they are
// declared to the script, as Redis requires, and on a Cluster each must
// hash to the record's slot (see HashTag), else Queue returns an error
// matching ErrCrossSlot. The record's own key is refused (ErrTxKey). It
// returns the command, whose reply (Val, Result, Int64 ...) is set once
// RunInTx has run it; until then, and when the claim was lost, its Err is
// not nil. Nothing is sent now. A command that is not a write of keys
// (blocking commands, SUBSCRIBE, EVAL) fails when it runs: Redis refuses it
// in a script.
func (t *Tx) Queue(keys []string, args ...any) (*goredis.Cmd, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("%w: no command", ErrTxKey)
	}
	for _, k := range keys {
		if k == t.recordKey {
			return nil, fmt.Errorf("%w: %.200q is the dedup record's key", ErrTxKey, k)
		}
		if t.check != nil {
			if err := t.check(k); err != nil {
				return nil, err
			}
		}
	}
	cmd := goredis.NewCmd(t.ctx, args...)
	cmd.SetErr(errNotRun)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.keys = append(t.keys, keys...)
	t.args = append(t.args, len(args))
	t.args = append(t.args, args...)
	t.cmds = append(t.cmds, cmd)
	return cmd, nil
}

// HashTag returns a Redis Cluster hash tag, "{...}", that puts a key in the
// slot of the record: begin a key with it (tx.HashTag() + ":charge") to
// write it in the record's atomic step. It is the record key's own hash
// tag when the key has one (a business key "{account-7}:payment-9" makes
// every record of account 7 share a slot, and so the account's keys
// "{account-7}:balance"), else the whole record key as a tag when it
// holds no "}", else (a "}" would end the tag early: a business key "a}b"
// or "{}x") a tag of up to four digits and letters chosen for the record's
// slot ("{5md}"). The same record always gets the same tag, on a Cluster
// or not; no round trip.
func (t *Tx) HashTag() string { return slotHashTag(t.recordKey) }

var errNotRun = errors.New("dedup/redis: the queued command has not run: RunInTx has not sent it yet, or the claim was lost")

// TxMiddleware is a Watermill middleware that runs the Redis commands the
// handler queues and the completion of its dedup record in one atomic
// step, only if the claim is still the handler's: no window remains
// between the effect and its record. Add it after the dedup middleware (the
// first middleware added is the outermost), with this Store as the dedup
// middleware's store:
//
//	router.AddMiddleware(deduplicator.Middleware, store.TxMiddleware)
//
// The handler queues its writes with TxFromContext(msg.Context()) and
// Tx.Queue instead of sending them; see RunInTx for what happens then. A
// RunInTx the handler calls for the message fails with ErrNestedTx: queue
// on the middleware's Tx. Cost: one script run (EVALSHA), replacing the
// dedup middleware's separate Complete.
func (s *Store) TxMiddleware(h message.HandlerFunc) message.HandlerFunc {
	return storekit.TxMiddleware(h, s.RunInTx)
}

// RunInTx runs work, then runs the commands work queued on its Tx
// (TxFromContext) and the completion of the record of the claim work runs
// under in one Lua script: Redis runs a script atomically, so no other
// command sees the commands without the completion, or runs between the
// token check and them. Call it inside the work given to dedup.Engine.Do
// (its context carries the claim); TxMiddleware calls it for a Watermill
// handler.
//
//   - work returns nil: the script checks the record as Complete does (in
//     progress, this claim's token); if so it runs the commands in order,
//     then completes the record exactly as Complete (the result is work's
//     bytes), and the claim is marked completed so that the engine does
//     not complete it again. RunInTx returns work's bytes.
//   - the claim was lost (the lease ended, another claim owns the
//     record): none of the commands runs; the error wraps
//     dedup.ErrClaimLost (and ErrExpired or ErrNotOwner).
//   - Redis refuses a command when it runs (a wrong type): the others
//     and the completion still run, Redis undoing nothing, and RunInTx
//     returns a *CommandError (ErrCommandFailed); the claim counts as
//     completed.
//   - work returns an error or panics: nothing is sent; the engine
//     releases the claim.
//   - called inside a RunInTx of the same claim (a helper that opens its
//     own, called from a handler TxMiddleware wraps), or after one
//     completed the record: ErrNestedTx before work runs, nothing queued
//     or sent. The enclosing RunInTx then writes its own commands with
//     the completion, or nothing if its work returns the error.
//   - the process dies before the script runs: nothing ran; the record
//     stays in progress until its lease ends, then a retry runs once.
//   - the reply is lost (the connection broke): go-redis may run the
//     script again, which then finds the record completed by this claim
//     and runs nothing (success, each command's reply unknown); else the
//     error is returned, and the engine's release finds the record
//     completed (nothing changes) or frees it (nothing ran).
//
// With Config.WaitReplicas the script and WAIT share one pipeline, as for
// Complete, and a completion WAIT does not confirm is a *ReplicationError.
// A context without a claim fails with ErrNoClaim before work runs, except
// a run the engine marks as unclaimed (dedup.Config.Shadow, or FailOpen
// while the store cannot be reached): the commands then run alone, in
// MULTI/EXEC, and nothing is completed. Cost: one round trip (EVALSHA;
// EVAL when the server lost its script cache), replacing the engine's
// Complete. Not on a go-redis Ring (ErrTxUnsupported).
func (s *Store) RunInTx(ctx context.Context, work func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	return storekit.RunInTx(ctx, txFinishTimeout, s.beginTx, work)
}

// beginTx opens the Tx of a RunInTx (storekit.RunInTx) for claim (nil: a
// run without a claim, whose commands run alone).
func (s *Store) beginTx(ctx context.Context, claim *dedup.Claim) (context.Context, storekit.Tx, error) {
	if _, ring := s.client.(*goredis.Ring); ring {
		return nil, nil, ErrTxUnsupported
	}
	tx := &Tx{ctx: ctx}
	if claim != nil {
		tx.recordKey = s.prefix + claim.Key
		if _, cluster := s.client.(*goredis.ClusterClient); cluster {
			slot := keySlot(tx.recordKey)
			tx.check = func(key string) error {
				if keySlot(key) != slot {
					return fmt.Errorf("%w: key %.200q is in slot %d, the record %.200q in slot %d; begin the key with %s",
						ErrCrossSlot, key, keySlot(key), tx.recordKey, slot, tx.HashTag())
				}
				return nil
			}
		}
	}
	return context.WithValue(ctx, txKey{}, tx), txRun{s: s, tx: tx}, nil
}

// txRun ends a Tx for storekit.RunInTx: its commands and the completion
// in one script, or its commands alone; nothing was sent before, so
// nothing to undo.
type txRun struct {
	s  *Store
	tx *Tx
}

func (r txRun) Complete(ctx context.Context, claim dedup.Claim, result []byte, retention time.Duration) (bool, error) {
	r.tx.mu.Lock()
	defer r.tx.mu.Unlock()
	err := r.s.completeWith(ctx, r.tx, claim, result, retention)
	// A command Redis refused ran after the token check: the completion
	// ran too.
	return err == nil || errors.Is(err, ErrCommandFailed), err
}

func (r txRun) Commit(ctx context.Context) error {
	r.tx.mu.Lock()
	defer r.tx.mu.Unlock()
	return r.s.runAlone(ctx, r.tx)
}

func (txRun) Abort(context.Context) {}

// txFinishTimeout bounds the completing script once work has returned,
// even if ctx was cancelled meanwhile.
const txFinishTimeout = 30 * time.Second

// completeWith runs txCompleteSrc for claim and tx's commands.
func (s *Store) completeWith(ctx context.Context, tx *Tx, claim dedup.Claim, result []byte, retention time.Duration) (err error) {
	const op = "complete in transaction"
	token, raw, err := rawToken(op, claim)
	if err != nil {
		return err
	}
	keys := append([]string{tx.recordKey}, tx.keys...)
	args := make([]any, 0, txArgBase-1+len(tx.args))
	args = append(args, token, appendCompact(nil, &raw), millis(retention), result, time.Now().UnixMilli(), s.omitProvenance, txArgBase)
	args = append(args, tx.args...)
	var cmd *goredis.Cmd
	if s.waitReplicas > 0 {
		var acks int64
		acks, err = s.withWait(ctx, tx.recordKey, txCompleteScript, func(p goredis.Pipeliner) goredis.Cmder {
			cmd = txCompleteScript.EvalSha(ctx, p, keys, args...)
			return cmd
		})
		if err == nil {
			defer func() {
				if err == nil || errors.Is(err, ErrCommandFailed) {
					if werr := s.confirm(op, claim.Key, acks); werr != nil {
						err = werr
					}
				}
			}()
		}
	} else {
		cmd = txCompleteScript.Run(ctx, s.client, keys, args...)
	}
	if err == nil {
		err = cmd.Err()
	}
	if err != nil {
		return fmt.Errorf("dedup/redis: %s: %w", op, err)
	}
	switch v := cmd.Val().(type) {
	case int64:
		if v == replyAlreadyCompleted {
			// An earlier run of this very script (go-redis retried after a
			// lost reply) completed the record with the commands.
			for _, c := range tx.cmds {
				c.SetErr(errors.New("dedup/redis: the command ran, but its reply was lost"))
			}
			return nil
		}
		return s.replyError(ctx, op, completeOp, claim.Key, v, nil, &raw)
	case []any:
		var replies []any
		if len(v) == 2 {
			replies, _ = v[1].([]any)
		}
		if len(replies) != len(tx.cmds) {
			return fmt.Errorf("dedup/redis: %s: unexpected script reply %v", op, v)
		}
		return setReplies(tx.cmds, replies)
	default:
		return fmt.Errorf("dedup/redis: %s: unexpected script reply %T", op, v)
	}
}

// setReplies gives each queued command its reply, and returns a
// *CommandError for the first that Redis refused.
func setReplies(cmds []*goredis.Cmd, replies []any) error {
	var first error
	for i, c := range cmds {
		switch r := replies[i].(type) {
		case nil:
			c.SetErr(goredis.Nil)
		case goredis.Error:
			c.SetErr(r)
			if first == nil {
				first = &CommandError{Index: i, Err: r}
			}
		default:
			c.SetErr(nil)
			c.SetVal(r)
		}
	}
	return first
}

// runAlone runs tx's commands in MULTI/EXEC, for a run without a claim.
func (s *Store) runAlone(ctx context.Context, tx *Tx) error {
	if len(tx.cmds) == 0 {
		return nil
	}
	_, err := s.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		for _, c := range tx.cmds {
			c.SetErr(nil)
			_ = p.Process(ctx, c)
		}
		return nil
	})
	if err != nil && !errors.Is(err, goredis.Nil) {
		return fmt.Errorf("dedup/redis: running the queued commands: %w", err)
	}
	return nil
}
