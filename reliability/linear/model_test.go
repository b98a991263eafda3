package linear

import (
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// The sequential model of one record, as dedup.Store, dedup.BatchStore and
// admin.Interface.Inspect define it. porcupine checks each key's history
// on its own (the model partitions by key), so the state is one record.
//
// Time: a lease or a retention ends at an instant the history cannot see
// exactly. A claim runs somewhere in its operation's [call, return], so its
// lease ends somewhere in [call+lease, return+lease] (widened by slack for
// the stores' millisecond clocks). An operation that meets the record at
// [c, r] sees it certainly live when r is before that window begins,
// certainly ended when c is after it ends, and either when the two overlap:
// the model then accepts both answers (conservative), and the operation is
// counted in the uncertainty band. A store whose takeover waits a margin
// past the lease's end (DynamoDB's ClockSkewMargin) has the window shifted
// by it for claims; the owner's Complete, Release and Extend stop at the
// end itself.

// slack widens every deadline window: the stores keep deadlines in
// milliseconds (Redis PX, DynamoDB), and the server's clock is not the
// test's.
const slack = 3 * int64(time.Millisecond)

// never is a deadline that no operation reaches: the end of a lease or
// retention set by an operation whose reply was lost (it may have run at
// any time after its call).
const never = math.MaxInt64

func addSat(a, b int64) int64 {
	if b > 0 && a > never-b {
		return never
	}
	return a + b
}

// kind is the kind of one single operation.
type kind uint8

const (
	opClaim kind = iota + 1
	opComplete
	opRelease
	opExtend
	opInspect
)

func (k kind) String() string {
	return [...]string{"?", "claim", "complete", "release", "extend", "inspect"}[k]
}

// step is one single operation on one key: a single call, or one record of
// a batch.
type step struct {
	Kind        kind
	Fingerprint string        // claim
	Lease       time.Duration // claim, extend
	Retention   time.Duration // complete
	Result      string        // complete
	Token       string        // complete, release, extend: the claim acted for
}

// input is one porcupine operation: one single operation (a single call,
// or one record of a batch) on one key, with the call's real-time
// interval, which the model reads for leases.
type input struct {
	Key  string
	Step step
	// Batch is "" for a single call, else the batch operation's name.
	// Records of one key in one batch are separate operations that must
	// take effect in request order: record Seq of Of of batch BatchID.
	Batch   string
	BatchID int64
	Seq, Of int
	// Ghost: an attempt of a claim that the client library resent (see
	// client.ghost); its answer is unknown.
	Ghost  bool
	Call   int64
	Return int64 // never: the reply was lost
}

// errKind is how a Complete, Release or Extend answered.
type errKind uint8

const (
	errNone errKind = iota
	errClaimLost
	errAlreadyCompleted
)

// stepOut is one step's answer.
type stepOut struct {
	Outcome dedup.Outcome // claim
	Token   string        // claim, acquired
	Fence   uint64        // claim, acquired
	Result  string        // claim, duplicate
	Err     errKind       // complete, release, extend
	State   string        // inspect: "" (no live record), admin.StateInProgress or admin.StateCompleted
}

// output is a porcupine operation's answer, or Unknown when the reply was
// lost (the operation is pending: any effect or none).
type output struct {
	Unknown bool
	Out     stepOut
}

// recState is the state of the model's record.
type recState uint8

const (
	absent     recState = iota // never claimed, released, or known to be gone
	inProgress                 // held by Holder until its lease ends
	completed                  // completed by Holder until its retention ends
)

// unknownHolder holds a record that a claim whose reply was lost may have
// acquired: no client knows its token.
const unknownHolder = "?"

// record is the model's state: one key's record. It is a comparable value.
type record struct {
	State       recState
	Holder      string // the owner's token (in progress) or the completing claim's (completed)
	Fingerprint string
	Result      string
	Lo, Hi      int64  // the lease (in progress) or retention (completed) ends somewhere in [Lo, Hi]
	Fence       uint64 // the largest fence of a won claim so far (0: none, or the store does not fence)
	// Order holds, for each batch with records of this key still to
	// take effect, the next one's Seq: "|batch:seq|..." sorted.
	Order string
}

// params are what a store's promise depends on.
type params struct {
	// margin is how long past its end a record still counts as live for
	// a claim (and for Inspect): DynamoDB's ClockSkewMargin. The owner's
	// operations stop at the end itself.
	margin int64
	// fencing: every won claim's fence must be larger than every earlier
	// won claim's of the key.
	fencing bool
	// lostRelease: an acknowledged Release may be undone (Redis with
	// WaitReplicas: a Release does not wait for the replicas, and a
	// failover may lose it; the record then stays its owner's until the
	// lease ends, as documented).
	lostRelease bool
	// retries: the client library resends a request whose reply was lost
	// (go-redis, the AWS SDK). A resent Release finds the record its first
	// attempt released and answers ErrClaimLost; a resent Complete or
	// Extend does too when the retention or lease its first attempt set
	// ended before the resend. So an owner's operation that answers
	// ErrClaimLost may have taken effect.
	retries bool
	// batchAnyOrder: the records of one key in one batch may take effect
	// in any order, not in request order as dedup.BatchStore promises
	// (the Redis store's ClaimBatch with WaitReplicas runs the records'
	// claims concurrently, up to 16 at once).
	batchAnyOrder bool
}

// life is what an operation at [c, r] knows about a deadline.
type life uint8

const (
	alive life = iota + 1 // certainly not yet passed when the operation took effect
	ended                 // certainly passed
	band                  // the operation overlaps the uncertainty window: either
)

// judge says whether the end in [lo, hi], extended by margin, had passed
// at the instant the operation [c, r] took effect.
func judge(lo, hi, margin, c, r int64) life {
	switch {
	case r < addSat(lo, margin):
		return alive
	case c > addSat(hi, margin):
		return ended
	default:
		return band
	}
}

func fpConflict(stored, claimed string) bool {
	return stored != "" && claimed != "" && stored != claimed
}

// window is the deadline window of something set at [c, r] for d.
func window(c, r int64, d time.Duration) (int64, int64) {
	return c + int64(d) - slack, addSat(r, int64(d)+slack)
}

// stepKnown applies one step with a known answer. It returns whether the
// store may answer so from st, the next state, and whether the decision
// fell in the uncertainty band.
func (p params) stepKnown(st record, s step, o stepOut, c, r int64) ([]record, bool) {
	switch s.Kind {
	case opClaim:
		l := ended
		if st.State != absent {
			l = judge(st.Lo, st.Hi, p.margin, c, r)
		}
		isBand := l == band
		switch o.Outcome {
		case dedup.Acquired:
			if l == alive {
				return nil, isBand
			}
			if p.fencing && o.Fence <= st.Fence {
				return nil, isBand
			}
			lo, hi := window(c, r, s.Lease)
			return []record{{State: inProgress, Holder: o.Token, Fingerprint: s.Fingerprint, Lo: lo, Hi: hi, Fence: max(st.Fence, o.Fence), Order: st.Order}}, isBand
		case dedup.Duplicate:
			ok := l != ended && st.State == completed && !fpConflict(st.Fingerprint, s.Fingerprint) && o.Result == st.Result
			return keep(ok, st), isBand
		case dedup.InProgress:
			ok := l != ended && st.State == inProgress && !fpConflict(st.Fingerprint, s.Fingerprint)
			return keep(ok, st), isBand
		case dedup.Conflict:
			ok := l != ended && st.State != absent && fpConflict(st.Fingerprint, s.Fingerprint)
			return keep(ok, st), isBand
		}
		return nil, isBand

	case opComplete, opRelease, opExtend:
		if st.State == inProgress && st.Holder == s.Token {
			l := judge(st.Lo, st.Hi, 0, c, r)
			isBand := l == band
			// effect is the record after the operation took effect.
			var effect record
			switch s.Kind {
			case opComplete:
				lo, hi := window(c, r, s.Retention)
				effect = record{State: completed, Holder: s.Token, Fingerprint: st.Fingerprint, Result: s.Result, Lo: lo, Hi: hi, Fence: st.Fence, Order: st.Order}
			case opRelease:
				effect = record{State: absent, Fence: st.Fence, Order: st.Order}
			default:
				effect = st
				effect.Lo, effect.Hi = window(c, r, s.Lease)
			}
			switch {
			case o.Err == errNone, o.Err == errAlreadyCompleted && s.Kind == opComplete:
				// ErrAlreadyCompleted: the client library resent the
				// Complete after its first reply was lost, and the resent
				// one found the record completed by this claim.
				if l == ended {
					return nil, isBand
				}
				return []record{effect}, isBand
			case o.Err == errClaimLost:
				var out []record
				if l != alive { // the lease had ended by the time it answered
					lost := st
					lost.Hi = min(st.Hi, r)
					out = append(out, lost)
				}
				// With a client library that resends a request whose reply
				// was lost, the first attempt may have taken effect and the
				// resent one found the record gone: released, or past the
				// retention or lease the first attempt set.
				if p.retries && l != ended && (s.Kind == opRelease || effect.Lo <= r) {
					out = append(out, effect)
				}
				return out, isBand
			}
			return nil, isBand
		}
		if st.State == completed && st.Holder == s.Token {
			// Its own completed record: ErrClaimLost, or
			// ErrAlreadyCompleted (which matches it) while the record lives.
			l := judge(st.Lo, st.Hi, 0, c, r)
			switch {
			case o.Err == errNone:
				return nil, l == band
			case o.Err == errAlreadyCompleted && l == ended:
				return nil, l == band
			}
			return []record{st}, l == band
		}
		// Not the owner (the record is gone, released, or another claim's).
		return keep(o.Err == errClaimLost, st), false

	case opInspect:
		l := ended
		if st.State != absent {
			l = judge(st.Lo, addSat(st.Hi, p.margin), 0, c, r)
		}
		switch o.State {
		case "":
			return keep(l != alive, st), l == band
		case "in_progress":
			return keep(l != ended && st.State == inProgress, st), l == band
		case "completed":
			return keep(l != ended && st.State == completed, st), l == band
		}
		return nil, l == band
	}
	return nil, false
}

// keep is the state unchanged when ok, else none.
func keep(ok bool, st record) []record {
	if ok {
		return []record{st}
	}
	return nil
}

// stepUnknown applies one step whose reply was lost: every state it may
// have left, from "it never ran" to "it ran at some time after its call".
func (p params) stepUnknown(st record, s step, c, r int64) []record {
	out := []record{st}
	switch s.Kind {
	case opClaim:
		lo, hi := window(c, r, s.Lease)
		out = append(out, record{State: inProgress, Holder: unknownHolder, Fingerprint: s.Fingerprint, Lo: lo, Hi: hi, Fence: st.Fence, Order: st.Order})
	case opComplete, opRelease, opExtend:
		if st.State != inProgress || st.Holder != s.Token || judge(st.Lo, st.Hi, 0, c, r) == ended {
			break
		}
		switch s.Kind {
		case opComplete:
			lo, hi := window(c, r, s.Retention)
			out = append(out, record{State: completed, Holder: s.Token, Fingerprint: st.Fingerprint, Result: s.Result, Lo: lo, Hi: hi, Fence: st.Fence, Order: st.Order})
		case opRelease:
			out = append(out, record{State: absent, Fence: st.Fence, Order: st.Order})
		default:
			next := st
			next.Lo, next.Hi = window(c, r, s.Lease)
			out = append(out, next)
		}
	}
	return out
}

// step applies an operation to one state: the states it may lead to (none:
// the answer is impossible) and whether it fell in the uncertainty band.
func (p params) step(st record, in input, out output) ([]record, bool) {
	if out.Unknown {
		return p.stepUnknown(st, in.Step, in.Call, in.Return), false
	}
	ordered := in.Of > 1 && !p.batchAnyOrder
	if ordered && orderNext(st.Order, in.BatchID) != in.Seq {
		return nil, false // an earlier record of its batch has not taken effect yet
	}
	next, inBand := p.stepKnown(st, in.Step, out.Out, in.Call, in.Return)
	if len(next) > 0 && p.lostRelease && in.Step.Kind == opRelease && out.Out.Err == errNone {
		// Either released, or the release was lost to a failover and
		// the record is still its owner's.
		next = append(next, st)
	}
	if ordered {
		for i := range next {
			next[i].Order = orderSet(next[i].Order, in.BatchID, in.Seq+1, in.Of)
		}
	}
	return dedupeRecords(next), inBand
}

// orderNext is the Seq of the next record of batch id to take effect.
func orderNext(order string, id int64) int {
	prefix := fmt.Sprintf("|%d:", id)
	i := strings.Index(order, prefix)
	if i < 0 {
		return 0
	}
	rest := order[i+len(prefix):]
	n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, '|')])
	return n
}

// orderSet records that record next of batch id is the next to take
// effect (of records in all; none once all did).
func orderSet(order string, id int64, next, of int) string {
	prefix := fmt.Sprintf("|%d:", id)
	var entries []string
	for _, e := range strings.Split(strings.Trim(order, "|"), "|") {
		if e != "" && !strings.HasPrefix("|"+e, prefix) {
			entries = append(entries, e)
		}
	}
	if next < of {
		entries = append(entries, fmt.Sprintf("%d:%d", id, next))
	}
	if len(entries) == 0 {
		return ""
	}
	sort.Strings(entries)
	return "|" + strings.Join(entries, "|") + "|"
}

// porcupineModel is the model for porcupine, partitioned by key.
func (p params) porcupineModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partitionByKey,
		Init:      func() []interface{} { return []interface{}{record{}} },
		Step: func(state, in, out interface{}) []interface{} {
			next, _ := p.step(state.(record), in.(input), out.(output))
			res := make([]interface{}, len(next))
			for i, n := range next {
				res[i] = n
			}
			return res
		},
		Equal:             func(a, b interface{}) bool { return a.(record) == b.(record) },
		Hash:              hashRecord,
		DescribeOperation: describeOperation,
		DescribeState:     func(s interface{}) string { return describeRecord(s.(record)) },
	}
	return nm.ToModel()
}

func hashRecord(s interface{}) uint64 {
	r := s.(record)
	h := fnv.New64a()
	fmt.Fprintf(h, "%d|%s|%s|%s|%d|%d|%d|%s", r.State, r.Holder, r.Fingerprint, r.Result, r.Lo, r.Hi, r.Fence, r.Order)
	return h.Sum64()
}

func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	var keys []string
	for _, op := range history {
		k := op.Input.(input).Key
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], op)
	}
	sort.Strings(keys)
	out := make([][]porcupine.Operation, len(keys))
	for i, k := range keys {
		out[i] = byKey[k]
	}
	return out
}

// short names a token for the visualization: a digest, since some
// stores' tokens are long or binary (the Redis store's is the record).
func short(token string) string {
	if token == unknownHolder {
		return token
	}
	h := fnv.New32a()
	h.Write([]byte(token))
	return fmt.Sprintf("%08x", h.Sum32())
}

func ms(t int64) string {
	if t == never {
		return "never"
	}
	return fmt.Sprintf("%.1fms", float64(t)/1e6)
}

func describeRecord(r record) string {
	fence := ""
	if r.Fence > 0 {
		fence = fmt.Sprintf(" fence>=%d", r.Fence)
	}
	switch r.State {
	case inProgress:
		return fmt.Sprintf("in_progress(%s fp=%q ends %s..%s%s)", short(r.Holder), r.Fingerprint, ms(r.Lo), ms(r.Hi), fence)
	case completed:
		return fmt.Sprintf("completed(%s fp=%q result=%q ends %s..%s%s)", short(r.Holder), r.Fingerprint, r.Result, ms(r.Lo), ms(r.Hi), fence)
	default:
		return "absent" + fence
	}
}

func describeStep(s step, o *stepOut) string {
	var b strings.Builder
	switch s.Kind {
	case opClaim:
		fmt.Fprintf(&b, "claim(fp=%q lease=%v)", s.Fingerprint, s.Lease)
	case opComplete:
		fmt.Fprintf(&b, "complete(%s %q ret=%v)", short(s.Token), s.Result, s.Retention)
	case opRelease:
		fmt.Fprintf(&b, "release(%s)", short(s.Token))
	case opExtend:
		fmt.Fprintf(&b, "extend(%s %v)", short(s.Token), s.Lease)
	case opInspect:
		b.WriteString("inspect")
	}
	if o == nil {
		return b.String() + " -> ?"
	}
	switch s.Kind {
	case opClaim:
		fmt.Fprintf(&b, " -> %s", o.Outcome)
		if o.Outcome == dedup.Acquired {
			fmt.Fprintf(&b, " %s", short(o.Token))
			if o.Fence > 0 {
				fmt.Fprintf(&b, " fence=%d", o.Fence)
			}
		}
		if o.Outcome == dedup.Duplicate {
			fmt.Fprintf(&b, " %q", o.Result)
		}
	case opInspect:
		state := o.State
		if state == "" {
			state = "not found"
		}
		fmt.Fprintf(&b, " -> %s", state)
	default:
		b.WriteString(" -> " + [...]string{"ok", "claim lost", "already completed"}[o.Err])
	}
	return b.String()
}

func describeOperation(in, out interface{}) string {
	i, o := in.(input), out.(output)
	var so *stepOut
	if !o.Unknown {
		so = &o.Out
	}
	d := describeStep(i.Step, so)
	switch {
	case i.Ghost:
		d = "an earlier attempt of " + d
	case i.Batch != "" && i.Of > 1:
		d = fmt.Sprintf("%s#%d[%d/%d: %s]", i.Batch, i.BatchID, i.Seq+1, i.Of, d)
	case i.Batch != "":
		d = fmt.Sprintf("%s#%d[%s]", i.Batch, i.BatchID, d)
	}
	return d
}
