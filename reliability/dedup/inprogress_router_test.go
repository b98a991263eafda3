package dedup_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// redeliveryDelay stands for the broker's redelivery delay of a nacked
// message (an SQS visibility timeout, a Kafka consumer's retry backoff):
// GoChannel would redeliver at once.
const redeliveryDelay = 10 * time.Millisecond

// effectTime is how long the charge takes once the holder goes on (a
// payment gateway's latency), during which copies are nacked or wait.
const effectTime = 50 * time.Millisecond

// copiesRun is what one router run of ten copies of ORDER-003 showed.
type copiesRun struct {
	name                            string
	charges, nacks, redeliveries    int
	inProgress, waited, claims      int
	routerErrors, routerInfoInProgr int
	maxWait                         time.Duration
}

// copiesObserver records the decisions of a run and, as the run's
// dedup.Tracer, closes allClaimed once want distinct messages have sent
// their first claim.
type copiesObserver struct {
	mu         sync.Mutex
	want       int
	claimed    map[string]bool
	allClaimed chan struct{}
	all        []dedup.Decision
	claimOps   int
}

func (o *copiesObserver) ObserveDecision(d dedup.Decision) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.all = append(o.all, d)
}

func (o *copiesObserver) ObserveStoreOp(op string, _ time.Duration, _ error) {
	if op == "claim" {
		o.mu.Lock()
		o.claimOps++
		o.mu.Unlock()
	}
}

func (o *copiesObserver) StartCall(ctx context.Context, call dedup.Call) (context.Context, dedup.CallTrace) {
	return ctx, copyTrace{o, call.MessageUUID}
}

// copyTrace follows one delivery of a copy.
type copyTrace struct {
	o    *copiesObserver
	uuid string
}

func (c copyTrace) ObserveDecision(dedup.Decision)   {}
func (c copyTrace) EndCall(dedup.ClaimResult, error) {}
func (c copyTrace) ObserveStoreOp(op string, _ time.Duration, _ error) {
	c.o.mu.Lock()
	defer c.o.mu.Unlock()
	if op == "claim" && !c.o.claimed[c.uuid] {
		c.o.claimed[c.uuid] = true
		if len(c.o.claimed) == c.o.want {
			close(c.o.allClaimed)
		}
	}
}

// runTenCopies sends ten copies of ORDER-003 at once through a Watermill
// router with the dedup middleware on a real Redis. The copy that wins the
// claim holds the key until every copy has sent its first claim, so that
// each of the nine others finds it in progress (and is nacked, or waits),
// then charges for effectTime.
// It returns the counts.
func runTenCopies(t *testing.T, name string, wait time.Duration, quietLogger, autoPipeline bool) copiesRun {
	t.Helper()
	const copies = 10
	logs := &handlerErrorCounter{}
	var routerLogger watermill.LoggerAdapter = logs
	if quietLogger {
		routerLogger = dedup.InProgressAtInfo(logs)
	}
	obs := &copiesObserver{want: copies, claimed: map[string]bool{}, allClaimed: make(chan struct{})}
	d := newDedup(t, dedup.Config{Store: newRedisStore(t, autoPipeline), Key: keyfuncs.JSON("order_id"), Scope: "charge",
		InProgressWait: wait, Observer: obs, Tracer: obs})

	var (
		mu         sync.Mutex
		deliveries = map[string]int{}
		acked      = map[string]bool{}
		allAcked   = make(chan struct{})
		run        = copiesRun{name: name}
	)
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: copies}, watermill.NopLogger{})
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, routerLogger)
	if err != nil {
		t.Fatal(err)
	}
	// Outermost: what the broker sees, and its redelivery delay after a nack.
	r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			mu.Lock()
			deliveries[msg.UUID]++
			mu.Unlock()
			out, err := h(msg)
			if err != nil {
				mu.Lock()
				run.nacks++
				mu.Unlock()
				select {
				case <-time.After(redeliveryDelay):
				case <-msg.Context().Done():
				}
				return out, err
			}
			mu.Lock()
			defer mu.Unlock()
			if !acked[msg.UUID] {
				acked[msg.UUID] = true
				if len(acked) == copies {
					close(allAcked)
				}
			}
			return out, nil
		}
	}, d.Middleware)
	r.AddConsumerHandler("charge", "orders", pubSub, func(msg *message.Message) error {
		mu.Lock()
		run.charges++
		mu.Unlock()
		select {
		case <-obs.allClaimed:
		case <-time.After(time.Minute):
			return fmt.Errorf("the holder waited a minute for the other copies' claims")
		}
		<-time.After(effectTime)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	routerDone := make(chan error, 1)
	go func() { routerDone <- r.Run(ctx) }()
	recv(t, "the router to start", r.Running())
	for range copies {
		if err := pubSub.Publish("orders", order("ORDER-003")); err != nil {
			t.Fatal(err)
		}
	}
	recv(t, "every copy to be acked", allAcked)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, "the router to stop", routerDone); err != nil {
		t.Fatal(err)
	}
	_ = pubSub.Close()

	for _, n := range deliveries {
		run.redeliveries += n - 1
	}
	for _, dec := range obs.all {
		if dec.Event == event.InProgress {
			run.inProgress++
		}
		if dec.Waited > 0 {
			run.waited++
			run.maxWait = max(run.maxWait, dec.Waited)
		}
	}
	run.claims = obs.claimOps
	run.routerErrors, run.routerInfoInProgr = logs.counts()
	return run
}

// handlerErrorCounter is a router logger that counts the router's
// "Handler returned error" lines at error and info level (the router logs
// from its own goroutines, also after Run returns).
type handlerErrorCounter struct {
	watermill.NopLogger
	mu          sync.Mutex
	error, info int
}

func (l *handlerErrorCounter) Error(msg string, _ error, _ watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if msg == "Handler returned error" {
		l.error++
	}
}

func (l *handlerErrorCounter) Info(msg string, _ watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if msg == "Handler returned error" {
		l.info++
	}
}

func (l *handlerErrorCounter) With(watermill.LogFields) watermill.LoggerAdapter { return l }

func (l *handlerErrorCounter) counts() (errors, infos int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.error, l.info
}

// Ten copies of ORDER-003 at once, three ways, on a real Redis: nacked as
// today (each an ERROR line of the router and a redelivery), nacked with
// the router's logger wrapped by InProgressAtInfo (the same nacks at info
// level), and with InProgressWait (no nack, no redelivery: each copy is
// acked as a duplicate once the holder completes). The table is the
// README's figure.
func TestInProgressWaitInARouter(t *testing.T) { eachAutoPipeline(t, inProgressWaitInARouter) }

func inProgressWaitInARouter(t *testing.T, autoPipeline bool) {
	runs := []copiesRun{
		runTenCopies(t, "nack (default)", 0, false, autoPipeline),
		runTenCopies(t, "nack, router logger InProgressAtInfo", 0, true, autoPipeline),
		runTenCopies(t, "InProgressWait 30s", 30*time.Second, false, autoPipeline),
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-38s %7s %5s %12s %11s %12s %11s %6s %8s %6s\n", "ORDER-003 x10", "charges", "nacks", "redeliveries", "in_progress", "router ERROR", "router INFO", "waited", "max wait", "claims")
	for _, r := range runs {
		fmt.Fprintf(&b, "%-38s %7d %5d %12d %11d %12d %11d %6d %8s %6d\n", r.name, r.charges, r.nacks, r.redeliveries, r.inProgress, r.routerErrors, r.routerInfoInProgr, r.waited, r.maxWait.Round(time.Millisecond), r.claims)
	}
	t.Log("\n" + b.String())

	plain, quiet, waited := runs[0], runs[1], runs[2]
	for _, r := range runs {
		if r.charges != 1 {
			t.Errorf("%s: %d charges, want 1", r.name, r.charges)
		}
	}
	if plain.nacks < 9 || plain.redeliveries != plain.nacks || plain.routerErrors != plain.nacks || plain.inProgress != plain.nacks {
		t.Errorf("without the option: %+v; want at least 9 nacks, each redelivered, an in_progress decision and a router ERROR line", plain)
	}
	if quiet.nacks < 9 || quiet.routerErrors != 0 || quiet.routerInfoInProgr != quiet.nacks {
		t.Errorf("with InProgressAtInfo: %+v; want the nacks at info level, no ERROR line", quiet)
	}
	if waited.nacks != 0 || waited.redeliveries != 0 || waited.routerErrors != 0 || waited.inProgress != 0 {
		t.Errorf("with InProgressWait: %+v; want no nack, no redelivery, no error", waited)
	}
}
