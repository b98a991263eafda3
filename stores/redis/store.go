package redis

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/stores/redis/redisbatch"
)

// Store is a dedup.Store on Redis 7.0 or newer: a single server, a Sentinel
// setup or a Cluster, through any go-redis v9 UniversalClient. Each record
// is one Redis string key, prefix + scoped key, so every operation touches
// one key (one Cluster slot) and needs no hash tags.
//
// Expiry is Redis' own: an in-progress record's TTL is its lease and a
// completed record's TTL is its retention, both set with PX and counted on
// the server's clock, so no client clock is trusted and an expired record is
// simply absent. Claim costs one round trip (two when it meets a record a
// failed handler released, which it takes over with a script); Complete,
// Release and Extend one each (EVALSHA; the first call after the server
// lost its script cache adds one EVAL).
//
// When Redis cannot be reached every method returns an error that is neither
// dedup.ErrClaimLost nor dedup.ErrInvalidDuration, and the caller (the
// middleware) nacks the message: nothing is acked without a record. go-redis
// reconnects by itself, so the store works again as soon as the server does.
// What survives a server crash is Redis' business: without persistence
// (AOF) or replication a restarted server has forgotten every record, and
// redelivered messages run their effect again. Replication is asynchronous:
// a failover can promote a replica that lacks the last claims and
// completions, unless Config.WaitReplicas makes them wait for it.
//
// A Store is safe for concurrent use; it holds no state but the client,
// with Config.AutoPipeline the batcher that shares its writes, and, while
// copies wait for held keys (dedup.Config.InProgressWait), the subscription
// connection that wakes them (see WatchKey; Close closes it).
type Store struct {
	client       goredis.UniversalClient
	prefix       string
	waitReplicas int                 // Config.WaitReplicas
	waitTimeout  time.Duration       // Config.WaitTimeout
	batch        *redisbatch.Batcher // Config.AutoPipeline; nil: every command alone
	// ap replaces batch in BenchmarkAutoPipeline (export_test.go), which
	// compares go-redis' auto-pipeliner with the store's batcher.
	ap *goredis.AutoPipeliner
	// omitProvenance is Config.OmitProvenance as Complete's last script
	// argument: "1" or "".
	omitProvenance string
	// watch keeps the key watches of WatchKey; nil for a client whose
	// shard channels cannot be followed (a Ring).
	watch *storekit.WatchHub
}

// claimAdmission is the number of claims the engine admits at once by
// default with Config.AutoPipeline: one full batch (redisbatch.DefaultMaxBatch).
// The engine's own bound (16) keeps a backlog of claims from taking every
// pool connection from Complete, Release and Extend; through the batcher
// every command of the store shares at most redisbatch.DefaultMaxInFlight
// batches on that many connections, so the bound only caps how many claims
// share a batch. Up to a full batch, every handler that runs at once can
// put its claim into the next batch; beyond it a claim would only wait in
// the batcher's queue instead of the engine's.
const claimAdmission = redisbatch.DefaultMaxBatch

// ClaimAdmission is how many Claim requests a dedup engine on this store
// admits at once when dedup.Config.MaxClaimsInFlight is left at zero: one
// full batch (256) with Config.AutoPipeline, whose batcher bounds the
// batches that every command of the store shares; 0 without it, which
// leaves the engine's own default (16). An explicit MaxClaimsInFlight
// always wins.
func (s *Store) ClaimAdmission() int {
	if s.batch == nil {
		return 0
	}
	return claimAdmission
}

// process sends cmd, batched with other calls' with Config.AutoPipeline
// (p is where it waits).
func (s *Store) process(ctx context.Context, cmd goredis.Cmder, p *redisbatch.Pending) error {
	if s.ap != nil {
		return s.ap.Process(ctx, cmd)
	}
	if s.batch != nil {
		return s.batch.Process(ctx, cmd, p)
	}
	return s.client.Process(ctx, cmd)
}

var _ dedup.Store = (*Store)(nil)

var _ dedup.ClaimAdmitter = (*Store)(nil)

// New checks that every server the client writes to runs Redis 7.0 or newer
// (INFO server on each Cluster master or Ring shard, on the one server or
// the current Sentinel master otherwise), that it is a master (INFO
// replication, else ROLE) and not an instance of an Active-Active database
// (COMMAND INFO CRDT.DEBUG) unless Config.AllowActiveActive, and, unless
// Config.AllowEviction, that its maxmemory-policy is noeviction (INFO
// memory, else CONFIG GET), and returns the store. A server that is too
// old gives a *VersionError matching ErrServerTooOld, a replica a
// *ReplicaError matching ErrReplica, an Active-Active instance an
// *ActiveActiveError matching ErrActiveActive, an evicting one an
// *EvictionPolicyError matching ErrEvictionPolicy, an unreachable one the
// client's error: all at construction, not at the first message. A server
// that tells its policy, its role or its commands neither way is accepted
// with a warning through Config.Logger. What cannot be detected (a proxy
// that hides the servers behind it) is in docs/redis.md.
// Cost: three round trips per server (four where INFO memory lacks the
// policy), two with AllowEviction, within ctx. A Config that Validate
// refuses (ErrNoClient, ErrAmbiguousPrefix, ...) is refused before any
// round trip. The client (Config.Client) is not closed by the store.
func New(ctx context.Context, config Config) (*Store, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config.setDefaults()
	client := config.Client
	if config.WaitReplicas > 0 {
		if err := checkWaitClient(client, config.WaitTimeout); err != nil {
			return nil, err
		}
	}
	check := func(ctx context.Context, c goredis.Cmdable, addr string) error {
		if err := checkVersion(ctx, c, addr); err != nil {
			return err
		}
		warn := func(msg string, err error) {
			config.Logger.Info(msg, watermill.LogFields{"addr": addr, "reason": err.Error()})
		}
		if err := checkTopology(ctx, c, addr, config.AllowActiveActive, warn); err != nil {
			return err
		}
		if config.AllowEviction {
			return nil
		}
		policy, err := evictionPolicy(ctx, c)
		switch {
		case errors.Is(err, errPolicyUnreadable):
			config.Logger.Info("dedup/redis: cannot read maxmemory-policy; make sure it is noeviction, "+
				"or a full server deletes records and their messages run their effect again",
				watermill.LogFields{"addr": addr, "reason": err.Error()})
			return nil
		case err != nil:
			return fmt.Errorf("dedup/redis: reading the maxmemory-policy of %s: %w", addr, err)
		case policy != noEviction:
			return &EvictionPolicyError{Addr: addr, Policy: policy}
		}
		return nil
	}
	if err := checkServers(ctx, client, check); err != nil {
		return nil, err
	}
	st := &Store{client: client, prefix: config.KeyPrefix, waitReplicas: config.WaitReplicas, waitTimeout: config.WaitTimeout}
	if config.OmitProvenance {
		st.omitProvenance = "1"
	}
	if config.AutoPipeline {
		st.batch = redisbatch.New(client, redisbatch.DefaultMaxBatch, redisbatch.DefaultMaxInFlight)
	}
	st.watch = newWatchHub(client, watchLinger)
	return st, nil
}

// RedisKey returns the Redis key holding the record of a scoped key:
// the configured prefix followed by the scoped key, verbatim.
func (s *Store) RedisKey(scopedKey string) string { return s.prefix + scopedKey }

// millis converts a positive duration to whole milliseconds for PX and
// PEXPIRE, rounding up: a lease is never shortened, and never 0 (which Redis
// refuses). The longest durations, where rounding up would overflow, are
// rounded down.
func millis(d time.Duration) int64 {
	if d > math.MaxInt64-time.Millisecond {
		return int64(d / time.Millisecond)
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// Claim implements dedup.Store.Claim with one command, SET key value NX PX
// lease GET: when the key is absent Redis stores the new in_progress record
// and replies nil (Acquired); when a live record exists it changes nothing and
// replies with the old value, decoded here into Duplicate (with its result),
// InProgress or Conflict. One round trip in every case; an expired record is
// absent for Redis, so it is taken over by the same command. The claim's
// owner token is 16 random bytes, stored in the record; Claim.Token is the
// whole in-progress record the claim wrote (the owner token at bytes 2 to
// 17), from which Complete builds the completed record, sending it with
// the record it expects: the script writes it only if the record under the
// key is still exactly that one, else builds it itself. Treat the token as
// opaque: compare it, pass it back.
//
// With Config.WaitReplicas the SET and a WAIT go in one pipeline to the
// key's master; an acquired claim that WAIT does not confirm is released
// (best effort) and refused with a *ReplicationError (ErrNotReplicated).
//
// If the reply is the record this call wrote (go-redis retried the command
// after a network error, and the first attempt had reached the server), the
// claim is Acquired: the token is random, no other claim can carry it. A value
// under the key that is not a record of this format gives an error wrapping
// ErrUnknownFormat.
//
// The record keeps the claim's dedup.Origin (OriginFromContext), the time
// of the claim by this process's clock and a claim count of 1. A claim
// that finds a released record takes it over with a second round trip (a
// compare-and-set script), keeping its Origin and time and counting one
// more claim. A record whose lease ended is gone from Redis: the claim
// that follows counts 1 again.
//
// Every Acquired claim carries a fence (Claim.Fence), kept in the record
// it wrote: this process's clock in microseconds (storekit.NextFence) for
// a key without a record, and for a takeover at least the released
// record's fence plus one, which the compare-and-set makes larger than
// every earlier winner's. After Redis deleted a record (its lease or
// retention ended), the next fence is larger than the last as long as the
// consumers' clocks agree within that lease or retention (docs/redis.md,
// "Fencing").
func (s *Store) Claim(ctx context.Context, key, fingerprint string, lease time.Duration) (dedup.ClaimResult, error) {
	if err := storekit.CheckDuration("lease", lease); err != nil {
		return dedup.ClaimResult{}, err
	}
	raw := storekit.RawToken()
	fp := fingerprintDigest(fingerprint)
	now := time.Now()
	p := firstClaim(ctx, now)
	fence := storekit.NextFence(0, now)
	if s.waitReplicas > 0 {
		return s.claimWait(ctx, key, raw, fp, &p, fence, lease)
	}
	a := claimArgsPool.Get().(*claimArgs)
	v := appendInProgress(a.value.b[:0], &raw, fp, &p, fence)
	a.value.len = uint16(len(v))
	// One string holds the command's key and then the record: the record
	// is the claim's token (see Claim.Token), the key the claim's note
	// for Complete (keepNote).
	kv := joinKeyRecord(s.prefix, key, v)
	n := len(kv) - len(v)
	token := kv[n:]
	a.key, a.ms = kv[:n], millis(lease)
	a.args = [...]any{"set", &a.key, &a.value, "nx", "px", &a.ms, "get"}
	old, found, err := s.setNXGet(ctx, a.args[:], &a.wait)
	a.release()
	if err == nil && !found {
		keepNote(ctx, kv[:n])
	}
	if err != nil {
		return dedup.ClaimResult{}, fmt.Errorf("dedup/redis: claim: %w", err)
	}
	if !found {
		return dedup.ClaimResult{Outcome: dedup.Acquired, Claim: dedup.Claim{Key: key, Token: token, Fence: fence}}, nil
	}
	res, err := outcomeOf(old, raw, fp, key, token)
	if err == errReleased {
		return s.takeOver(ctx, key, old, raw, fp, token, lease)
	}
	return res, err
}

// keepNote keeps key, the claim's Redis key (with the store's prefix), on
// the claim's context when the engine made that context
// (dedup.HeldClaimFromContext): the
// engine's Complete of the claim finds it there (noteKey) rather than
// making the string again.
func keepNote(ctx context.Context, key string) {
	if hc, ok := dedup.HeldClaimFromContext(ctx); ok && hc.Claim().Token == "" {
		hc.SetNote(key)
	}
}

// noteKey returns the Redis key that keepNote kept for claim, if ctx is
// the engine's context of that claim.
func (s *Store) noteKey(ctx context.Context, claim dedup.Claim) (string, bool) {
	hc, ok := dedup.HeldClaimFromContext(ctx)
	if !ok || hc.Claim() != claim {
		return "", false
	}
	key := hc.Note()
	if len(key) != len(s.prefix)+len(claim.Key) || key[:len(s.prefix)] != s.prefix || key[len(s.prefix):] != claim.Key {
		return "", false
	}
	return key, true
}

// joinKeyRecord returns prefix+key+string(v) in one allocation (the
// compiler makes string(v) a second one in a concatenation).
func joinKeyRecord(prefix, key string, v []byte) string {
	var b strings.Builder
	b.Grow(len(prefix) + len(key) + len(v))
	b.WriteString(prefix)
	b.WriteString(key)
	b.Write(v)
	return b.String()
}

// firstClaim is the provenance of a claim that creates a record at now:
// its Origin, now, one claim.
func firstClaim(ctx context.Context, now time.Time) provenance {
	p := provenance{claimedAt: now.UnixMilli(), claims: 1}
	p.origin, _ = dedup.OriginFromContext(ctx)
	return p
}

// claimArgs are a claim's command arguments, held where go-redis can take
// pointers to them: no allocation per argument. They are pooled: go-redis
// is done with a command's arguments when it returns (a hook that kept a
// command's Args after the call would see them change).
type claimArgs struct {
	key   string
	value recordArg
	ms    int64
	args  [7]any
	wait  redisbatch.Pending
}

// release drops what the arguments point to and puts them back in the
// pool.
func (a *claimArgs) release() {
	a.key, a.wait = "", redisbatch.Pending{}
	clear(a.args[:])
	claimArgsPool.Put(a)
}

// release drops what the arguments point to and puts them back in the
// pool.
func (a *scriptArgs) release() {
	a.key, a.token, a.result, a.now, a.wait = "", "", nil, 0, redisbatch.Pending{}
	a.built.len, a.expected = 0, ""
	clear(a.args[:])
	clear(a.fast[:])
	scriptArgsPool.Put(a)
}

var (
	claimArgsPool  = sync.Pool{New: func() any { return new(claimArgs) }}
	scriptArgsPool = sync.Pool{New: func() any { return new(scriptArgs) }}
)

// recordArg is an in-progress record passed by pointer (go-redis writes an
// encoding.BinaryMarshaler's bytes as they are).
type recordArg struct {
	b   [maxInProgress]byte
	len uint16
}

func (a *recordArg) MarshalBinary() ([]byte, error) { return a.b[:a.len], nil }

// setNXGet sends SET NX PX GET and returns the old value, if found. The
// reply is read raw: go-redis turns the nil reply of an acquiring claim
// into an error (redis.Nil) and classifies it for a retry, which costs
// more than the command. An error reply (MOVED on a Cluster, READONLY,
// LOADING: the command did not run) is answered by sending the command
// again the ordinary way, which follows redirections and retries.
func (s *Store) setNXGet(ctx context.Context, args []any, p *redisbatch.Pending) (old []byte, found bool, err error) {
	cmd := rawCmds.Get().(*goredis.RawCmd)
	*cmd = *goredis.NewRawCmd(ctx, args...)
	err = s.process(ctx, cmd, p)
	old, found, ok := parseBulkReply(cmd.Val()) // old is in the reply's own buffer, not in cmd
	*cmd = goredis.RawCmd{}
	rawCmds.Put(cmd)
	if err != nil {
		return nil, false, err
	}
	if ok {
		return old, found, nil
	}
	v, err := s.client.Do(ctx, args...).Text()
	if errors.Is(err, goredis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return []byte(v), true, nil
}

// parseBulkReply reads a RESP2 or RESP3 bulk string or null reply; ok is
// false for anything else (an error reply).
func parseBulkReply(raw []byte) (v []byte, found, ok bool) {
	switch {
	case len(raw) >= 3 && raw[0] == '_': // RESP3 null
		return nil, false, true
	case len(raw) < 4 || raw[0] != '$':
		return nil, false, false
	case raw[1] == '-': // RESP2 null bulk string: $-1
		return nil, false, true
	}
	n, i := 0, 1
	for ; i < len(raw) && raw[i] >= '0' && raw[i] <= '9'; i++ {
		n = n*10 + int(raw[i]-'0')
		if n > len(raw) {
			return nil, false, false
		}
	}
	if i+2+n+2 != len(raw) || raw[i] != '\r' || raw[i+1] != '\n' {
		return nil, false, false
	}
	return raw[i+2 : i+2+n], true, true
}

// claimWait is Claim with Config.WaitReplicas: SET NX PX GET and WAIT in
// one pipeline to the key's master. An acquired claim that WAIT does not
// confirm is released (best effort) and refused with a *ReplicationError.
func (s *Store) claimWait(ctx context.Context, key string, raw [tokenLen]byte, fp []byte, p *provenance, fence uint64, lease time.Duration) (dedup.ClaimResult, error) {
	var cmd *goredis.Cmd
	value := appendInProgress(nil, &raw, fp, p, fence)
	token := string(value) // see Claim.Token
	n, err := s.withWait(ctx, s.prefix+key, nil, func(p goredis.Pipeliner) goredis.Cmder {
		cmd = p.Do(ctx, "set", s.prefix+key, value, "nx", "px", millis(lease), "get")
		return cmd
	})
	if err != nil {
		if cmd != nil && errors.Is(cmd.Err(), goredis.Nil) {
			// The SET took the key but WAIT did not answer.
			s.releaseRefused(ctx, key, &raw)
		}
		return dedup.ClaimResult{}, fmt.Errorf("dedup/redis: claim: %w", err)
	}
	old, err := cmd.Text()
	if errors.Is(err, goredis.Nil) {
		if err := s.confirm("claim", key, n); err != nil {
			s.releaseRefused(ctx, key, &raw)
			return dedup.ClaimResult{}, err
		}
		return dedup.ClaimResult{Outcome: dedup.Acquired, Claim: dedup.Claim{Key: key, Token: token, Fence: fence}}, nil
	}
	if err != nil {
		return dedup.ClaimResult{}, fmt.Errorf("dedup/redis: claim: %w", err)
	}
	res, err := outcomeOf([]byte(old), raw, fp, key, token)
	if err == errReleased {
		return s.takeOver(ctx, key, []byte(old), raw, fp, token, lease)
	}
	if err != nil || res.Outcome != dedup.Acquired {
		return res, err
	}
	// Our own record, written by an earlier attempt on another connection:
	// this connection wrote nothing, so make it write the record again.
	if err := s.touch(ctx, "claim", key, &raw); err != nil {
		s.releaseRefused(ctx, key, &raw)
		return dedup.ClaimResult{}, err
	}
	return res, nil
}

// errReleased: outcomeOf found a released record, which the claim takes
// over (takeOver).
var errReleased = errors.New("dedup/redis: released record")

// outcomeOf decodes the value a claim found and classifies it; a released
// record gives errReleased.
func outcomeOf(old []byte, token [tokenLen]byte, fp []byte, key, claimToken string) (dedup.ClaimResult, error) {
	r, err := decodeRecord(old)
	if err != nil {
		return dedup.ClaimResult{}, fmt.Errorf("dedup/redis: claim: %w", err)
	}
	if r.state == stateReleased {
		return dedup.ClaimResult{}, errReleased
	}
	if r.state == stateInProgress && r.token == token {
		// Our own record, written by an earlier attempt of this command,
		// with its fence.
		return dedup.ClaimResult{Outcome: dedup.Acquired, Claim: dedup.Claim{Key: key, Token: claimToken, Fence: r.fence}}, nil
	}
	if len(fp) > 0 && len(r.fp) > 0 && string(fp) != string(r.fp) {
		return dedup.ClaimResult{Outcome: dedup.Conflict}, nil
	}
	if r.state == stateCompleted {
		return dedup.ClaimResult{Outcome: dedup.Duplicate, Result: r.result}, nil
	}
	return dedup.ClaimResult{Outcome: dedup.InProgress}, nil
}

// Complete implements dedup.Store.Complete with a compare-and-set script:
// only if the record is still in progress and carries the claim's token, it becomes a completed record holding result, with the
// retention as its TTL, and its provenance with the time of completion by
// this process's clock (unless Config.OmitProvenance). Otherwise nothing changes and the error matches
// dedup.ErrClaimLost and one of ErrExpired, ErrNotOwner, ErrAlreadyCompleted.
// One round trip, or two when the record changed since the claim (below).
// With Config.WaitReplicas the whole script and a WAIT share one round
// trip, and a completion WAIT does not confirm returns a
// *ReplicationError (a store error: retry it).
//
// For a claim this store made (Claim.Token is the in-progress record the
// claim wrote) whose completed record keeps a field, Complete builds the
// completed record from that record and sends the least script
// (completeAsClaimedSrc), which writes it only if the record under the key
// is still exactly the claim's; when it is not, the whole script
// (completeSrc) follows and tells why. Any other token (the owner's 16
// bytes, or their hex form) or record gets the whole script alone, which
// builds the same bytes from the record it finds, at about 2 µs more of
// the server's CPU.
func (s *Store) Complete(ctx context.Context, claim dedup.Claim, result []byte, retention time.Duration) error {
	if err := storekit.CheckDuration("retention", retention); err != nil {
		return err
	}
	return s.run(ctx, "complete", completeOp, claim, millis(retention), result)
}

// Release implements dedup.Store.Release with one script run
// (compare-and-set): only if the record is still in progress and carries
// the claim's token, it becomes a released record, with its provenance,
// for what is left of the lease (KEEPTTL); every operation treats it as no
// record but the next Claim, which counts it. Otherwise nothing changes and
// the error matches dedup.ErrClaimLost and one of ErrExpired (also for a
// released record), ErrNotOwner, ErrAlreadyCompleted. One round trip; it
// never waits for replicas, even with Config.WaitReplicas: a release a
// promoted replica lacks only delays the next copy until the lease ends.
func (s *Store) Release(ctx context.Context, claim dedup.Claim) error {
	return s.run(ctx, "release", releaseOp, claim, 0, nil)
}

// Extend implements dedup.Store.Extend with one script run
// (compare-and-pexpire): the record's TTL becomes lease, from now on the
// server's clock, only if it is still in progress and carries the claim's
// token. Otherwise nothing changes and the error matches dedup.ErrClaimLost
// and one of ErrExpired, ErrNotOwner, ErrAlreadyCompleted. One round trip.
// With Config.WaitReplicas it waits like Complete: an extension a promoted
// replica lacks would end the lease early there.
func (s *Store) Extend(ctx context.Context, claim dedup.Claim, lease time.Duration) error {
	if err := storekit.CheckDuration("lease", lease); err != nil {
		return err
	}
	return s.run(ctx, "extend", extendOp, claim, millis(lease), nil)
}

// scriptArgs are a token-checking script's arguments (EVALSHA sha 1 key
// token compact [ms [result now omit built expected]]), and in fast those
// of completeAsClaimedSrc (EVALSHA sha 1 key expected built ms [result]),
// held where go-redis can take pointers to them: no allocation per
// argument; pooled like claimArgs.
type scriptArgs struct {
	key, token string
	compact    compactArg
	ms, now    int64
	result     sliceArg
	built      builtArg // Complete: the completed record built here, if any
	expected   string   // the in-progress record it was built from
	args       [12]any
	fast       [8]any // completeAsClaimedSrc's
	wait       redisbatch.Pending
}

// builtArg holds a completed record without its result (appendCompleted).
type builtArg struct {
	b   [maxCompletedHeader]byte
	len uint16
}

func (a *builtArg) MarshalBinary() ([]byte, error) { return a.b[:a.len], nil }

// compactArg holds a compact completed record (at most 20 digits).
type compactArg struct {
	b   [20]byte
	len uint8
}

func (a *compactArg) MarshalBinary() ([]byte, error) { return a.b[:a.len], nil }

// sliceArg is a []byte argument passed by pointer.
type sliceArg []byte

func (a *sliceArg) MarshalBinary() ([]byte, error) { return *a, nil }

// ownedScript is a token-checking script: its source and SHA1, kept as
// strings that go-redis can take pointers to.
type ownedScript struct {
	script   *goredis.Script
	src, sha string
}

func newOwnedScript(src string) *ownedScript {
	s := goredis.NewScript(src)
	return &ownedScript{script: s, src: src, sha: s.Hash()}
}

var (
	completeOp          = newOwnedScript(completeSrc)
	completeAsClaimedOp = newOwnedScript(completeAsClaimedSrc)
	releaseOp           = newOwnedScript(releaseSrc)
	extendOp            = newOwnedScript(extendSrc)
)

// run runs one of the token-checking scripts with ARGV[1] the raw token,
// ARGV[2] the claim's compact completed record, then ms (when positive)
// and result (Complete), and maps its reply.
func (s *Store) run(ctx context.Context, op string, script *ownedScript, claim dedup.Claim, ms int64, result []byte) error {
	token, raw, err := rawToken(op, claim)
	if err != nil {
		return err
	}
	a := scriptArgsPool.Get().(*scriptArgs)
	a.token, a.ms = token, ms
	a.result = result
	a.args = [...]any{"evalsha", &script.sha, 1, &a.key, &a.token, &a.compact, &a.ms, &a.result, &a.now, &s.omitProvenance, &a.built, &a.expected}
	args := a.args[:]
	switch {
	case ms == 0: // Release
		args = args[:6]
	case script != completeOp: // Extend
		args = args[:7]
	default:
		a.now = time.Now().UnixMilli()
		if key, ok := s.noteKey(ctx, claim); ok {
			a.key = key // the claim's: no string made
		}
		if v, ok := tokenRecord(claim.Token); ok {
			if b, ok := appendCompleted(a.built.b[:0], v, a.now, s.omitProvenance != ""); ok {
				a.built.len, a.expected = uint16(len(b)), v
			}
		}
	}
	if a.key == "" {
		a.key = s.prefix + claim.Key
	}
	if a.expected != "" && s.waitReplicas == 0 {
		// The record as the claim wrote it, most likely: the least script
		// first (completeAsClaimedSrc), the whole one only if it was not.
		a.fast = [...]any{"evalsha", &completeAsClaimedOp.sha, 1, &a.key, &a.expected, &a.built, &a.ms, &a.result}
		n := len(a.fast)
		if len(result) == 0 {
			n--
		}
		reply, err := s.evalOwned(ctx, completeAsClaimedOp, a.fast[:n], &a.wait)
		if err == nil && reply == replyOK {
			a.release()
			return nil
		}
		if err == nil && reply != replyNotAsClaimed {
			err = fmt.Errorf("unexpected script reply %d", reply)
		}
		if err != nil {
			a.release()
			return fmt.Errorf("dedup/redis: %s: %w", op, err)
		}
	}
	// The whole script's compact completed record: only now, past the
	// least script, which does without it.
	a.compact.len = uint8(len(appendCompact(a.compact.b[:0], &raw)))
	if s.waitReplicas > 0 && script != releaseOp {
		r := raw // a copy: raw itself stays on the stack
		err := s.runWait(ctx, op, script, claim.Key, args, &r)
		a.release()
		return err
	}
	reply, err := s.evalOwned(ctx, script, args, &a.wait)
	a.release()
	if err == nil && reply == replyOK {
		return nil
	}
	r := raw // on the heap only on this path
	return s.replyError(ctx, op, script, claim.Key, reply, err, &r)
}

// runWait is run with Config.WaitReplicas: the script and WAIT in one
// pipeline.
func (s *Store) runWait(ctx context.Context, op string, script *ownedScript, key string, args []any, raw *[tokenLen]byte) error {
	var cmd *goredis.Cmd
	acks, err := s.withWait(ctx, s.prefix+key, script.script, func(p goredis.Pipeliner) goredis.Cmder {
		cmd = goredis.NewCmd(ctx, args...)
		_ = p.Process(ctx, cmd)
		return cmd
	})
	var reply int64
	if err == nil {
		reply, err = cmd.Int64()
	}
	if err == nil && reply == replyOK {
		return s.confirm(op, key, acks)
	}
	return s.replyError(ctx, op, script, key, reply, err, raw)
}

// replyError maps a script's failure or reply other than replyOK to an
// error.
func (s *Store) replyError(ctx context.Context, op string, script *ownedScript, key string, reply int64, err error, raw *[tokenLen]byte) error {
	if err != nil {
		return fmt.Errorf("dedup/redis: %s: %w", op, err)
	}
	switch reply {
	case replyExpired:
		return lost(op, key, ErrExpired, "")
	case replyNotOwner:
		return lost(op, key, ErrNotOwner, "")
	case replyAlreadyCompleted:
		if s.waitReplicas > 0 && script == completeOp {
			// An earlier attempt on another connection completed it (go-redis
			// retried): confirm that write before reporting it done.
			if err := s.touch(ctx, op, key, raw); err != nil {
				return err
			}
		}
		return lost(op, key, ErrAlreadyCompleted, "")
	case replyUnknownFormat:
		return lost(op, key, ErrUnknownFormat, "it cannot carry this claim's token")
	default:
		return fmt.Errorf("dedup/redis: %s: unexpected script reply %d", op, reply)
	}
}

// decodeHexToken decodes a token in hex into raw and returns it raw.
func decodeHexToken(token string, raw *[tokenLen]byte) (string, bool) {
	if _, err := hex.Decode(raw[:], []byte(token)); err != nil {
		return "", false
	}
	return string(raw[:]), true
}

// evalOwned runs a token-checking script: EVALSHA with args (args[1] the
// script's SHA1, args[3] the key), then EVAL when the server does not know
// the script (NOSCRIPT), as go-redis' Script.Run does, through the batcher
// with Config.AutoPipeline. The command is pooled and the arguments are
// the caller's (pooled too), where Script.Run would build both for every
// call.
//
// It pays in bytes: Script.Run costs more allocations per Claim+Complete
// (`go test -run '^$' -bench ClaimComplete -benchmem ./stores/redis/`); in
// time, paired builds found no consistent difference
// (docs/dev/redis-autopipeline.md).
func (s *Store) evalOwned(ctx context.Context, script *ownedScript, args []any, p *redisbatch.Pending) (int64, error) {
	cmd := cmds.Get().(*goredis.Cmd)
	*cmd = *goredis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	_ = s.process(ctx, cmd, p)
	// (HasErrorPrefix allocates even for a nil error.)
	if err := cmd.Err(); err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", &script.src
		*cmd = *goredis.NewCmd(ctx, args...)
		cmd.SetFirstKeyPos(3)
		_ = s.process(ctx, cmd, p)
	}
	n, err := cmd.Int64()
	*cmd = goredis.Cmd{}
	cmds.Put(cmd)
	return n, err
}

// rawCmds and cmds pool the commands of the claim and of the token-checking
// scripts, the two commands on every message's path: go-redis is done with
// a command when Process returns (as with the pooled arguments, a hook that
// kept a command after the call would see it change).
var (
	rawCmds = sync.Pool{New: func() any { return new(goredis.RawCmd) }}
	cmds    = sync.Pool{New: func() any { return new(goredis.Cmd) }}
)

func lost(op, key string, why error, detail string) error {
	if detail != "" {
		return fmt.Errorf("%w: %s %.200q: %w (%s)", dedup.ErrClaimLost, op, key, why, detail)
	}
	return fmt.Errorf("%w: %s %.200q: %w", dedup.ErrClaimLost, op, key, why)
}
