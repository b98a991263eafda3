package embedded

import (
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// natsReady bounds the wait for the embedded NATS server to accept clients.
const natsReady = 30 * time.Second

// NATS is an in-process NATS server with JetStream.
type NATS struct {
	// URL is the client URL, "nats://127.0.0.1:port".
	URL string

	srv *server.Server
	dir string
}

// StartNATS starts a NATS server with JetStream on a free 127.0.0.1 port,
// storing its streams in a new temporary directory, and returns once it
// accepts clients. Call Close to stop it and remove the directory.
func StartNATS() (*NATS, error) {
	dir, err := os.MkdirTemp("", "embedded-nats-*")
	if err != nil {
		return nil, fmt.Errorf("embedded: NATS store directory: %w", err)
	}
	srv, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("embedded: NATS server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(natsReady) {
		srv.Shutdown()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("embedded: NATS server not accepting clients after %v", natsReady)
	}
	return &NATS{URL: srv.ClientURL(), srv: srv, dir: dir}, nil
}

// Close stops the server and removes its streams.
func (n *NATS) Close() {
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
	_ = os.RemoveAll(n.dir)
}
