package redisaddr_test

import (
	"errors"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/cmd/dedupctl/env/redisaddr"
)

func TestClientForms(t *testing.T) {
	for _, tc := range []struct {
		addr, want string
		cluster    bool
	}{
		{"127.0.0.1:6379", "127.0.0.1:6379", false},
		{"  127.0.0.1:6380 ", "127.0.0.1:6380", false},
		{"redis://user:secret@127.0.0.1:6381/2", "127.0.0.1:6381", false},
		{"127.0.0.1:7000, 127.0.0.1:7001,", "Cluster 127.0.0.1:7000,127.0.0.1:7001", true},
	} {
		c, err := redisaddr.Client(tc.addr)
		if err != nil {
			t.Fatalf("%q: %v", tc.addr, err)
		}
		if got := redisaddr.Describe(c); got != tc.want {
			t.Errorf("%q: Describe = %q, want %q", tc.addr, got, tc.want)
		}
		if _, ok := c.(*goredis.ClusterClient); ok != tc.cluster {
			t.Errorf("%q: cluster client %v, want %v", tc.addr, ok, tc.cluster)
		}
		_ = c.Close()
	}
	c, _ := redisaddr.Client("redis://user:secret@127.0.0.1:6381/2")
	if o := c.(*goredis.Client).Options(); o.Password != "secret" || o.DB != 2 {
		t.Errorf("URL parsed to password %q, db %d", o.Password, o.DB)
	}
	_ = c.Close()
}

func TestClientRefusesEmptyAndBadURL(t *testing.T) {
	for _, addr := range []string{"", "  ", ",", " , "} {
		if _, err := redisaddr.Client(addr); !errors.Is(err, redisaddr.ErrEmpty) {
			t.Errorf("%q: %v, want ErrEmpty", addr, err)
		}
	}
	_, err := redisaddr.Client("redis://user:secret@127.0.0.1:notaport/x")
	if err == nil {
		t.Fatal("a malformed URL was accepted")
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("the error shows the password: %v", err)
	}
}
