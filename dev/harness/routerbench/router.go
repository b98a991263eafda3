package routerbench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// Variant names, as printed.
const (
	vRaw   = "raw"
	vStore = "claim+complete"
	vFloor = "raw pair"
	// vCASFloor is the raw pair whose second write is a compare-and-set
	// (Redis: an EVALSHA of the least such script), the floor of a
	// Complete that must check its token.
	vCASFloor = "raw CAS pair"
	vRouter   = "router"
	// vRouterFloor is a router whose handler runs the raw pair, no
	// middleware: the floor of router+dedup.
	vRouterFloor = "router+raw pair"
	// vRouterCASFloor is a router whose handler runs the raw CAS pair, no
	// middleware: the floor of router+dedup with the same two commands
	// (on Redis, a completion is an EVALSHA, not a SET XX).
	vRouterCASFloor = "router+raw CAS pair"
	// vRouterStore is a router whose handler calls the store's Claim and
	// Complete itself, no middleware: what router+dedup costs without the
	// engine (its lease, admission, contexts, key checks and decisions),
	// between the raw floors and router+dedup.
	vRouterStore = "router+claim+complete"
	vHappy       = "router+dedup"
	vDup         = "router+dedup dup"
	vWMHappy     = "router+wm-dedup"
	vWMDup       = "router+wm-dedup dup"
)

const (
	// keyMetadata carries the business key; both middlewares read it.
	keyMetadata = "order_id"
	// scope is the dedup Config.Scope of every router variant and the scope
	// of the claim+complete variant's keys.
	scope = "charge-orders"
	// dupKeys is how many completed keys the duplicate paths cycle through.
	dupKeys = 1024
)

var payload = []byte(`{"order_id":"ORDER-000123","amount_cents":15000}`)

// lane is one router variant: maxC consumer handlers, each on its own
// topic, behind the same middleware. Publishing to topic i of a lane blocks
// until handler i acked the message (GoChannel with
// BlockPublishUntilSubscriberAck), so c publishing goroutines keep exactly
// c messages in flight, publish to ack.
type lane struct {
	name   string
	topics []string
	// handlerCalls counts calls of the innermost handler: every message on
	// the happy path, none on the duplicate path.
	handlerCalls atomic.Int64
	// wantCalls says whether each message must reach the handler.
	wantCalls bool
	// nextKey returns the business key of the next message.
	nextKey func() string
	// dupKeys are the keys a duplicate lane cycles through; wmRepo is the
	// repository of a lane with Watermill's Deduplicator.
	dupKeys []string
	wmRepo  *swapRepo

	errMu    sync.Mutex
	errCount int
	firstErr error
}

// guard is each lane's outermost middleware: an error from the chain would
// nack, and GoChannel would redeliver it for ever; the guard records it
// (the run then fails) and acks.
func (l *lane) guard(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err != nil {
			l.errMu.Lock()
			l.errCount++
			if l.firstErr == nil {
				l.firstErr = err
			}
			l.errMu.Unlock()
		}
		return out, nil
	}
}

func (l *lane) err() error {
	l.errMu.Lock()
	defer l.errMu.Unlock()
	if l.errCount == 0 {
		return nil
	}
	return fmt.Errorf("%s: %d handler errors, first: %w", l.name, l.errCount, l.firstErr)
}

// rig is one Watermill router on one GoChannel with every lane of a store.
type rig struct {
	pub    *gochannel.GoChannel
	router *message.Router
	lanes  map[string]*lane
	stop   func() error
}

// floorLane is a router lane without middleware whose handler runs run
// with the message's scoped key (vRouterFloor, vRouterCASFloor); tag makes
// its business keys distinct from every other lane's.
type floorLane struct {
	name, tag string
	run       func(ctx context.Context, key string) error
}

// storePair is the work of the router+claim+complete lane: the store's
// Claim of the scoped key, for rawLease (dedup's default lease), then its
// Complete for rawRetention (dedup's default retention) with no result, as
// the middleware makes them for a new message.
func storePair(store dedup.Store) func(ctx context.Context, key string) error {
	return func(ctx context.Context, key string) error {
		res, err := store.Claim(ctx, key, "", rawLease)
		if err != nil {
			return err
		}
		if res.Outcome != dedup.Acquired {
			return fmt.Errorf("routerbench: %s: claim of %q: outcome %v, want Acquired", vRouterStore, key, res.Outcome)
		}
		return store.Complete(ctx, res.Claim, nil, rawRetention)
	}
}

// newRig starts a router whose lanes use store through dedup.New (and,
// when withWatermill, Watermill's own Deduplicator on an in-memory
// repository), each with maxC handlers, and one lane per floor. Keys are
// unique to id.
func newRig(ctx context.Context, store dedup.Store, id string, maxC, maxClaims int, withWatermill bool, floors ...floorLane) (*rig, error) {
	pub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	r := &rig{pub: pub, router: router, lanes: map[string]*lane{}}

	distinct := func(tag string) func() string { return newAtomicSeq("ORDER-" + id + "-" + tag + "-") }
	cycleKeys := func(tag string) []string {
		keys := make([]string, dupKeys)
		for i := range keys {
			keys[i] = "ORDER-" + id + "-" + tag + "-" + strconv.Itoa(i)
		}
		return keys
	}
	cycle := func(keys []string) func() string {
		var seq atomic.Int64
		return func() string { return keys[(seq.Add(1)-1)%dupKeys] }
	}
	newDedup := func() (message.HandlerMiddleware, error) {
		d, err := dedup.New(dedup.Config{Store: store, Key: keyfuncs.Metadata(keyMetadata), Scope: scope, MaxClaimsInFlight: maxClaims})
		if err != nil {
			return nil, err
		}
		return d.Middleware, nil
	}
	newWatermill := func() (message.HandlerMiddleware, *swapRepo) {
		repo := &swapRepo{}
		repo.reset()
		d := &wmmiddleware.Deduplicator{
			KeyFactory: wmmiddleware.NewMessageHasherFromMetadataField(keyMetadata),
			Repository: repo,
			Timeout:    time.Minute, // its own default
		}
		return d.Middleware, repo
	}

	type spec struct {
		name      string
		mw        message.HandlerMiddleware
		wantCalls bool
		nextKey   func() string
		dupKeys   []string
		repo      *swapRepo
		// work, when set, is what the handler does beside counting.
		work func(*message.Message) error
	}
	happy, err := newDedup()
	if err != nil {
		return nil, err
	}
	dup, err := newDedup()
	if err != nil {
		return nil, err
	}
	dupLaneKeys, wmDupKeys := cycleKeys("dup"), cycleKeys("wmdup")
	specs := []spec{
		{vRouter, nil, true, distinct("none"), nil, nil, nil},
		{vHappy, happy, true, distinct("happy"), nil, nil, nil},
		{vDup, dup, false, cycle(dupLaneKeys), dupLaneKeys, nil, nil},
	}
	for _, f := range floors {
		specs = append(specs, spec{name: f.name, wantCalls: true, nextKey: distinct(f.tag),
			work: func(msg *message.Message) error {
				return f.run(msg.Context(), admin.ScopedKey(scope, msg.Metadata.Get(keyMetadata)))
			}})
	}
	if withWatermill {
		wmHappy, happyRepo := newWatermill()
		wmDup, dupRepo := newWatermill()
		specs = append(specs,
			spec{vWMHappy, wmHappy, true, distinct("wm"), nil, happyRepo, nil},
			spec{vWMDup, wmDup, false, cycle(wmDupKeys), wmDupKeys, dupRepo, nil})
	}
	for _, s := range specs {
		l := &lane{name: s.name, wantCalls: s.wantCalls, nextKey: s.nextKey, dupKeys: s.dupKeys, wmRepo: s.repo}
		for i := range maxC {
			topic := fmt.Sprintf("bench-%s-%d", s.name, i)
			l.topics = append(l.topics, topic)
			work := s.work
			h := router.AddConsumerHandler(topic, topic, pub, func(msg *message.Message) error {
				l.handlerCalls.Add(1)
				if work != nil {
					return work(msg)
				}
				return nil
			})
			if s.mw != nil {
				h.AddMiddleware(l.guard, s.mw)
			} else {
				h.AddMiddleware(l.guard)
			}
		}
		r.lanes[s.name] = l
	}

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- router.Run(runCtx) }()
	select {
	case <-router.Running():
	case err := <-done:
		cancel()
		return nil, fmt.Errorf("routerbench: router stopped before running: %w", err)
	case <-ctx.Done():
		cancel()
		return nil, ctx.Err()
	}
	r.stop = func() error {
		err := router.Close()
		cancel()
		err = errors.Join(err, <-done, pub.Close())
		return err
	}

	// Complete the duplicate lanes' keys once, through their own
	// middleware (the first copy takes the happy path).
	for _, name := range []string{vDup, vWMDup} {
		l, ok := r.lanes[name]
		if !ok {
			continue
		}
		if _, _, err := drive(ctx, min(maxC, 16), 0, dupKeys, r.publisher(l)); err != nil {
			_ = r.stop()
			return nil, fmt.Errorf("routerbench: completing the duplicate keys: %w", err)
		}
		if got := l.handlerCalls.Load(); got != dupKeys {
			_ = r.stop()
			return nil, fmt.Errorf("routerbench: %s: %d handler calls for %d first copies", name, got, dupKeys)
		}
		if err := l.err(); err != nil {
			_ = r.stop()
			return nil, err
		}
		l.handlerCalls.Store(0)
	}
	return r, nil
}

// reset follows an emptied store (backend.reset): the Watermill lanes get
// empty repositories, and every duplicate lane's keys are completed again,
// directly in store and the repository (as their first copies did through
// the router), so that the lanes measure what they did before.
func (r *rig) reset(ctx context.Context, store dedup.Store) error {
	for _, l := range r.lanes {
		if l.wmRepo != nil {
			l.wmRepo.reset()
			for _, k := range l.dupKeys {
				if _, err := l.wmRepo.IsDuplicate(ctx, k); err != nil {
					return err
				}
			}
			continue
		}
		for _, k := range l.dupKeys {
			res, err := store.Claim(ctx, admin.ScopedKey(scope, k), "", 30*time.Second)
			if err == nil && res.Outcome != dedup.Acquired {
				err = fmt.Errorf("routerbench: completing %q again: %v", k, res.Outcome)
			}
			if err == nil {
				err = store.Complete(ctx, res.Claim, nil, 24*time.Hour)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// swapRepo is Watermill's map repository, which reset replaces by an empty
// one (see swapStore).
type swapRepo struct {
	p atomic.Pointer[wmmiddleware.ExpiringKeyRepository]
}

func (s *swapRepo) reset() {
	// The same retention as dedup's default (24h), so no key is forgotten
	// during the run.
	repo, err := wmmiddleware.NewMapExpiringKeyRepository(24 * time.Hour)
	if err != nil {
		panic(err) // only for a window under a millisecond
	}
	s.p.Store(&repo)
}

func (s *swapRepo) IsDuplicate(ctx context.Context, key string) (bool, error) {
	return (*s.p.Load()).IsDuplicate(ctx, key)
}

// publisher returns the workload of a lane: worker w publishes one message
// to the lane's topic w and returns when it was acked.
func (r *rig) publisher(l *lane) func(ctx context.Context, worker int) error {
	return func(_ context.Context, worker int) error {
		msg := message.NewMessage(watermill.NewUUID(), payload)
		msg.Metadata.Set(keyMetadata, l.nextKey())
		return r.pub.Publish(l.topics[worker], msg)
	}
}

// checked runs a lane's workload through drive and then checks what the
// handlers saw: every message on a happy lane, none on a duplicate lane,
// and no handler error.
func (r *rig) checked(ctx context.Context, l *lane, c int, d time.Duration, total int64) (int64, time.Duration, error) {
	before := l.handlerCalls.Load()
	n, elapsed, err := drive(ctx, c, d, total, r.publisher(l))
	if err != nil {
		return n, elapsed, err
	}
	if err := l.err(); err != nil {
		return n, elapsed, err
	}
	calls := l.handlerCalls.Load() - before
	want := int64(0)
	if l.wantCalls {
		want = n
	}
	if calls != want {
		return n, elapsed, fmt.Errorf("routerbench: %s: the handler ran %d times for %d messages, want %d", l.name, calls, n, want)
	}
	return n, elapsed, nil
}

// drive runs op on c goroutines (worker 0..c-1), each calling it in a loop,
// for the duration d or, when total > 0, until total calls were made in
// all. It returns the number of calls and the wall time from start until
// every worker stopped, and the first error (a failing worker stops).
func drive(ctx context.Context, c int, d time.Duration, total int64, op func(ctx context.Context, worker int) error) (int64, time.Duration, error) {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	start := time.Now()
	deadline := start.Add(d)
	for w := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if total > 0 {
					if next.Add(1) > total {
						return
					}
				} else {
					if !time.Now().Before(deadline) {
						return
					}
					next.Add(1)
				}
				if err := op(ctx, w); err != nil {
					errMu.Lock()
					if first == nil {
						first = err
					}
					errMu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	n := next.Load()
	if total > 0 {
		n = min(n, total)
	}
	if first == nil {
		first = ctx.Err()
	}
	return n, elapsed, first
}

// newAtomicSeq returns a function that returns prefix1, prefix2, …: a new
// key on every call, from any goroutine.
func newAtomicSeq(prefix string) func() string {
	var seq atomic.Int64
	return func() string { return prefix + strconv.FormatInt(seq.Add(1), 10) }
}
