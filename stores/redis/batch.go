package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

var _ dedup.BatchStore = (*Store)(nil)

// BatchRequestSize is the most commands one pipeline of the batch methods
// carries; a larger batch is sent as several pipelines, one after the
// other.
const BatchRequestSize = 1000

// waitReplicasConcurrency is how many single operations the batch methods
// run at once with Config.WaitReplicas, which they do not pipeline.
const waitReplicasConcurrency = 16

// ClaimBatch implements [dedup.BatchStore.ClaimBatch]: the SET NX PX GET of
// every record in one pipeline (on a Cluster, go-redis sends one pipeline
// per master owning some of the keys, concurrently), each decided as Claim
// decides its reply. Records that find a released record take it over
// with one more pipeline of the takeover script (EVALSHA; EVAL for the
// scripts the server did not know). One round trip for a batch of new,
// live or expired records (per BatchRequestSize records), two when some
// take over a released record. A failure part-way (a connection dropped
// after part of a pipeline) fails only the records without a reply. Each
// acquired record has its fence, as Claim gives it.
//
// With Config.WaitReplicas the records are claimed one by one (each
// waiting for its replicas), up to 16 at once, the records of one key in
// request order (the second finds the first's record, as the batch
// contract asks).
func (s *Store) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.ClaimResult, []error) {
	res, errs := make([]dedup.ClaimResult, len(reqs)), make([]error, len(reqs))
	if s.waitReplicas > 0 {
		keys := make([]string, len(reqs))
		for i, r := range reqs {
			keys[i] = r.Key
		}
		storekit.EachInKeyOrder(keys, waitReplicasConcurrency, func(i int) {
			r := reqs[i]
			res[i], errs[i] = s.Claim(dedup.WithOrigin(ctx, r.Origin), r.Key, r.Fingerprint, r.Lease)
		})
		return res, errs
	}
	type claimRec struct {
		i     int
		raw   [tokenLen]byte
		fp    []byte
		value []byte
		fence uint64
		cmd   *goredis.Cmd
		old   []byte // a released record found, for the takeover
	}
	now := time.Now()
	fence := storekit.NextFence(0, now) // every key's own: one claim each here
	recs := make([]*claimRec, 0, len(reqs))
	for i, r := range reqs {
		if errs[i] = storekit.CheckDuration("lease", r.Lease); errs[i] != nil {
			continue
		}
		c := &claimRec{i: i, raw: storekit.RawToken(), fp: fingerprintDigest(r.Fingerprint), fence: fence}
		p := provenance{claimedAt: now.UnixMilli(), claims: 1, origin: r.Origin}
		c.value = appendInProgress(nil, &c.raw, c.fp, &p, c.fence)
		recs = append(recs, c)
	}
	s.pipelined(ctx, len(recs), func(p goredis.Pipeliner, k int) {
		c := recs[k]
		recs[k].cmd = p.Do(ctx, "set", s.prefix+reqs[c.i].Key, c.value, "nx", "px", millis(reqs[c.i].Lease), "get")
	})
	var released []*claimRec
	decide := func(c *claimRec, old []byte) bool {
		r, err := outcomeOf(old, c.raw, c.fp, reqs[c.i].Key, "")
		if err == errReleased {
			c.old = old
			return true
		}
		if err == nil && r.Outcome == dedup.Acquired {
			// Our own record, written by an earlier attempt: the token is
			// the record (see Store.Claim).
			r.Claim.Token = string(old)
		}
		res[c.i], errs[c.i] = r, err
		return false
	}
	for _, c := range recs {
		v, err := c.cmd.Text()
		switch {
		case errors.Is(err, goredis.Nil):
			res[c.i] = dedup.ClaimResult{Outcome: dedup.Acquired, Claim: dedup.Claim{Key: reqs[c.i].Key, Token: string(c.value), Fence: c.fence}}
		case err != nil:
			errs[c.i] = fmt.Errorf("dedup/redis: claim: %w", err)
		case decide(c, []byte(v)):
			released = append(released, c)
		}
	}
	// Take over the released records: as takeOver does, one pipeline per
	// attempt for all of them.
	for attempt := 1; len(released) > 0; attempt++ {
		if attempt > maxTakeovers {
			for _, c := range released {
				res[c.i] = dedup.ClaimResult{Outcome: dedup.InProgress}
			}
			break
		}
		type takeover struct {
			c      *claimRec
			keys   []string
			value  []byte
			fence  uint64
			lease  int64
			cmd    *goredis.Cmd
			failed bool
		}
		var tos []*takeover
		for _, c := range released {
			value, fence, err := takeoverValue(c.old, &c.raw, c.fp, reqs[c.i].Origin)
			if err != nil {
				errs[c.i] = err
				continue
			}
			tos = append(tos, &takeover{c: c, keys: []string{s.prefix + reqs[c.i].Key}, value: value, fence: fence, lease: millis(reqs[c.i].Lease)})
		}
		s.scripted(ctx, takeoverScript, len(tos), func(p goredis.Pipeliner, k int, sha bool) *goredis.Cmd {
			t := tos[k]
			if sha {
				t.cmd = takeoverScript.EvalSha(ctx, p, t.keys, t.c.old, t.value, t.lease)
			} else {
				t.cmd = takeoverScript.Eval(ctx, p, t.keys, t.c.old, t.value, t.lease)
			}
			return t.cmd
		})
		released = released[:0]
		for _, t := range tos {
			c := t.c
			v, err := t.cmd.Text()
			switch {
			case errors.Is(err, goredis.Nil):
				res[c.i] = dedup.ClaimResult{Outcome: dedup.Acquired, Claim: dedup.Claim{Key: reqs[c.i].Key, Token: string(t.value), Fence: t.fence}}
			case err != nil:
				errs[c.i] = fmt.Errorf("dedup/redis: claim: %w", err)
			case decide(c, []byte(v)):
				released = append(released, c)
			}
		}
	}
	return res, errs
}

// takeoverValue is the in-progress record a claim writes over the
// released record old, and its fence: old's provenance with one more
// claim, or (a record of an earlier version) the claim's own, and
// storekit.NextFence of old's fence (0 when old has none) by this
// process's clock. The takeover script writes it only over old exactly,
// so the fence is larger than the one it replaces whatever the clocks of
// the processes that wrote them: the clock only keeps fences near the
// time, for the claim that follows the record's deletion (see
// docs/redis.md, "Fencing").
func takeoverValue(old []byte, raw *[tokenLen]byte, fp []byte, origin dedup.Origin) ([]byte, uint64, error) {
	r, err := decodeRecord(old)
	if err != nil {
		return nil, 0, fmt.Errorf("dedup/redis: claim: %w", err)
	}
	now := time.Now()
	p, ok := decodeProvenance(r.prov)
	if ok {
		p.claims++
	} else {
		p = provenance{claimedAt: now.UnixMilli(), claims: 1, origin: origin}
	}
	fence := storekit.NextFence(r.fence, now)
	return appendInProgress(nil, raw, fp, &p, fence), fence, nil
}

// CompleteBatch implements [dedup.BatchStore.CompleteBatch]: as Complete
// runs it, the least completion script (completeAsClaimedSrc) of every
// record still as its claim wrote it, in one pipeline (one per master on a
// Cluster; per BatchRequestSize records), EVALSHA, then EVAL in a second
// pipeline for the records whose reply was NOSCRIPT (a server that lost
// its script cache); then the whole completion script, the same way, of
// the records that were not as claimed (lost, completed already) or whose
// token is the owner's 16 bytes alone. With Config.WaitReplicas the
// records are completed one by one, up to 16 at once.
func (s *Store) CompleteBatch(ctx context.Context, reqs []dedup.CompleteRequest) []error {
	errs := make([]error, len(reqs))
	if s.waitReplicas > 0 {
		storekit.Each(len(reqs), waitReplicasConcurrency, func(i int) {
			errs[i] = s.Complete(ctx, reqs[i].Claim, reqs[i].Result, reqs[i].Retention)
		})
		return errs
	}
	now := time.Now().UnixMilli()
	type asClaimed struct {
		i    int
		args []any // KEYS[1] then ARGV
		cmd  *goredis.Cmd
	}
	var quick []*asClaimed
	var whole []int // the records for the whole script
	built := make([][]byte, len(reqs))
	for i, r := range reqs {
		if err := storekit.CheckDuration("retention", r.Retention); err != nil {
			errs[i] = err
			continue
		}
		if _, _, err := rawToken("complete", r.Claim); err != nil {
			errs[i] = err
			continue
		}
		// The completed record built here from the in-progress record
		// the token is, as Complete builds it.
		v, ok := tokenRecord(r.Claim.Token)
		if ok {
			built[i], ok = appendCompleted(nil, v, now, s.omitProvenance != "")
		}
		if !ok {
			built[i] = nil
			whole = append(whole, i)
			continue
		}
		args := []any{s.prefix + r.Claim.Key, v, built[i], millis(r.Retention)}
		if len(r.Result) > 0 {
			args = append(args, r.Result)
		}
		quick = append(quick, &asClaimed{i: i, args: args})
	}
	script := completeAsClaimedOp.script
	s.scripted(ctx, script, len(quick), func(p goredis.Pipeliner, k int, sha bool) *goredis.Cmd {
		q := quick[k]
		if sha {
			q.cmd = script.EvalSha(ctx, p, []string{q.args[0].(string)}, q.args[1:]...)
		} else {
			q.cmd = script.Eval(ctx, p, []string{q.args[0].(string)}, q.args[1:]...)
		}
		return q.cmd
	})
	for _, q := range quick {
		switch reply, err := q.cmd.Int64(); {
		case err != nil:
			errs[q.i] = fmt.Errorf("dedup/redis: complete: %w", err)
		case reply == replyNotAsClaimed:
			whole = append(whole, q.i)
		case reply != replyOK:
			errs[q.i] = fmt.Errorf("dedup/redis: complete: unexpected script reply %d", reply)
		}
	}
	if len(whole) == 0 {
		return errs
	}
	sub := make([]error, len(whole))
	s.ownedBatch(ctx, "complete", completeOp, len(whole), sub, func(k int) (dedup.Claim, []any, error) {
		r := reqs[whole[k]]
		token, raw, _ := rawToken("complete", r.Claim) // checked above
		result := r.Result
		if result == nil {
			result = []byte{}
		}
		// ARGV[7] and ARGV[8], as Complete sends them.
		b, expected := []byte{}, ""
		if built[whole[k]] != nil {
			b, expected = built[whole[k]], r.Claim.Token
		}
		return r.Claim, []any{s.prefix + r.Claim.Key, token, appendCompact(nil, &raw), millis(r.Retention), result, now, s.omitProvenance, b, expected}, nil
	})
	for k, i := range whole {
		errs[i] = sub[k]
	}
	return errs
}

// ReleaseBatch implements [dedup.BatchStore.ReleaseBatch]: the release
// script of every record (as Release runs it) in one pipeline (one per
// master on a Cluster; per BatchRequestSize records), with CompleteBatch's
// NOSCRIPT fallback. It never waits for replicas.
func (s *Store) ReleaseBatch(ctx context.Context, claims []dedup.Claim) []error {
	errs := make([]error, len(claims))
	s.ownedBatch(ctx, "release", releaseOp, len(claims), errs, func(i int) (dedup.Claim, []any, error) {
		token, raw, err := rawToken("release", claims[i])
		if err != nil {
			return claims[i], nil, err
		}
		return claims[i], []any{s.prefix + claims[i].Key, token, appendCompact(nil, &raw)}, nil
	})
	return errs
}

// ownedBatch runs a token-checking script for n records in pipelines;
// argsOf returns record i's claim and its KEYS[1] and ARGV (or an error
// that is the record's answer). Each reply is mapped as run maps it.
func (s *Store) ownedBatch(ctx context.Context, op string, script *ownedScript, n int, errs []error, argsOf func(i int) (dedup.Claim, []any, error)) {
	type rec struct {
		i     int
		claim dedup.Claim
		args  []any // KEYS[1] then ARGV
		cmd   *goredis.Cmd
	}
	recs := make([]*rec, 0, n)
	for i := range n {
		claim, args, err := argsOf(i)
		if err != nil {
			errs[i] = err
			continue
		}
		recs = append(recs, &rec{i: i, claim: claim, args: args})
	}
	s.scripted(ctx, script.script, len(recs), func(p goredis.Pipeliner, k int, sha bool) *goredis.Cmd {
		r := recs[k]
		if sha {
			r.cmd = script.script.EvalSha(ctx, p, []string{r.args[0].(string)}, r.args[1:]...)
		} else {
			r.cmd = script.script.Eval(ctx, p, []string{r.args[0].(string)}, r.args[1:]...)
		}
		return r.cmd
	})
	for _, r := range recs {
		reply, err := r.cmd.Int64()
		if err == nil && reply == replyOK {
			continue
		}
		var raw [tokenLen]byte
		_, raw, _ = rawToken(op, r.claim)
		errs[r.i] = s.replyError(ctx, op, script, r.claim.Key, reply, err, &raw)
	}
}

// rawToken returns a claim's owner token as the scripts take it (16 raw
// bytes) and as an array, or the error of a token this store did not
// issue. Claim.Token is the in-progress record the claim wrote (tokenRecord),
// or the owner token alone: 16 raw bytes, or their hex form.
func rawToken(op string, claim dedup.Claim) (token string, raw [tokenLen]byte, err error) {
	token = claim.Token
	switch len(token) {
	case tokenLen:
		copy(raw[:], token)
		return token, raw, nil
	case 2 * tokenLen: // the hex form of earlier versions and of storekit.NewToken
		if token, ok := decodeHexToken(token, &raw); ok {
			return token, raw, nil
		}
	}
	if v, ok := tokenRecord(token); ok {
		token = v[tokenOffset : tokenOffset+tokenLen]
		copy(raw[:], token)
		return token, raw, nil
	}
	return "", raw, lost(op, claim.Key, ErrNotOwner, "the token was not issued by this store")
}

// tokenRecord returns the in-progress record a claim's token is, if it is
// one (see Claim.Token): version 2, in progress, its length that of its
// fields. (A token of 16 raw bytes or of their 32 hex digits is not: its
// first byte would have to be 2 and its 19th its length less 19.)
func tokenRecord(token string) (string, bool) {
	if len(token) < headerLen || token[0] != formatV2 || token[1] != stateInProgress || len(token) != headerLen+int(token[fieldsOffsetP]) {
		return "", false
	}
	return token, true
}

// pipelined queues n commands (add queues the k-th) in pipelines of at
// most BatchRequestSize commands, each sent in one round trip (one per
// master on a Cluster). A command's own error (or the pipeline's, for the
// commands it did not answer) is on the command.
func (s *Store) pipelined(ctx context.Context, n int, add func(p goredis.Pipeliner, k int)) {
	for start := 0; start < n; start += BatchRequestSize {
		p := s.client.Pipeline()
		for k := start; k < min(n, start+BatchRequestSize); k++ {
			add(p, k)
		}
		_, _ = p.Exec(ctx)
	}
}

// scripted runs n script commands (add queues the k-th, with EVALSHA when
// sha, else EVAL) in pipelines, then those whose reply was NOSCRIPT again
// with EVAL, as goredis.Script.Run does for one.
func (s *Store) scripted(ctx context.Context, script *goredis.Script, n int, add func(p goredis.Pipeliner, k int, sha bool) *goredis.Cmd) {
	cmds := make([]*goredis.Cmd, n)
	s.pipelined(ctx, n, func(p goredis.Pipeliner, k int) { cmds[k] = add(p, k, true) })
	var again []int
	for k, c := range cmds {
		if err := c.Err(); err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
			again = append(again, k)
		}
	}
	s.pipelined(ctx, len(again), func(p goredis.Pipeliner, k int) { add(p, again[k], false) })
}
