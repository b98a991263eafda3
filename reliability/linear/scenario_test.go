package linear

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/anishathalye/porcupine"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// nemesis injects a scenario's faults while the clients run. It may run
// recorded operations of its own (a witness client, rec.newClient) and
// returns when its faults are over.
type nemesis func(t *testing.T, rec *recorder) error

// runScenario runs the workload on tg while nem runs, and returns the
// history. The clients stop settle after nem returns (or when the
// workload's Duration passes, if sooner): the history ends on a healthy
// store.
func runScenario(t *testing.T, w workload, tg target, seed uint64, settle time.Duration, nem nemesis) []porcupine.Operation {
	t.Helper()
	rec := newRecorder()
	stop := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		var err error
		if nem != nil {
			err = nem(t, rec)
		}
		time.Sleep(settle)
		close(stop)
		errc <- err
	}()
	n := w.run(rec, tg, stop, seed)
	<-stop
	if err := <-errc; err != nil {
		t.Fatalf("injecting the faults: %v", err)
	}
	t.Logf("%d calls from %d clients", n, w.Clients)
	return rec.history()
}

// every runs f every period until stop is closed, and waits for it.
func every(period time.Duration, stop <-chan struct{}, f func()) func() {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				f()
			}
		}
	}()
	return wg.Wait
}

// faultProxy is an in-process TCP proxy, Shopify's toxiproxy used as a
// library (its server and proxy API, no daemon), between a store's clients
// and its server: latency one way, connections reset one way (upstream: the
// request is lost before the server sees it; downstream: the server ran it
// and the reply is lost).
type faultProxy struct {
	proxy *toxiproxy.Proxy
}

func newFaultProxy(t testing.TB, name, upstream string) *faultProxy {
	t.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(server, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("toxiproxy: %v", err)
	}
	t.Cleanup(p.Stop)
	return &faultProxy{proxy: p}
}

// Addr is the proxy's listening address.
func (f *faultProxy) Addr() string { return f.proxy.Listen }

// add installs a toxic; stream is "upstream" (client → server) or
// "downstream".
func (f *faultProxy) add(name, typ, stream string, attributes map[string]any) error {
	b, err := json.Marshal(map[string]any{"name": name, "type": typ, "stream": stream, "attributes": attributes})
	if err != nil {
		return err
	}
	if _, err := f.proxy.Toxics.AddToxicJson(strings.NewReader(string(b))); err != nil {
		return fmt.Errorf("adding toxic %s: %w", name, err)
	}
	return nil
}

func (f *faultProxy) remove(name string) error {
	return f.proxy.Toxics.RemoveToxic(context.Background(), name)
}

// toxicCounts says how many of each fault a proxy nemesis injected.
type toxicCounts struct {
	mu                                   sync.Mutex
	latency, resetUpstream, resetDownstr int
}

func (c *toxicCounts) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("%d latency windows, %d upstream and %d downstream reset windows", c.latency, c.resetUpstream, c.resetDownstr)
}

// proxyFaults is a nemesis that injects, for rounds rounds one after the
// other: 150 ms of 20–80 ms latency each way, 60 ms of resets upstream,
// 60 ms of resets downstream, with 150 ms of calm between.
func proxyFaults(p *faultProxy, rounds int, counts *toxicCounts) nemesis {
	return func(t *testing.T, rec *recorder) error {
		calm := func() { time.Sleep(150 * time.Millisecond) }
		for i := 0; i < rounds; i++ {
			calm()
			lat := 20 + 20*(i%4)
			for _, stream := range []string{"upstream", "downstream"} {
				if err := p.add("latency-"+stream, "latency", stream, map[string]any{"latency": lat, "jitter": 10}); err != nil {
					return err
				}
			}
			time.Sleep(150 * time.Millisecond)
			for _, stream := range []string{"upstream", "downstream"} {
				if err := p.remove("latency-" + stream); err != nil {
					return err
				}
			}
			calm()
			stream := "upstream"
			if i%2 == 1 {
				stream = "downstream"
			}
			if err := p.add("reset", "reset_peer", stream, map[string]any{"timeout": 0}); err != nil {
				return err
			}
			time.Sleep(60 * time.Millisecond)
			if err := p.remove("reset"); err != nil {
				return err
			}
			counts.mu.Lock()
			counts.latency++
			if stream == "upstream" {
				counts.resetUpstream++
			} else {
				counts.resetDownstr++
			}
			counts.mu.Unlock()
		}
		return nil
	}
}
