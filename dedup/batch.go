package dedup

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/internal/fanout"
	"github.com/watermill-dedup/watermill-dedup/internal/keys"
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
// result and error for a call that ran). fn's context carries the claim of
// call i and ends as Do's work context ends.
//
// The claims of every call go to the store together before any call runs
// (a [BatchStore] takes them in one request where its server allows;
// other stores are called once per record, concurrently). Then each call
// takes its turn (see Batch.Concurrency and BatchCall.Group): a call that
// won its claim runs fn; the others are decided as Do decides them
// (Duplicate with its result, ErrInProgress, ErrKeyReuse, a *StoreError;
// Config.InProgressWait, Shadow and FailOpen apply).
//
// Completions stream: a call's record is handed to the store as soon as
// its fn returns, without waiting for the batch's other calls, and so is
// the release of a call that failed or did not start. Completions and
// releases that are ready while an earlier request is in flight go
// together in the next one (a BatchStore's CompleteBatch and
// ReleaseBatch), as an auto-pipeliner coalesces them; store errors are
// retried as Do retries them. A timeout or crash in the middle of a batch
// therefore repeats an effect on redelivery only if it came within one
// completion round trip of that call's fn returning: the window of Do.
// DoBatch returns once every completion and release it sent has been
// answered.
//
// The same key twice in the batch (same scope) is claimed once. The call
// of that key whose turn comes first runs fn; a later copy does not: it
// is a Duplicate with that call's result once it has succeeded,
// ErrKeyReuse when both carry fingerprints that differ, ErrInProgress when
// it failed. A copy whose turn comes while that call runs (in another
// group) claims on its own, as Do would, and finds the key in progress
// (with Config.InProgressWait it waits for that call's end, and is its
// Duplicate when it succeeded). No call ever waits for a call that has
// not started: a copy in a group that takes its turn before the group of
// the key's first call is the one that runs. A copy that cannot share the
// claim (its fingerprint differs from the one the key was claimed with, or
// the claim met a record of another consumer, or a store error) is
// decided on its own. Unusable keys and scopes are refused as Do refuses
// them, before anything is claimed; a call without a Scope takes
// Config.Scope, as in Do. A call with Call.KeyErr is decided as Do
// decides it, at its turn.
//
// A call's StartBy (Call.StartBy) bounds its InProgressWait, and is
// checked again at its turn: a claim won with the batch whose turn comes
// at or after StartBy is released unworked, the call ending with
// ErrNotStarted.
//
// Leases: each won claim's lease runs from the batch's claim, and is kept
// by its own heartbeat until its completion or release is answered, as Do
// keeps its lease, while earlier calls run. A call whose Deadline is set (a
// Lambda invocation's) has a lease that ends there, which no heartbeat
// extends: claims made up front for a batch that must end by then cost no
// extension. Without a Deadline, set Config.Lease to cover the wait of the
// batch's last call, or its heartbeats extend every claim waiting for its
// turn (one Extend per claim per Config.Heartbeat).
//
// Panics: a panic of fn releases the call's claim and stops the batch: the
// calls left do not start (ErrNotStarted) and their claims are released. A
// panic of anything else DoBatch calls (the Observer, the Logger, a
// CallTrace, Batch.Stops, the store) stops the batch the same way and
// releases the claim of the call it cut short. In both cases the
// completions of the calls whose fn succeeded are sent, and so are the
// releases, before the panic goes on from DoBatch, on the caller's
// goroutine, also when it was raised on a goroutine of a concurrent turn.
//
// Every call is decided and observed as Do's: its log events, and with
// Config.Tracer a trace of its own (Tracer.StartCall for each call before
// the claims, EndCall when the batch returns); Observer.ObserveStoreOp
// gets each record's claim, completion and release with the round trip of
// the batch request that carried it. The batch's claim request takes one
// admission of Config.MaxClaimsInFlight.
//
// Cost with a BatchStore: one claim request for the batch (plus a second
// for records that take over released ones, depending on the store), then
// completion and release requests as calls end: one when every fn returns
// at once, up to one per call when they return one by one, each slower than
// a round trip; plus one Extend per heartbeat per claim held without a
// Deadline. A batch of one call (without BatchCall.Err) is run by Do, with
// the store's single-record methods, at Do's cost; Batch.Stops is called
// for it once Do has returned.
func (e *Engine) DoBatch(ctx context.Context, b Batch, fn func(ctx context.Context, i int) ([]byte, error)) ([]ClaimResult, []error) {
	results, errs := make([]ClaimResult, len(b.Calls)), make([]error, len(b.Calls))
	switch {
	case len(b.Calls) == 0:
		return results, errs
	case len(b.Calls) == 1 && b.Calls[0].Err == nil:
		// One call is Do's call, decided alike: without the batch's
		// bookkeeping a batch of one costs what Do costs (go run
		// ./dev/bench -batch 1, per-record/DoBatch).
		results[0], errs[0] = e.Do(ctx, b.Calls[0].Call, func(ctx context.Context) ([]byte, error) { return fn(ctx, 0) })
		if b.Stops != nil {
			b.Stops(0, results[0], errs[0])
		}
		return results, errs
	}
	r := &batchRun{e: e, ctx: ctx, b: b, fn: fn, slots: make([]batchSlot, len(b.Calls))}
	r.guard(func() {
		r.prepare()
		r.claim()
	})
	r.turns(results, errs)
	r.finish(results, errs)
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
	// order and start are the batch's turns (see unitsOf): the calls of a
	// group in batch order, a call without a group alone; in the order of
	// their first call.
	order, start []int

	mu         sync.Mutex
	panicked   bool
	panicValue any
	// ends are the completions and releases waiting for the next request
	// (see send); wake, made with the sender, tells it of new ones;
	// closing tells it to stop once none is left, and stopped is closed
	// then.
	ends    []batchEnd
	wake    chan struct{}
	closing bool
	stopped chan struct{}
}

// batchSlot is one call of the batch.
type batchSlot struct {
	r     *batchRun
	i     int
	run   *callRun
	ctx   context.Context // the caller's, with the call's trace
	trace CallTrace

	preset error     // decided before any claim (ErrNoScope, a passed deadline)
	keyErr error     // an unusable key: decided at its turn (keyMissing)
	key    *batchKey // its scoped key's, when it is usable

	// The key's claim, when this call sent it or took it over (see take).
	sent    bool
	res     ClaimResult
	err     error
	elapsed time.Duration
	won     bool // holds a claim (under batchRun.mu once turns run)
	settled bool // its completion or release is queued, or the work completed the record (under batchRun.mu)

	// Under batchRun.mu, for its copies: the end of its turn, and a channel
	// closed then, made when a copy waits for it (see ended).
	done, ok bool
	out      []byte
	over     chan struct{}

	traceEnded bool
}

// batchKey is a scoped key of the batch, which one claim serves.
type batchKey struct {
	// claimer is the call whose callRun sent the key's claim and keeps it
	// until a call takes its turn with it: the key's first call in the
	// order of the turns (units). Nil when no claim was sent for it, or
	// once it was released unstarted. Under batchRun.mu.
	claimer *batchSlot
	// first is the call that took its turn with the key's claim: the one
	// whose work runs; its copies are decided from it. Under batchRun.mu.
	first *batchSlot
}

// guard runs fn, noting a panic of it as the batch's (see notePanic).
func (r *batchRun) guard(fn func()) {
	defer func() {
		if p := recover(); p != nil {
			r.notePanic(p)
		}
	}()
	fn()
}

// notePanic records the batch's first panic: the calls left do not start,
// and DoBatch raises it again once the batch's records are finished.
func (r *batchRun) notePanic(p any) {
	r.mu.Lock()
	if !r.panicked {
		r.panicked, r.panicValue = true, p
	}
	r.mu.Unlock()
}

func (r *batchRun) halted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.panicked
}

// unitsOf is the turns of calls: the calls of a group one after the other
// in batch order, a call without a group alone, in the order of each
// unit's first call. Unit u is order[start[u]:start[u+1]]: two
// allocations for the batch, none per call.
func unitsOf(calls []BatchCall) (order, start []int) {
	unit := make([]int, len(calls)) // the unit of each call
	start = make([]int, 0, len(calls)+1)
	var group map[string]int
	for i, c := range calls {
		if c.Group == "" {
			unit[i] = len(start)
			start = append(start, 0)
			continue
		}
		if group == nil {
			group = make(map[string]int)
		}
		u, ok := group[c.Group]
		if !ok {
			u = len(start)
			group[c.Group] = u
			start = append(start, 0)
		}
		unit[i] = u
	}
	// Count each unit's calls, then place them: a counting sort that keeps
	// batch order within a unit.
	n := len(start)
	for _, u := range unit {
		start[u]++
	}
	at := 0
	for u := range n {
		count := start[u]
		start[u] = at
		at += count
	}
	start = append(start, at)
	order = make([]int, len(calls))
	next := make([]int, n)
	copy(next, start[:n])
	for i, u := range unit {
		order[next[u]] = i
		next[u]++
	}
	return order, start
}

// unit returns the calls of unit u.
func (r *batchRun) unit(u int) []int { return r.order[r.start[u]:r.start[u+1]] }

// prepare checks every call and makes its callRun, as Do does before its
// claim, and chooses the call that sends each key's claim: the key's first
// in the order of the turns.
func (r *batchRun) prepare() {
	e := r.e
	runs := make([]callRun, len(r.slots)) // one allocation
	for i := range r.slots {
		s := &r.slots[i]
		s.r, s.i, s.ctx = r, i, r.ctx
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
		s.run = &runs[i]
		s.run.e, s.run.call = e, call
		switch {
		case r.b.Calls[i].Err != nil:
			s.preset = r.b.Calls[i].Err
		case call.Scope == "":
			s.preset = ErrNoScope
		case call.KeyErr != nil: // as Do
			s.run.nameUnkeyed()
			s.keyErr = call.KeyErr
		default:
			if err := e.checkKey(call.Key, call.MessageUUID); err != nil {
				s.keyErr = err
				continue
			}
			s.run.held.key = keys.Scoped(call.Scope, call.Key)
		}
	}
	r.order, r.start = unitsOf(r.b.Calls)
	byKey := make(map[string]*batchKey, len(r.slots))
	batchKeys := make([]batchKey, 0, len(r.slots)) // one allocation
	for u := range len(r.start) - 1 {
		for _, i := range r.unit(u) {
			s := &r.slots[i]
			if s.preset != nil || s.keyErr != nil {
				continue
			}
			k := byKey[s.run.held.key]
			if k == nil {
				batchKeys = append(batchKeys, batchKey{})
				k = &batchKeys[len(batchKeys)-1]
				byKey[s.run.held.key] = k
			}
			s.key = k
			if k.claimer != nil {
				continue
			}
			if _, err := e.callLease(&s.run.call); err != nil {
				s.preset, s.key = err, nil
				continue
			}
			k.claimer, s.sent = s, true
			s.run.newWorkContext(s.ctx)
		}
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
		lease, err := e.callLease(&s.run.call) // the wait for admission took some of the time left
		if err != nil {
			s.sent, s.preset = false, err
			s.key.claimer, s.key = nil, nil
			continue
		}
		s.run.keeper.lease, s.run.keeper.claimedAt = lease, now
		o, _ := OriginFromContext(s.run.work) // the call's, else the context's
		reqs = append(reqs, ClaimRequest{Key: s.run.held.key, Fingerprint: s.run.call.Fingerprint, Lease: lease, Origin: o})
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
			s.run.claimSentAt(start) // for the wait of its turn
		}
		if s.err == nil && (s.res.Outcome < Acquired || s.res.Outcome > Conflict) {
			s.err = fmt.Errorf("unknown outcome %v", s.res.Outcome)
		}
		if s.err == nil && s.res.Outcome == Acquired {
			s.won = true
			s.run.hold(s.res.Claim)
		}
	}
	// Told once every won claim is kept, so that a panicking Observer
	// leaves none unreleased (see finish).
	for _, s := range slots {
		e.observeOp(s.ctx, "claim", elapsed, s.err)
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
		res[i], errs[i] = e.cfg.Store.Claim(WithOrigin(ctx, rq.Origin), rq.Key, rq.Fingerprint, rq.Lease)
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
// other, up to Batch.Concurrency groups (or lone calls) at once. A panic
// on a turn's goroutine is noted (see notePanic), never left to end the
// process.
func (r *batchRun) turns(results []ClaimResult, errs []error) {
	if r.halted() { // prepare or claim panicked
		for i := range r.slots {
			errs[i] = r.notStarted(&r.slots[i], true)
		}
		return
	}
	fanout.Each(len(r.start)-1, r.b.Concurrency, func(u int) {
		unit := r.unit(u)
		for k, i := range unit {
			s := &r.slots[i]
			if r.halted() {
				errs[i] = r.notStarted(s, true)
				continue
			}
			res, err, stops := r.takeTurn(s)
			results[i], errs[i] = res, err
			if stops {
				for _, j := range unit[k+1:] {
					errs[j] = r.notStarted(&r.slots[j], false)
				}
				return
			}
		}
	})
}

// takeTurn is call s's turn, and reports whether it stops the later calls
// of its group (Batch.Stops). A panic of the turn is noted; the claim of
// the call it cut short is released by finish.
func (r *batchRun) takeTurn(s *batchSlot) (res ClaimResult, err error, stops bool) {
	turned := false
	defer func() {
		if !turned {
			// A panic, or runtime.Goexit (p is nil then: the goroutine
			// ends, the batch goes on without the call).
			if p := recover(); p != nil {
				r.notePanic(p)
				err = fmt.Errorf("%w: %v", errBatchPanicked, p)
			} else {
				err = fmt.Errorf("%w: its goroutine exited", errBatchPanicked)
			}
			res, stops = ClaimResult{}, true
		}
		r.endTurn(s, err == nil && res.Outcome == Acquired, res.Result)
	}()
	res, err = r.turn(s)
	if r.b.Stops != nil {
		stops = r.b.Stops(s.i, res, err)
	} else {
		stops = err != nil
	}
	turned = true
	return res, err, stops
}

// errBatchPanicked is the error of a call whose turn a panic cut short, and
// the cause of the release of its claim; DoBatch raises the panic itself.
var errBatchPanicked = errors.New("dedup: the batch panicked")

// notStarted ends a call that does not take its turn (after a failure of
// its group, or after a panic), releasing its claim. A panic of what is
// told of it is noted.
func (r *batchRun) notStarted(s *batchSlot, panicked bool) (err error) {
	err = fmt.Errorf("%w: an earlier call of its group %q failed", ErrNotStarted, r.b.Calls[s.i].Group)
	if panicked {
		err = fmt.Errorf("%w: the batch panicked", ErrNotStarted)
	}
	r.mu.Lock()
	won := s.won && !s.settled
	if k := s.key; k != nil && k.claimer == s && k.first == nil {
		k.claimer = nil // a copy that takes its turn claims on its own
	}
	r.mu.Unlock()
	if won {
		r.guard(func() {
			s.run.reportClaim(event.ClaimWon, s.res, s.elapsed, 0)
		})
		s.release(err)
	}
	r.endTurn(s, false, nil)
	return err
}

// endTurn records the end of a call's turn, for its copies. Only the first
// call counts.
func (r *batchRun) endTurn(s *batchSlot, ok bool, out []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s.done {
		return
	}
	s.done, s.ok, s.out = true, ok, out
	if s.over != nil {
		close(s.over)
	}
}

// ended returns a channel closed at the end of the call's turn.
func (r *batchRun) ended(s *batchSlot) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s.over == nil {
		s.over = make(chan struct{})
		if s.done {
			close(s.over)
		}
	}
	return s.over
}

// turn decides one call, as Do decides it after its claim, and runs its
// work when its claim was won.
func (r *batchRun) turn(s *batchSlot) (ClaimResult, error) {
	f, ctx, w := s.run, s.ctx, s // s is the call's work (see batchSlot.work)
	switch {
	case s.preset != nil:
		return ClaimResult{}, s.preset
	case s.keyErr != nil:
		return f.keyMissing(ctx, s.keyErr, w)
	}
	switch t, first := r.take(s); t {
	case copyOfFirst:
		return r.copyTurn(s, first, w)
	case claimAlone:
		return f.do(ctx, w)
	case heldForAnother:
		return r.heldForAnother(s, w)
	}
	if s.err != nil {
		return f.claimFailed(ctx, w, s.elapsed, 0, s.err)
	}
	e := r.e
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
		f.reportClaim(event.ClaimWon, res, elapsed, waited)
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
			f.reportClaim(event.SkipDuplicate, res, elapsed, waited)
			return res, nil
		}
	}
	return f.refused(ctx, res, elapsed, waited, w)
}

// keyTurn is how a call of the batch takes its key at its turn (see take).
type keyTurn int

const (
	// withTheClaim: the call goes on with the key's claim (its answer in
	// the slot), which it sent or took over.
	withTheClaim keyTurn = iota
	// copyOfFirst: another call took its turn with the key's claim first.
	copyOfFirst
	// claimAlone: no claim of the batch serves the call: it claims on its
	// own, as Do does.
	claimAlone
	// heldForAnother: the batch holds the key for a call that has not
	// started, under a fingerprint that is not this call's.
	heldForAnother
)

// take decides how call s takes its key at its turn. The first call to
// take its turn with the key's claim runs the work: s itself, taking the
// claim over from the call that sent it when that one's turn has not come
// (a call of a group that takes its turn later), so that no call ever
// waits for one that has not started. A call after it is its copy. A call
// whose fingerprint is not the one the claim was sent with cannot take it
// over.
func (r *batchRun) take(s *batchSlot) (keyTurn, *batchSlot) {
	r.mu.Lock()
	k := s.key
	if k.first != nil {
		defer r.mu.Unlock()
		return copyOfFirst, k.first
	}
	c := k.claimer
	switch {
	case c == s:
		k.first = s
		r.mu.Unlock()
		return withTheClaim, nil
	case c == nil:
		r.mu.Unlock()
		return claimAlone, nil
	case c.run.call.Fingerprint != s.run.call.Fingerprint:
		defer r.mu.Unlock()
		if c.won {
			return heldForAnother, c
		}
		return claimAlone, nil
	}
	k.first = s
	s.sent, s.res, s.err, s.elapsed, s.won = c.sent, c.res, c.err, c.elapsed, c.won
	from := c.run
	c.sent, c.won = false, false
	c.run = &callRun{e: r.e, call: from.call} // for its own turn, as a copy
	c.run.held.key = from.held.key
	r.mu.Unlock()
	s.takeOver(from)
	return withTheClaim, nil
}

// takeOver gives call s the claim, and the claim's answer, that run
// from (of the call that sent it) has kept until now: its lease keeper
// hands over the lease as it stands, and the work's context is s's.
func (s *batchSlot) takeOver(from *callRun) {
	f := s.run
	if from.wait != nil {
		f.claimSentAt(from.wait.claimSent)
	}
	f.newWorkContext(s.ctx)
	if !s.won {
		from.work.end(nil)
		return
	}
	old := &from.keeper
	old.stop()
	old.mu.Lock()
	leaseEnd, lastBeat, expired := old.leaseEnd, old.lastBeat, old.expired
	old.mu.Unlock()
	from.work.end(nil)
	f.keeper.lease, f.keeper.claimedAt = old.lease, old.claimedAt
	f.held.key, f.held.token, f.held.fence = from.held.key, from.held.token, from.held.fence
	f.keepLeaseFrom(leaseEnd, lastBeat, expired)
}

// heldForAnother decides a call whose key the batch holds for a call that
// has not started, claimed under another fingerprint: as the store would
// answer its own claim (ErrKeyReuse when both fingerprints are set, else
// in progress), without waiting for a call that has not started.
func (r *batchRun) heldForAnother(s *batchSlot, w worker) (ClaimResult, error) {
	res := ClaimResult{Outcome: InProgress}
	if s.run.call.Fingerprint != "" && s.key.claimerFingerprint(r) != "" {
		res.Outcome = Conflict
	}
	return s.run.refused(s.ctx, res, 0, 0, w)
}

// claimerFingerprint is the fingerprint the key's claim was sent with.
func (k *batchKey) claimerFingerprint(r *batchRun) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if k.claimer == nil {
		return ""
	}
	return k.claimer.run.call.Fingerprint
}

// copyTurn decides a call whose key another call of the batch took its
// turn with first (see DoBatch).
func (r *batchRun) copyTurn(s, first *batchSlot, w worker) (ClaimResult, error) {
	e, f := r.e, s.run
	r.mu.Lock()
	won, done, ok, out := first.won, first.done, first.ok, first.out
	sent, firstRes, firstErr := first.sent, first.res, first.err
	r.mu.Unlock()
	fp, firstFP := f.call.Fingerprint, first.run.call.Fingerprint
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
	case sent && firstErr == nil && fp == firstFP && !(firstRes.Outcome == InProgress && e.cfg.InProgressWait > 0):
		// The first call met a record of another claim: so does this one.
		res = firstRes
	default:
		// Undecidable here (another fingerprint, a store error, a wait):
		// claimed on its own, as Do claims it.
		return f.do(s.ctx, w)
	}
	if res.Outcome == Duplicate && !e.cfg.Shadow {
		f.reportClaim(event.SkipDuplicate, res, 0, 0)
		return res, nil
	}
	return f.refused(s.ctx, res, 0, 0, w)
}

// copyWhileFirstRuns decides a copy whose first call holds the key and
// has not ended (it is running: it took its turn): the copy claims on its
// own, as Do would (the store answers InProgress while the first call
// holds it), and with Config.InProgressWait waits for the first call's
// end, bounded as Do's wait is: a Duplicate of its result when it
// succeeded.
func (r *batchRun) copyWhileFirstRuns(s, first *batchSlot, w worker) (ClaimResult, error) {
	e, f, ctx := r.e, s.run, s.ctx
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
		f.reportClaim(event.ClaimWon, res, elapsed, 0)
		return f.run(ctx, res.Claim, w)
	case InProgress:
		if e.cfg.InProgressWait > 0 && !e.cfg.Shadow {
			var ok bool
			var out []byte
			ok, out, waited = r.awaitFirst(ctx, f, first)
			if ok {
				res = ClaimResult{Outcome: Duplicate, Result: out}
				f.reportClaim(event.SkipDuplicate, res, elapsed, waited)
				return res, nil
			}
		}
	case Duplicate:
		if !e.cfg.Shadow {
			f.reportClaim(event.SkipDuplicate, res, elapsed, 0)
			return res, nil
		}
	}
	return f.refused(ctx, res, elapsed, waited, w)
}

// awaitFirst waits for the first call's end, at most Config.InProgressWait
// and not past the copy's Deadline or StartBy, and reports whether it
// succeeded (its result) and how long the wait took on the clock.
func (r *batchRun) awaitFirst(ctx context.Context, f *callRun, first *batchSlot) (ok bool, out []byte, waited time.Duration) {
	clock := r.e.cfg.Clock
	start := clock.Now()
	left := f.call.waitLeft(start, r.e.cfg.InProgressWait)
	if left > 0 {
		timeout := make(chan struct{})
		stop := clock.AfterFunc(left, func() { close(timeout) })
		select {
		case <-r.ended(first):
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

// work is the work of the call: the batch's function, its panic turned
// into an error (the claim is released) that stops the batch.
func (s *batchSlot) work(ctx context.Context) (result []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.r.notePanic(p)
			result, err = nil, fmt.Errorf("%w: %v", errWorkPanicked, p)
		}
	}()
	return s.r.fn(ctx, s.i)
}

// batchEnd is the end of a call's claim, waiting to be sent: its
// completion with result, or its release for cause.
type batchEnd struct {
	s       *batchSlot
	release bool
	result  []byte
	cause   error
	attempt int // completions sent before (store errors retried)
}

// complete queues the completion of the call, whose work succeeded.
func (s *batchSlot) complete(result []byte) {
	s.run.keeper.finish()
	s.r.queue(batchEnd{s: s, result: result})
}

// release queues the release of the call's claim: its work failed or did
// not start.
func (s *batchSlot) release(cause error) {
	s.run.keeper.finish()
	s.r.queue(batchEnd{s: s, release: true, cause: cause})
}

// settle notes that the call's work completed its record itself (in its
// own transaction): nothing is left to send.
func (s *batchSlot) settle() {
	s.r.mu.Lock()
	s.settled = true
	s.r.mu.Unlock()
}

// queue hands a claim's end to the batch's sender, starting it with the
// first: the end goes in the next request, at once when none is in flight.
func (r *batchRun) queue(end batchEnd) {
	r.mu.Lock()
	end.s.settled = true
	r.ends = append(r.ends, end)
	start := r.wake == nil
	if start {
		r.wake, r.stopped = make(chan struct{}, 1), make(chan struct{})
	}
	wake := r.wake
	r.mu.Unlock()
	if start {
		go r.send()
		return
	}
	select {
	case wake <- struct{}{}:
	default: // it is awake already
	}
}

// send sends the queued ends, each request carrying every end queued
// while the one before was in flight, until finish says the batch is over
// and none is left. It runs on a goroutine of its own, so that no call's
// turn waits for a round trip of another's end; a panic there (the store,
// the Observer, the Logger) is noted for DoBatch to raise, and the ends go
// on.
func (r *batchRun) send() {
	defer close(r.stopped)
	r.gather()
	backoff := r.e.cfg.CompleteBackoff
	for {
		r.mu.Lock()
		ends, closing := r.ends, r.closing
		r.ends = nil
		r.mu.Unlock()
		if len(ends) == 0 {
			if closing {
				return
			}
			<-r.wake
			r.gather()
			continue
		}
		again, pause := r.sendEnds(ends)
		if len(again) == 0 {
			continue
		}
		if pause {
			sleep(r.e.cfg.Clock, backoff)
			backoff *= 2
		}
		r.mu.Lock()
		r.ends = append(again, r.ends...)
		r.mu.Unlock()
	}
}

// gather lets the ends that are arriving together join the request about
// to be sent: it yields the processor for as long as each yield brings
// more (the turns already runnable end meanwhile), and no longer: never
// for a call whose work has not returned.
func (r *batchRun) gather() {
	r.mu.Lock()
	n := len(r.ends)
	r.mu.Unlock()
	for {
		runtime.Gosched()
		r.mu.Lock()
		more := len(r.ends) > n
		n = len(r.ends)
		r.mu.Unlock()
		if !more {
			return
		}
	}
}

// sendEnds sends the completions of ends in one request and their releases
// in another, and decides each answer; it returns the completions to send
// again (store errors, as Do retries them) and whether to pause first.
func (r *batchRun) sendEnds(ends []batchEnd) (again []batchEnd, pause bool) {
	e := r.e
	var completes, releases []batchEnd
	for _, end := range ends {
		if end.release {
			releases = append(releases, end)
		} else {
			completes = append(completes, end)
		}
	}
	if len(completes) > 0 {
		reqs := make([]CompleteRequest, len(completes))
		for k, end := range completes {
			reqs[k] = CompleteRequest{Claim: end.s.run.keeper.claim(), Result: end.result, Retention: e.cfg.Retention}
		}
		errs, elapsed := r.storeOp(len(reqs), func(ctx context.Context) []error { return e.completeMany(ctx, reqs) })
		for k, end := range completes {
			f, err := end.s.run, errs[k]
			more, wait := false, false
			r.guard(func() {
				e.observeOp(end.s.ctx, "complete", elapsed, err)
				if !errors.Is(err, errStorePanicked) {
					more, wait = f.completeAgain(err, &end.result, end.attempt)
				}
			})
			if more {
				end.attempt++
				again, pause = append(again, end), pause || wait
				continue
			}
			r.guard(func() { f.completed(err) })
			f.keeper.stop() // also when what completed told panicked
		}
	}
	if len(releases) > 0 {
		claims := make([]Claim, len(releases))
		for k, end := range releases {
			claims[k] = end.s.run.keeper.claim()
		}
		errs, elapsed := r.storeOp(len(claims), func(ctx context.Context) []error { return e.releaseMany(ctx, claims) })
		for k, end := range releases {
			f, err := end.s.run, errs[k]
			r.guard(func() {
				e.observeOp(end.s.ctx, "release", elapsed, err)
				f.released(err, end.cause)
			})
			f.keeper.stop()
		}
	}
	return again, pause
}

// errStorePanicked is the error of each record of a batch request whose
// store method panicked (the panic is the batch's): not sent again.
var errStorePanicked = errors.New("dedup: the store panicked")

// storeOp runs a batch's completion or release within StoreTimeout,
// detached from the caller's context (the records must be finished even
// when it ended), and returns its n errors and round trip. A panic of the
// store is noted and fails every record of the request.
func (r *batchRun) storeOp(n int, op func(ctx context.Context) []error) (errs []error, elapsed time.Duration) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), r.e.cfg.StoreTimeout)
	defer cancel()
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			r.notePanic(p)
			errs = fill(n, fmt.Errorf("%w: %v", errStorePanicked, p))
		}
		elapsed = time.Since(start)
	}()
	return op(ctx), 0
}

// finish ends the batch once every turn has: it releases the claims that
// a panic left held, waits until every end queued has been answered, stops
// every lease keeper and ends every work context and trace.
func (r *batchRun) finish(results []ClaimResult, errs []error) {
	for i := range r.slots {
		s := &r.slots[i]
		r.mu.Lock()
		held := s.won && !s.settled
		r.mu.Unlock()
		if held {
			r.guard(func() { s.run.reportClaim(event.ClaimWon, s.res, s.elapsed, 0) })
			s.release(errBatchPanicked)
		}
	}
	r.mu.Lock()
	r.closing = true
	wake, stopped := r.wake, r.stopped
	r.mu.Unlock()
	if wake != nil {
		select {
		case wake <- struct{}{}:
		default:
		}
		<-stopped
	}
	for i := range r.slots {
		s := &r.slots[i]
		if s.run == nil {
			continue
		}
		if s.run.keeper.run != nil {
			s.run.keeper.stop()
		}
		if s.run.work != nil {
			s.run.work.end(nil)
		}
		if s.trace != nil && !s.traceEnded {
			s.traceEnded = true
			r.guard(func() { s.trace.EndCall(results[i], errs[i]) })
		}
	}
}
