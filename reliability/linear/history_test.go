package linear

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
)

// target is the store under test and its optional capabilities.
type target struct {
	store dedup.Store
	batch dedup.BatchStore // nil: the store has no batch capability
	admin admin.Interface  // nil: the store has no admin view
	// retries: the store's client library resends a request whose reply
	// was lost (go-redis, the AWS SDK; see client.ghost).
	retries bool
}

func newTarget(s dedup.Store) target {
	tg := target{store: s}
	tg.batch, _ = s.(dedup.BatchStore)
	tg.admin, _ = s.(admin.Interface)
	return tg
}

// recorder collects the operations of every client, timed on one
// monotonic clock.
type recorder struct {
	start   time.Time
	mu      sync.Mutex
	ops     []porcupine.Operation
	clients atomic.Int64 // client ids handed out
	ghosts  atomic.Int64 // see client.ghost
	batches atomic.Int64 // batch ids handed out
}

func newRecorder() *recorder { return &recorder{start: time.Now()} }

func (r *recorder) now() int64 { return int64(time.Since(r.start)) }

func (r *recorder) history() []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]porcupine.Operation(nil), r.ops...)
}

// client issues operations one after the other and records them. After an
// operation whose reply was lost it takes a new id: the lost operation may
// still be running (porcupine's lanes are per client).
type client struct {
	rec     *recorder
	tg      target
	id      int
	timeout time.Duration
	pending int
	lastErr error // of the last claim
}

func (r *recorder) newClient(tg target, timeout time.Duration) *client {
	return &client{rec: r, tg: tg, id: int(r.clients.Add(1) - 1), timeout: timeout}
}

// add records one operation; an unknown one returns at never.
func (c *client) add(in input, o stepOut, unknown bool) {
	if unknown {
		in.Return = never
		o = stepOut{}
	}
	c.rec.mu.Lock()
	c.rec.ops = append(c.rec.ops, porcupine.Operation{ClientId: c.id, Input: in, Call: in.Call, Output: output{Unknown: unknown, Out: o}, Return: in.Return})
	c.rec.mu.Unlock()
}

// ghost records, beside a claim that the client library may have sent
// more than once, an attempt with no known answer in the same interval,
// when the call lasted longer than the lease: an earlier attempt may have
// acquired the record, its reply lost, and its lease ended before the
// attempt that answered (which then found another claim's record, and
// could not know the first was its own). A shorter call's resent attempt
// finds its own live record and says Acquired.
func (c *client) ghost(in input) {
	if !c.tg.retries || in.Return-in.Call < int64(in.Step.Lease)-slack {
		return
	}
	in.Ghost = true
	c.rec.mu.Lock()
	c.rec.ops = append(c.rec.ops, porcupine.Operation{ClientId: c.id, Input: in, Call: in.Call, Output: output{Unknown: true}, Return: in.Return})
	c.rec.mu.Unlock()
	c.rec.ghosts.Add(1)
}

// lost counts an operation whose reply was lost and moves to a new id.
func (c *client) lost() {
	c.pending++
	c.id = int(c.rec.clients.Add(1) - 1)
}

// errOf classifies the error of a Complete, Release or Extend: known
// answers (nil, ErrClaimLost, ErrAlreadyCompleted), or unknown: every
// other error means the store could not answer, and the operation may
// have taken effect (dedup.Store's contract).
func errOf(err error) (errKind, bool) {
	switch {
	case err == nil:
		return errNone, true
	case errors.Is(err, dedup.ErrAlreadyCompleted):
		return errAlreadyCompleted, true
	case errors.Is(err, dedup.ErrClaimLost):
		return errClaimLost, true
	}
	return 0, false
}

func (c *client) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), c.timeout)
}

func (c *client) claim(key, fp string, lease time.Duration) (dedup.ClaimResult, bool) {
	ctx, cancel := c.ctx()
	defer cancel()
	call := c.rec.now()
	res, err := c.tg.store.Claim(ctx, key, fp, lease)
	ret := c.rec.now()
	c.lastErr = err
	known := err == nil
	o := stepOut{Outcome: res.Outcome, Token: res.Claim.Token, Fence: res.Claim.Fence, Result: string(res.Result)}
	in := input{Key: key, Step: step{Kind: opClaim, Fingerprint: fp, Lease: lease}, Call: call, Return: ret}
	c.add(in, o, !known)
	if known {
		c.ghost(in)
	} else {
		c.lost()
	}
	return res, known
}

// finish runs Complete, Release or Extend of claim and records it.
func (c *client) finish(s step, claim dedup.Claim) (errKind, bool) {
	ctx, cancel := c.ctx()
	defer cancel()
	s.Token = claim.Token
	call := c.rec.now()
	var err error
	switch s.Kind {
	case opComplete:
		err = c.tg.store.Complete(ctx, claim, []byte(s.Result), s.Retention)
	case opRelease:
		err = c.tg.store.Release(ctx, claim)
	case opExtend:
		err = c.tg.store.Extend(ctx, claim, s.Lease)
	}
	ret := c.rec.now()
	e, known := errOf(err)
	c.add(input{Key: claim.Key, Step: s, Call: call, Return: ret}, stepOut{Err: e}, !known)
	if !known {
		c.lost()
	}
	return e, known
}

// inspect reads the record with admin's Inspect. A read whose reply was
// lost changes nothing and is left out of the history.
func (c *client) inspect(key string) {
	ctx, cancel := c.ctx()
	defer cancel()
	call := c.rec.now()
	rec, err := c.tg.admin.Inspect(ctx, key)
	ret := c.rec.now()
	var state string
	switch {
	case err == nil:
		state = rec.State
	case errors.Is(err, admin.ErrNotFound):
	default:
		return
	}
	c.add(input{Key: key, Step: step{Kind: opInspect}, Call: call, Return: ret}, stepOut{State: state}, false)
}

// addBatch records a batch: one operation per record, with the batch's
// interval. The records of one key take effect in request order, up to
// the first whose answer was lost; that record and the ones after it of
// its key are pending, in no order.
func (c *client) addBatch(name string, keys []string, steps []step, outs []stepOut, known []bool, call, ret int64) {
	id := c.rec.batches.Add(1)
	idx := map[string][]int{}
	var order []string
	for i, k := range keys {
		if _, ok := idx[k]; !ok {
			order = append(order, k)
		}
		idx[k] = append(idx[k], i)
	}
	anyLost := false
	for _, k := range order {
		ordered := 0 // records of k before the first lost one
		for _, i := range idx[k] {
			if !known[i] {
				break
			}
			ordered++
		}
		for n, i := range idx[k] {
			in := input{Key: k, Step: steps[i], Batch: name, BatchID: id, Call: call, Return: ret}
			if n < ordered {
				in.Seq, in.Of = n, ordered
				c.add(in, outs[i], false)
				if steps[i].Kind == opClaim {
					c.ghost(in)
				}
				continue
			}
			anyLost = true
			c.add(in, stepOut{}, true)
		}
	}
	if anyLost {
		c.lost()
	}
}

func (c *client) claimBatch(keys []string, fps []string, lease time.Duration) ([]dedup.ClaimResult, []bool) {
	reqs := make([]dedup.ClaimRequest, len(keys))
	steps := make([]step, len(keys))
	for i, k := range keys {
		reqs[i] = dedup.ClaimRequest{Key: k, Fingerprint: fps[i], Lease: lease}
		steps[i] = step{Kind: opClaim, Fingerprint: fps[i], Lease: lease}
	}
	ctx, cancel := c.ctx()
	defer cancel()
	call := c.rec.now()
	res, errs := c.tg.batch.ClaimBatch(ctx, reqs)
	ret := c.rec.now()
	outs := make([]stepOut, len(keys))
	known := make([]bool, len(keys))
	for i := range keys {
		known[i] = errs[i] == nil
		outs[i] = stepOut{Outcome: res[i].Outcome, Token: res[i].Claim.Token, Fence: res[i].Claim.Fence, Result: string(res[i].Result)}
	}
	c.addBatch("claim_batch", keys, steps, outs, known, call, ret)
	return res, known
}

// finishBatch runs CompleteBatch (kind opComplete) or ReleaseBatch.
func (c *client) finishBatch(k kind, claims []dedup.Claim, results []string, retention time.Duration) ([]errKind, []bool) {
	keys := make([]string, len(claims))
	steps := make([]step, len(claims))
	for i, cl := range claims {
		keys[i] = cl.Key
		steps[i] = step{Kind: k, Token: cl.Token}
		if k == opComplete {
			steps[i].Result, steps[i].Retention = results[i], retention
		}
	}
	ctx, cancel := c.ctx()
	defer cancel()
	call := c.rec.now()
	var errs []error
	name := "release_batch"
	if k == opComplete {
		name = "complete_batch"
		reqs := make([]dedup.CompleteRequest, len(claims))
		for i, cl := range claims {
			reqs[i] = dedup.CompleteRequest{Claim: cl, Result: []byte(results[i]), Retention: retention}
		}
		errs = c.tg.batch.CompleteBatch(ctx, reqs)
	} else {
		errs = c.tg.batch.ReleaseBatch(ctx, claims)
	}
	ret := c.rec.now()
	outs := make([]stepOut, len(claims))
	known := make([]bool, len(claims))
	kinds := make([]errKind, len(claims))
	for i := range claims {
		kinds[i], known[i] = errOf(errs[i])
		outs[i] = stepOut{Err: kinds[i]}
	}
	c.addBatch(name, keys, steps, outs, known, call, ret)
	return kinds, known
}

// workload is what the random clients do.
type workload struct {
	// Clients run at once for Duration, each issuing up to MaxOps
	// operations, a random pause of up to 2×Pace apart.
	Clients  int
	Duration time.Duration
	MaxOps   int
	Pace     time.Duration
	// Hot keys: at any moment the clients use HotKeys keys; every
	// KeyPeriod one key retires and a new one comes in, so that each
	// key's history stays short (porcupine checks each key alone) and
	// completed records do not end the key's story.
	HotKeys   int
	KeyPeriod time.Duration
	KeyPrefix string
	// Lease of claims and extensions; Retention of most completions,
	// ShortRetention of half of them (so that completed records expire
	// within the history).
	Lease, Retention, ShortRetention time.Duration
	// Abandon is the chance that a client forgets a claim it holds, whose
	// lease then runs out (a crashed consumer).
	Abandon float64
	// Stale is the share of operations that act for a claim the client
	// no longer holds (released, completed, taken over): a non-owner.
	Stale float64
	// OpTimeout bounds each call.
	OpTimeout time.Duration
}

// defaultWorkload suits every store; LINEAR_LONG=1 runs five times longer.
func defaultWorkload(prefix string) workload {
	w := workload{
		Clients: 6, Duration: 6 * time.Second, MaxOps: 1500, Pace: 6 * time.Millisecond,
		HotKeys: 4, KeyPeriod: 40 * time.Millisecond, KeyPrefix: prefix,
		Lease: 500 * time.Millisecond, Retention: time.Minute, ShortRetention: 300 * time.Millisecond,
		Abandon: 0.05, Stale: 0.06, OpTimeout: 3 * time.Second,
	}
	if long() {
		w.Duration *= 5
		w.MaxOps *= 5
	}
	return w
}

// long reports whether LINEAR_LONG is set: every history runs about five
// times longer (more fault rounds).
func long() bool { return os.Getenv("LINEAR_LONG") != "" }

// rounds is how many rounds of faults a scenario injects: n, five times
// more with LINEAR_LONG.
func rounds(n int) int {
	if long() {
		return 5 * n
	}
	return n
}

// keyAt is the scoped key of hot key number n.
func (w workload) keyAt(n int64) string { return fmt.Sprintf("%s%04d", w.KeyPrefix, n) }

// run runs the clients until Duration passes, MaxOps each are done or
// stop is closed, and returns how many operations they issued.
func (w workload) run(rec *recorder, tg target, stop <-chan struct{}, seed uint64) int64 {
	var wg sync.WaitGroup
	var total atomic.Int64
	deadline := time.Now().Add(w.Duration)
	for i := 0; i < w.Clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			c := rec.newClient(tg, w.OpTimeout)
			n := w.client(c, rng, deadline, stop)
			total.Add(int64(n))
		}(i)
	}
	wg.Wait()
	return total.Load()
}

func (w workload) fingerprint(rng *rand.Rand) string {
	switch x := rng.IntN(100); {
	case x < 85:
		return "fp-a"
	case x < 93:
		return ""
	default:
		return "fp-b"
	}
}

func (w workload) retention(rng *rand.Rand) time.Duration {
	if rng.IntN(2) == 0 {
		return w.ShortRetention
	}
	return w.Retention
}

// client is one client's loop.
func (w workload) client(c *client, rng *rand.Rand, deadline time.Time, stop <-chan struct{}) int {
	held := map[string]dedup.Claim{} // claims this client believes it holds
	var stale []dedup.Claim          // claims it no longer holds: their owner is gone
	forget := func(cl dedup.Claim) {
		delete(held, cl.Key)
		stale = append(stale, cl)
		if len(stale) > 8 {
			stale = stale[1:]
		}
	}
	hold := func(cl dedup.Claim) {
		if old, ok := held[cl.Key]; ok {
			forget(old)
		}
		held[cl.Key] = cl
	}
	pick := func() dedup.Claim {
		n := rng.IntN(len(held))
		for _, cl := range held {
			if n == 0 {
				return cl
			}
			n--
		}
		panic("unreachable")
	}
	hot := func() string {
		epoch := int64(time.Since(c.rec.start) / w.KeyPeriod)
		switch rng.IntN(20) {
		case 0: // any key so far: a record lost long ago shows
			return w.keyAt(rng.Int64N(epoch + 1))
		case 1, 2, 3, 4: // one of the last few keys: their leases and retentions end
			return w.keyAt(max(0, epoch-int64(rng.IntN(30))))
		}
		return w.keyAt(epoch + int64(rng.IntN(w.HotKeys)))
	}
	seq := 0
	result := func() string { seq++; return fmt.Sprintf("r%d-%d", c.id, seq) }
	n := 0
	for ; n < w.MaxOps && time.Now().Before(deadline); n++ {
		select {
		case <-stop:
			return n
		default:
		}
		pendingBefore := c.pending
		time.Sleep(time.Duration(rng.Int64N(int64(2*w.Pace) + 1)))
		x := rng.Float64()
		if len(held) > 0 && x < 0.35 {
			x = -1 // an operation on a held claim
		} else {
			x = rng.Float64()
		}
		switch {
		case x < 0:
			cl := pick()
			switch y := rng.Float64(); {
			case y < w.Abandon:
				forget(cl)
			case y < 0.50:
				c.finish(step{Kind: opComplete, Result: result(), Retention: w.retention(rng)}, cl)
				forget(cl)
			case y < 0.75:
				c.finish(step{Kind: opRelease}, cl)
				forget(cl)
			default:
				if e, known := c.finish(step{Kind: opExtend, Lease: w.Lease}, cl); !known || e != errNone {
					forget(cl)
				}
			}
		case x < w.Stale && len(stale) > 0:
			cl := stale[rng.IntN(len(stale))]
			switch rng.IntN(3) {
			case 0:
				c.finish(step{Kind: opComplete, Result: result(), Retention: w.retention(rng)}, cl)
			case 1:
				c.finish(step{Kind: opRelease}, cl)
			default:
				c.finish(step{Kind: opExtend, Lease: w.Lease}, cl)
			}
		case x < w.Stale+0.08 && c.tg.admin != nil:
			c.inspect(hot())
		case x < w.Stale+0.20 && c.tg.batch != nil:
			if len(held) > 0 && rng.IntN(2) == 0 {
				var claims []dedup.Claim
				var results []string
				for _, cl := range held {
					if len(claims) == 0 || rng.IntN(2) == 0 {
						claims = append(claims, cl)
						results = append(results, result())
					}
				}
				k := opRelease
				if rng.IntN(2) == 0 {
					k = opComplete
				}
				c.finishBatch(k, claims, results, w.retention(rng))
				for _, cl := range claims {
					forget(cl)
				}
				break
			}
			m := 1 + rng.IntN(3)
			keys, fps := make([]string, m), make([]string, m)
			for i := range keys {
				keys[i], fps[i] = hot(), w.fingerprint(rng)
			}
			res, known := c.claimBatch(keys, fps, w.Lease)
			for i := range res {
				if known[i] && res[i].Outcome == dedup.Acquired {
					hold(res[i].Claim)
				}
			}
		default:
			if res, known := c.claim(hot(), w.fingerprint(rng), w.Lease); known && res.Outcome == dedup.Acquired {
				hold(res.Claim)
			}
		}
		if c.pending > pendingBefore {
			// Back off after a lost reply: a store that is down would
			// otherwise fill the history with pending operations, each
			// of which the checker must place.
			time.Sleep(50*time.Millisecond + time.Duration(rng.Int64N(int64(50*time.Millisecond))))
		}
	}
	return n
}

// completeFresh claims a key of its own and completes it (retention a
// minute), trying key, key+"-1", ... until one claim and completion both
// answered (a busy machine may time a call out); it returns the key
// completed.
func (c *client) completeFresh(key string) (string, error) {
	var last error
	for i := 0; i < 5; i++ {
		k := key
		if i > 0 {
			k = fmt.Sprintf("%s-%d", key, i)
		}
		res, err := c.claimUntilAnswered(k, time.Minute, 10*time.Second)
		switch {
		case err != nil:
			last = err
			continue
		case res.Outcome != dedup.Acquired:
			last = fmt.Errorf("the witness's first claim of %s found %v", k, res.Outcome)
			continue
		}
		if e, known := c.finish(step{Kind: opComplete, Result: "witness", Retention: time.Minute}, res.Claim); !known || e != errNone {
			last = fmt.Errorf("the witness's Complete of %s: answered %v, %v", k, known, e)
			continue
		}
		return k, nil
	}
	return "", last
}

// claimUntilAnswered claims key (fingerprint "fp-a"), for a witness that
// must show whether a record survived a fault: it retries a claim whose
// reply was lost (each attempt is in the history) until one answers or
// limit passes.
func (c *client) claimUntilAnswered(key string, lease time.Duration, limit time.Duration) (dedup.ClaimResult, error) {
	end := time.Now().Add(limit)
	for {
		res, known := c.claim(key, "fp-a", lease)
		if known {
			return res, nil
		}
		if time.Now().After(end) {
			return res, fmt.Errorf("%s: %w", key, c.lastErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
