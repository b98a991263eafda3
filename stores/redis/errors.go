package redis

import (
	"errors"
	"fmt"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// Why a claim was lost. Complete, Release and Extend return errors that match
// both dedup.ErrClaimLost and exactly one of these with errors.Is, so a
// caller can tell an expired claim from a claim another consumer took over.
var (
	// ErrExpired: there is no record under the key any more: its lease ended
	// (and nobody claimed it since), it was released, or Redis evicted it.
	// Nothing was changed or created.
	ErrExpired = errors.New("dedup/redis: no record: the lease ended, or the claim was released or evicted")

	// ErrNotOwner: the record carries another owner token: the lease ended
	// and another consumer claimed the key. Nothing was changed.
	ErrNotOwner = errors.New("dedup/redis: the record is owned by another claim")

	// ErrAlreadyCompleted: the record was completed with this very claim, so
	// the claim can no longer release, extend or complete it. For Complete
	// this may also mean that an earlier attempt of the same call succeeded
	// but its reply was lost (go-redis retries a command after a network
	// error, up to Options.MaxRetries): the effect is recorded either way.
	// It matches dedup.ErrAlreadyCompleted, which the middleware counts as
	// completed.
	ErrAlreadyCompleted = fmt.Errorf("dedup/redis: the record was already completed by this claim: %w", dedup.ErrAlreadyCompleted)
)

// ErrUnknownFormat: the value under a key is not a record this version can
// read (a newer format version, or a value another program wrote under the
// prefix). Claim returns it as a store error (the middleware nacks); it is not
// ErrClaimLost, except when Complete, Release or Extend find such a value,
// which cannot carry their claim's token.
var ErrUnknownFormat = errors.New("dedup/redis: unknown record format")

// ErrNoClient: New was given a Config without a Client (nil, or a nil
// pointer such as a nil *redis.Client). Validate reports it too.
var ErrNoClient = errors.New("dedup/redis: Config.Client is required")

// ErrAmbiguousPrefix: New was given a Config.KeyPrefix that does not end
// with ":" or contains another ":". Such a prefix is a prefix of another's
// keys ("app:" and "app:billing:", or "dedup" and "dedupx:"), so two stores
// sharing a database could share records. See Config.KeyPrefix.
var ErrAmbiguousPrefix = errors.New("dedup/redis: ambiguous key prefix")

// ErrServerTooOld: New found a server older than Redis 7.0, which cannot
// combine SET NX with GET (the one-round-trip claim). The error is a
// *VersionError.
var ErrServerTooOld = errors.New("dedup/redis: Redis 7.0 or newer is required")

// VersionError is returned by New when a server is too old (it matches
// ErrServerTooOld) or its version cannot be read.
type VersionError struct {
	// Addr is the server's address as the client knows it.
	Addr string
	// Version is the redis_version reported by INFO, or "" when unreadable.
	Version string
	// Err is ErrServerTooOld, or the reason the version could not be read.
	Err error
}

func (e *VersionError) Error() string {
	if e.Version == "" {
		return fmt.Sprintf("dedup/redis: reading the version of %s: %v", e.Addr, e.Err)
	}
	return fmt.Sprintf("dedup/redis: %s runs Redis %s: %v", e.Addr, e.Version, e.Err)
}

// Unwrap returns the cause (ErrServerTooOld when the server is too old).
func (e *VersionError) Unwrap() error { return e.Err }

// ErrNotReplicated: with Config.WaitReplicas set, a write (an acquiring
// Claim, a Complete, an Extend) reached fewer replicas than required within
// Config.WaitTimeout, or the master failed before WAIT answered. The write
// may or may not survive a failover, so it is not acted on: Claim has
// released its claim (best effort) and the message should be nacked;
// Complete and Extend should be retried. It is a store error, not
// dedup.ErrClaimLost. The error is a *ReplicationError.
var ErrNotReplicated = errors.New("dedup/redis: the write did not reach the required replicas in time")

// ReplicationError is returned when WAIT confirms fewer replicas than
// Config.WaitReplicas. It matches ErrNotReplicated.
type ReplicationError struct {
	// Op is "claim", "complete" or "extend".
	Op string
	// Key is the scoped key.
	Key string
	// Want is Config.WaitReplicas; Got is what WAIT answered.
	Want, Got int64
}

func (e *ReplicationError) Error() string {
	return fmt.Sprintf("dedup/redis: %s %.200q: WAIT confirmed %d of %d replicas: %v", e.Op, e.Key, e.Got, e.Want, ErrNotReplicated)
}

// Unwrap returns ErrNotReplicated.
func (e *ReplicationError) Unwrap() error { return ErrNotReplicated }
