package dedup

import (
	"context"
	"errors"
	"time"
)

// traceKey carries the CallTrace of a call in its context, so that the
// store operations (which see the context, not the call) reach it.
type traceKey struct{}

// traceOf returns the trace of the call whose context ctx is, if any.
func traceOf(ctx context.Context) CallTrace {
	t, _ := ctx.Value(traceKey{}).(CallTrace)
	return t
}

// noTrace stands for a nil CallTrace from Tracer.StartCall, so that Do
// does not start the call again.
type noTrace struct{}

func (noTrace) ObserveDecision(Decision)                    {}
func (noTrace) ObserveStoreOp(string, time.Duration, error) {}
func (noTrace) EndCall(ClaimResult, error)                  {}

// errWorkPanicked is what EndCall gets when the call's work panicked.
var errWorkPanicked = errors.New("dedup: the work panicked")

// doTraced is Do with Config.Tracer: the call starts on the Tracer, its
// decisions and store operations reach the CallTrace, and EndCall gets
// what Do returns (or errWorkPanicked while a panic goes on).
func (e *Engine) doTraced(ctx context.Context, call Call, fn func(ctx context.Context) ([]byte, error)) (ClaimResult, error) {
	ctx, trace := e.cfg.Tracer.StartCall(ctx, call)
	if trace == nil {
		trace = noTrace{}
	} else {
		ctx = context.WithValue(ctx, traceKey{}, trace)
	}
	call.trace = trace
	ended := false
	defer func() {
		if !ended {
			trace.EndCall(ClaimResult{}, errWorkPanicked)
		}
	}()
	res, err := e.Do(ctx, call, fn)
	ended = true
	trace.EndCall(res, err)
	return res, err
}
