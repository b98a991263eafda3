package redis

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

// ErrWatchUnsupported is WatchKey's error for a client whose shard channels
// the store cannot follow (a *redis.Ring, or a client type of its own): the
// engine polls instead.
var ErrWatchUnsupported = errors.New("dedup/redis: this client cannot watch keys (a Ring?): waiters poll")

// watchLinger is how long the subscription connection stays open with no
// key watched, so that the waits of a busy consumer share one connection
// instead of dialling one each.
const watchLinger = 30 * time.Second

// watchPing is how long the subscription connection may be silent before
// it is pinged; a ping unanswered that long ends the connection.
const watchPing = 30 * time.Second

var _ dedup.KeyWatcher = (*Store)(nil)

// WatchKey lets the engine wake a waiter of dedup.Config.InProgressWait:
// the waiter is woken when the record of key is completed or released, which the
// completing and releasing scripts announce on the shard channel named
// like the record's Redis key (SPUBLISH; on a Cluster it hashes to the
// record's slot). It returns at once; one subscription connection per
// store (per Cluster master) carries every watched key, subscribed once
// per key (SSUBSCRIBE) however many waiters watch it, and unsubscribed when
// the last one stops; the connection is opened at the first watch and
// closed after 30s without any, or by Close. The subscription is confirmed
// asynchronously: its confirmation wakes the waiters, whose claim then
// covers what happened before it. A lost connection is dialled again and
// its keys subscribed again (which wakes their waiters), as go-redis does;
// on a Cluster, a key whose slot moved (a failover) is subscribed on its
// new master. A *redis.Ring cannot be watched (ErrWatchUnsupported).
// Cost: no round trip on the waiter's path; one SSUBSCRIBE and one
// SUNSUBSCRIBE per key watched, on the subscription connection.
func (s *Store) WatchKey(_ context.Context, key string, since time.Time) (<-chan struct{}, func(), error) {
	if s.watch == nil {
		return nil, nil, ErrWatchUnsupported
	}
	return s.watch.Watch(s.prefix+key, since)
}

// Close closes the store's subscription connection, if any, and waits for
// its goroutines to end; the watches still open are closed (their waiters
// poll), and later ones are refused. It does not close the client; the
// store's other methods keep working. Calling it more than once is safe.
func (s *Store) Close() error {
	if s.watch != nil {
		s.watch.Close()
	}
	return nil
}

// newWatchHub returns the hub of a store's watches on client, or nil when
// the client's shard channels cannot be followed.
func newWatchHub(client goredis.UniversalClient, linger time.Duration) *storekit.WatchHub {
	t := &subscriber{client: client}
	switch c := client.(type) {
	case *goredis.Client:
	case *goredis.ClusterClient:
		t.cluster = c
	default:
		return nil
	}
	return storekit.NewWatchHub(t.run, linger)
}

// subscriber is the transport of a store's watches: one PubSub (one
// connection) per master, each read by a goroutine of its own.
type subscriber struct {
	client  goredis.UniversalClient
	cluster *goredis.ClusterClient // nil: one server
}

// route returns the address of the master holding channel's slot ("" for
// a single server).
func (t *subscriber) route(ctx context.Context, channel string) (string, error) {
	if t.cluster == nil {
		return "", nil
	}
	c, err := t.cluster.MasterForKey(ctx, channel)
	if err != nil {
		return "", err
	}
	return c.Options().Addr, nil
}

// reload returns what reads a Cluster's map of slots again (in the
// background), or nil for one server.
func (t *subscriber) reload(ctx context.Context) func() {
	if t.cluster == nil {
		return nil
	}
	return func() { t.cluster.ReloadState(ctx) }
}

// reloadSlots reads a Cluster's map of slots again, in the background.
func (t *subscriber) reloadSlots(ctx context.Context) {
	if t.cluster != nil {
		t.cluster.ReloadState(ctx)
	}
}

// run subscribes to what h wants, on one subscription group per master.
func (t *subscriber) run(ctx context.Context, h *storekit.WatchHub) {
	groups := map[string]*subGroup{} // by master address
	of := map[string]*subGroup{}     // by channel
	// moved holds, for a while, the server a channel's slot moved away
	// from: until the Cluster's map of slots, read again, shows another
	// master, subscribing there would reach a replica, which does not
	// hear the new master's announcements.
	moved := map[string]movedFrom{}
	broken := make(chan brokenGroup)
	defer func() {
		for _, g := range groups {
			g.close()
		}
	}()
	idle := time.NewTimer(h.Linger())
	defer idle.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	attempt := 0
	for {
		want := map[string]bool{}
		for _, name := range h.Wanted() {
			want[name] = true
		}
		for name := range moved {
			if !want[name] {
				delete(moved, name)
			}
		}
		for name, g := range of {
			if want[name] {
				continue
			}
			g.unsubscribe(ctx, name) // the connection stays for the next wait
			delete(of, name)
			h.Unsubscribed(name)
		}
		failed := false
		for name := range want {
			if of[name] != nil {
				continue
			}
			addr, err := t.route(ctx, name)
			if m, ok := moved[name]; ok && err == nil && m.addr == addr && time.Now().Before(m.until) {
				err = errStaleSlots
				t.reloadSlots(ctx)
			}
			if err != nil {
				failed = true
				continue
			}
			delete(moved, name)
			g := groups[addr]
			if g == nil {
				g = newSubGroup(ctx, addr, t.client.SSubscribe(ctx), t.reload(ctx), h, broken)
				groups[addr] = g
			}
			g.subscribe(ctx, name)
			of[name] = g
		}
		if failed {
			retry.Reset(storekit.WatchBackoff(attempt))
			attempt++
		}
		select {
		case <-ctx.Done():
			return
		case <-h.Changed():
			idle.Reset(h.Linger())
		case b := <-broken:
			// Its server dropped or refused a subscription (a slot that
			// moved, an ACL) or went silent: subscribe its channels again
			// from scratch, after the Cluster's map of slots is read again.
			g := b.g
			if groups[g.addr] == g {
				delete(groups, g.addr)
			}
			for _, name := range g.close() {
				if of[name] == g {
					delete(of, name)
					h.Inactive(name)
					if b.moved {
						moved[name] = movedFrom{g.addr, time.Now().Add(movedFor)}
					}
				}
			}
			t.reloadSlots(ctx)
			retry.Reset(storekit.WatchBackoff(attempt))
			attempt++
		case <-retry.C:
		case <-idle.C:
			if h.ExitIfIdle() {
				return
			}
			for addr, g := range groups { // a master no key waits on for a while
				if g.empty() {
					g.close()
					delete(groups, addr)
				}
			}
			idle.Reset(h.Linger())
		}
	}
}

// errStaleSlots: the Cluster's map of slots still shows the master a
// channel's slot moved away from.
var errStaleSlots = errors.New("dedup/redis: the map of slots is not read again yet")

// movedFor is how long a slot that moved away from a server is not
// subscribed there again (unless the map of slots still says so then).
const movedFor = 10 * time.Second

type movedFrom struct {
	addr  string
	until time.Time
}

// brokenGroup is a group whose subscriptions must start again elsewhere;
// moved: its server said a slot moved away.
type brokenGroup struct {
	g     *subGroup
	moved bool
}

// subGroup is one PubSub (one connection, to one master) and the channels
// subscribed on it.
type subGroup struct {
	addr   string
	ps     *goredis.PubSub
	reload func() // reads a Cluster's map of slots again; nil for one server

	mu      sync.Mutex
	names   map[string]bool
	unsub   map[string]int // SUNSUBSCRIBEs sent, not yet confirmed
	closing chan struct{}
	closed  bool
	done    chan struct{} // the reading goroutine ended
}

func newSubGroup(ctx context.Context, addr string, ps *goredis.PubSub, reload func(), h *storekit.WatchHub, broken chan<- brokenGroup) *subGroup {
	g := &subGroup{addr: addr, ps: ps, reload: reload, names: map[string]bool{}, unsub: map[string]int{},
		closing: make(chan struct{}), done: make(chan struct{})}
	go g.read(ctx, h, broken)
	return g
}

// subscribe sends SSUBSCRIBE (dialling first if needed); go-redis keeps
// the channel even when the write fails, and subscribes it again on its
// next connection.
func (g *subGroup) subscribe(ctx context.Context, name string) {
	g.mu.Lock()
	g.names[name] = true
	g.mu.Unlock()
	_ = g.ps.SSubscribe(ctx, name)
}

func (g *subGroup) unsubscribe(ctx context.Context, name string) {
	g.mu.Lock()
	delete(g.names, name)
	g.unsub[name]++
	g.mu.Unlock()
	_ = g.ps.SUnsubscribe(ctx, name)
}

func (g *subGroup) empty() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.names) == 0
}

func (g *subGroup) channels() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]string, 0, len(g.names))
	for name := range g.names {
		out = append(out, name)
	}
	return out
}

// expected reports whether a sunsubscribe of name is one the group asked
// for.
func (g *subGroup) expected(name string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.unsub[name] == 0 {
		return false
	}
	if g.unsub[name]--; g.unsub[name] == 0 {
		delete(g.unsub, name)
	}
	return true
}

// close closes the connection, waits for the reading goroutine, and
// returns the channels that were subscribed.
func (g *subGroup) close() []string {
	g.mu.Lock()
	if !g.closed {
		g.closed = true
		close(g.closing)
	}
	g.mu.Unlock()
	_ = g.ps.Close()
	<-g.done
	return g.channels()
}

// read turns what the connection receives into the hub's events until the
// group is closed or broken.
func (g *subGroup) read(ctx context.Context, h *storekit.WatchHub, broken chan<- brokenGroup) {
	defer close(g.done)
	report := func(moved bool) {
		select {
		case broken <- brokenGroup{g, moved}:
		case <-g.closing:
		}
	}
	attempt, pinged := 0, false
	for {
		msg, err := g.ps.ReceiveTimeout(ctx, watchPing)
		select {
		case <-g.closing:
			return
		default:
		}
		var netErr net.Error
		var redisErr goredis.Error
		switch {
		case err == nil:
			attempt, pinged = 0, false
		case errors.As(err, &redisErr):
			// An error reply: a SSUBSCRIBE refused (MOVED, NOPERM).
			report(strings.HasPrefix(err.Error(), "MOVED"))
			return
		case errors.As(err, &netErr) && netErr.Timeout() && !pinged:
			pinged = true
			_ = g.ps.Ping(ctx)
			continue
		case errors.As(err, &netErr) && netErr.Timeout():
			report(false) // silent past a ping: start again on a new connection
			return
		default:
			// The connection broke: go-redis dials again and subscribes
			// every channel again (at the latest on the next receive),
			// whose confirmations make them active again. On a Cluster
			// the server may be gone for good (a failover): the new
			// connection goes to the slot's master as the Cluster's map
			// of slots, read again, tells.
			for _, name := range g.channels() {
				h.Inactive(name)
			}
			if g.reload != nil {
				g.reload()
			}
			select {
			case <-g.closing:
				return
			case <-time.After(storekit.WatchBackoff(attempt)):
			}
			attempt++
			continue
		}
		switch m := msg.(type) {
		case *goredis.Subscription:
			switch m.Kind {
			case "ssubscribe":
				h.Active(m.Channel)
			case "sunsubscribe":
				if !g.expected(m.Channel) {
					// The server dropped it: its slot moved away (a
					// failover); subscribe it again where it now lives.
					h.Inactive(m.Channel)
					report(true)
					return
				}
			}
		case *goredis.Message:
			h.Notify(m.Channel)
		}
	}
}
