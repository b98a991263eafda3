package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Tests of the harness itself: its waits must end, whatever the code under
// test does.

// recordingTB is a testing.TB whose failures and cleanups are recorded
// instead of acted on, so a test can watch a helper fail. Fatalf and
// FailNow end the calling goroutine, as testing.T's do.
type recordingTB struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
	failures []string
}

func (r *recordingTB) Helper() {}

func (r *recordingTB) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

func (r *recordingTB) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *recordingTB) FailNow() { runtime.Goexit() }

// runCleanups runs the recorded cleanups, last first, and reports whether
// they returned within limit.
func (r *recordingTB) runCleanups(limit time.Duration) bool {
	r.mu.Lock()
	cleanups := r.cleanups
	r.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()
	select {
	case <-done:
		return true
	case <-time.After(limit):
		return false
	}
}

func (r *recordingTB) failed() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.failures, "; ")
}

var errSubscribe = errors.New("subscribe refused")

// refusingSubscriber refuses every subscription, so router.Run fails at
// start.
type refusingSubscriber struct{}

func (refusingSubscriber) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	return nil, errSubscribe
}
func (refusingSubscriber) Close() error { return nil }

// A router whose Run fails at start fails the test with Run's error, and the
// cleanup returns at once. It used to take Run's error from the channel
// for the t.Fatalf and then wait on the same channel again in the cleanup:
// the suite hung until the 20-minute go test timeout.
func TestRunRouterFailingAtStartFailsAndDoesNotHang(t *testing.T) {
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router.AddConsumerHandler("charge-orders", "orders", refusingSubscriber{}, func(*message.Message) error { return nil })
	tb := &recordingTB{TB: t}
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		runRouter(tb, router)
	}()
	select {
	case <-returned:
	case <-time.After(routerLimit + 10*time.Second):
		t.Fatalf("runRouter did not return within %v of a router that cannot start", routerLimit+10*time.Second)
	}
	if !tb.runCleanups(5 * time.Second) {
		t.Fatal("runRouter's cleanup still waited 5s after Run had failed: it would hang the suite")
	}
	if got := tb.failed(); !strings.Contains(got, "router stopped at once") || !strings.Contains(got, errSubscribe.Error()) {
		t.Errorf("failures %q, want one saying the router stopped at once, with Run's error", got)
	}
}
