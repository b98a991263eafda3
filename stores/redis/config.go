package redis

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

// DefaultKeyPrefix is the prefix New uses when Config.KeyPrefix is empty.
const DefaultKeyPrefix = "dedup:"

// Config configures a Store. It is passed by value; New never writes to the
// caller's copy.
type Config struct {
	// Client is the go-redis client of the database that holds the
	// records: a *redis.Client, a *redis.ClusterClient, a Sentinel client
	// (redis.NewFailoverClient) or a *redis.Ring all satisfy it. Required:
	// New refuses a nil client (or a nil pointer in the interface) with
	// ErrNoClient. The store never closes it.
	Client goredis.UniversalClient

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

	// AllowActiveActive lets New accept an instance of an Active-Active
	// database (Redis Enterprise or Redis Cloud Active-Active, "CRDB"),
	// which New otherwise refuses with an *ActiveActiveError when the
	// server knows the command CRDT.DEBUG. Every instance of such a
	// database takes writes and replicates them to the others
	// asynchronously: SET NX is atomic within one instance only, so two
	// consumers claiming a key through two instances (regions) can both
	// acquire it and both run its effect, with fences that do not order
	// them; when the instances sync, the later write by wall clock wins.
	// Set it only where every consumer of a key writes through the same
	// instance (the other regions on standby); a consumer moved to another
	// instance then meets only the records that replication brought there.
	// Defaults to false.
	AllowActiveActive bool

	// WaitReplicas, when positive, makes a write the store relies on wait
	// until that many replicas have it before it is reported: Claim when
	// it acquires, Complete, and Extend each send their write and
	// `WAIT WaitReplicas WaitTimeout` in one pipeline, on one connection to
	// the key's master (the Cluster node that owns the key's slot), so one
	// round trip still. Redis replicates asynchronously: without it a
	// master that acknowledged a claim or a completion and died before its
	// replica had it leaves a promoted replica that never saw the record,
	// and the next copy of the message runs its effect again.
	//
	// A write that WAIT does not confirm in time is not acted on: Claim
	// releases the claim it took (best effort) and returns an error
	// matching ErrNotReplicated (the middleware nacks the message, which is
	// redelivered); Complete and Extend return such an error (the
	// middleware retries Complete as after any store error). Release does
	// not wait: a lost release only delays the next copy until the lease
	// ends. Claims that find a record (Duplicate, InProgress, Conflict) are
	// never refused, but the WAIT travels with them too (the outcome is
	// not known before the reply): it waits for the connection's earlier
	// writes, so while the replicas lag or are gone they also take up to
	// WaitTimeout.
	//
	// Cost: each acquiring Claim, Complete and Extend waits for the
	// replica's acknowledgement (one replication round trip, well under a
	// millisecond on a LAN; see README.md for the measured ratio), and with
	// fewer than WaitReplicas replicas connected every claim is refused
	// after WaitTimeout. It narrows but does not close every window: WAIT
	// is not consensus, and a failover may promote a replica that is not
	// among those that acknowledged; set it to the number of replicas, or
	// rely on Sentinel and Cluster promoting the most up-to-date one.
	// Not supported with a Ring (New refuses it). Defaults to 0: no wait.
	WaitReplicas int

	// WaitTimeout bounds each WAIT (in the server) when WaitReplicas is
	// positive. It must be shorter than the client's ReadTimeout, which
	// bounds the whole pipeline (New checks this for *redis.Client and
	// *redis.ClusterClient). Defaults to 1s when WaitReplicas is positive;
	// setting it without WaitReplicas is a configuration error.
	WaitTimeout time.Duration

	// AutoPipeline sends the commands of concurrent calls together: while
	// a command is in flight, the commands of other calls (claims,
	// completions, releases, extensions) wait and then go as one pipeline,
	// in one write with one read of the replies, instead of one round trip
	// and two system calls each. With nothing in flight a command is sent
	// at once, alone: no delay is added to a lone caller. A command that
	// waits is delayed by the batches ahead of it: one per 256 commands
	// queued before it, two in flight at once, each bounded by the
	// client's ReadTimeout and WriteTimeout (times MaxRetries+1 when the
	// connection breaks). Neither dedup.Config.StoreTimeout nor the
	// caller's context cuts that wait short: they are checked when the
	// command's batch is taken, and a command whose context has ended by
	// then is not sent (it fails with the context's error). Under load it
	// trades about one round trip of latency for several times the
	// throughput (see README.md for the measured figures); a server that
	// stalls delays every queued caller up to those client timeouts, so
	// keep them short. Each command keeps its own reply: a batch whose connection
	// breaks fails its own commands only, and go-redis retries it as it
	// retries a single command. On a ClusterClient go-redis splits each
	// batch per master (by each key's slot), on a Ring per shard. Not
	// supported with WaitReplicas (whose WAIT must follow its own write on
	// one connection). Defaults to false.
	//
	// The batcher is the store's own, not go-redis' AutoPipeliner (go-redis
	// v9.23, the version this module requires, marks it experimental):
	// measured side by side on Claim+Complete (BenchmarkAutoPipeline;
	// figures in README.md), go-redis' hands every command to its flushing
	// goroutine, even a lone one, and took more time and CPU per call with
	// one caller and fewer calls per second with many. go-redis'
	// full-duplex mode came closest.
	AutoPipeline bool

	// OmitProvenance leaves the provenance out of completed records: the
	// first claim's transport id and message id (dedup.Origin), claimed-at,
	// completed-at and the claim count, which in-progress records keep
	// either way. A completed record without fingerprint and result is
	// then a bare integer that Redis keeps inside its object header: about
	// 145 bytes of used_memory per record instead of about 193 (34-byte
	// keys, a Watermill UUID; see README.md for the figures), for
	// memory-tight deployments that can do without knowing which copy ran
	// the effect. Defaults to false: every record keeps its provenance.
	OmitProvenance bool

	// Logger receives New's warnings, each logged once per server at info
	// level with its addr, after which New proceeds: a server that tells
	// neither INFO memory's maxmemory_policy nor CONFIG GET
	// maxmemory-policy; one that tells its replication role neither in
	// INFO replication nor with ROLE; one that refuses COMMAND INFO, so
	// that an Active-Active database cannot be told apart. Defaults to
	// watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

func (c *Config) setDefaults() {
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultKeyPrefix
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	if c.WaitReplicas > 0 && c.WaitTimeout == 0 {
		c.WaitTimeout = defaultWaitTimeout
	}
}

// defaultWaitTimeout is Config.WaitTimeout's default.
const defaultWaitTimeout = time.Second

// Validate reports every problem in the configuration at once (joined with
// errors.Join), after applying defaults to a copy. New calls it.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if storekit.IsNil(c.Client) {
		errs = append(errs, fmt.Errorf("%w (the go-redis client of the database that holds the records)", ErrNoClient))
	}
	if i := strings.IndexByte(c.KeyPrefix, ':'); i != len(c.KeyPrefix)-1 {
		errs = append(errs, fmt.Errorf("%w: Config.KeyPrefix %q must end with \":\" and contain no other \":\" "+
			"(e.g. %q), or its records could share Redis keys with those of another prefix", ErrAmbiguousPrefix, c.KeyPrefix, suggestPrefix(c.KeyPrefix)))
	}
	if c.WaitReplicas < 0 {
		errs = append(errs, fmt.Errorf("dedup/redis: Config.WaitReplicas must not be negative, got %d", c.WaitReplicas))
	}
	if c.WaitTimeout < 0 || (c.WaitTimeout > 0 && c.WaitTimeout < time.Millisecond) {
		errs = append(errs, fmt.Errorf("dedup/redis: Config.WaitTimeout must be at least 1ms, got %v", c.WaitTimeout))
	}
	if c.AutoPipeline && c.WaitReplicas > 0 {
		errs = append(errs, errors.New("dedup/redis: Config.AutoPipeline cannot be combined with Config.WaitReplicas, whose WAIT must follow its own write on one connection"))
	}
	if c.WaitTimeout > 0 && c.WaitReplicas <= 0 {
		errs = append(errs, fmt.Errorf("dedup/redis: Config.WaitTimeout is %v but Config.WaitReplicas is %d: set WaitReplicas to wait for replicas", c.WaitTimeout, c.WaitReplicas))
	}
	return errors.Join(errs...)
}

// suggestPrefix turns a refused prefix into an accepted one, for the error
// message: inner colons become "-", and the prefix ends with ":".
func suggestPrefix(prefix string) string {
	return strings.ReplaceAll(strings.TrimRight(prefix, ":"), ":", "-") + ":"
}
