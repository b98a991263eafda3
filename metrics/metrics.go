// Package metrics exports the decisions of a dedup.Deduplicator as Prometheus
// metrics. It is its own package so that the core stays free of the
// Prometheus client.
//
//	obs, err := metrics.New(prometheus.DefaultRegisterer, metrics.Config{})
//	d, err := dedup.New(dedup.Config{Store: store, Key: key, Observer: obs})
//
// Metrics (with the default namespace "dedup"):
//
//	dedup_decisions_total{handler,event}              counter: one per decision (claim_won, skip_duplicate, in_progress, would_skip, ...)
//	dedup_replays_total{handler}                      counter: duplicates whose stored result was returned for replay
//	dedup_in_progress_wait_seconds{handler,event}     histogram: waits for another claim (Config.InProgressWait), by the decision they ended in
//	dedup_store_operation_duration_seconds{op,result} histogram: claim/complete/release/extend latency; result ok, claim_lost or error
//	dedup_claims_in_flight{handler}                   gauge: claims won whose handler has not finished
//	dedup_claim_admission_limit                       gauge: Config.MaxClaimsInFlight, only with RegisterAdmissionLimit
//	dedup_claim_admission_capacity_seconds_total      counter: MaxClaimsInFlight × seconds, only with RegisterAdmissionLimit
//
// Fresh runs are decisions{event="completed"}, duplicates
// decisions{event="skip_duplicate"} (of which replays_total returned a
// stored result); in shadow mode (Config.Shadow) the copies dedup would
// have skipped are decisions{event="would_skip"}.
package metrics

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
)

// Config configures the metrics.
type Config struct {
	// Namespace prefixes every metric name. Defaults to "dedup".
	Namespace string
	// Buckets are the store latency histogram's buckets, in seconds.
	// Defaults to 0.25ms … 2.5s, which spans a local Redis to a remote
	// DynamoDB.
	Buckets []float64
	// WaitBuckets are the in-progress wait histogram's buckets, in
	// seconds. Defaults to 10ms … 30s.
	WaitBuckets []float64
	// ConstLabels are added to every metric (e.g. the service name).
	ConstLabels prometheus.Labels
}

// Observer implements dedup.Observer with Prometheus metrics. Its methods are
// safe for concurrent use and cost a few atomic operations each.
type Observer struct {
	decisions *prometheus.CounterVec
	replays   *prometheus.CounterVec
	waits     *prometheus.HistogramVec
	latency   *prometheus.HistogramVec
	inFlight  *prometheus.GaugeVec
}

var _ dedup.Observer = (*Observer)(nil)

// New creates the metrics and registers them on reg. Registering twice on the
// same registerer fails (use a different Namespace or ConstLabels).
func New(reg prometheus.Registerer, cfg Config) (*Observer, error) {
	if reg == nil {
		return nil, errors.New("dedup/metrics: a prometheus.Registerer is required")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "dedup"
	}
	if cfg.Buckets == nil {
		cfg.Buckets = []float64{.00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}
	}
	if cfg.WaitBuckets == nil {
		cfg.WaitBuckets = []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	}
	o := &Observer{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: cfg.Namespace, Name: "decisions_total", ConstLabels: cfg.ConstLabels,
			Help: "Decisions of the dedup middleware, by handler and event (claim_won, completed, skip_duplicate, in_progress, released, claim_lost, key_missing, transport_key, key_reuse, store_error, fail_open, would_skip, would_reject).",
		}, []string{"handler", "event"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: cfg.Namespace, Name: "replays_total", ConstLabels: cfg.ConstLabels,
			Help: "Duplicates whose stored result (output messages, HTTP response) was returned for replay.",
		}, []string{"handler"}),
		waits: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: cfg.Namespace, Name: "in_progress_wait_seconds", ConstLabels: cfg.ConstLabels, Buckets: cfg.WaitBuckets,
			Help: "Waits for another claim of the key to end (InProgressWait), by the decision they ended in (skip_duplicate, claim_won, in_progress, ...).",
		}, []string{"handler", "event"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: cfg.Namespace, Name: "store_operation_duration_seconds", ConstLabels: cfg.ConstLabels, Buckets: cfg.Buckets,
			Help: "Latency of dedup store operations (claim, complete, release, extend), by result (ok, claim_lost, error).",
		}, []string{"op", "result"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: cfg.Namespace, Name: "claims_in_flight", ConstLabels: cfg.ConstLabels,
			Help: "Claims won whose handler has not finished yet.",
		}, []string{"handler"}),
	}
	for _, c := range []prometheus.Collector{o.decisions, o.replays, o.waits, o.latency, o.inFlight} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// ObserveDecision counts the decision (and the replay, and the wait before
// it, if any) and tracks claims in flight: a won claim adds one, and its
// single terminal decision (op complete or release) removes it.
func (o *Observer) ObserveDecision(d dedup.Decision) {
	o.decisions.WithLabelValues(d.Handler, string(d.Event)).Inc()
	if d.Replayed {
		o.replays.WithLabelValues(d.Handler).Inc()
	}
	if d.Waited > 0 {
		o.waits.WithLabelValues(d.Handler, string(d.Event)).Observe(d.Waited.Seconds())
	}
	switch {
	case d.Event == event.ClaimWon:
		o.inFlight.WithLabelValues(d.Handler).Inc()
	case d.Op == "complete" || d.Op == "release":
		o.inFlight.WithLabelValues(d.Handler).Dec()
	}
}

// ObserveStoreOp records a store operation's latency.
func (o *Observer) ObserveStoreOp(op string, elapsed time.Duration, err error) {
	result := "ok"
	switch {
	case errors.Is(err, dedup.ErrClaimLost):
		result = "claim_lost"
	case err != nil:
		result = "error"
	}
	o.latency.WithLabelValues(op, result).Observe(elapsed.Seconds())
}
