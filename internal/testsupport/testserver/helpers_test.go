package testserver

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// timed runs start and logs how long it took.
func timed[T any](t *testing.T, what string, start func() (T, error)) T {
	t.Helper()
	t0 := time.Now()
	v, err := start()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	t.Logf("%s started in %d ms", what, time.Since(t0).Milliseconds())
	return v
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func waitDead(t *testing.T, pid int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still alive after %v", pid, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// listenAddrs returns the local addresses ("127.0.0.1", "0.0.0.0", ...) of
// the IPv4 and IPv6 sockets listening on port, from /proc/net/tcp{,6}.
func listenAddrs(t *testing.T, port int) []string {
	t.Helper()
	var out []string
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fields := strings.Fields(line)
			if len(fields) < 4 || fields[3] != "0A" { // 0A = LISTEN
				continue
			}
			hexIP, hexPort, _ := strings.Cut(fields[1], ":")
			p, _ := strconv.ParseUint(hexPort, 16, 16)
			if int(p) != port {
				continue
			}
			switch hexIP {
			case "0100007F":
				out = append(out, "127.0.0.1")
			case "00000000", "00000000000000000000000000000000":
				out = append(out, "any")
			default:
				out = append(out, hexIP)
			}
		}
	}
	return out
}

func portOf(t *testing.T, hostport string) int {
	t.Helper()
	i := strings.LastIndexByte(hostport, ':')
	p, err := strconv.Atoi(hostport[i+1:])
	if err != nil {
		t.Fatalf("port of %q: %v", hostport, err)
	}
	return p
}

func assertLoopbackOnly(t *testing.T, port int) {
	t.Helper()
	addrs := listenAddrs(t, port)
	if len(addrs) == 0 {
		t.Fatalf("nothing listens on port %d", port)
	}
	for _, a := range addrs {
		if a != "127.0.0.1" {
			t.Fatalf("port %d listens on %v, want 127.0.0.1 only", port, addrs)
		}
	}
}
