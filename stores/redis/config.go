package redis

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
	// Keep it free of "{" and "}": in a Redis Cluster those select the part
	// of the key that is hashed to a slot, and a prefix with a hash tag
	// would put every record on one node.
	KeyPrefix string
}

func (c *Config) setDefaults() {
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultKeyPrefix
	}
}
