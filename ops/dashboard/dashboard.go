// Package dashboard builds the Grafana dashboard of watermill-dedup's
// Prometheus metrics (package metrics) as code, with the Grafana Foundation
// SDK. The generated file dedup-dashboard.json, committed beside this file,
// is what a team imports into Grafana; `go generate ./dashboard/` in the
// ops module (it runs gen in this folder) writes it again after a change
// here.
//
// The panels answer the operators' questions, per handler where the metric
// has a handler label (a template variable picks handlers; another picks the
// Prometheus job): how many copies are absorbed (duplicate share,
// decisions), is the store failing (errors, error share, latency p50/p99,
// per store operation: those metrics have no handler label), are claims
// lost, do copies find their key in progress, how many handlers run on a
// claim, and how much of the claim admission bound is in use.
package dashboard

//go:generate go run ./gen

import (
	"encoding/json"
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// UID is the dashboard's uid: importing the file again replaces the
// dashboard rather than adding a copy.
const UID = "watermill-dedup"

// File is the name of the generated file, in this package's folder.
const File = "dedup-dashboard.json"

// Selectors every panel's queries apply: the job and handler variables.
const (
	sel        = `job=~"$job",handler=~"$handler"`
	jobSel     = `job=~"$job"`
	rate       = "[$__rate_interval]"
	decisions  = "dedup_decisions_total"
	storeCount = "dedup_store_operation_duration_seconds_count"
)

// query is one PromQL target of a panel.
type query struct {
	expr, legend string
}

// panel describes one panel.
type panel struct {
	title, description, unit string
	stat                     bool    // a stat panel (a number) rather than a time series
	stacked                  bool    // stack the series (parts of a whole)
	max                      float64 // the axis' maximum, when positive
	threshold                float64 // a red line at this value, when positive
	width                    uint32
	queries                  []query
}

// row is a titled group of panels.
type row struct {
	title  string
	panels []panel
}

func layout() []row {
	copies := func(events string) string {
		return fmt.Sprintf(`sum by (handler) (rate(%s{%s,event=~"%s"}%s))`, decisions, sel, events, rate)
	}
	return []row{
		{"Copies absorbed", []panel{
			{title: "Duplicate share", unit: "percentunit", max: 1, width: 8,
				description: "Of the copies that won their claim or found their key completed, the share that were duplicates (acked without running the handler; would_skip in shadow mode). A jump means a producer or broker sends copies again.",
				queries: []query{{
					copies("skip_duplicate|would_skip") + " / " + copies("claim_won|skip_duplicate|would_skip"),
					"{{handler}}"}}},
			{title: "Decisions", unit: "ops", stacked: true, width: 10,
				description: "Decisions per second by handler and event: claim_won then completed or released, skip_duplicate, in_progress, claim_lost, store_error, key_missing, key_reuse, fail_open, would_skip, would_reject.",
				queries: []query{{
					fmt.Sprintf(`sum by (handler, event) (rate(%s{%s}%s))`, decisions, sel, rate),
					"{{handler}} {{event}}"}}},
			{title: "Copies absorbed", stat: true, width: 6,
				description: "Duplicates skipped over the dashboard's time range, by handler: effects that did not run twice.",
				queries: []query{{
					fmt.Sprintf(`sum by (handler) (increase(%s{%s,event=~"skip_duplicate|would_skip"}[$__range]))`, decisions, sel),
					"{{handler}}"}}},
		}},
		{"Store", []panel{
			{title: "Store errors", unit: "ops", width: 6,
				description: "Failed store operations per second, by operation (claim, complete, release, extend): timeouts, refused connections, throttling. Per process: the store metrics have no handler label.",
				queries: []query{{
					fmt.Sprintf(`sum by (op) (rate(%s{%s,result="error"}%s))`, storeCount, jobSel, rate),
					"{{op}}"}}},
			{title: "Store error share", unit: "percentunit", max: 1, threshold: 0.05, width: 6,
				description: "Failed store operations over all operations, by operation. The alert DedupStoreErrorShareHigh pages above 5% for 5 minutes.",
				queries: []query{{
					fmt.Sprintf(`sum by (op) (rate(%s{%s,result="error"}%s)) / sum by (op) (rate(%s{%s}%s))`, storeCount, jobSel, rate, storeCount, jobSel, rate),
					"{{op}}"}}},
			{title: "Store latency", unit: "s", threshold: 0.25, width: 6,
				description: "Store latency by operation: the median and the 99th percentile (estimated from the histogram buckets). DedupStoreLatencyHigh warns when p99 stays above 250ms.",
				queries: []query{
					{fmt.Sprintf(`histogram_quantile(0.99, sum by (op, le) (rate(dedup_store_operation_duration_seconds_bucket{%s}%s)))`, jobSel, rate), "{{op}} p99"},
					{fmt.Sprintf(`histogram_quantile(0.5, sum by (op, le) (rate(dedup_store_operation_duration_seconds_bucket{%s}%s)))`, jobSel, rate), "{{op}} p50"},
				}},
			{title: "Store errors by handler", unit: "ops", width: 6,
				description: "store_error decisions per second by handler: the messages nacked (or, with FailOpen, run without a claim) because the store failed.",
				queries: []query{{
					fmt.Sprintf(`sum by (handler) (rate(%s{%s,event="store_error"}%s))`, decisions, sel, rate),
					"{{handler}}"}}},
		}},
		{"Claims", []panel{
			{title: "Claims lost", unit: "short", width: 6,
				description: "claim_lost decisions by handler: a record no longer carried the claim's token (the lease ended, or an operator evicted it). Each may have run an effect twice; DedupClaimLost pages on any.",
				queries: []query{{
					fmt.Sprintf(`sum by (handler) (increase(%s{%s,event="claim_lost"}%s))`, decisions, sel, rate),
					"{{handler}}"}}},
			{title: "Copies finding their key in progress", unit: "ops", width: 6,
				description: "in_progress decisions per second by handler: copies that arrived while another consumer held the key (nacked, or waited in vain).",
				queries: []query{{
					copies("in_progress"), "{{handler}}"}}},
			{title: "In-progress share", unit: "percentunit", max: 1, threshold: 0.2, width: 6,
				description: "Of the claims answered, the share that found the key in progress. DedupInProgressStorm warns above 20% for 10 minutes.",
				queries: []query{{
					copies("in_progress") + " / " + copies("claim_won|skip_duplicate|in_progress"), "{{handler}}"}}},
			{title: "Handlers running on a claim", unit: "short", width: 6,
				description: "dedup_claims_in_flight: claims won whose handler has not finished, by handler. Not limited by the admission bound (which limits claim requests at the store).",
				queries: []query{{
					fmt.Sprintf(`sum by (handler) (dedup_claims_in_flight{%s})`, sel), "{{handler}}"}}},
			{title: "Claims at the store vs the admission bound", unit: "short", width: 12,
				description: "Per instance: the average number of Claim requests at the store (claim seconds per second) against dedup.Config.MaxClaimsInFlight (metrics.RegisterAdmissionLimit). When the first reaches the second, messages queue for admission; DedupClaimAdmissionSaturated warns above 90% for 10 minutes.",
				queries: []query{
					{fmt.Sprintf(`sum by (instance) (rate(dedup_store_operation_duration_seconds_sum{%s,op="claim"}%s))`, jobSel, rate), "{{instance}} claims at the store"},
					{fmt.Sprintf(`sum by (instance) (dedup_claim_admission_limit{%s})`, jobSel), "{{instance}} admission bound"},
				}},
			{title: "Claim admission in use", unit: "percentunit", max: 1, threshold: 0.9, width: 12,
				description: "Per instance: the share of the admission bound that claims keep busy (1: every slot all the time).",
				queries: []query{{
					fmt.Sprintf(`sum by (instance) (rate(dedup_store_operation_duration_seconds_sum{%s,op="claim"}%s)) / sum by (instance) (rate(dedup_claim_admission_capacity_seconds_total{%s}%s))`, jobSel, rate, jobSel, rate),
					"{{instance}}"}}},
		}},
	}
}

// datasource is the panels' data source: the one the variable selects.
func datasource() common.DataSourceRef {
	return common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}
}

func targets(qs []query) []cog.Builder[variants.Dataquery] {
	out := make([]cog.Builder[variants.Dataquery], len(qs))
	for i, q := range qs {
		out[i] = prometheus.NewDataqueryBuilder().
			Datasource(datasource()).
			RefId(string(rune('A' + i))).
			Expr(q.expr).
			LegendFormat(q.legend)
	}
	return out
}

func thresholds(red float64) *dashboard.ThresholdsConfigBuilder {
	steps := []dashboard.Threshold{{Color: "green"}}
	if red > 0 {
		steps = append(steps, dashboard.Threshold{Value: cog.ToPtr(red), Color: "red"})
	}
	return dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps(steps)
}

func build(p panel, id uint32) cog.Builder[dashboard.Panel] {
	if p.stat {
		b := stat.NewPanelBuilder().Id(id).Title(p.title).Description(p.description).
			Datasource(datasource()).Targets(targets(p.queries)).
			Unit(p.unit).Height(8).Span(p.width).Thresholds(thresholds(p.threshold))
		if p.unit == "" {
			b.Unit("short")
		}
		return b
	}
	b := timeseries.NewPanelBuilder().Id(id).Title(p.title).Description(p.description).
		Datasource(datasource()).Targets(targets(p.queries)).
		Unit(p.unit).Min(0).Height(8).Span(p.width).FillOpacity(10).
		Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).
			DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom)).
		Thresholds(thresholds(p.threshold))
	if p.max > 0 {
		b.Max(p.max)
	}
	if p.threshold > 0 {
		b.ThresholdsStyle(common.NewGraphThresholdsStyleConfigBuilder().Mode(common.GraphThresholdsStyleModeLine))
	}
	if p.stacked {
		b.Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal))
	}
	return b
}

// Build returns the dashboard: three rows (copies absorbed, store, claims)
// of the panels described in the package doc, and the variables
// datasource, job and handler.
func Build() (dashboard.Dashboard, error) {
	handlerQuery := `label_values(dedup_decisions_total{job=~"$job"}, handler)`
	jobQuery := `label_values(dedup_decisions_total, job)`
	all := dashboard.VariableOption{ // every job and handler at first
		Selected: cog.ToPtr(true),
		Text:     dashboard.StringOrArrayOfString{ArrayOfString: []string{"All"}},
		Value:    dashboard.StringOrArrayOfString{ArrayOfString: []string{"$__all"}},
	}
	b := dashboard.NewDashboardBuilder("watermill-dedup").
		Uid(UID).
		Description("Exactly-once effects for at-least-once consumers: copies absorbed, store health, lost and in-progress claims, per handler. Generated by the ops/dashboard package of watermill-dedup.").
		Tags([]string{"watermill", "dedup"}).
		Refresh("30s").
		Time("now-3h", "now").
		Timezone(common.TimeZoneBrowser).
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").
			Label("Data source").Type("prometheus")).
		WithVariable(dashboard.NewQueryVariableBuilder("job").
			Label("Job").Datasource(datasource()).
			Query(dashboard.StringOrMap{String: cog.ToPtr(jobQuery)}).Definition(jobQuery).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).Sort(dashboard.VariableSortAlphabeticalAsc).
			Multi(true).IncludeAll(true).AllValue(".*").Current(all)).
		WithVariable(dashboard.NewQueryVariableBuilder("handler").
			Label("Handler").Datasource(datasource()).
			Query(dashboard.StringOrMap{String: cog.ToPtr(handlerQuery)}).Definition(handlerQuery).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).Sort(dashboard.VariableSortAlphabeticalAsc).
			Multi(true).IncludeAll(true).AllValue(".*").Current(all))
	id := uint32(0)
	for _, r := range layout() {
		id++
		b.WithRow(dashboard.NewRowBuilder(r.title).Id(id))
		for _, p := range r.panels {
			id++
			b.WithPanel(build(p, id))
		}
	}
	return b.Build()
}

// JSON returns the dashboard as the committed file holds it: indented JSON
// ending in a newline, the same bytes on every run.
func JSON() ([]byte, error) {
	d, err := Build()
	if err != nil {
		return nil, fmt.Errorf("dashboard: building: %w", err)
	}
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("dashboard: encoding: %w", err)
	}
	return append(out, '\n'), nil
}
