package dedup_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// watchedStore is a memory store with the WatchKey capability
// (dedup.KeyWatcher) driven by the test: wake and end act on the watches of
// a key, as a store's subscription would.
type watchedStore struct {
	dedup.Store
	refuse bool // WatchKey fails

	mu      sync.Mutex
	watches map[string]map[chan struct{}]bool // open watches per key
	since   []time.Time                       // WatchKey's since, per call
	sent    []time.Time                       // when each Claim arrived
	stops   int
}

func newWatchedStore(clock dedup.Clock) *watchedStore {
	return &watchedStore{Store: memstore.New(clock), watches: map[string]map[chan struct{}]bool{}}
}

func (s *watchedStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	s.mu.Lock()
	s.sent = append(s.sent, time.Now())
	s.mu.Unlock()
	return s.Store.Claim(ctx, key, fp, lease)
}

func (s *watchedStore) WatchKey(_ context.Context, key string, since time.Time) (<-chan struct{}, func(), error) {
	if s.refuse {
		return nil, nil, errors.New("no subscription")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.since = append(s.since, since)
	c := make(chan struct{}, 1)
	if s.watches[key] == nil {
		s.watches[key] = map[chan struct{}]bool{}
	}
	s.watches[key][c] = true
	var once sync.Once
	return c, func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.stops++
			delete(s.watches[key], c)
		})
	}, nil
}

// wake wakes every watch of key (a real announcement, or a forged one).
func (s *watchedStore) wake(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.watches[key] {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// end closes every watch of key, as a store that was closed does.
func (s *watchedStore) end(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.watches[key] {
		close(c)
		delete(s.watches[key], c)
	}
}

func (s *watchedStore) counts() (claims, open, stops int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.watches {
		open += len(w)
	}
	return len(s.sent), open, s.stops
}

// watchKey is the scoped key of watchCall.
var watchCall = dedup.Call{Scope: "charge", Key: "ORDER-003"}

const watchKey = "charge:ORDER-003"

// watchSetup returns an engine on a watched store whose key is held by a
// call that completes with "charged" once release is closed, and a copy
// waiting for it; it returns once the copy is in its pause.
func watchSetup(t *testing.T, store *watchedStore, clock *fakeclock.Clock, holderErr error) (e *dedup.Engine, release chan struct{}, holder <-chan error, copyDone <-chan watchResult, ran *bool) {
	t.Helper()
	e, err := dedup.NewEngine(dedup.Config{Store: store, Clock: clock, InProgressWait: time.Minute,
		InProgressPoll: 100 * time.Millisecond, DisableHeartbeat: true})
	if err != nil {
		t.Fatal(err)
	}
	release = make(chan struct{})
	entered, hold := make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), watchCall, func(context.Context) ([]byte, error) {
			close(entered)
			<-release
			return []byte("charged"), holderErr
		})
		hold <- err
	}()
	recv(t, "the holder's work to start", entered)
	ran = new(bool)
	out := make(chan watchResult, 1)
	go func() {
		res, err := e.Do(context.Background(), watchCall, func(context.Context) ([]byte, error) {
			*ran = true
			return []byte("charged by the copy"), nil
		})
		out <- watchResult{res, err}
	}()
	waitForTimers(t, clock, 2) // the holder's lease deadline, the copy's pause
	return e, release, hold, out, ran
}

type watchResult struct {
	res dedup.ClaimResult
	err error
}

// waitForTimers waits (bounded) until clock has n pending timers.
func waitForTimers(t *testing.T, clock *fakeclock.Clock, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := clock.WaitForTimers(ctx, n); err != nil {
		t.Fatalf("waited a minute for %d timers: %v", n, err)
	}
}

// A copy waiting on a store that wakes waiters claims as soon as it is
// woken: it answers the holder's completion without the clock moving (no
// poll pause), with two claims (the first, and the one the wake prompted),
// and it ends its watch.
func TestWaitWokenByTheStoreClaimsAtOnce(t *testing.T) {
	clock := fakeclock.New(epoch)
	store := newWatchedStore(clock)
	_, release, holder, copyDone, ran := watchSetup(t, store, clock, nil)
	if _, open, _ := store.counts(); open != 1 {
		t.Fatalf("%d watches open while the copy waits, want 1", open)
	}
	close(release)
	if err := recv(t, "the holder to complete", holder); err != nil {
		t.Fatal(err)
	}
	store.wake(watchKey)
	got := recv(t, "the woken copy to answer", copyDone)
	if got.err != nil || got.res.Outcome != dedup.Duplicate || string(got.res.Result) != "charged" || *ran {
		t.Fatalf("woken copy: %+v %v (work ran: %v), want the holder's duplicate", got.res, got.err, *ran)
	}
	claims, open, stops := store.counts()
	if claims != 3 || open != 0 || stops != 1 {
		t.Errorf("%d claims, %d watches open, %d stops; want 3 (holder, copy, after the wake), 0, 1", claims, open, stops)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	// The watch covers changes since the copy's first claim was sent.
	if len(store.since) != 1 || store.since[0].After(store.sent[1]) || store.since[0].Before(store.sent[0]) {
		t.Errorf("WatchKey since %v, want at most the copy's first claim (%v) and after the holder's (%v)", store.since, store.sent[1], store.sent[0])
	}
}

// A wake is not an outcome: a forged (or late) one makes the copy claim
// once more, find the key still in progress and go on waiting; its work
// does not run and it answers the real completion.
func TestForgedWakeCostsOneClaimNeverAnEffect(t *testing.T) {
	clock := fakeclock.New(epoch)
	store := newWatchedStore(clock)
	_, release, holder, copyDone, ran := watchSetup(t, store, clock, nil)
	store.wake(watchKey) // the holder is still running
	waitForWatch(t, "the forged wake's claim", func() bool { c, _, _ := store.counts(); return c == 3 })
	waitForTimers(t, clock, 2) // back in its pause
	select {
	case got := <-copyDone:
		t.Fatalf("the copy answered a forged wake: %+v %v", got.res, got.err)
	default:
	}
	close(release)
	if err := recv(t, "the holder to complete", holder); err != nil {
		t.Fatal(err)
	}
	store.wake(watchKey)
	got := recv(t, "the copy to answer", copyDone)
	if got.err != nil || got.res.Outcome != dedup.Duplicate || *ran {
		t.Fatalf("copy: %+v %v (work ran: %v), want a duplicate", got.res, got.err, *ran)
	}
	if claims, _, _ := store.counts(); claims != 4 {
		t.Errorf("%d claims, want 4 (holder, copy, forged wake, real wake)", claims)
	}
}

// With no wake at all (a lost announcement), the copy still answers: it
// claims every InProgressFallback (1s by default), not every
// InProgressPoll.
func TestLostWakeIsCaughtByTheFallbackPoll(t *testing.T) {
	clock := fakeclock.New(epoch)
	store := newWatchedStore(clock)
	_, release, holder, copyDone, _ := watchSetup(t, store, clock, nil)
	clock.Advance(999 * time.Millisecond)
	if claims, _, _ := store.counts(); claims != 2 {
		t.Fatalf("%d claims before the fallback's pause passed, want 2", claims)
	}
	clock.Advance(time.Millisecond)
	waitForWatch(t, "the fallback claim", func() bool { c, _, _ := store.counts(); return c == 3 })
	waitForTimers(t, clock, 2)
	close(release)
	if err := recv(t, "the holder to complete", holder); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	got := recv(t, "the copy to answer", copyDone)
	if got.err != nil || got.res.Outcome != dedup.Duplicate {
		t.Fatalf("copy: %+v %v, want a duplicate", got.res, got.err)
	}
	if _, open, stops := store.counts(); open != 0 || stops != 1 {
		t.Errorf("%d watches open, %d stops, want 0 and 1", open, stops)
	}
}

// A watch the store ends (the store was closed) wakes the copy once, and
// the copy then polls from InProgressPoll, as without the capability; a
// released key is won by the copy, whose work runs.
func TestEndedWatchFallsBackToPolling(t *testing.T) {
	clock := fakeclock.New(epoch)
	store := newWatchedStore(clock)
	_, release, holder, copyDone, ran := watchSetup(t, store, clock, errors.New("gateway timeout"))
	store.end(watchKey)
	waitForWatch(t, "the claim after the watch ended", func() bool { c, _, _ := store.counts(); return c == 3 })
	waitForTimers(t, clock, 2)
	close(release)
	if err := recv(t, "the holder to fail", holder); err == nil {
		t.Fatal("the holder succeeded")
	}
	clock.Advance(100 * time.Millisecond) // InProgressPoll
	got := recv(t, "the copy to win the released key", copyDone)
	if got.err != nil || got.res.Outcome != dedup.Acquired || !*ran {
		t.Fatalf("copy: %+v %v (work ran: %v), want it to win the released key and run", got.res, got.err, *ran)
	}
}

// A store that cannot watch (WatchKey fails) is polled as without the
// capability: the copy claims after InProgressPoll.
func TestRefusedWatchPolls(t *testing.T) {
	clock := fakeclock.New(epoch)
	store := newWatchedStore(clock)
	store.refuse = true
	_, release, holder, copyDone, _ := watchSetup(t, store, clock, nil)
	close(release)
	if err := recv(t, "the holder to complete", holder); err != nil {
		t.Fatal(err)
	}
	clock.Advance(100 * time.Millisecond)
	got := recv(t, "the copy to answer", copyDone)
	if got.err != nil || got.res.Outcome != dedup.Duplicate {
		t.Fatalf("copy: %+v %v, want a duplicate after one InProgressPoll", got.res, got.err)
	}
}

// A wait that ends at its bound or with its context ends its watch too.
func TestWatchEndsWithTheWait(t *testing.T) {
	clock := fakeclock.New(epoch)
	store := newWatchedStore(clock)
	e, err := dedup.NewEngine(dedup.Config{Store: store, Clock: clock, InProgressWait: time.Minute, DisableHeartbeat: true})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release)
	entered := make(chan struct{})
	go func() {
		_, _ = e.Do(context.Background(), watchCall, func(context.Context) ([]byte, error) {
			close(entered)
			<-release
			return nil, nil
		})
	}()
	recv(t, "the holder's work to start", entered)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(ctx, watchCall, func(context.Context) ([]byte, error) { return nil, nil })
		done <- err
	}()
	waitForTimers(t, clock, 2)
	cancel()
	if err := recv(t, "the cancelled copy", done); !errors.Is(err, dedup.ErrInProgress) {
		t.Fatalf("cancelled copy: %v, want ErrInProgress", err)
	}
	if _, open, stops := store.counts(); open != 0 || stops != 1 {
		t.Errorf("%d watches open, %d stops after the wait ended, want 0 and 1", open, stops)
	}
}

func TestInProgressFallbackValidated(t *testing.T) {
	_, err := dedup.NewEngine(dedup.Config{Store: memstore.New(nil), InProgressFallback: -time.Second})
	if !errors.Is(err, dedup.ErrInvalidDuration) {
		t.Fatalf("negative InProgressFallback: %v, want ErrInvalidDuration", err)
	}
}

// waitForWatch polls cond until it holds (bounded): it waits for the engine's
// goroutines, it is not a clock.
func waitForWatch(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
