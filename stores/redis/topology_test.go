package redis_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// expectReplicaRefused checks that err is the typed refusal of addr with
// role, naming master when given.
func expectReplicaRefused(t *testing.T, err error, addr, role, master string) {
	t.Helper()
	var rerr *redis.ReplicaError
	if !errors.Is(err, redis.ErrReplica) || !errors.As(err, &rerr) {
		t.Fatalf("New on %s: %v, want a *ReplicaError matching ErrReplica", addr, err)
	}
	if rerr.Addr != addr || rerr.Role != role || rerr.Master != master {
		t.Fatalf("refusal %+v, want addr %s, role %q, master %q", rerr, addr, role, master)
	}
	if !strings.Contains(err.Error(), "NewFailoverClient") {
		t.Fatalf("refusal %q does not say what to give instead", err)
	}
}

// A client given a replica's address: the replica would refuse every
// claim (READONLY), or, with replica-read-only no, keep claims from its
// master. New refuses it and names its master, also when the client's ACL
// user cannot read INFO replication (ROLE tells the role then); the
// master's address is accepted.
func TestNewRefusesReplica(t *testing.T) {
	master := startRedis(t)
	replica, err := testserver.StartRedisReplica(master)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = replica.Close() })

	_, err = newWith(t, clientOf(t, &goredis.Options{Addr: replica.Addr}), redis.Config{})
	expectReplicaRefused(t, err, replica.Addr, "slave", master.Addr)
	_, err = newWith(t, clientOf(t, &goredis.Options{Addr: replica.Addr}), redis.Config{AllowEviction: true, AllowActiveActive: true})
	expectReplicaRefused(t, err, replica.Addr, "slave", master.Addr)

	ctx := context.Background()
	admin := clientOf(t, &goredis.Options{Addr: replica.Addr})
	if err := admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-info", "+info|server", "+info|memory").Err(); err != nil {
		t.Fatal(err)
	}
	limited := clientOf(t, &goredis.Options{Addr: replica.Addr, Username: "app", Password: "secret"})
	if err := limited.Info(ctx, "replication").Err(); err == nil {
		t.Fatal("the ACL user can read INFO replication")
	}
	_, err = newWith(t, limited, redis.Config{})
	expectReplicaRefused(t, err, replica.Addr, "slave", master.Addr)

	store, err := newWith(t, clientOf(t, &goredis.Options{Addr: master.Addr}), redis.Config{})
	if err != nil {
		t.Fatalf("New on the master: %v", err)
	}
	if res, err := store.Claim(ctx, "k", "", time.Minute); err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("claim on the master: %+v %v", res, err)
	}
}

// A plain client given a Sentinel's address instead of a FailoverClient:
// refused as not a master.
func TestNewRefusesSentinel(t *testing.T) {
	master := startRedis(t)
	sentinel, err := testserver.StartRedisSentinel(master.Addr, "dedup-master")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sentinel.Close() })
	_, err = newWith(t, clientOf(t, &goredis.Options{Addr: sentinel.Addr}), redis.Config{})
	expectReplicaRefused(t, err, sentinel.Addr, "sentinel", "")
}

// An instance of an Active-Active database knows CRDT.DEBUG (a command
// plain Redis lacks): New refuses it, unless Config.AllowActiveActive. No
// Redis Enterprise server runs here: the test server has another command
// renamed CRDT.DEBUG, which is what New looks at (COMMAND INFO).
func TestNewRefusesActiveActive(t *testing.T) {
	r := startRedis(t, "--rename-command", "LOLWUT", "CRDT.DEBUG")
	client := clientOf(t, &goredis.Options{Addr: r.Addr})
	_, err := newWith(t, client, redis.Config{})
	var aerr *redis.ActiveActiveError
	if !errors.Is(err, redis.ErrActiveActive) || !errors.As(err, &aerr) || aerr.Addr != r.Addr {
		t.Fatalf("New on a server that knows CRDT.DEBUG: %v, want an *ActiveActiveError for %s", err, r.Addr)
	}
	if !strings.Contains(err.Error(), "AllowActiveActive") {
		t.Fatalf("refusal %q does not name the opt-in", err)
	}
	store, err := newWith(t, client, redis.Config{AllowActiveActive: true})
	if err != nil {
		t.Fatalf("New with AllowActiveActive: %v", err)
	}
	if res, err := store.Claim(context.Background(), "k", "", time.Minute); err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("claim with AllowActiveActive: %+v %v", res, err)
	}
}

// A server that lets the client's ACL user run neither COMMAND nor (on a
// master) INFO replication and ROLE: New cannot tell, warns once for each
// through the store's logger, and proceeds.
func TestNewWarnsWhenTopologyUnreadable(t *testing.T) {
	r := startRedis(t)
	ctx := context.Background()
	admin := clientOf(t, &goredis.Options{Addr: r.Addr})
	if err := admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-command", "-role", "-info", "+info|server", "+info|memory").Err(); err != nil {
		t.Fatal(err)
	}
	client := clientOf(t, &goredis.Options{Addr: r.Addr, Username: "app", Password: "secret"})
	logger := watermill.NewCaptureLogger()
	store, err := newWith(t, client, redis.Config{Logger: logger})
	if err != nil {
		t.Fatalf("New where the topology cannot be read: %v, want a store and warnings", err)
	}
	logs := logger.Captured()[watermill.InfoLogLevel]
	if n := countLogs(logger); n != 2 || len(logs) != 2 {
		t.Fatalf("log lines: %v, want two warnings at info level", logger.Captured())
	}
	for i, want := range []string{"replication role", "Active-Active"} {
		if !strings.Contains(logs[i].Msg, want) || logs[i].Fields["addr"] != r.Addr {
			t.Errorf("warning %q %v does not name %q and the server", logs[i].Msg, logs[i].Fields, want)
		}
	}
	if res, err := store.Claim(ctx, "k", "", time.Minute); err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("claim: %+v %v", res, err)
	}
}
