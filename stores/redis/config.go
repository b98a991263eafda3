package redis

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
)

// DefaultKeyPrefix is the prefix New uses when Config.KeyPrefix is empty.
const DefaultKeyPrefix = "dedup:"

// Config configures a Store. It is passed by value; New never writes to the
// caller's copy.
type Config struct {
	// KeyPrefix is prepended to every scoped key to form the Redis key, so
	// the records of one application are easy to find (SCAN MATCH
	// dedup:*), to give their own ACL (~dedup:*) and to tell apart from
	// other data in the same database. A record of scope "charge-orders"
	// and business key "ORDER-000123" lives at
	// "dedup:charge-orders:ORDER-000123". Defaults to "dedup:"; there is no
	// way to have no prefix. Give every application sharing a database its
	// own prefix, or the same prefix to let them deduplicate together.
	//
	// It must end with ":" and contain no other ":" ("dedup:",
	// "billing-dedup:", "{dedup}:"); New refuses anything else with
	// ErrAmbiguousPrefix. The scope is escaped so that it holds no ":", so
	// the first ":" ends the prefix and the second the scope: the Redis key
	// of (prefix, scope, key) is then never that of another triple. With a
	// nested prefix it would be: "app:" + scope "billing" + key
	// "charge:ORDER-1" and "app:billing:" + scope "charge" + key "ORDER-1"
	// are both "app:billing:charge:ORDER-1".
	//
	// Keep it free of "{" and "}": in a Redis Cluster those select the part
	// of the key that is hashed to a slot, and a prefix with a hash tag
	// would put every record on one node.
	KeyPrefix string

	// AllowEviction lets New accept a server whose maxmemory-policy is not
	// noeviction. Without it New reads the policy of every server it checks
	// (INFO memory, else CONFIG GET) and refuses any other with an
	// *EvictionPolicyError: when memory is full, allkeys-* policies delete
	// any key and volatile-* policies exactly the keys with a TTL, which
	// every record has. An evicted completed record lets the next copy of
	// its message run the effect again; an evicted in-progress record lets
	// a copy run while its owner still does. Set it only for a database
	// where a lost record is acceptable (or that can never fill up), and
	// alert on Redis' evicted_keys. Defaults to false.
	AllowEviction bool

	// Logger receives New's warning when a server tells neither INFO
	// memory's maxmemory_policy nor CONFIG GET maxmemory-policy (logged
	// once per such server, at info level, with its addr), after which New
	// proceeds. Defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

func (c *Config) setDefaults() {
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultKeyPrefix
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

// Validate reports every problem in the configuration at once (joined with
// errors.Join), after applying defaults to a copy. New calls it.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if i := strings.IndexByte(c.KeyPrefix, ':'); i != len(c.KeyPrefix)-1 {
		errs = append(errs, fmt.Errorf("%w: Config.KeyPrefix %q must end with \":\" and contain no other \":\" "+
			"(e.g. %q), or its records could share Redis keys with those of another prefix", ErrAmbiguousPrefix, c.KeyPrefix, suggestPrefix(c.KeyPrefix)))
	}
	return errors.Join(errs...)
}

// suggestPrefix turns a refused prefix into an accepted one, for the error
// message: inner colons become "-", and the prefix ends with ":".
func suggestPrefix(prefix string) string {
	return strings.ReplaceAll(strings.TrimRight(prefix, ":"), ":", "-") + ":"
}
