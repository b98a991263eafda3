package testserver

import (
	"errors"
	"io"
	"os"
	"strings"
	"testing"
)

// A Prometheus of its own answers queries on its loopback port; Close stops
// it cleanly and removes its directory; a configuration it cannot load is
// an error with its output.
func TestPrometheus(t *testing.T) {
	t.Parallel()
	p := timed(t, "prometheus", func() (*Prometheus, error) {
		return StartPrometheus("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n")
	})
	if !strings.HasPrefix(p.URL, "http://127.0.0.1:") {
		t.Errorf("URL %q is not on loopback", p.URL)
	}
	resp, err := apiClient.Get(p.URL + "/api/v1/query?query=1%2B1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if !strings.Contains(string(body), `"result":[`) || !strings.Contains(string(body), `"2"`) {
		t.Errorf("1+1 answered %s", body)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory left behind: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := StartPrometheus("global: [not a map"); err == nil {
		t.Error("a configuration Prometheus cannot load started")
	}
}
