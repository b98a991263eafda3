package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// ErrReplica: New found that a server the store would write to is not a
// master: a replica (role:slave), which refuses the store's writes
// (READONLY) or, with replica-read-only no, takes them without its master
// ever seeing them, so that its claims are not atomic with the master's;
// or a Sentinel. The error is a *ReplicaError. Give the master's address,
// or a client that finds the master itself: redis.NewFailoverClient
// (Sentinel) or redis.NewClusterClient.
var ErrReplica = errors.New("dedup/redis: the server is not a master")

// ReplicaError is returned by New for a server whose replication role is
// not master. It matches ErrReplica.
type ReplicaError struct {
	// Addr is the server's address as the client knows it.
	Addr string
	// Role is the role it reports: "slave" for a replica, "sentinel".
	Role string
	// Master is the host:port of its master as the replica reports it,
	// or "" when it does not say.
	Master string
}

func (e *ReplicaError) Error() string {
	what := "a " + e.Role
	if e.Role == "slave" {
		what = "a replica"
		if e.Master != "" {
			what += " of " + e.Master
		}
	}
	return fmt.Sprintf("dedup/redis: %s is %s, not a master: the store writes every claim, "+
		"and a replica refuses writes (READONLY) or keeps them from its master, where another claim of the same key can win; "+
		"give the master's address, or a client that finds the master: redis.NewFailoverClient (Sentinel) or redis.NewClusterClient", e.Addr, what)
}

// Unwrap returns ErrReplica.
func (e *ReplicaError) Unwrap() error { return ErrReplica }

// ErrActiveActive: New found a database whose instances all take writes
// and replicate them to each other (a Redis Enterprise or Redis Cloud
// Active-Active database, "CRDB"). SET NX is atomic within one instance
// only: two instances (regions) can each create a record for the same key,
// and when they sync, the last write by wall clock wins, so two copies of
// a message consumed in two regions can both run their effect and both
// hold a fence. The error is an *ActiveActiveError. Use a database that is
// not Active-Active, or set Config.AllowActiveActive where every consumer
// of a key writes through one instance.
var ErrActiveActive = errors.New("dedup/redis: the database is Active-Active (CRDT): a claim is atomic within one instance only")

// ActiveActiveError is returned by New for a server that shows it is an
// instance of an Active-Active database. It matches ErrActiveActive.
type ActiveActiveError struct {
	// Addr is the server's address as the client knows it.
	Addr string
	// Evidence is what gave it away.
	Evidence string
}

func (e *ActiveActiveError) Error() string {
	return fmt.Sprintf("dedup/redis: %s is an instance of an Active-Active (CRDT) database (%s): "+
		"SET NX is atomic within one instance only, so consumers writing through two instances can both claim a key and both run its effect; "+
		"use a database that is not Active-Active, or set Config.AllowActiveActive if every consumer of a key writes through the same instance", e.Addr, e.Evidence)
}

// Unwrap returns ErrActiveActive.
func (e *ActiveActiveError) Unwrap() error { return ErrActiveActive }

// crdtCommand is the command an Active-Active database has and a plain
// Redis lacks: Redis' compatibility tables send OBJECT ENCODING users of
// an Active-Active database to CRDT.DEBUG ENCODING.
const crdtCommand = "crdt.debug"

// topology is what checkTopology reads from one server.
type topology struct {
	// role is INFO replication's role (else ROLE's first element); ""
	// when the server tells neither.
	role, master string
	// crdt says whether COMMAND INFO knows crdtCommand; crdtErr is the
	// server's refusal of COMMAND INFO, if any.
	crdt    bool
	crdtErr error
	// roleErr says why role is "": the server refused both INFO
	// replication and ROLE, or neither told a role.
	roleErr error
}

// readTopology reads a server's replication role and whether it knows
// crdtCommand: INFO replication, ROLE (for a server that refuses INFO
// replication to the client's ACL user, or has no role field there: a
// Sentinel) and COMMAND INFO in one pipeline, one round trip. A Redis
// error reply is kept in the result (the caller cannot tell); a failure to
// reach the server is returned.
func readTopology(ctx context.Context, c goredis.Cmdable) (topology, error) {
	var t topology
	var info *goredis.StringCmd
	var role, cmd *goredis.Cmd
	_, err := c.Pipelined(ctx, func(p goredis.Pipeliner) error {
		info = p.Info(ctx, "replication")
		role = p.Do(ctx, "role")
		cmd = p.Do(ctx, "command", "info", crdtCommand)
		return nil
	})
	if err != nil && info.Err() == nil && role.Err() == nil && cmd.Err() == nil {
		return t, err // the pipeline failed before its commands did
	}
	for _, c := range []goredis.Cmder{info, role, cmd} {
		if err := c.Err(); err != nil && !isServerError(err) {
			return t, err
		}
	}
	if err := cmd.Err(); err != nil {
		t.crdtErr = err
	} else {
		t.crdt = knowsCommand(cmd.Val(), crdtCommand)
	}
	if info.Err() == nil {
		s := info.Val()
		t.role = infoField(s, "role")
		if h, p := infoField(s, "master_host"), infoField(s, "master_port"); h != "" {
			t.master = h + ":" + p
		}
	}
	if t.role != "" {
		return t, nil
	}
	r, err := role.Slice()
	if err != nil {
		t.roleErr = fmt.Errorf("INFO replication: %v; ROLE: %w", info.Err(), err)
		return t, nil
	}
	if len(r) > 0 {
		t.role, _ = r[0].(string)
	}
	switch {
	case t.role == "":
		t.roleErr = fmt.Errorf("INFO replication: %v; ROLE replied %v", info.Err(), r)
	case t.role == "slave" && len(r) >= 3:
		t.master = fmt.Sprintf("%v:%v", r[1], r[2])
	}
	return t, nil
}

// checkTopology refuses a server where the store's claims would not be
// atomic: one that is not a master (*ReplicaError), or, unless
// allowActiveActive, an instance of an Active-Active database
// (*ActiveActiveError). warn is told what could not be read; the server is
// then accepted. Cost: readTopology's.
func checkTopology(ctx context.Context, c goredis.Cmdable, addr string, allowActiveActive bool, warn func(msg string, err error)) error {
	t, err := readTopology(ctx, c)
	if err != nil {
		return fmt.Errorf("dedup/redis: reading the replication role of %s: %w", addr, err)
	}
	switch {
	case t.roleErr != nil:
		warn("dedup/redis: cannot read the replication role; make sure the address is a master's, "+
			"or a replica refuses every claim (READONLY)", t.roleErr)
	case !strings.EqualFold(t.role, "master"):
		return &ReplicaError{Addr: addr, Role: t.role, Master: t.master}
	}
	if allowActiveActive {
		return nil
	}
	if t.crdtErr != nil {
		warn("dedup/redis: cannot tell whether the database is Active-Active (COMMAND INFO refused); "+
			"if it is, claims through two of its instances can both win", t.crdtErr)
		return nil
	}
	if t.crdt {
		return &ActiveActiveError{Addr: addr, Evidence: "it knows the command " + strings.ToUpper(crdtCommand)}
	}
	return nil
}

// knowsCommand reports whether a reply of COMMAND INFO name describes that
// command. Redis answers one entry per name asked, nil for a command it
// does not know (a renamed command is described under its original name,
// so the entry's name is not checked). An emulator that ignores the
// argument and lists every command (miniredis) knows it only if the list
// names it.
func knowsCommand(reply any, name string) bool {
	entries, _ := reply.([]any)
	if len(entries) == 1 {
		return entries[0] != nil
	}
	for _, e := range entries {
		if desc, _ := e.([]any); len(desc) > 0 {
			if got, _ := desc[0].(string); strings.EqualFold(got, name) {
				return true
			}
		}
	}
	return false
}
