package linear

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// checkTimeout bounds one porcupine check; a check that runs out fails
// the test (a history the checker cannot decide proves nothing).
const checkTimeout = 2 * time.Minute

// verdict is what the checker said of one history, with the figures the
// tests print.
type verdict struct {
	Result  porcupine.CheckResult
	Fencing bool
	Keys    int
	Ops     int // porcupine operations: single calls and batches' records
	Pending int // operations whose reply was lost
	Ghosts  int // claims' attempts whose answer was lost (client.ghost)
	Band    int // operations in the uncertainty band of a lease or retention
	// Takeovers are claims won over a record whose lease had ended;
	// Afresh, over a completed record past its retention.
	Takeovers, Afresh int
	Outcomes          map[string]int
	Path              string   // the visualization, when the history is not linearizable
	Refused           int      // how many keys' histories are not linearizable
	Failing           []string // the first few of them, each with its operations
	Took              time.Duration
}

func (v verdict) String() string {
	refused := ""
	if v.Result == porcupine.Illegal {
		refused = fmt.Sprintf(" (%d keys refused)", v.Refused)
	}
	return fmt.Sprintf("%s%s: %d keys, %d operations, %d pending, %d resent claims' lost attempts, %d in the uncertainty band, fencing=%v, "+
		"%d takeovers of an ended lease, %d claims after retention, outcomes %v; checked in %v",
		v.Result, refused, v.Keys, v.Ops, v.Pending, v.Ghosts, v.Band, v.Fencing, v.Takeovers, v.Afresh, v.Outcomes, v.Took.Round(time.Millisecond))
}

// check runs porcupine on a history. A history that is not linearizable
// (or that the checker could not decide) is written with porcupine's
// visualization under $TMPDIR/dedup-histories/, named after the test,
// beside a text file of the keys refused and every operation.
func check(t testing.TB, ops []porcupine.Operation, p params, expectAnomaly bool) verdict {
	t.Helper()
	v := verdict{Ops: len(ops), Outcomes: map[string]int{}}
	keys := map[string]bool{}
	for _, op := range ops {
		in, out := op.Input.(input), op.Output.(output)
		keys[in.Key] = true
		switch {
		case in.Ghost:
			v.Ghosts++
			continue
		case out.Unknown:
			v.Pending++
			continue
		}
		o := out.Out
		switch in.Step.Kind {
		case opClaim:
			v.Outcomes[o.Outcome.String()]++
			if o.Outcome == dedup.Acquired && o.Fence > 0 {
				v.Fencing = true
			}
		case opInspect:
			v.Outcomes["inspect"]++
		default:
			v.Outcomes[in.Step.Kind.String()+" "+[...]string{"ok", "claim lost", "already completed"}[o.Err]]++
		}
	}
	v.Keys = len(keys)
	p.fencing = v.Fencing
	model := p.porcupineModel()
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, ops, checkTimeout)
	v.Took = time.Since(start)
	v.Result = res
	if res != porcupine.Ok {
		v.Path = writeVisualization(t, model, info, expectAnomaly && res == porcupine.Illegal)
		if res == porcupine.Illegal {
			v.Refused, v.Failing = failingKeys(model, ops)
		}
		if v.Path != "" {
			if err := writeText(ops, v.Failing, strings.TrimSuffix(v.Path, ".html")+".txt"); err != nil {
				t.Errorf("writing the history: %v", err)
			}
		}
		return v
	}
	for _, partition := range info.PartialLinearizationsOperations() {
		if len(partition) == 0 {
			continue
		}
		states := []record{{}}
		for _, op := range partition[0] {
			in, out := op.Input.(input), op.Output.(output)
			var next []record
			inBand := false
			for _, st := range states {
				if !out.Unknown && in.Step.Kind == opClaim && out.Out.Outcome == dedup.Acquired {
					switch st.State {
					case inProgress:
						v.Takeovers++
					case completed:
						v.Afresh++
					}
				}
				n, b := p.step(st, in, out)
				next = append(next, n...)
				inBand = inBand || b
			}
			if inBand {
				v.Band++
			}
			states = dedupeRecords(next)
		}
	}
	return v
}

// failingKeys checks each key's history alone: how many are not
// linearizable, and the first few, operation by operation in call order.
func failingKeys(model porcupine.Model, ops []porcupine.Operation) (int, []string) {
	var out []string
	n := 0
	for _, part := range partitionByKey(ops) {
		if porcupine.CheckOperations(model, part) {
			continue
		}
		if n++; n > 3 {
			continue
		}
		sorted := append([]porcupine.Operation(nil), part...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
		var b strings.Builder
		fmt.Fprintf(&b, "key %s:\n", part[0].Input.(input).Key)
		for i, op := range sorted {
			if i == 80 {
				fmt.Fprintf(&b, "  ... %d more\n", len(sorted)-i)
				break
			}
			fmt.Fprintf(&b, "  client %3d [%s, %s] %s\n", op.ClientId, ms(op.Call), ms(op.Return), describeOperation(op.Input, op.Output))
		}
		out = append(out, b.String())
	}
	return n, out
}

func dedupeRecords(rs []record) []record {
	seen := map[record]bool{}
	out := rs[:0:0]
	for _, r := range rs {
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	return out
}

// historyDir is where failing histories go: t.TempDir is deleted when the
// test ends.
func historyDir() string { return filepath.Join(os.TempDir(), "dedup-histories") }

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// writeVisualization writes a failing history as
// $TMPDIR/dedup-histories/<test>-<time>.html, or, for an anomaly the test
// expects, as $TMPDIR/dedup-histories/expected/<test>.html (overwritten by
// the next run).
func writeVisualization(t testing.TB, model porcupine.Model, info porcupine.LinearizationInfo, expected bool) string {
	t.Helper()
	dir := historyDir()
	name := unsafeName.ReplaceAllString(strings.ReplaceAll(t.Name(), "/", "-"), "_")
	file := fmt.Sprintf("%s-%s.html", name, time.Now().Format("20060102-150405.000"))
	if expected {
		dir, file = filepath.Join(dir, "expected"), name+".html"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Errorf("writing the history: %v", err)
		return ""
	}
	path := filepath.Join(dir, file)
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		t.Errorf("writing the history: %v", err)
		return ""
	}
	return path
}

// writeText writes the keys refused, then every operation of the history,
// one a line in call order, next to the visualization.
func writeText(ops []porcupine.Operation, failing []string, path string) error {
	sorted := append([]porcupine.Operation(nil), ops...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	var b strings.Builder
	if len(failing) > 0 {
		fmt.Fprintf(&b, "Not linearizable:\n%s\nThe whole history:\n", strings.Join(failing, "\n"))
	}
	for _, op := range sorted {
		fmt.Fprintf(&b, "%s client %3d [%s, %s] %s\n", op.Input.(input).Key, op.ClientId, ms(op.Call), ms(op.Return), describeOperation(op.Input, op.Output))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// requireLinearizable fails the test unless the history is linearizable,
// naming the visualization of a failing one.
func requireLinearizable(t testing.TB, ops []porcupine.Operation, p params) verdict {
	t.Helper()
	v := check(t, ops, p, false)
	t.Logf("FIGURES %s", v)
	if v.Result != porcupine.Ok {
		t.Fatalf("the history is not linearizable (%s): open %s in a browser\n%s", v.Result, v.Path, strings.Join(v.Failing, "\n"))
	}
	return v
}

// before is the history as it stood at instant at (on the recorder's
// clock): the operations called before it, those still running then
// pending. A scenario checks it to show that an anomaly came with its
// fault, not before.
func before(ops []porcupine.Operation, at int64) []porcupine.Operation {
	var out []porcupine.Operation
	for _, op := range ops {
		if op.Call >= at {
			continue
		}
		if op.Return > at {
			in := op.Input.(input)
			in.Return, in.Seq, in.Of = never, 0, 0
			op.Input, op.Output, op.Return = in, output{Unknown: true}, never
		}
		out = append(out, op)
	}
	return out
}

// requireAnomaly fails the test unless porcupine finds the history not
// linearizable.
func requireAnomaly(t testing.TB, ops []porcupine.Operation, p params) verdict {
	t.Helper()
	v := check(t, ops, p, true)
	t.Logf("FIGURES %s", v)
	if v.Result != porcupine.Illegal {
		t.Fatalf("porcupine found the history %s, want Illegal", v.Result)
	}
	t.Logf("the anomaly, as porcupine shows it: %s", v.Path)
	if testing.Verbose() && len(v.Failing) > 0 {
		t.Logf("the first key refused:\n%s", v.Failing[0])
	}
	return v
}
