package dynamo

import (
	"fmt"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// prepared is a condition (and update) expression built once, at New, with
// feature/dynamodb/expression and placeholder values; each request supplies
// its own values under the placeholders' keys. It saves building the same
// expression strings and name maps on every request (dozens of
// allocations). The name map is shared by every request and never
// modified.
type prepared struct {
	condition, update *string
	names             map[string]string
	// keys[i] are the value keys (":0", ...) of the i-th placeholder (more
	// than one where the expression names it twice); fixed holds the
	// values that are the same for every request.
	keys  [][]string
	fixed map[string]types.AttributeValue
}

// placeholder marks the i-th per-request value of a prepared expression.
func placeholder(i int) expression.OperandBuilder {
	return expression.Value(fmt.Sprintf("\x00placeholder-%d", i))
}

// prepare builds b and locates the placeholders 0..n-1 among its values.
func prepare(b expression.Builder, n int) (prepared, error) {
	expr, err := b.Build()
	if err != nil {
		return prepared{}, err
	}
	p := prepared{condition: expr.Condition(), update: expr.Update(), names: expr.Names(), keys: make([][]string, n),
		fixed: map[string]types.AttributeValue{}}
	found := 0
	for k, v := range expr.Values() {
		s, ok := v.(*types.AttributeValueMemberS)
		var i int
		if ok {
			if _, err := fmt.Sscanf(s.Value, "\x00placeholder-%d", &i); err == nil && i >= 0 && i < n {
				if len(p.keys[i]) == 0 {
					found++
				}
				p.keys[i] = append(p.keys[i], k)
				continue
			}
		}
		p.fixed[k] = v
	}
	if found != n {
		return prepared{}, fmt.Errorf("dynamo: preparing an expression: found %d of %d placeholders", found, n)
	}
	if len(p.fixed) == 0 {
		p.fixed = nil
	}
	return p, nil
}

// values returns the value map of a request: the fixed values and vs under
// the placeholders' keys.
func (p *prepared) values(vs ...types.AttributeValue) map[string]types.AttributeValue {
	m := make(map[string]types.AttributeValue, len(p.fixed)+len(vs)+1)
	for k, v := range p.fixed {
		m[k] = v
	}
	for i, v := range vs {
		for _, k := range p.keys[i] {
			m[k] = v
		}
	}
	return m
}

// statements are the store's prepared expressions.
type statements struct {
	// create: attribute_not_exists(pk), the PutItem of a claim that finds
	// no record (the first attempt of every claim); it takes no placeholder.
	create prepared
	// claim: attribute_not_exists(pk) OR (deadline < placeholder 0 (now -
	// margin) AND fenceBelow(1)): the PutItem of a claim that starts a
	// record afresh.
	claim prepared
	// takeOver[v] (the UpdateItem of a claim): attribute_not_exists(pk) OR
	// (deadline < 0 AND state <> completed AND fenceBelow(5)), and SET
	// state = in_progress, token = 1, deadline = 2, ttl = 3, fence = 5,
	// claims = if_not_exists(claims, 0) + 1, claimed_at =
	// if_not_exists(claimed_at, 4), then by the bits of v: fingerprint =
	// next placeholder (1) or REMOVE fingerprint, transport_id =
	// if_not_exists(transport_id, next) (2), message_id likewise (4);
	// REMOVE result, completed_at.
	//
	// fenceBelow(i) is attribute_not_exists(fence) OR fence < placeholder
	// i, the new fence: a takeover computed from a record read earlier
	// never lowers the fence that another claim wrote meanwhile (a claim
	// that took the record over and released it again, after this one
	// read it, with a clock ahead of this one's). The claim then reads the
	// record again and writes a fence above the new one.
	takeOver [8]prepared
	// owned (Release): token = 0 AND state = in_progress AND deadline > 1.
	owned prepared
	// release: owned, and SET state = released, deadline = 0.
	release prepared
	// complete: owned, and SET state = completed, deadline = 2, ttl = 3,
	// completed_at = 4, result = 5; completeNoResult the same with REMOVE
	// result.
	complete, completeNoResult prepared
	// extend: owned, and SET deadline = 2, ttl = 3.
	extend prepared
	// ptComplete: FormatPowertools' completions (see
	// preparePowertoolsStatements); complete and completeNoResult are not
	// used there.
	ptComplete [4]prepared
}

// Bits of the statements.takeOver variants.
const (
	withFingerprint = 1 << iota
	withTransportID
	withMessageID
)

func prepareStatements(a AttributeNames) (statements, error) {
	var st statements
	var err error
	create := expression.AttributeNotExists(expression.Name(a.PartitionKey))
	if st.create, err = prepare(expression.NewBuilder().WithCondition(create), 0); err != nil {
		return st, err
	}
	fenceBelow := func(i int) expression.ConditionBuilder {
		return expression.AttributeNotExists(expression.Name(a.Fence)).Or(expression.Name(a.Fence).LessThan(placeholder(i)))
	}
	claim := expression.AttributeNotExists(expression.Name(a.PartitionKey)).
		Or(expression.Name(a.Deadline).LessThan(placeholder(0)).And(fenceBelow(1)))
	if st.claim, err = prepare(expression.NewBuilder().WithCondition(claim), 2); err != nil {
		return st, err
	}
	takeOver := expression.AttributeNotExists(expression.Name(a.PartitionKey)).
		Or(expression.Name(a.Deadline).LessThan(placeholder(0)).And(
			expression.Name(a.State).NotEqual(expression.Value(stateCompleted)),
			fenceBelow(5)))
	for v := range st.takeOver {
		u, n := takeOverUpdate(a, stateInProgress, takeOverSlots{token: 1, deadline: 2, ttl: 3, claimedAt: 4, fence: 5, next: 6}, v)
		if st.takeOver[v], err = prepare(expression.NewBuilder().WithCondition(takeOver).WithUpdate(u), n); err != nil {
			return st, err
		}
	}
	owned := ownedBy(a, stateInProgress)
	if st.owned, err = prepare(expression.NewBuilder().WithCondition(owned), 2); err != nil {
		return st, err
	}
	release := expression.Set(expression.Name(a.State), expression.Value(stateReleased)).
		Set(expression.Name(a.Deadline), expression.Value(0))
	if st.release, err = prepare(expression.NewBuilder().WithCondition(owned).WithUpdate(release), 2); err != nil {
		return st, err
	}
	complete := expression.Set(expression.Name(a.State), expression.Value(stateCompleted)).
		Set(expression.Name(a.Deadline), placeholder(2)).
		Set(expression.Name(a.TTL), placeholder(3)).
		Set(expression.Name(a.CompletedAt), placeholder(4))
	if st.complete, err = prepare(expression.NewBuilder().WithCondition(owned).WithUpdate(complete.Set(expression.Name(a.Result), placeholder(5))), 6); err != nil {
		return st, err
	}
	complete = expression.Set(expression.Name(a.State), expression.Value(stateCompleted)).
		Set(expression.Name(a.Deadline), placeholder(2)).
		Set(expression.Name(a.TTL), placeholder(3)).
		Set(expression.Name(a.CompletedAt), placeholder(4)).
		Remove(expression.Name(a.Result))
	if st.completeNoResult, err = prepare(expression.NewBuilder().WithCondition(owned).WithUpdate(complete), 5); err != nil {
		return st, err
	}
	extend := expression.Set(expression.Name(a.Deadline), placeholder(2)).
		Set(expression.Name(a.TTL), placeholder(3))
	if st.extend, err = prepare(expression.NewBuilder().WithCondition(owned).WithUpdate(extend), 4); err != nil {
		return st, err
	}
	return st, nil
}

// str is a string attribute value.
// takeOverSlots are the placeholders of a takeover's values.
type takeOverSlots struct{ token, deadline, ttl, claimedAt, fence, next int }

// takeOverUpdate writes a takeover in either layout: the record in state
// inProgress under a new token, deadline, expiry and fence, one more claim
// counted, the result gone, and the optional attributes of variant v from
// placeholder p.next on. It returns the update and its placeholder count.
func takeOverUpdate(a AttributeNames, inProgress string, p takeOverSlots, v int) (expression.UpdateBuilder, int) {
	u := expression.Set(expression.Name(a.State), expression.Value(inProgress)).
		Set(expression.Name(a.Token), placeholder(p.token)).
		Set(expression.Name(a.Deadline), placeholder(p.deadline)).
		Set(expression.Name(a.TTL), placeholder(p.ttl)).
		Set(expression.Name(a.Fence), placeholder(p.fence)).
		Set(expression.Name(a.Claims), expression.Plus(expression.IfNotExists(expression.Name(a.Claims), expression.Value(0)), expression.Value(1))).
		Set(expression.Name(a.ClaimedAt), expression.IfNotExists(expression.Name(a.ClaimedAt), placeholder(p.claimedAt))).
		Remove(expression.Name(a.Result)).
		Remove(expression.Name(a.CompletedAt))
	n := p.next
	if v&withFingerprint != 0 {
		u = u.Set(expression.Name(a.Fingerprint), placeholder(n))
		n++
	} else {
		u = u.Remove(expression.Name(a.Fingerprint))
	}
	for _, id := range []struct {
		bit  int
		name string
	}{{withTransportID, a.TransportID}, {withMessageID, a.MessageID}} {
		if v&id.bit != 0 {
			u = u.Set(expression.Name(id.name), expression.IfNotExists(expression.Name(id.name), placeholder(n)))
			n++
		}
	}
	return u, n
}

// ownedBy is the condition of a holder's write in either layout: token
// placeholder 0, in state inProgress, the deadline after placeholder 1.
func ownedBy(a AttributeNames, inProgress string) expression.ConditionBuilder {
	return expression.Name(a.Token).Equal(placeholder(0)).And(
		expression.Name(a.State).Equal(expression.Value(inProgress)),
		expression.Name(a.Deadline).GreaterThan(placeholder(1)),
	)
}

func str(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }
