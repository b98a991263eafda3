package prometheus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	promclient "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/metrics"
)

// waitFor bounds every wait of the scenario: generous, so that the test
// passes beside CPU-bound processes; a healthy run needs about a minute in
// all.
const waitFor = 4 * time.Minute

// alertScenarios names, for every alert of dedup-rules.yml, the part of the
// scenario that must make its expression return series. An alert the
// server loads that is missing here fails the test: give it a scenario.
var alertScenarios = map[string]string{
	"DedupClaimLost":               "an operator evicts keys of charge-orders while their handler runs (its Complete finds the claim lost)",
	"DedupStoreErrorShareHigh":     "the store stops answering (every operation runs into StoreTimeout)",
	"DedupStoreErrors":             "the store stops answering",
	"DedupInProgressStorm":         "a crashed consumer holds a key of ship-orders whose copy is nacked and redelivered",
	"DedupDuplicateShareJump":      "charge-orders gets fresh keys only, then every key five times",
	"DedupClaimAdmissionSaturated": "four publishers keep two admission slots busy with 20ms claims",
	"DedupStoreLatencyHigh":        "the store stops answering: claims take StoreTimeout (250ms)",
}

// flakyStore is the scenario's store: a memory store some milliseconds
// away (each Claim takes claimDelay longer), which stops answering while
// down is set: every operation then waits for its context (the engine's
// StoreTimeout) and fails.
type flakyStore struct {
	dedup.Store
	claimDelay time.Duration
	down       atomic.Bool
}

var errStoreDown = errors.New("store not answering")

func (s *flakyStore) wait(ctx context.Context, d time.Duration) error {
	if s.down.Load() {
		<-ctx.Done()
		return fmt.Errorf("%w: %w", errStoreDown, ctx.Err())
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *flakyStore) Claim(ctx context.Context, key, fingerprint string, lease time.Duration) (dedup.ClaimResult, error) {
	if err := s.wait(ctx, s.claimDelay); err != nil {
		return dedup.ClaimResult{}, err
	}
	return s.Store.Claim(ctx, key, fingerprint, lease)
}

func (s *flakyStore) Complete(ctx context.Context, c dedup.Claim, result []byte, retention time.Duration) error {
	if err := s.wait(ctx, 0); err != nil {
		return err
	}
	return s.Store.Complete(ctx, c, result, retention)
}

func (s *flakyStore) Release(ctx context.Context, c dedup.Claim) error {
	if err := s.wait(ctx, 0); err != nil {
		return err
	}
	return s.Store.Release(ctx, c)
}

func (s *flakyStore) Extend(ctx context.Context, c dedup.Claim, lease time.Duration) error {
	if err := s.wait(ctx, 0); err != nil {
		return err
	}
	return s.Store.Extend(ctx, c, lease)
}

// promAPI queries a Prometheus server's HTTP API.
type promAPI struct {
	base   string
	client *http.Client
}

type apiResponse struct {
	Status    string          `json:"status"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
	Data      json.RawMessage `json:"data"`
}

func (p promAPI) get(ctx context.Context, path string, params url.Values) (json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path+"?"+params.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r apiResponse
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", path, resp.Status, err)
	}
	if r.Status != "success" {
		return nil, &apiError{path: path, typ: r.ErrorType, msg: r.Error}
	}
	return r.Data, nil
}

// apiError is an error answer of the API.
type apiError struct{ path, typ, msg string }

func (e *apiError) Error() string { return fmt.Sprintf("%s: %s: %s", e.path, e.typ, e.msg) }

// series is one element of an instant vector.
type series struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s series) String() string {
	keys := make([]string, 0, len(s.Metric))
	for k := range s.Metric {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("{")
	for i, k := range keys {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "%s=%q", k, s.Metric[k])
	}
	fmt.Fprintf(&b, "} %v", s.Value[1])
	return b.String()
}

// errBadQuery marks a query the server refused (it does not parse, or
// cannot be evaluated): waiting does not help.
var errBadQuery = errors.New("query refused")

// query runs an instant query. A query that does not return an instant
// vector, or that the server refuses, gives an error wrapping errBadQuery.
func (p promAPI) query(ctx context.Context, expr string) ([]series, error) {
	data, err := p.get(ctx, "/api/v1/query", url.Values{"query": {expr}})
	var refused *apiError
	if errors.As(err, &refused) && (refused.typ == "bad_data" || refused.typ == "execution") {
		return nil, fmt.Errorf("%w: %w", errBadQuery, err)
	}
	if err != nil {
		return nil, err
	}
	var v struct {
		ResultType string   `json:"resultType"`
		Result     []series `json:"result"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, err
	}
	if v.ResultType != "vector" {
		return nil, fmt.Errorf("%w: result type %q, want vector", errBadQuery, v.ResultType)
	}
	return v.Result, nil
}

// waitSeries polls expr until it returns at least one series, and returns
// them; it fails the test when the server refuses the query, or when
// waitFor passes first.
func waitSeries(t *testing.T, ctx context.Context, p promAPI, srv *testserver.Prometheus, what, expr string) []series {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		res, err := p.query(ctx, expr)
		if errors.Is(err, errBadQuery) {
			t.Fatalf("%s: the server refuses %s: %v", what, expr, err)
		}
		if err == nil && len(res) > 0 {
			return res
		}
		last = err
		if time.Now().After(deadline) {
			var recorded strings.Builder // what the recording rules say now
			for _, name := range []string{"job:dedup_decisions:rate5m", "job:dedup_duplicate_share:ratio_rate5m",
				"job:dedup_in_progress_share:ratio_rate5m", "job:dedup_store_error_share:ratio_rate5m",
				"job:dedup_store_latency_seconds:p99_5m", "instance:dedup_claim_admission:ratio_rate5m"} {
				res, err := p.query(ctx, name)
				fmt.Fprintf(&recorded, "%s: %v %v\n", name, res, err)
			}
			t.Fatalf("%s: %s returned no series within %v (last error: %v)\nrecorded:\n%sprometheus output:\n%s",
				what, expr, waitFor, last, recorded.String(), srv.Output())
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, ctx.Err())
		}
	}
}

// loadedRules returns the rules the server loaded: record or alert name →
// expression, and which names are alerts.
func loadedRules(t *testing.T, ctx context.Context, p promAPI) (exprs map[string]string, alerts []string) {
	t.Helper()
	data, err := p.get(ctx, "/api/v1/rules", nil)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Groups []struct {
			Rules []struct {
				Name   string `json:"name"`
				Query  string `json:"query"`
				Type   string `json:"type"`
				Health string `json:"health"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	exprs = map[string]string{}
	for _, g := range v.Groups {
		for _, r := range g.Rules {
			exprs[r.Name] = r.Query
			if r.Type == "alerting" {
				alerts = append(alerts, r.Name)
			}
		}
	}
	sort.Strings(alerts)
	return exprs, alerts
}

// dashboardQueries returns every panel query of the committed dashboard,
// keyed by "panel title / refId", and the variables' label_values queries.
func dashboardQueries(t *testing.T) (panels map[string]string, variables map[string]string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "dashboard", "dedup-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	panels, variables = map[string]string{}, map[string]string{}
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			panels[p.Title+" / "+q.RefID] = q.Expr
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(string); ok && v.Type == "query" {
			variables[v.Name] = q
		}
	}
	return panels, variables
}

// grafanaVars stands for what Grafana substitutes in the dashboard's
// queries: every job and handler, a rate window of a few scrapes, the
// dashboard's time range.
var grafanaVars = strings.NewReplacer(
	`"$job"`, `".*"`, `"$handler"`, `".*"`,
	`$__rate_interval`, `30s`, `$__range`, `5m`)

// labelValues matches Grafana's label_values(selector, label).
var labelValues = regexp.MustCompile(`^label_values\((.*),\s*(\w+)\)$`)

// TestRulesAndDashboardOnARealPrometheus runs a Watermill router under load
// (gochannel, a memory store some milliseconds away) with duplicates, a
// crashed consumer holding a key, claims lost to an operator's eviction and
// a store outage, and a real Prometheus server scraping it every second and
// evaluating dedup-rules.yml every second. Through the server's HTTP API,
// every rule expression and every dashboard query must parse and return
// series for the part of the scenario that should produce them; every
// alert must reach at least the pending state (DedupClaimLost, which has no
// `for:`, firing).
func TestRulesAndDashboardOnARealPrometheus(t *testing.T) {
	lookPath(t, "prometheus")
	rules, err := filepath.Abs("dedup-rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitFor)
	defer cancel()

	// The service: metrics on a loopback HTTP endpoint.
	reg := promclient.NewRegistry()
	obs, err := metrics.New(reg, metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const admission = 2
	if err := metrics.RegisterAdmissionLimit(reg, metrics.Config{}, admission); err != nil {
		t.Fatal(err)
	}
	endpoint := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer endpoint.Close()

	mem := memstore.New(nil)
	store := &flakyStore{Store: mem, claimDelay: 20 * time.Millisecond}
	d, err := dedup.New(dedup.Config{
		Store: store, Key: keyfuncs.JSON("order_id"), Observer: obs,
		MaxClaimsInFlight: admission, StoreTimeout: 250 * time.Millisecond, CompleteRetries: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(d.Middleware)
	router.AddConsumerHandler("charge-orders", "orders", pubSub, func(msg *message.Message) error {
		var body struct {
			OrderID string `json:"order_id"`
		}
		if err := json.Unmarshal(msg.Payload, &body); err != nil {
			return err
		}
		if strings.HasPrefix(body.OrderID, "LOST-") {
			// An operator evicts the key while its handler runs: the
			// Complete that follows finds the claim lost.
			if _, err := mem.Evict(msg.Context(), admin.ScopedKey("charge-orders", body.OrderID)); err != nil {
				return err
			}
		}
		return nil
	})
	router.AddConsumerHandler("ship-orders", "shipments", pubSub, func(*message.Message) error { return nil })
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case err := <-routerDone:
		t.Fatalf("router stopped at once: %v", err)
	case <-time.After(waitFor):
		t.Fatal("router not running")
	}

	// The load: two publishers per topic, each waiting for its message to
	// be acked. copies is how many times each key is sent; every lostEvery-th
	// key of orders (when positive) is one whose handler loses its claim.
	var copies, lostEvery atomic.Int32
	copies.Store(1)
	publish := func(topic, key string) error {
		return pubSub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"`+key+`"}`)))
	}
	var stop atomic.Bool
	var publishers sync.WaitGroup
	publishErr := make(chan error, 8)
	for _, topic := range []string{"orders", "shipments"} {
		for w := range 2 {
			publishers.Add(1)
			go func() {
				defer publishers.Done()
				for i := 0; !stop.Load(); i++ {
					key := fmt.Sprintf("%s-%d-%d", topic, w, i)
					if n := lostEvery.Load(); topic == "orders" && n > 0 && i%int(n) == 0 {
						key = "LOST-" + key
					}
					for range copies.Load() {
						if err := publish(topic, key); err != nil {
							if !stop.Load() { // closing the Pub/Sub ends a Publish
								publishErr <- err
							}
							return
						}
					}
				}
			}()
		}
	}
	var held dedup.Claim
	var heldPublish sync.WaitGroup
	defer func() { // clean shutdown, also when the test fails half-way
		stop.Store(true)
		store.down.Store(false)
		if held.Token != "" {
			_ = mem.Release(context.Background(), held)
		}
		if err := router.Close(); err != nil {
			t.Errorf("closing the router: %v", err)
		}
		_ = pubSub.Close()
		publishers.Wait()
		heldPublish.Wait()
		select {
		case err := <-publishErr:
			t.Errorf("publishing: %v", err)
		default:
		}
	}()

	// The server: scrapes the endpoint and evaluates the rules every second.
	srv, err := testserver.StartPrometheus(fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: orders-service
    static_configs:
      - targets: [%q]
`, rules, strings.TrimPrefix(endpoint.URL, "http://")))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := srv.Close(); err != nil {
			t.Errorf("closing prometheus: %v", err)
		}
	}()
	api := promAPI{base: srv.URL, client: &http.Client{Timeout: 30 * time.Second}}
	exprs, alerts := loadedRules(t, ctx, api)
	for _, a := range alerts {
		if alertScenarios[a] == "" {
			t.Errorf("alert %s has no scenario in this test: add one", a)
		}
	}
	if len(alerts) != len(alertScenarios) {
		t.Fatalf("the server loaded alerts %v, the test knows %d", alerts, len(alertScenarios))
	}
	alert := func(name string) string { return exprs[name] }

	// Phase 1, fresh keys only: the duplicate share of charge-orders is
	// recorded at 0 a few times (the baseline of the jump), and nothing
	// is lost or failing yet.
	waitSeries(t, ctx, api, srv, "baseline", `count_over_time(job:dedup_duplicate_share:ratio_rate5m{handler="charge-orders"}[1m]) >= 3`)
	for _, name := range []string{"DedupClaimLost", "DedupStoreErrorShareHigh", "DedupDuplicateShareJump"} {
		if res, err := api.query(ctx, alert(name)); err != nil || len(res) > 0 {
			t.Errorf("before its scenario, %s returned %v (%v)", name, res, err)
		}
	}

	// Phase 2: every key five times; every 25th key of orders lost; a
	// crashed consumer holds HELD-1 of ship-orders, whose copy is nacked
	// (in_progress) and redelivered at once, again and again.
	copies.Store(5)
	lostEvery.Store(25)
	res, err := mem.Claim(ctx, admin.ScopedKey("ship-orders", "HELD-1"), "", 10*time.Minute)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("holding HELD-1: %v %v", res.Outcome, err)
	}
	held = res.Claim
	heldPublish.Add(1)
	go func() {
		defer heldPublish.Done()
		if err := publish("shipments", "HELD-1"); err != nil {
			publishErr <- err
		}
	}()
	for _, name := range []string{"DedupDuplicateShareJump", "DedupInProgressStorm", "DedupClaimLost"} {
		got := waitSeries(t, ctx, api, srv, name, alert(name))
		t.Logf("%s (%s): %v", name, alertScenarios[name], got)
	}
	if err := mem.Release(ctx, held); err != nil {
		t.Fatalf("releasing HELD-1: %v", err)
	}
	held = dedup.Claim{}

	// Phase 3: the store stops answering until the error and latency
	// alerts' expressions hold.
	store.down.Store(true)
	for _, name := range []string{"DedupStoreErrorShareHigh", "DedupStoreErrors", "DedupStoreLatencyHigh"} {
		got := waitSeries(t, ctx, api, srv, name, alert(name))
		t.Logf("%s (%s): %v", name, alertScenarios[name], got)
	}
	store.down.Store(false)
	got := waitSeries(t, ctx, api, srv, "DedupClaimAdmissionSaturated", alert("DedupClaimAdmissionSaturated"))
	t.Logf("DedupClaimAdmissionSaturated (%s): %v", alertScenarios["DedupClaimAdmissionSaturated"], got)

	// Every rule (the recording rules too) and every dashboard query returns
	// series; every alert reached the pending state, DedupClaimLost firing.
	names := make([]string, 0, len(exprs))
	for name := range exprs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		waitSeries(t, ctx, api, srv, "rule "+name, exprs[name])
	}
	for _, name := range alerts {
		state := `alertstate=~"pending|firing"`
		if name == "DedupClaimLost" {
			state = `alertstate="firing"`
		}
		waitSeries(t, ctx, api, srv, "alert "+name, fmt.Sprintf(`ALERTS{alertname=%q,%s}`, name, state))
	}
	panels, variables := dashboardQueries(t)
	if len(panels) == 0 || len(variables) != 2 {
		t.Fatalf("the dashboard has %d queries and variables %v", len(panels), variables)
	}
	titles := make([]string, 0, len(panels))
	for title := range panels {
		titles = append(titles, title)
	}
	sort.Strings(titles)
	for _, title := range titles {
		expr := grafanaVars.Replace(panels[title])
		if strings.Contains(expr, "$") {
			t.Errorf("panel %s: a variable this test does not substitute: %s", title, expr)
			continue
		}
		waitSeries(t, ctx, api, srv, "panel "+title, expr)
	}
	for name, q := range variables {
		m := labelValues.FindStringSubmatch(grafanaVars.Replace(q))
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(selector, label)", name, q)
			continue
		}
		data, err := api.get(ctx, "/api/v1/label/"+m[2]+"/values", url.Values{"match[]": {m[1]}})
		if err != nil {
			t.Errorf("variable %s: %v", name, err)
			continue
		}
		var values []string
		if err := json.Unmarshal(data, &values); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"job": "orders-service", "handler": "charge-orders,ship-orders"}[name]
		if strings.Join(values, ",") != want {
			t.Errorf("variable %s offers %v, want %s", name, values, want)
		}
	}
}
