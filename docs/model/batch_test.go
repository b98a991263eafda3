package model_test

import "testing"

// Model-checks docs/model/batch.pml: the batch path (Engine.DoBatch as the
// Lambda adapters use it) with streamed completions and the copy rule "the
// copy that takes its turn first runs". See README.md, "The batch model".
//
// Every search here is small (at most about 100,000 states), so every build
// is compiled with -O0: gcc -O1 costs three times the CPU and saves less
// than pan then spends.
func TestBatchModel(t *testing.T) { testModel(t, "batch.pml", batchBuilds()) }

func batchBuilds() []build {
	return []build{
		// (a) and (b), safety, one build per Batch.Concurrency.
		{name: "batch-c1", opt: "-O0", checks: []check{
			{claim: "at_most_once", what: "(a) no second effect for a key but one per completion in flight when its invocation died (groups one after the other)"},
			{claim: "waits_on_running", what: "(b) a copy waits only for a call that is running (groups one after the other)"},
		}},
		{name: "batch-c2", opt: "-O0", defines: []string{"-DCONC=2"}, checks: []check{
			{claim: "at_most_once", what: "(a) at most once, the window aside (groups at once)"},
			{claim: "waits_on_running", what: "(b) a copy waits only for a call that is running (groups at once)"},
		}},
		{name: "batch-end-states-c1", opt: "-O0", defines: []string{"-DNOLTL"}, checks: []check{
			{what: "(b) no deadlock; every completion finds its own claim, every exit leaves no claim held (groups one after the other)"},
		}},
		{name: "batch-end-states-c2", opt: "-O0", defines: []string{"-DNOLTL", "-DCONC=2"}, checks: []check{
			{what: "(b) no deadlock, assertions (groups at once)"},
		}},
		{name: "batch-no-deadline-c1", opt: "-O0", defines: []string{"-DNOLTL", "-DNO_DEADLINE"}, checks: []check{
			{what: "(b) no deadlock without a deadline, where nothing bounds a wait (groups one after the other)"},
		}},
		{name: "batch-no-deadline-c2", opt: "-O0", defines: []string{"-DNOLTL", "-DNO_DEADLINE", "-DCONC=2"}, checks: []check{
			{what: "(b) no deadlock without a deadline (groups at once)"},
		}},
		// (b), liveness under the timing assumption TIMELY.
		{name: "batch-timely-c1", opt: "-O0", defines: []string{"-DTIMELY"}, liveness: true, checks: []check{
			{claim: "eventually_done", what: "(b) every invocation ends; every record is eventually acked and each key's effect ran (groups one after the other)"},
			{claim: "no_wasted_invocation", what: "(b) an invocation that is not slow and meets no error finishes its whole batch (groups one after the other)"},
		}},
		{name: "batch-timely-c2", opt: "-O0", defines: []string{"-DTIMELY", "-DCONC=2"}, liveness: true, checks: []check{
			{claim: "eventually_done", what: "(b) every record eventually acked, each key's effect ran (groups at once)"},
			{claim: "no_wasted_invocation", what: "(b) a timely invocation without errors finishes its batch (groups at once)"},
		}},
		// The window of (a) exists: without it, (a) would be plain at most once.
		{name: "batch-window", opt: "-O0", bfs: true, checks: []check{
			{claim: "strictly_once", wantErrors: true, cause: "effects[0]<=1", trail: true,
				what: "limit: a kill while a completion is in flight lets the redelivery run the effect again"},
		}},
		// (c) the old design: completions sent after the batch's last handler.
		{name: "batch-mutant-complete-at-end", opt: "-O0", defines: []string{"-DMUTANT_COMPLETE_AT_END"}, bfs: true, checks: []check{
			{claim: "at_most_once", wantErrors: true, cause: "effects[0]<=(1+torn[0])", trail: true,
				what: "mutant (c): a completion queued until the batch's end is lost with the invocation, and the effect runs again with no completion ever in flight"},
			{claim: "hang_repeats", wantErrors: true, cause: "hungkill", trail: true,
				what: "mutant (c): r0's handler returns, r2's handler runs until the deadline kills the invocation, r0's effect runs again"},
		}},
		// (d) the old copy rule: a copy waits for the lowest-index occurrence.
		{name: "batch-mutant-old-copy-rule", opt: "-O0", defines: []string{"-DMUTANT_OLD_COPY_RULE", "-DTIMELY"}, bfs: true, checks: []check{
			{claim: "waits_on_running", wantErrors: true, cause: "waitbad", trail: true,
				what: "mutant (d): the copy r2 waits for r1, which cannot start before r2's group has ended"},
			{claim: "no_wasted_invocation", wantErrors: true, cause: "wasted", trail: true,
				what: "mutant (d): a timely invocation without errors waits until StartBy, then releases r1 unstarted: k's effect does not run"},
		}},
		{name: "batch-mutant-old-copy-rule-no-deadline", opt: "-O0", defines: []string{"-DNOLTL", "-DMUTANT_OLD_COPY_RULE", "-DNO_DEADLINE", "-DMAXCRASH=0"}, bfs: true, checks: []check{
			{wantErrors: true, cause: "invalid end state", trail: true,
				what: "mutant (d) without a deadline: the copy waits forever for a call that can only start after it (deadlock)"},
		}},
		// Sanity: the interesting states are reached.
		{name: "batch-reach-copy-first", opt: "-O0", defines: []string{"-DNOLTL", "-DREACH_COPY_FIRST"}, bfs: true, checks: []check{
			{wantErrors: true, cause: "ph[1]==1", trail: true, what: "sanity: the copy r2, in an earlier group, runs before r1 has had its turn"},
		}},
		{name: "batch-reach-copy-waits", opt: "-O0", defines: []string{"-DNOLTL", "-DREACH_COPY_WAITS", "-DCONC=2"}, bfs: true, checks: []check{
			{wantErrors: true, cause: "assertion violated", trail: true, what: "sanity: with groups at once, a copy waits for a running call"},
		}},
		{name: "batch-reach-timeout-after-complete", opt: "-O0", defines: []string{"-DNOLTL", "-DREACH_TIMEOUT_AFTER_COMPLETE"}, bfs: true, checks: []check{
			{wantErrors: true, cause: "!(landed)", trail: true, what: "sanity: an invocation is killed at its deadline after a completion has landed"},
		}},
		{name: "batch-reach-takeover", opt: "-O0", defines: []string{"-DNOLTL", "-DREACH_TAKEOVER"}, bfs: true, checks: []check{
			{wantErrors: true, cause: "rst[0]!=1", what: "sanity: a redelivery takes over the expired lease of a killed invocation"},
		}},
		{name: "batch-reach-inprogress", opt: "-O0", defines: []string{"-DNOLTL", "-DREACH_INPROGRESS"}, bfs: true, checks: []check{
			{wantErrors: true, cause: "assertion violated", what: "sanity: a retry before a crashed invocation's deadline finds its keys InProgress"},
		}},
		{name: "batch-reach-late-release", opt: "-O0", defines: []string{"-DNOLTL", "-DREACH_LATE_RELEASE"}, bfs: true, checks: []check{
			{wantErrors: true, cause: "left<=1", what: "sanity: a claim is released unstarted because StartBy passed"},
		}},
	}
}
