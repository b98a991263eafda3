package metrics_test

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/watermill-dedup/watermill-dedup/metrics"
)

// The gauge holds the bound it is given, dedup's default for zero, and the
// capacity counter the bound times the seconds since registration, both with
// the Observer's namespace and constant labels.
func TestAdmissionLimitGauge(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      metrics.Config
		limit    int
		gauge    string
		capacity string
		want     float64
	}{
		{"explicit", metrics.Config{ConstLabels: prometheus.Labels{"service": "billing"}}, 4,
			"dedup_claim_admission_limit", "dedup_claim_admission_capacity_seconds_total", 4},
		{"default", metrics.Config{}, 0, "dedup_claim_admission_limit", "dedup_claim_admission_capacity_seconds_total", 16},
		{"namespace", metrics.Config{Namespace: "orders"}, 32, "orders_claim_admission_limit", "orders_claim_admission_capacity_seconds_total", 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			if _, err := metrics.New(reg, tc.cfg); err != nil {
				t.Fatal(err)
			}
			before := time.Now()
			if err := metrics.RegisterAdmissionLimit(reg, tc.cfg, tc.limit); err != nil {
				t.Fatal(err)
			}
			got := gather(t, reg, tc.gauge)
			capacity := gather(t, reg, tc.capacity)
			elapsed := time.Since(before).Seconds()
			if len(capacity) != 1 {
				t.Fatalf("%s: %d series, want 1", tc.capacity, len(capacity))
			}
			// The bound times the seconds since registration: at most the
			// bound times the seconds the test measured around it.
			if v := capacity[0].GetCounter().GetValue(); v < 0 || v > tc.want*elapsed {
				t.Errorf("%s = %v, want between 0 and %v × %vs", tc.capacity, v, tc.want, elapsed)
			}
			if !matches(capacity[0], tc.cfg.ConstLabels) || len(capacity[0].GetLabel()) != len(tc.cfg.ConstLabels) {
				t.Errorf("%s labels %v, want exactly %v", tc.capacity, labels(capacity[0]), tc.cfg.ConstLabels)
			}
			if len(got) != 1 {
				t.Fatalf("%s: %d series, want 1", tc.gauge, len(got))
			}
			if v := got[0].GetGauge().GetValue(); v != tc.want {
				t.Errorf("%s = %v, want %v", tc.gauge, v, tc.want)
			}
			if !matches(got[0], tc.cfg.ConstLabels) || len(got[0].GetLabel()) != len(tc.cfg.ConstLabels) {
				t.Errorf("%s labels %v, want exactly %v", tc.gauge, labels(got[0]), tc.cfg.ConstLabels)
			}
			if err := metrics.RegisterAdmissionLimit(reg, tc.cfg, tc.limit); err == nil {
				t.Error("registering the gauge twice on one registerer succeeded")
			}
		})
	}
}

func TestAdmissionLimitRefusesBadInput(t *testing.T) {
	err := metrics.RegisterAdmissionLimit(prometheus.NewRegistry(), metrics.Config{}, -1)
	if !errors.Is(err, metrics.ErrInvalidAdmissionLimit) {
		t.Errorf("RegisterAdmissionLimit(-1) = %v, want ErrInvalidAdmissionLimit", err)
	}
	if err := metrics.RegisterAdmissionLimit(nil, metrics.Config{}, 1); err == nil {
		t.Error("RegisterAdmissionLimit(nil registerer) succeeded")
	}
}
