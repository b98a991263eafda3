package metrics

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// defaultMaxClaimsInFlight is dedup.Config.MaxClaimsInFlight's documented
// default, which a zero value takes.
const defaultMaxClaimsInFlight = 16

// ErrInvalidAdmissionLimit: RegisterAdmissionLimit was given a negative
// bound, which dedup.Config refuses too.
var ErrInvalidAdmissionLimit = errors.New("dedup/metrics: MaxClaimsInFlight must not be negative")

// RegisterAdmissionLimit registers two metrics of the claim admission bound,
// maxClaimsInFlight: the dedup.Config.MaxClaimsInFlight of the Deduplicator
// or Engine that reports to the Observer made with the same cfg (0 stands
// for the engine's default, 16). A store can raise the default of a
// MaxClaimsInFlight left at zero (stores/redis with Config.AutoPipeline
// admits 256, its Store.ClaimAdmission): pass that number then, not 0.
// With the default namespace:
//
//	dedup_claim_admission_limit                     gauge: the bound
//	dedup_claim_admission_capacity_seconds_total    counter: the bound × the seconds since registration
//
// Both have the labels of cfg.ConstLabels only.
//
// The bound limits the Claim requests a Deduplicator has at the store at
// once; a claim waits for a free slot before it is sent, and the store
// latency histogram measures it from that moment. So the claim seconds per
// second, rate(dedup_store_operation_duration_seconds_sum{op="claim"}[5m]),
// are the average number of slots held (Little's law), and
//
//	rate(dedup_store_operation_duration_seconds_sum{op="claim"}[5m])
//	  / rate(dedup_claim_admission_capacity_seconds_total[5m])
//
// is the share of the bound in use (1: every slot always busy, so new
// messages queue for admission). Dividing by the capacity counter rather
// than by the gauge keeps the ratio right for a process younger than the
// window, whose rates Prometheus underestimates alike. The shipped
// alerting rules and dashboard use it. It is an average over the window
// and over the Deduplicators sharing the Observer: when several do,
// register the sum of their bounds. (The gauge dedup_claims_in_flight
// counts something else: handlers running on a won claim, which the
// admission bound does not limit.)
//
// Registering twice on the same registerer fails, as for New. Cost: a
// gauge set once, and a clock reading per scrape.
func RegisterAdmissionLimit(reg prometheus.Registerer, cfg Config, maxClaimsInFlight int) error {
	if reg == nil {
		return errors.New("dedup/metrics: a prometheus.Registerer is required")
	}
	if maxClaimsInFlight < 0 {
		return fmt.Errorf("%w: got %d", ErrInvalidAdmissionLimit, maxClaimsInFlight)
	}
	if maxClaimsInFlight == 0 {
		maxClaimsInFlight = defaultMaxClaimsInFlight
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "dedup"
	}
	limit := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: cfg.Namespace, Name: "claim_admission_limit", ConstLabels: cfg.ConstLabels,
		Help: "The bound on Claim requests at the store at once (dedup.Config.MaxClaimsInFlight); rate(store_operation_duration_seconds_sum{op=\"claim\"}) over it is the share of the bound in use.",
	})
	limit.Set(float64(maxClaimsInFlight))
	start := time.Now()
	capacity := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: cfg.Namespace, Name: "claim_admission_capacity_seconds_total", ConstLabels: cfg.ConstLabels,
		Help: "Admission slot-seconds offered since registration (MaxClaimsInFlight × seconds); rate(store_operation_duration_seconds_sum{op=\"claim\"}) over its rate is the share of the bound in use.",
	}, func() float64 { return float64(maxClaimsInFlight) * time.Since(start).Seconds() })
	for _, c := range []prometheus.Collector{limit, capacity} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
