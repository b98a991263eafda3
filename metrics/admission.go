package metrics

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// defaultMaxClaimsInFlight is dedup.Config.MaxClaimsInFlight's documented
// default, which a zero value takes.
const defaultMaxClaimsInFlight = 16

// ErrInvalidAdmissionLimit: RegisterAdmissionLimit was given a negative
// bound, which dedup.Config refuses too.
var ErrInvalidAdmissionLimit = errors.New("dedup/metrics: MaxClaimsInFlight must not be negative")

// RegisterAdmissionLimit registers the gauge <namespace>_claim_admission_limit
// (dedup_claim_admission_limit by default) holding maxClaimsInFlight, the
// dedup.Config.MaxClaimsInFlight of the Deduplicator or Engine that reports
// to the Observer made with the same cfg (0 stands for its default, 16).
// The gauge has the labels of cfg.ConstLabels only.
//
// The admission bound limits the Claim requests a Deduplicator has at the
// store at once; a claim waits for a free slot before it is sent, and the
// store latency histogram measures it from that moment. So, by Little's
// law, the claim seconds per second,
//
//	rate(dedup_store_operation_duration_seconds_sum{op="claim"}[5m])
//
// are the average number of admission slots held, and dividing it by this
// gauge gives the share of the bound in use (1: every slot always busy, so
// new messages queue for admission). That ratio is what the shipped
// alerting rules and dashboard compare against the bound. It is an average
// over the window and over the Deduplicators sharing the Observer: when
// several do, register the sum of their bounds. (The gauge
// dedup_claims_in_flight counts something else: handlers running on a won
// claim, which the admission bound does not limit.)
//
// Registering twice on the same registerer fails, as for New. Cost: one
// gauge, set once.
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
	return reg.Register(limit)
}
