package dashboard_test

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	sdk "github.com/grafana/grafana-foundation-sdk/go/dashboard"

	"github.com/watermill-dedup/watermill-dedup/ops/dashboard"
)

// The committed file is what the generator writes today, byte for byte.
func TestCommittedDashboardIsGenerated(t *testing.T) {
	want, err := dashboard.JSON()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dashboard.File)
	if err != nil {
		t.Fatalf("%v (run go generate ./dashboard/ in the ops module)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what the generator writes: run go generate ./dashboard/ in the ops module and commit the file", dashboard.File)
	}
	again, err := dashboard.JSON()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, want) {
		t.Error("two runs of the generator wrote different bytes")
	}
}

// The file reads back as a Grafana dashboard; panel ids are unique; every
// panel queries the selected Prometheus data source and has a title, a
// description and at least one query.
func TestDashboardShape(t *testing.T) {
	plugins.RegisterDefaultPlugins()
	b, err := os.ReadFile(dashboard.File)
	if err != nil {
		t.Fatal(err)
	}
	var d sdk.Dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("the SDK cannot read the dashboard back: %v", err)
	}
	if d.Uid == nil || *d.Uid != dashboard.UID {
		t.Errorf("uid %v, want %q", d.Uid, dashboard.UID)
	}
	var raw struct {
		Panels []struct {
			ID          int    `json:"id"`
			Type        string `json:"type"`
			Title       string `json:"title"`
			Description string `json:"description"`
			Datasource  struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	ids := map[int]string{}
	panels := 0
	for _, p := range raw.Panels {
		if p.ID <= 0 {
			t.Errorf("panel %q has id %d", p.Title, p.ID)
		}
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", other, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.Type == "row" {
			continue
		}
		panels++
		if p.Title == "" || p.Description == "" || len(p.Targets) == 0 {
			t.Errorf("panel %d: title %q, description %q, %d queries", p.ID, p.Title, p.Description, len(p.Targets))
		}
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: data source %q, want the variable", p.Title, p.Datasource.UID)
		}
		for _, q := range p.Targets {
			if !strings.Contains(q.Expr, `job=~"$job"`) {
				t.Errorf("panel %q: query %q ignores the job variable", p.Title, q.Expr)
			}
		}
	}
	if panels < 13 {
		t.Errorf("%d panels, want the 13 of the layout", panels)
	}
	var vars []string
	for _, v := range raw.Templating.List {
		vars = append(vars, v.Name)
	}
	if strings.Join(vars, ",") != "datasource,job,handler" {
		t.Errorf("variables %v, want datasource, job, handler", vars)
	}
}
