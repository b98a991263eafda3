package embedded

import (
	"fmt"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
)

// miniredisVersion is what the embedded server reports as redis_version.
// miniredis implements the Redis 7 commands the store uses (SET with NX, PX
// and GET together; EVALSHA with the Lua string library) and the stream
// commands of watermill-redisstream (XADD, XREADGROUP, XACK, XPENDING with
// IDLE, XCLAIM, XINFO CONSUMERS), which the store conformance suite and the
// redisstream broker tests check; its own INFO has no server section, so the
// store's version check would refuse it.
const miniredisVersion = "7.2.0"

// Redis is an in-process miniredis.
type Redis struct {
	// Addr is "127.0.0.1:port".
	Addr string

	mini *miniredis.Miniredis
}

// StartRedis starts a miniredis on a free 127.0.0.1 port whose TTLs follow
// the wall clock and which answers INFO server with a Redis 7 version. It
// keeps everything in memory. Call Close to stop it.
//
// miniredis only expires keys when told to. ClockTTL makes it age every TTL
// by the time elapsed since the previous command, at the start of each
// command, so a key is never aged by time that passed before it was set.
// (A ticker calling FastForward did that: when the ticker goroutine ran
// late, its catch-up step expired keys set just before it at once, and until
// then expired keys lived on; a busy 2-core machine under -race saw lags of
// a second.) Cost: each command walks the keys to age them, which is fine for
// a demo's few thousand keys.
func StartRedis() (*Redis, error) {
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	if err := m.Start(); err != nil {
		return nil, fmt.Errorf("embedded: starting miniredis: %w", err)
	}
	m.Server().SetPreHook(func(c *server.Peer, cmd string, args ...string) bool {
		if cmd == "INFO" && len(args) == 1 && strings.EqualFold(args[0], "server") {
			c.WriteBulk("# Server\r\nredis_version:" + miniredisVersion + "\r\nredis_mode:standalone\r\nexecutable:miniredis\r\n")
			return true
		}
		return false
	})
	return &Redis{Addr: m.Addr(), mini: m}, nil
}

// Close stops the server; its data is gone.
func (r *Redis) Close() { r.mini.Close() }
