package postgres_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// countedStore counts answered claims; embedding keeps WatchKey.
type countedStore struct {
	*postgres.Store
	claims atomic.Int64
}

func (s *countedStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, key, fp, lease)
	s.claims.Add(1)
	return res, err
}

// watchEngine returns an engine whose waits can only be ended by a wake
// (the fallback poll is an hour).
func watchEngine(t *testing.T, store dedup.Store) *dedup.Engine {
	t.Helper()
	e, err := dedup.NewEngine(dedup.Config{Store: store, InProgressWait: 5 * time.Minute, InProgressFallback: time.Hour,
		Lease: 5 * time.Minute, CompleteRetries: 20})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// notifyStore returns a migrated store with Config.Notify, closed after
// the test.
func notifyStore(t *testing.T) *postgres.Store {
	t.Helper()
	s := newStore(t, postgres.Config{Notify: true})
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// heldKey is a holder of a key and copies waiting for it.
type heldKey struct {
	released chan struct{}
	once     sync.Once
	holder   chan error
	answers  chan dedup.ClaimResult
	errs     chan error
	n        int
}

// holdKey runs a holder of key (whose work blocks until release, then
// returns holderErr or "done") and n copies waiting for it; it returns
// once every copy watches the key.
func holdKey(t *testing.T, e *dedup.Engine, key string, n int, holderErr error, watching func() int) *heldKey {
	t.Helper()
	call := dedup.Call{Scope: "watch", Key: key}
	h := &heldKey{released: make(chan struct{}), holder: make(chan error, 1), answers: make(chan dedup.ClaimResult, n), errs: make(chan error, n), n: n}
	entered := make(chan struct{})
	go func() {
		_, err := e.Do(context.Background(), call, func(context.Context) ([]byte, error) {
			close(entered)
			<-h.released
			return []byte("done"), holderErr
		})
		h.holder <- err
	}()
	recvBounded(t, "the holder to run", entered)
	before := watching()
	for range n {
		go func() {
			res, err := e.Do(context.Background(), call, func(context.Context) ([]byte, error) { return []byte("copy"), nil })
			h.answers <- res
			h.errs <- err
		}()
	}
	waitUntil(t, "every copy to watch the key", func() bool { return watching() >= before+n })
	return h
}

func (h *heldKey) release() { h.once.Do(func() { close(h.released) }) }

// duplicates releases the holder and checks that it completed and every
// copy answered its duplicate.
func (h *heldKey) duplicates(t *testing.T) {
	t.Helper()
	h.release()
	if err := recvBounded(t, "the holder", h.holder); err != nil {
		t.Fatalf("holder: %v", err)
	}
	for range h.n {
		res, err := recvBounded(t, "a copy", h.answers), recvBounded(t, "a copy's error", h.errs)
		if err != nil || res.Outcome != dedup.Duplicate || string(res.Result) != "done" {
			t.Errorf("copy: %v %q %v, want the holder's duplicate", res.Outcome, res.Result, err)
		}
	}
}

func recvBounded[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(2 * time.Minute):
		t.Fatalf("waited two minutes for %s", what)
		panic("unreachable")
	}
}

// waitUntil polls cond (bounded); it waits for other goroutines, it is
// not a clock.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// listeners returns the pids of the backends whose last statement was a
// LISTEN or an UNLISTEN (the stores' listening connections).
func listeners(t *testing.T) []int32 {
	t.Helper()
	rows, err := pool.Query(testCtx(t), `SELECT pid FROM pg_stat_activity
		WHERE (query LIKE 'LISTEN %' OR query LIKE 'UNLISTEN %') AND pid <> pg_backend_pid()`)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

// listenerGoroutines counts the goroutines of the stores' listeners.
func listenerGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "stores/postgres.(*listener)") {
			count++
		}
	}
	return count
}

// Ten copies wait for a holder on a store with Notify: the holder's
// completion (pg_notify in its statement) wakes them, through one
// listening connection, and they answer its duplicate; nothing else could
// have woken them. After Close the connection and its goroutine are gone.
func TestNotifiedWaitersAnswerTheCompletion(t *testing.T) {
	store := notifyStore(t)
	counted := &countedStore{Store: store}
	e := watchEngine(t, counted)
	h := holdKey(t, e, "ten", 10, nil, func() int { return postgres.OpenWatches(store) })
	waitUntil(t, "the listening connection", func() bool { return len(listeners(t)) == 1 })
	h.duplicates(t)
	if n := counted.claims.Load(); n > 1+3*10 {
		t.Errorf("%d claims for one holder and ten copies, want at most 31", n)
	}
	_ = store.Close()
	waitUntil(t, "the listener's goroutine to end", func() bool { return listenerGoroutines() == 0 })
	waitUntil(t, "the listening backend to end", func() bool { return len(listeners(t)) == 0 })
}

// A release is announced too: the waiting copy wins the released key and
// runs its work.
func TestNotifiedWaiterWinsAReleasedKey(t *testing.T) {
	store := notifyStore(t)
	e := watchEngine(t, store)
	h := holdKey(t, e, "released", 1, errors.New("gateway timeout"), func() int { return postgres.OpenWatches(store) })
	h.release()
	if err := recvBounded(t, "the holder", h.holder); err == nil {
		t.Fatal("the holder succeeded")
	}
	res, err := recvBounded(t, "the copy", h.answers), recvBounded(t, "the copy's error", h.errs)
	if err != nil || res.Outcome != dedup.Acquired || string(res.Result) != "copy" {
		t.Fatalf("copy: %v %q %v, want it to win the released key", res.Outcome, res.Result, err)
	}
}

// A forged notification (anyone may NOTIFY) costs the copy one claim,
// which finds the key in progress: it waits on and answers the real
// completion.
func TestForgedNotificationCostsAClaim(t *testing.T) {
	store := notifyStore(t)
	counted := &countedStore{Store: store}
	e := watchEngine(t, counted)
	h := holdKey(t, e, "forged", 1, nil, func() int { return postgres.OpenWatches(store) })
	// Holder, copy, and the claim the LISTEN's confirmation prompts.
	waitUntil(t, "the copy's claim once listening", func() bool { return counted.claims.Load() == 3 })
	if _, err := pool.Exec(testCtx(t), `SELECT pg_notify($1, 'completed, honest')`, postgres.ChannelOf("watch:forged")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the claim the forged notification prompts", func() bool { return counted.claims.Load() == 4 })
	h.duplicates(t)
	if n := counted.claims.Load(); n != 5 {
		t.Errorf("%d claims, want 5 (holder, copy, listening, forged, completed)", n)
	}
}

// The listening backend is terminated (pg_terminate_backend) while copies
// wait, and the holder completes: the connection is opened again, its
// channels listened to again, which wakes the copies (the completion's
// notification may have been lost with the connection); they answer it.
// After Close nothing is left.
func TestWaitersSurviveATerminatedListener(t *testing.T) {
	store := notifyStore(t)
	e := watchEngine(t, store)
	h := holdKey(t, e, "terminated", 3, nil, func() int { return postgres.OpenWatches(store) })
	var pids []int32
	waitUntil(t, "the listening connection", func() bool { pids = listeners(t); return len(pids) == 1 })
	var ok bool
	if err := pool.QueryRow(testCtx(t), `SELECT pg_terminate_backend($1)`, pids[0]).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend: %v %v", ok, err)
	}
	// Until its backend has exited, the terminated connection may still
	// pass on the completion's notification, the copies would answer
	// through it, and with nothing left to watch no connection would be
	// opened again (seen under load).
	waitUntil(t, "the terminated backend to exit", func() bool {
		var n int
		if err := pool.QueryRow(testCtx(t), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pids[0]).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	h.duplicates(t)
	waitUntil(t, "a new listening connection", func() bool { p := listeners(t); return len(p) == 1 && p[0] != pids[0] })
	_ = store.Close()
	waitUntil(t, "the listener's goroutine to end", func() bool { return listenerGoroutines() == 0 })
	waitUntil(t, "the listening backend to end", func() bool { return len(listeners(t)) == 0 })
}

// Notify needs a pool (its configuration opens the listening connection);
// without Notify, WatchKey refuses and waiters poll.
func TestNotifyConfiguration(t *testing.T) {
	conn, err := pgx.Connect(testCtx(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := postgres.New(context.Background(), postgres.Config{DB: conn, Notify: true}); !errors.Is(err, postgres.ErrNotifyNeedsPool) {
		t.Errorf("New(conn, Notify): %v, want ErrNotifyNeedsPool", err)
	}
	s := newStore(t, postgres.Config{})
	if _, _, err := s.WatchKey(testCtx(t), "k", time.Now()); !errors.Is(err, postgres.ErrNotifyOff) {
		t.Errorf("WatchKey without Notify: %v, want ErrNotifyOff", err)
	}
}
