package testserver_test

import (
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

// A node starts on its own ports and answers AMQP; Close stops it.
func TestRabbitMQStartsAndStops(t *testing.T) {
	r, err := testserver.StartRabbitMQ()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s at %s ready after %v", r.NodeName, r.URL, r.Startup.Round(10*time.Millisecond))
	u, err := url.Parse(r.URL)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if c, err := net.DialTimeout("tcp", u.Host, time.Second); err == nil {
		_ = c.Close()
		t.Errorf("%s still accepts connections after Close", u.Host)
	}
}
