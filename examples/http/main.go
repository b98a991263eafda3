// Command http is the example of one dedup store serving an API, a webhook
// receiver and a Watermill consumer: POST /payments takes an
// Idempotency-Key, POST /webhooks/payments-provider is keyed on the
// provider's event id, and the consumer of the events the webhook publishes
// is keyed on the payment id, all in the same Redis.
//
//	go run ./examples/http                       # in-process miniredis
//	REDIS_ADDR=127.0.0.1:6379 go run ./examples/http   # a real Redis 7
//
// See README.md in this directory for curl commands and their responses.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	verbose := flag.Bool("v", false, "log every dedup decision")
	flag.Parse()
	if err := run(*addr, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "examples/http:", err)
		os.Exit(1)
	}
}

func run(addr string, verbose bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	client, what, closeRedis, err := openRedis(os.Getenv("REDIS_ADDR")) // unset: an in-process miniredis
	if err != nil {
		return err
	}
	defer closeRedis()

	var logger watermill.LoggerAdapter = watermill.NopLogger{}
	if verbose {
		logger = watermill.NewStdLogger(true, false)
	}
	a, err := newApp(ctx, client, logger)
	if err != nil {
		return err
	}
	defer a.Close()

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 10 * time.Second}
	fmt.Printf("listening on http://%s, store: %s\n", ln.Addr(), what)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
