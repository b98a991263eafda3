// This folder holds the Prometheus rules shipped for watermill-dedup
// (dedup-rules.yml) and their tests: promtool's unit tests, and a run of
// every rule against a real Prometheus server scraping a router under load.

package prometheus_test

import (
	"os/exec"
	"testing"
)

// installHint says how to get promtool and prometheus.
const installHint = "Debian's prometheus package ships promtool and the server: apt-get install prometheus (bash scripts/ensure-test-deps.sh installs it)"

// lookPath finds a program the tests need, or fails the test saying how to
// install it.
func lookPath(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found on PATH: %v. %s", name, err, installHint)
	}
	return path
}

// The rules file is valid (promtool check rules) and its unit tests pass
// (promtool test rules): every alert fires on its scenario and stays quiet
// on the look-alikes.
func TestRulesWithPromtool(t *testing.T) {
	promtool := lookPath(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", "dedup-rules.yml"},
		{"test", "rules", "dedup-rules_test.yml"},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		} else {
			t.Logf("promtool %v:\n%s", args, out)
		}
	}
}
