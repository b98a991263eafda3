package testserver_test

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

// do sends one inline command and returns the first line of the reply.
func do(t *testing.T, addr, cmd string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(c, "%s\r\n", cmd); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(line, "$") && !strings.HasPrefix(line, "$-1") {
		line, _ = r.ReadString('\n')
	}
	return strings.TrimSpace(line)
}

// eventually polls cmd on addr until it answers want, for up to 20s: a
// replica applies what it acknowledged asynchronously of its clients.
func eventually(t *testing.T, addr, cmd, want, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := do(t, addr, cmd)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s = %q after 20s, want %q", what, cmd, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A replica gets the master's writes; with the link cut it does not, and
// the master still acknowledges them; healed, it catches up by itself.
func TestRedisReplicaAndCut(t *testing.T) {
	master, err := testserver.StartRedisWithArgs("--repl-diskless-sync-delay", "0")
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	replica, err := testserver.StartRedisReplica(master)
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close()
	if role, err := replica.Role(); err != nil || role != "slave" {
		t.Fatalf("replica Role() = %q, %v", role, err)
	}
	do(t, master.Addr, "SET a 1")
	if got := do(t, master.Addr, "WAIT 1 2000"); got != ":1" {
		t.Fatalf("WAIT 1 with the replica linked = %s, want :1", got)
	}
	eventually(t, replica.Addr, "GET a", "1", "the replica, linked")
	if err := testserver.CutReplication(master, replica); err != nil {
		t.Fatal(err)
	}
	do(t, master.Addr, "SET b 2")
	if got := do(t, master.Addr, "WAIT 1 200"); got != ":0" {
		t.Fatalf("WAIT 1 with the link cut = %s, want :0", got)
	}
	if got := do(t, replica.Addr, "GET b"); got != "$-1" {
		t.Fatalf("replica GET b with the link cut = %q, want nil", got)
	}
	if err := testserver.HealReplication(replica); err != nil {
		t.Fatal(err)
	}
	if err := replica.WaitReplicaOf(master, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, replica.Addr, "GET b", "2", "the replica after healing")
	// The master, killed, comes back as the replica's replica.
	if err := master.Kill(); err != nil {
		t.Fatal(err)
	}
	do(t, replica.Addr, "REPLICAOF NO ONE")
	if err := master.StartAsReplicaOf(replica, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, master.Addr, "GET b", "2", "the old master after rejoining")
}
