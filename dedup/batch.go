package dedup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/internal/fanout"
	"github.com/watermill-dedup/watermill-dedup/internal/originctx"
	"github.com/watermill-dedup/watermill-dedup/internal/scopedkey"
)

// BatchCall is one call of a [Batch]: a [Call], and the group whose order
// it keeps.
type BatchCall struct {
	Call
	// Group orders calls: the calls of one non-empty Group take their
	// turn one after the other, in batch order, and once one of them
	// fails (see Batch.Stops) the group's later calls do not start: they
	// end with ErrNotStarted, and their claims are released with the
	// batch's other releases. A FIFO queue's message group, a stream's
	// shard. Calls without a Group are independent.
	Group string
	// Err, when not nil, is the call's end: it is not claimed, ends with
	// Err at its turn (stopping its group as any failure does) and is not
	// decided by the engine. For an entry point that could not build the
	// call (a record that is not a message): it keeps its place in its
	// group's order. When Call.KeyErr is set too, Err wins.
	Err error
}

// Batch is what Engine.DoBatch runs.
type Batch struct {
	// Calls are the batch's calls, each decided as Engine.Do decides its
	// call.
	Calls []BatchCall
	// Concurrency is how many calls (or groups, whose calls take their
	// turn one by one) take their turn at once. Defaults to 1: one call
	// after the other, in batch order.
	Concurrency int
	// Stops reports whether call i, which ended with res and err, stops
	// the later calls of its group. It is called once for each call that
	// took its turn (never for one that did not start because of an
	// earlier call), from the goroutine of that turn. Defaults to
	// err != nil.
	Stops func(i int, res ClaimResult, err error) bool
}

// batchFallbackConcurrency is how many single-record requests the engine
// sends at once for a batch when the store has no batch capability.
const batchFallbackConcurrency = 16

// DoBatch runs fn(ctx, i) at most once for each call i of the batch, across
// every process sharing the store, as Engine.Do runs its function, and
// returns one ClaimResult and one error per call, in order (the shape of
// BatchStore.ClaimBatch): what Do would have returned for the call (fn's
// result and error for a call that ran). fn's
// context carries the claim of call i and ends as Do's work context ends.
//
// The claims of every call go to the store together before any call runs
// (a [BatchStore] takes them in one request where its server allows;
// other stores are called once per record, concurrently). Then each call
// takes its turn (see Batch.Concurrency and BatchCall.Group): a call that
// won its claim runs fn; the others are decided as Do decides them
// (Duplicate with its result, ErrInProgress, ErrKeyReuse, a *StoreError;
// Config.InProgressWait, Shadow and FailOpen apply). Once every call has
// had its turn, the records of the calls that succeeded are completed
// together (store errors retried as Do retries them), and the claims of
// the calls that failed or did not start are released together.
//
// A key that appears more than once in the batch (same scope) is claimed
// once, by its first call; a later copy does not run fn: it is a
// Duplicate with the first call's result once that call has succeeded,
// ErrKeyReuse when both carry fingerprints that differ, ErrInProgress when
// the first call failed. A copy whose turn comes while its first call runs
// (another group's) claims on its own, as Do would, and finds the key in
// progress (with Config.InProgressWait it waits for the first call's end,
// and is its Duplicate when it succeeded). A copy whose first call met a
// record of another owner under another fingerprint (or a store error) is
// claimed on its own too. Unusable keys and
// scopes are refused as Do refuses them, before anything is claimed; a
// call without a Scope takes Config.Scope, as in Do. A call with
// Call.KeyErr is decided as Do decides it, at its turn.
//
// A call's StartBy (Call.StartBy) bounds its InProgressWait, and is
// checked again at its turn: a claim won with the batch whose turn comes
// at or after StartBy is released unworked with the batch's releases, the
// call ending with ErrNotStarted.
//
// Leases: each won claim's lease runs from the batch's claim, and is kept
// by its own heartbeat until its completion or release, as Do keeps its
// lease, while earlier calls run. A call whose Deadline is set (a Lambda
// invocation's) has a lease that ends there, which no heartbeat extends:
// claims made up front for a batch that must end by then cost no
// extension. Without a Deadline, set Config.Lease to cover the wait of the
// batch's last call, or its heartbeats extend every claim waiting for its
// turn (one Extend per claim per Config.Heartbeat).
//
// A panic of fn releases the call's claim and stops the batch: the calls
// left do not start (ErrNotStarted), the batch's completions and releases
// are sent, and the panic goes on from DoBatch.
//
// Every call is decided and observed as Do's: its log events, and with
// Config.Tracer a trace of its own (Tracer.StartCall for each call before
// the claims, EndCall when the batch returns); Observer.ObserveStoreOp
// gets each record's claim, completion and release with the round trip of
// the batch request that carried it. The batch's claim request takes one
// admission of Config.MaxClaimsInFlight.
//
// Cost with a BatchStore: one claim request for the batch (plus a second
// for records that take over released ones, depending on the store), one
// completion request, one release request when a call failed or did not
// start; plus one Extend per heartbeat per claim held without a Deadline.
func (e *Engine) DoBatch(ctx context.Context, b Batch, fn func(ctx context.Context, i int) ([]byte, error)) ([]ClaimResult, []error) {
	r := &batchRun{e: e, ctx: ctx, b: b, fn: fn, slots: make([]batchSlot, len(b.Calls))}
	results, errs := make([]ClaimResult, len(b.Calls)), make([]error, len(b.Calls))
	if len(b.Calls) == 0 {
		return results, errs
	}
	defer r.cleanup()
	r.prepare()
	r.claim()
	r.turns(results, errs)
	r.finish()
	for i := range r.slots {
		s := &r.slots[i]
		if s.trace != nil {
			s.traceEnded = true
			s.trace.EndCall(results[i], errs[i])
		}
	}
	if r.panicked {
		panic(r.panicValue)
	}
	return results, errs
}

// batchRun is one DoBatch.
type batchRun struct {
	e     *Engine
	ctx   context.Context
	b     Batch
	fn    func(ctx context.Context, i int) ([]byte, error)
	slots []batchSlot

	mu         sync.Mutex
	completes  []*batchSlot // work done: complete with slot.result
	releases   []*batchSlot // work failed or not started: release with slot.cause
	panicked   bool
	panicValue any
}

// batchSlot is one call of the batch.
type batchSlot struct {
	r     *batchRun
	i     int
	f     *flight
	ctx   context.Context // the caller's, with the call's trace
	trace CallTrace

	preset error // decided before any claim (ErrNoScope, a passed deadline)
	keyErr error // an unusable key: decided at its turn (keyMissing)
	first  int   // the index of the first call of the same scoped key, or -1

	sent    bool // claimed with the batch
	res     ClaimResult
	err     error
	elapsed time.Duration
	won     bool // holds a claim (set before its turn, or during it under mu)

	// Under batchRun.mu, for its copies: the call's end, and a channel
	// closed then.
	done, ok bool
	out      []byte
	ended    chan struct{}

	result     []byte // to complete with
	cause      error  // to release with
	traceEnded bool
}

// prepare checks every call and makes its flight, as Do does before its
// claim.
func (r *batchRun) prepare() {
	e := r.e
	firsts := make(map[string]int, len(r.slots))
	for i := range r.slots {
		s := &r.slots[i]
		s.r, s.i, s.first, s.ctx = r, i, -1, r.ctx
		s.ended = make(chan struct{})
		call := r.b.Calls[i].Call
		if call.Scope == "" {
			call.Scope = e.cfg.Scope // as Do takes it
		}
		call.trace = nil
		if e.cfg.Tracer != nil {
			ctx, trace := e.cfg.Tracer.StartCall(r.ctx, call)
			if trace == nil {
				trace = noTrace{}
			} else {
				ctx = context.WithValue(ctx, traceKey{}, trace)
			}
			call.trace, s.ctx, s.trace = trace, ctx, trace
		}
		s.f = &flight{e: e, call: call}
		if err := r.b.Calls[i].Err; err != nil {
			s.preset = err
			continue
		}
		if call.Scope == "" {
			s.preset = ErrNoScope
			continue
		}
		if call.KeyErr != nil { // as Do
			s.f.nameUnkeyed()
			s.keyErr = call.KeyErr
			continue
		}
		if err := e.checkKey(call.Key, call.MessageUUID); err != nil {
			s.keyErr = err
			continue
		}
		key := scopedkey.Of(call.Scope, call.Key)
		s.f.hc.Key = key
		if first, ok := firsts[key]; ok {
			s.first = first
			continue
		}
		firsts[key] = i
		if _, err := e.callLease(&s.f.call); err != nil {
			s.preset = err
			continue
		}
		s.sent = true
		s.f.newWorkContext(s.ctx)
	}
}

// claim sends the claims of every call that needs one, once admitted
// (one admission for the batch: see Engine.claims), and starts keeping
// each won claim.
func (r *batchRun) claim() {
	e := r.e
	var sent []*batchSlot
	for i := range r.slots {
		if r.slots[i].sent {
			sent = append(sent, &r.slots[i])
		}
	}
	if len(sent) == 0 {
		return
	}
	select {
	case e.claims <- struct{}{}:
	case <-r.ctx.Done():
		for _, s := range sent {
			s.err = context.Cause(r.ctx)
		}
		return
	}
	defer func() { <-e.claims }()
	now := e.cfg.Clock.Now()
	reqs := make([]ClaimRequest, 0, len(sent))
	slots := sent[:0:0]
	for _, s := range sent {
		lease, err := e.callLease(&s.f.call) // the wait for admission took some of the time left
		if err != nil {
			s.sent, s.preset = false, err
			continue
		}
		s.f.keeper.lease, s.f.keeper.claimedAt = lease, now
		o, _ := OriginFromContext(s.f.work) // the call's, else the context's
		reqs = append(reqs, ClaimRequest{Key: s.f.hc.Key, Fingerprint: s.f.call.Fingerprint, Lease: lease, Origin: o})
		slots = append(slots, s)
	}
	if len(reqs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(r.ctx, e.cfg.StoreTimeout)
	start := time.Now()
	res, errs := e.claimMany(ctx, reqs)
	elapsed := time.Since(start)
	cancel()
	for k, s := range slots {
		s.res, s.err, s.elapsed = res[k], errs[k], elapsed
		if s.err == nil && s.res.Outcome == InProgress && e.cfg.InProgressWait > 0 {
			s.f.claimSentAt(start) // for the wait of its turn
		}
		if s.err == nil && (s.res.Outcome < Acquired || s.res.Outcome > Conflict) {
			s.err = fmt.Errorf("unknown outcome %v", s.res.Outcome)
		}
		e.observeOp(s.ctx, "claim", elapsed, s.err)
		if s.err == nil && s.res.Outcome == Acquired {
			s.won = true
			s.f.hold(s.res.Claim)
		}
	}
}

// claimMany is BatchStore.ClaimBatch, or one Store.Claim per record.
func (e *Engine) claimMany(ctx context.Context, reqs []ClaimRequest) ([]ClaimResult, []error) {
	if bs, ok := e.cfg.Store.(BatchStore); ok {
		res, errs := bs.ClaimBatch(ctx, reqs)
		if len(res) == len(reqs) && len(errs) == len(reqs) {
			return res, errs
		}
		return make([]ClaimResult, len(reqs)), fill(len(reqs), fmt.Errorf("%T.ClaimBatch answered %d results and %d errors for %d records", bs, len(res), len(errs), len(reqs)))
	}
	res, errs := make([]ClaimResult, len(reqs)), make([]error, len(reqs))
	fanout.Each(len(reqs), batchFallbackConcurrency, func(i int) {
		rq := reqs[i]
		res[i], errs[i] = e.cfg.Store.Claim(originctx.With(ctx, rq.Origin.TransportID, rq.Origin.MessageID), rq.Key, rq.Fingerprint, rq.Lease)
	})
	return res, errs
}

// completeMany is BatchStore.CompleteBatch, or one Store.Complete per
// record.
func (e *Engine) completeMany(ctx context.Context, reqs []CompleteRequest) []error {
	if bs, ok := e.cfg.Store.(BatchStore); ok {
		if errs := bs.CompleteBatch(ctx, reqs); len(errs) == len(reqs) {
			return errs
		}
		return fill(len(reqs), fmt.Errorf("%T.CompleteBatch answered a wrong number of errors for %d records", bs, len(reqs)))
	}
	errs := make([]error, len(reqs))
	fanout.Each(len(reqs), batchFallbackConcurrency, func(i int) {
		errs[i] = e.cfg.Store.Complete(ctx, reqs[i].Claim, reqs[i].Result, reqs[i].Retention)
	})
	return errs
}

// releaseMany is BatchStore.ReleaseBatch, or one Store.Release per record.
func (e *Engine) releaseMany(ctx context.Context, claims []Claim) []error {
	if bs, ok := e.cfg.Store.(BatchStore); ok {
		if errs := bs.ReleaseBatch(ctx, claims); len(errs) == len(claims) {
			return errs
		}
		return fill(len(claims), fmt.Errorf("%T.ReleaseBatch answered a wrong number of errors for %d records", bs, len(claims)))
	}
	errs := make([]error, len(claims))
	fanout.Each(len(claims), batchFallbackConcurrency, func(i int) {
		errs[i] = e.cfg.Store.Release(ctx, claims[i])
	})
	return errs
}

func fill(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// turns gives every call its turn: the calls of a group one after the
// other, up to Batch.Concurrency groups (or lone calls) at once.
func (r *batchRun) turns(results []ClaimResult, errs []error) {
	var units [][]int
	group := map[string]int{}
	for i, c := range r.b.Calls {
		if c.Group == "" {
			units = append(units, []int{i})
			continue
		}
		if u, ok := group[c.Group]; ok {
			units[u] = append(units[u], i)
			continue
		}
		group[c.Group] = len(units)
		units = append(units, []int{i})
	}
	fanout.Each(len(units), r.b.Concurrency, func(u int) {
		stopped := false
		for _, i := range units[u] {
			s := &r.slots[i]
			r.mu.Lock()
			halt := r.panicked
			r.mu.Unlock()
			if stopped || halt {
				errs[i] = r.notStarted(s, halt)
				continue
			}
			res, err := r.turn(s)
			results[i], errs[i] = res, err
			r.end(s, err == nil && res.Outcome == Acquired, res.Result)
			if r.b.Stops != nil {
				stopped = r.b.Stops(i, res, err)
			} else {
				stopped = err != nil
			}
		}
	})
}

// notStarted ends a call that does not take its turn (after a failure of
// its group, or after another call's panic), releasing its claim.
func (r *batchRun) notStarted(s *batchSlot, panicked bool) error {
	err := fmt.Errorf("%w: an earlier call of its group %q failed", ErrNotStarted, r.b.Calls[s.i].Group)
	if panicked {
		err = fmt.Errorf("%w: the work of another call of the batch panicked", ErrNotStarted)
	}
	if s.won {
		s.f.claimEvent(event.ClaimWon, s.res, s.elapsed, 0)
		s.release(err)
	}
	r.end(s, false, nil)
	return err
}

// end records the end of a call's turn, for its copies.
func (r *batchRun) end(s *batchSlot, ok bool, out []byte) {
	r.mu.Lock()
	s.done, s.ok, s.out = true, ok, out
	r.mu.Unlock()
	close(s.ended)
}

// turn decides one call, as Do decides it after its claim, and runs its
// work when its claim was won.
func (r *batchRun) turn(s *batchSlot) (ClaimResult, error) {
	e, f, ctx, w := r.e, s.f, s.ctx, batchWorker{r: r, i: s.i}
	switch {
	case s.preset != nil:
		return ClaimResult{}, s.preset
	case s.keyErr != nil:
		return f.keyMissing(ctx, s.keyErr, w)
	case s.first >= 0:
		return r.copyTurn(s, w)
	case s.err != nil:
		return f.claimFailed(ctx, w, s.elapsed, 0, s.err)
	}
	res, elapsed, waited := s.res, s.elapsed, time.Duration(0)
	if res.Outcome == InProgress && e.cfg.InProgressWait > 0 && !e.cfg.Shadow {
		var err error
		res, elapsed, waited, err = f.awaitHolder(ctx, elapsed)
		if err == nil && (res.Outcome < Acquired || res.Outcome > Conflict) {
			err = fmt.Errorf("unknown outcome %v", res.Outcome)
		}
		if err != nil {
			if errors.Is(err, errCallDeadline) {
				return ClaimResult{}, err
			}
			return f.claimFailed(ctx, w, elapsed, waited, err)
		}
		if res.Outcome == Acquired {
			f.hold(res.Claim)
			r.mu.Lock()
			s.won = true
			r.mu.Unlock()
		}
	}
	switch res.Outcome {
	case Acquired:
		f.claimEvent(event.ClaimWon, res, elapsed, waited)
		if f.work.Err() != nil {
			// The caller's context ended, or the lease did (the keeper
			// reported it), before the call's turn: not started.
			err := fmt.Errorf("dedup: not started: %w", context.Cause(f.work))
			s.release(err)
			return res, err
		}
		return f.runHeld(ctx, w, s)
	case Duplicate:
		if !e.cfg.Shadow {
			f.claimEvent(event.SkipDuplicate, res, elapsed, waited)
			return res, nil
		}
	}
	return f.refused(ctx, res, elapsed, waited, w)
}

// copyTurn decides a call whose key an earlier call of the batch claimed
// (see DoBatch).
func (r *batchRun) copyTurn(s *batchSlot, w worker) (ClaimResult, error) {
	e, f := r.e, s.f
	first := &r.slots[s.first]
	r.mu.Lock()
	won, done, ok, out := first.won, first.done, first.ok, first.out
	r.mu.Unlock()
	fp, firstFP := f.call.Fingerprint, first.f.call.Fingerprint
	differ := fp != "" && firstFP != "" && fp != firstFP
	var res ClaimResult
	switch {
	case won && differ:
		res.Outcome = Conflict
	case won && done && ok:
		res = ClaimResult{Outcome: Duplicate, Result: out}
	case won && done:
		res.Outcome = InProgress // it failed: no second run in this batch
	case won:
		return r.copyWhileFirstRuns(s, first, w)
	case first.sent && first.err == nil && fp == firstFP && !(first.res.Outcome == InProgress && e.cfg.InProgressWait > 0):
		// The first call met a record of another claim: so does this one.
		res = first.res
	default:
		// Undecidable here (another fingerprint, a store error, a wait):
		// claimed on its own, as Do claims it.
		return f.do(s.ctx, w)
	}
	if res.Outcome == Duplicate && !e.cfg.Shadow {
		f.claimEvent(event.SkipDuplicate, res, 0, 0)
		return res, nil
	}
	return f.refused(s.ctx, res, 0, 0, w)
}

// copyWhileFirstRuns decides a copy whose first call holds the key and
// has not ended: the copy claims on its own, as Do would (the store
// answers InProgress while the first call holds it), and with
// Config.InProgressWait waits for the first call's end, bounded as Do's
// wait is: a Duplicate of its result when it succeeded. (Polling the
// store could not see it: the batch completes its records after every
// call's turn.)
func (r *batchRun) copyWhileFirstRuns(s, first *batchSlot, w worker) (ClaimResult, error) {
	e, f, ctx := r.e, s.f, s.ctx
	lease, err := e.callLease(&f.call)
	if err != nil {
		return ClaimResult{}, err
	}
	f.newWorkContext(ctx)
	start := time.Now()
	res, err := f.claim(ctx, lease)
	elapsed := time.Since(start)
	if err == nil && (res.Outcome < Acquired || res.Outcome > Conflict) {
		err = fmt.Errorf("unknown outcome %v", res.Outcome)
	}
	if err != nil {
		if errors.Is(err, errCallDeadline) {
			return ClaimResult{}, err
		}
		return f.claimFailed(ctx, w, elapsed, 0, err)
	}
	var waited time.Duration
	switch res.Outcome {
	case Acquired: // the first call's claim was lost meanwhile
		f.claimEvent(event.ClaimWon, res, elapsed, 0)
		return f.run(ctx, res.Claim, w)
	case InProgress:
		if e.cfg.InProgressWait > 0 && !e.cfg.Shadow {
			var ok bool
			var out []byte
			ok, out, waited = r.awaitFirst(ctx, f, first)
			if ok {
				res = ClaimResult{Outcome: Duplicate, Result: out}
				f.claimEvent(event.SkipDuplicate, res, elapsed, waited)
				return res, nil
			}
		}
	case Duplicate:
		if !e.cfg.Shadow {
			f.claimEvent(event.SkipDuplicate, res, elapsed, 0)
			return res, nil
		}
	}
	return f.refused(ctx, res, elapsed, waited, w)
}

// awaitFirst waits for the first call's end, at most Config.InProgressWait
// and not past the copy's Deadline or StartBy, and reports whether it succeeded (its
// result) and how long the wait took on the clock.
func (r *batchRun) awaitFirst(ctx context.Context, f *flight, first *batchSlot) (ok bool, out []byte, waited time.Duration) {
	clock := r.e.cfg.Clock
	start := clock.Now()
	left := f.call.waitLeft(start, r.e.cfg.InProgressWait)
	if left > 0 {
		timeout := make(chan struct{})
		stop := clock.AfterFunc(left, func() { close(timeout) })
		select {
		case <-first.ended:
		case <-timeout:
		case <-ctx.Done():
		}
		stop()
	}
	r.mu.Lock()
	ok, out = first.done && first.ok, first.out
	r.mu.Unlock()
	return ok, out, clock.Now().Sub(start)
}

// batchWorker is the work of call i: the batch's function, its panic
// turned into an error (the claim is released) that stops the batch.
type batchWorker struct {
	r *batchRun
	i int
}

func (w batchWorker) work(ctx context.Context) (result []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			w.r.mu.Lock()
			if !w.r.panicked {
				w.r.panicked, w.r.panicValue = true, p
			}
			w.r.mu.Unlock()
			result, err = nil, fmt.Errorf("%w: %v", errWorkPanicked, p)
		}
	}()
	return w.r.fn(ctx, w.i)
}

// complete queues the completion of the call, whose work succeeded.
func (s *batchSlot) complete(result []byte) {
	s.r.mu.Lock()
	s.result = result
	s.r.completes = append(s.r.completes, s)
	s.r.mu.Unlock()
}

// release queues the release of the call's claim: its work failed or did
// not start.
func (s *batchSlot) release(cause error) {
	s.r.mu.Lock()
	s.cause = cause
	s.r.releases = append(s.r.releases, s)
	s.r.mu.Unlock()
}

// finish sends the batch's completions (retrying store errors as Do
// does) and its releases, each kind together, and decides each.
func (r *batchRun) finish() {
	e := r.e
	pending := r.completes
	results := make([][]byte, len(pending))
	for k, s := range pending {
		s.f.keeper.finish()
		results[k] = s.result
	}
	backoff := e.cfg.CompleteBackoff
	for attempt := 0; len(pending) > 0; attempt++ {
		reqs := make([]CompleteRequest, len(pending))
		for k, s := range pending {
			reqs[k] = CompleteRequest{Claim: s.f.keeper.claim(), Result: results[k], Retention: e.cfg.Retention}
		}
		errs, elapsed := r.send(func(ctx context.Context) []error { return e.completeMany(ctx, reqs) })
		var again []*batchSlot
		var againResults [][]byte
		pause := false
		for k, s := range pending {
			e.observeOp(s.ctx, "complete", elapsed, errs[k])
			more, wait := s.f.completeAgain(errs[k], &results[k], attempt)
			if !more {
				s.f.completed(errs[k])
				continue
			}
			pause = pause || wait
			again, againResults = append(again, s), append(againResults, results[k])
		}
		pending, results = again, againResults
		if pause && len(pending) > 0 {
			sleep(e.cfg.Clock, backoff)
			backoff *= 2
		}
	}

	if len(r.releases) == 0 {
		return
	}
	claims := make([]Claim, len(r.releases))
	for k, s := range r.releases {
		s.f.keeper.finish()
		claims[k] = s.f.keeper.claim()
	}
	errs, elapsed := r.send(func(ctx context.Context) []error { return e.releaseMany(ctx, claims) })
	for k, s := range r.releases {
		e.observeOp(s.ctx, "release", elapsed, errs[k])
		s.f.released(errs[k], s.cause)
	}
}

// send runs a batch's completion or release within StoreTimeout, detached
// from the caller's context (the records must be finished even when it
// ended), and returns its errors and round trip.
func (r *batchRun) send(op func(ctx context.Context) []error) ([]error, time.Duration) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), r.e.cfg.StoreTimeout)
	defer cancel()
	start := time.Now()
	errs := op(ctx)
	return errs, time.Since(start)
}

// cleanup stops every lease keeper and ends every work context, also when
// the store, an Observer or the batch's work panicked.
func (r *batchRun) cleanup() {
	for i := range r.slots {
		s := &r.slots[i]
		if s.f == nil {
			continue
		}
		if s.f.keeper.f != nil {
			s.f.keeper.stop()
		}
		if s.f.work != nil {
			s.f.work.end(nil)
		}
		if s.trace != nil && !s.traceEnded {
			s.traceEnded = true
			s.trace.EndCall(ClaimResult{}, errWorkPanicked)
		}
	}
}
