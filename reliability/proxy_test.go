package reliability_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// faultProxy is an in-process TCP proxy (Shopify's toxiproxy, used as a
// library, no daemon) between Redis clients and a redis-server, listening
// on a free 127.0.0.1 port, into which the test injects faults:
//
//   - latency on one direction ("latency"): every chunk is held for the
//     latency; a latency of a minute, removed later, holds requests until
//     then and delivers them on removal (a pause);
//   - connection resets ("reset_peer" with timeout 0): a connection that
//     sends data in that direction while the toxic is present is closed
//     with RST, its data dropped. Upstream (client → server) the request is
//     lost before Redis sees it; downstream (server → client) Redis has
//     run the command and its reply is lost.
type faultProxy struct {
	proxy *toxiproxy.Proxy
}

func newFaultProxy(t testing.TB, upstream string) *faultProxy {
	t.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(server, "redis", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("toxiproxy: %v", err)
	}
	t.Cleanup(p.Stop)
	return &faultProxy{proxy: p}
}

// Addr is the proxy's listening address, for the client.
func (f *faultProxy) Addr() string { return f.proxy.Listen }

// add installs a toxic; stream is "upstream" (client → server) or
// "downstream".
func (f *faultProxy) add(t testing.TB, name, typ, stream string, attributes map[string]any) {
	t.Helper()
	if err := f.tryAdd(name, typ, stream, attributes); err != nil {
		t.Fatal(err)
	}
}

// tryAdd is add for goroutines other than the test's: it returns the error.
func (f *faultProxy) tryAdd(name, typ, stream string, attributes map[string]any) error {
	b, err := json.Marshal(map[string]any{"name": name, "type": typ, "stream": stream, "attributes": attributes})
	if err != nil {
		return err
	}
	if _, err := f.proxy.Toxics.AddToxicJson(strings.NewReader(string(b))); err != nil {
		return fmt.Errorf("adding toxic %s: %w", name, err)
	}
	return nil
}

// remove takes a toxic out; data it held is delivered.
func (f *faultProxy) remove(t testing.TB, name string) {
	t.Helper()
	if err := f.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
		t.Fatalf("removing toxic %s: %v", name, err)
	}
}
