package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// recordingTracer is a dedup.Tracer that writes what each call's trace
// receives as lines, and marks the call's context.
type recordingTracer struct {
	mu    sync.Mutex
	lines []string
	nilOf string // StartCall returns a nil CallTrace for this key
}

type ctxMark struct{}

func (r *recordingTracer) StartCall(ctx context.Context, call dedup.Call) (context.Context, dedup.CallTrace) {
	r.add("start " + call.Key)
	if call.Key == r.nilOf {
		return ctx, nil
	}
	return context.WithValue(ctx, ctxMark{}, call.Key), &recordingCall{r, call.Key}
}

func (r *recordingTracer) add(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, line)
}

func (r *recordingTracer) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.lines)
}

type recordingCall struct {
	r   *recordingTracer
	key string
}

func (c *recordingCall) ObserveDecision(d dedup.Decision) {
	c.r.add(c.key + " decision " + string(d.Event))
}
func (c *recordingCall) ObserveStoreOp(op string, _ time.Duration, err error) {
	c.r.add(fmt.Sprintf("%s op %s %v", c.key, op, err))
}
func (c *recordingCall) EndCall(res dedup.ClaimResult, err error) {
	c.r.add(fmt.Sprintf("%s end %s %v", c.key, res.Outcome, err))
}

// Config.Tracer: each call is started once with its context going on to
// the work, its decisions and its claim and complete reach its own trace,
// and EndCall gets what Do returns, also when the work panics. A nil
// CallTrace is allowed.
func TestTracerFollowsEachCall(t *testing.T) {
	tracer := &recordingTracer{nilOf: "ORDER-untraced"}
	e := newEngine(t, dedup.Config{Store: memstore.New(nil), Tracer: tracer, DisableHeartbeat: true})
	ctx := context.Background()
	work := func(ctx context.Context) ([]byte, error) {
		if ctx.Value(ctxMark{}) == nil {
			return nil, errors.New("the work's context does not derive from StartCall's")
		}
		return []byte("ok"), nil
	}
	for _, key := range []string{"ORDER-1", "ORDER-1"} {
		if _, err := e.Do(ctx, dedup.Call{Scope: "s", Key: key}, work); err != nil {
			t.Fatal(err)
		}
	}
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the work's panic", p)
			}
		}()
		_, _ = e.Do(ctx, dedup.Call{Scope: "s", Key: "ORDER-2"}, func(context.Context) ([]byte, error) { panic("boom") })
	}()
	if _, err := e.Do(ctx, dedup.Call{Scope: "s", Key: "ORDER-untraced"}, func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"start ORDER-1", "ORDER-1 op claim <nil>", "ORDER-1 decision claim_won", "ORDER-1 op complete <nil>",
		"ORDER-1 decision completed", "ORDER-1 end acquired <nil>",
		"start ORDER-1", "ORDER-1 op claim <nil>", "ORDER-1 decision skip_duplicate", "ORDER-1 end duplicate <nil>",
		"start ORDER-2", "ORDER-2 op claim <nil>", "ORDER-2 decision claim_won", "ORDER-2 op release <nil>",
		"ORDER-2 decision released", "ORDER-2 end outcome(0) dedup: the work panicked",
		"start ORDER-untraced",
	}
	if got := tracer.got(); !slices.Equal(got, want) {
		t.Fatalf("trace lines:\n%q\nwant\n%q", got, want)
	}
}
