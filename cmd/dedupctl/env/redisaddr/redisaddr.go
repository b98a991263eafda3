// Package redisaddr turns the one Redis address format dedupctl accepts
// (REDIS_ADDR, -redis-addr) into a go-redis client. Other commands that
// open the same stores (the repository's lab) parse with it too, so that an
// address that works for one works for the other.
package redisaddr

import (
	"errors"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// Env names the environment variable the commands read the address from.
const Env = "REDIS_ADDR"

// ErrEmpty is returned by Client for an empty or blank address: the caller
// decides what no address means (dedupctl refuses it, the lab starts an
// embedded server).
var ErrEmpty = errors.New("redisaddr: no Redis address")

// Client returns a client for addr, which is one of:
//
//   - "host:port": one server;
//   - a redis:// or rediss:// URL (user, password, database, TLS): one
//     server, parsed by goredis.ParseURL;
//   - comma-separated "host:port" seeds: a Redis Cluster.
//
// Blanks around each part are ignored. It makes no request: an unreachable
// server shows on the first command. A malformed URL gives an error naming
// the address with its password masked.
func Client(addr string) (goredis.UniversalClient, error) {
	addr = strings.TrimSpace(addr)
	switch {
	case addr == "":
		return nil, ErrEmpty
	case strings.Contains(addr, ","):
		var seeds []string
		for _, a := range strings.Split(addr, ",") {
			if a = strings.TrimSpace(a); a != "" {
				seeds = append(seeds, a)
			}
		}
		if len(seeds) == 0 {
			return nil, ErrEmpty
		}
		return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: seeds}), nil
	case strings.Contains(addr, "://"):
		o, err := goredis.ParseURL(addr)
		if err != nil {
			// go-redis quotes the URL, password included, in its error.
			return nil, fmt.Errorf("redisaddr: Redis address %q: %s", mask(addr), strings.ReplaceAll(err.Error(), addr, mask(addr)))
		}
		return goredis.NewClient(o), nil
	default:
		return goredis.NewClient(&goredis.Options{Addr: addr}), nil
	}
}

// Describe names the server(s) of a client made by Client, without the
// credentials a URL may carry: "127.0.0.1:6379" or "Cluster a:1,b:2".
func Describe(c goredis.UniversalClient) string {
	switch c := c.(type) {
	case *goredis.Client:
		return c.Options().Addr
	case *goredis.ClusterClient:
		return "Cluster " + strings.Join(c.Options().Addrs, ",")
	default:
		return fmt.Sprintf("%T", c)
	}
}

// mask replaces the password of a URL-like address with "xxxxx".
func mask(addr string) string {
	scheme, rest, ok := strings.Cut(addr, "://")
	if !ok {
		return addr
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return addr
	}
	user, _, hasPass := strings.Cut(rest[:at], ":")
	if !hasPass {
		return addr
	}
	return scheme + "://" + user + ":xxxxx" + rest[at:]
}
