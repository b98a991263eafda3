package testserver_test

import (
	"testing"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

func TestStartRedisSentinel(t *testing.T) {
	master, err := testserver.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	s, err := testserver.StartRedisSentinel(master.Addr, "mymaster")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := testserver.StartRedisSentinel("not-an-address", "m"); err == nil {
		t.Fatal("a master address without a port was accepted")
	}
}
