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
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	goredis "github.com/redis/go-redis/v9"
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

	redisAddr, what := os.Getenv("REDIS_ADDR"), "Redis at "+os.Getenv("REDIS_ADDR")
	if redisAddr == "" {
		mr, err := startMiniredis(ctx)
		if err != nil {
			return err
		}
		defer mr.Close()
		redisAddr, what = mr.Addr(), "in-process miniredis (set REDIS_ADDR to use a real Redis 7)"
	}
	client := goredis.NewClient(&goredis.Options{Addr: redisAddr})
	defer client.Close()

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

// startMiniredis starts an in-process Redis stand-in on a free loopback
// port, with two adjustments the store needs:
//
//   - miniredis does not answer INFO server, which the store reads to refuse
//     servers older than 7.0; a hook answers it with a 7.x version
//     (miniredis does implement SET NX PX GET and the Lua scripts);
//   - miniredis only expires keys when told time has passed; a goroutine
//     moves its clock with the wall clock, so leases and retention end.
func startMiniredis(ctx context.Context) (*miniredis.Miniredis, error) {
	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr("127.0.0.1:0"); err != nil {
		return nil, err
	}
	// Set before any client connects: only this process knows the address.
	mr.Server().SetPreHook(func(c *server.Peer, cmd string, args ...string) bool {
		if cmd == "INFO" && len(args) == 1 && strings.EqualFold(args[0], "server") {
			c.WriteBulk("# Server\r\nredis_version:7.2.0\r\n")
			return true
		}
		return false
	})
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				mr.FastForward(now.Sub(last))
				last = now
			}
		}
	}()
	return mr, nil
}
