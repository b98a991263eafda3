package linear

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// httpFaults is an HTTP proxy in front of a DynamoDB emulator that answers
// some requests itself with a ThrottlingException (the request never
// reaches the emulator), and forwards others but drops the response
// (the emulator ran the request; the client's connection is reset before
// the reply). Everything else is forwarded as is.
type httpFaults struct {
	upstream  *url.URL
	transport *http.Transport
	listener  net.Listener

	mu             sync.Mutex
	rng            *rand.Rand
	throttle, drop float64 // chances, per request; 0 while calm

	requests, throttled, dropped atomic.Int64
}

func newHTTPFaults(t testing.TB, endpoint string) *httpFaults {
	t.Helper()
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &httpFaults{upstream: u, listener: l, rng: rand.New(rand.NewPCG(1, 2)),
		transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64}}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		_ = srv.Close()
		h.transport.CloseIdleConnections()
	})
	return h
}

// Endpoint is the proxy's base URL, for the SDK.
func (h *httpFaults) Endpoint() string { return "http://" + h.listener.Addr().String() }

// set changes the chances of throttling and of a dropped response.
func (h *httpFaults) set(throttle, drop float64) {
	h.mu.Lock()
	h.throttle, h.drop = throttle, drop
	h.mu.Unlock()
}

func (h *httpFaults) roll() (throttle, drop bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	x := h.rng.Float64()
	return x < h.throttle, x >= h.throttle && x < h.throttle+h.drop
}

const throttlingBody = `{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"Rate of requests exceeds the allowed throughput."}`

func (h *httpFaults) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.requests.Add(1)
	throttle, drop := h.roll()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if throttle {
		h.throttled.Add(1)
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.Header().Set("X-Amzn-ErrorType", "ThrottlingException")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(throttlingBody))
		return
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, h.upstream.String()+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	resp, err := h.transport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	reply, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if drop {
		// The emulator ran the request; reset the client's connection
		// instead of answering.
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				h.dropped.Add(1)
				if tcp, ok := conn.(*net.TCPConn); ok {
					_ = tcp.SetLinger(0)
				}
				_ = conn.Close()
				return
			}
		}
	}
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(reply)
}

// dynamoClient returns a DynamoDB client of endpoint with the SDK's
// default retries (3 attempts), not rate limited (the SDK's retry quota,
// meant for a remote service, runs out under injected faults).
func dynamoClient(endpoint string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(endpoint),
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.RateLimiter = ratelimit.None
		}),
		HTTPClient: awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
			t.Proxy = nil
			t.MaxIdleConnsPerHost = 32
		}),
	})
}

// dynamoMargin is the store's ClockSkewMargin in these tests: a record is
// taken over once its deadline is that far past, by the claiming client's
// clock (the test's own).
const dynamoMargin = 50 * time.Millisecond

// TestLinearDynamo: the DynamoDB store's history on moto and on dynalite,
// behind an HTTP proxy that, in fault windows, answers one request in ten
// with a ThrottlingException and drops the response of one in ten after
// the emulator ran it (the SDK retries both; a claim or completion resent
// after a lost reply finds its own write).
func TestLinearDynamo(t *testing.T) {
	t.Parallel()
	for _, emulator := range []string{"moto", "dynalite"} {
		t.Run(emulator, func(t *testing.T) {
			var endpoint string
			switch emulator {
			case "moto":
				m, err := testserver.StartMoto()
				if errors.Is(err, testserver.ErrMotoMissing) {
					t.Skip(err)
				}
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = m.Close() })
				endpoint = m.Endpoint
			default:
				n, err := testserver.StartDynalite()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = n.Close() })
				endpoint = n.Endpoint
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			const table = "linear"
			if err := dynamo.CreateTable(ctx, dynamoClient(endpoint), dynamo.TableConfig{Table: table, SkipTTL: true}); err != nil {
				t.Fatal(err)
			}
			proxy := newHTTPFaults(t, endpoint)
			store, err := dynamo.New(ctx, dynamo.Config{Client: dynamoClient(proxy.Endpoint()), Table: table, SkipTTL: true, ClockSkewMargin: dynamoMargin})
			if err != nil {
				t.Fatal(err)
			}
			tg := newTarget(store)
			tg.retries = true
			w := defaultWorkload("linear:" + emulator + ":")
			w.Duration = time.Minute
			w.MaxOps = 1 << 20
			w.Lease = time.Second // the emulators answer in tens of milliseconds, and the SDK's retries take longer
			ops := runScenario(t, w, tg, 23, time.Second, func(t *testing.T, rec *recorder) error {
				for i := 0; i < rounds(4); i++ {
					time.Sleep(600 * time.Millisecond)
					proxy.set(0.1, 0.1)
					time.Sleep(600 * time.Millisecond)
					proxy.set(0, 0)
				}
				return nil
			})
			t.Logf("faults: %d requests through the proxy, %d throttled, %d responses dropped", proxy.requests.Load(), proxy.throttled.Load(), proxy.dropped.Load())
			requireLinearizable(t, ops, params{margin: int64(dynamoMargin), retries: true})
		})
	}
}
