package metrics_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func gather(t *testing.T, reg prometheus.Gatherer, name string) []*dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()
		}
	}
	return nil
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func matches(m *dto.Metric, want map[string]string) bool {
	got := labels(m)
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// counterSum adds the counter series whose labels include want; absent
// series read as zero.
func counterSum(t *testing.T, reg prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	v := 0.0
	for _, m := range gather(t, reg, name) {
		if matches(m, want) {
			v += m.GetCounter().GetValue()
		}
	}
	return v
}

func gaugeValue(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	v := 0.0
	for _, m := range gather(t, reg, name) {
		v += m.GetGauge().GetValue()
	}
	return v
}

func histogramCounts(t *testing.T, reg prometheus.Gatherer, name string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, m := range gather(t, reg, name) {
		l := labels(m)
		out[l["op"]+"/"+l["result"]] += m.GetHistogram().GetSampleCount()
	}
	return out
}
