package dynamo

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Format is the layout of a store's items (Config.Format).
type Format int

const (
	// FormatNative is the store's own layout, described in the package
	// documentation. The default.
	FormatNative Format = iota
	// FormatPowertools is the layout of the DynamoDBPersistenceLayer of
	// Powertools for AWS Lambda (TypeScript and Python): the partition key
	// "<scope>#<key>", status INPROGRESS or COMPLETED, expiration in epoch
	// seconds, in_progress_expiration in epoch milliseconds, the result in
	// data and the fingerprint in validation, so that a record written by a
	// Powertools function is a duplicate here and the other way round. The
	// store's own token, fence and who-and-when ride along in attributes
	// that Powertools ignores. See the package documentation, "Sharing a
	// table with Powertools".
	FormatPowertools
)

// PowertoolsRuntime is the Powertools for AWS Lambda runtime whose
// functions share a FormatPowertools table. It decides how a result is
// kept in the data attribute, as each runtime writes and reads it.
type PowertoolsRuntime int

const (
	// PowertoolsTypeScript: data holds the handler's result as a DynamoDB
	// value (an object as a map, a string as a string, …), as the
	// TypeScript DynamoDBPersistenceLayer marshals it.
	PowertoolsTypeScript PowertoolsRuntime = iota + 1
	// PowertoolsPython: data holds the result as JSON text (a string), as
	// the Python DynamoDBPersistenceLayer writes it (json.dumps).
	PowertoolsPython
)

// Defaults of PowertoolsLayout, those of Powertools'
// DynamoDBPersistenceLayer.
const (
	DefaultPowertoolsKeyAttr              = "id"
	DefaultPowertoolsExpiryAttr           = "expiration"
	DefaultPowertoolsInProgressExpiryAttr = "in_progress_expiration"
	DefaultPowertoolsStatusAttr           = "status"
	DefaultPowertoolsDataAttr             = "data"
	DefaultPowertoolsValidationKeyAttr    = "validation"
)

// PowertoolsLayout configures FormatPowertools. Its attribute names are
// the options of Powertools' DynamoDBPersistenceLayer (keyAttr,
// expiryAttr, … in TypeScript; key_attr, expiry_attr, … in Python): set
// those the functions set, and leave the rest to their defaults, which are
// Powertools'. Powertools' sortKeyAttr layout (a composite key) is not
// supported: New refuses a table with a sort key.
type PowertoolsLayout struct {
	// Runtime is the runtime of the Powertools functions that share the
	// table. Required.
	Runtime PowertoolsRuntime

	// KeyAttr is the partition key (S). Defaults to "id".
	KeyAttr string
	// ExpiryAttr is the end of the record's life in epoch seconds (N), for
	// an in-progress record too; enable DynamoDB TTL on it. Defaults to
	// "expiration".
	ExpiryAttr string
	// InProgressExpiryAttr is when an in-progress record may be taken over,
	// in epoch milliseconds (N). Defaults to "in_progress_expiration".
	InProgressExpiryAttr string
	// StatusAttr is "INPROGRESS" or "COMPLETED" (S). Defaults to "status".
	StatusAttr string
	// DataAttr holds the stored result, as Runtime keeps it. Defaults to
	// "data".
	DataAttr string
	// ValidationKeyAttr holds the fingerprint (S): Powertools' payload
	// hash. Defaults to "validation".
	ValidationKeyAttr string
}

func (p *PowertoolsLayout) setDefaults() {
	set := func(v *string, d string) {
		if *v == "" {
			*v = d
		}
	}
	set(&p.KeyAttr, DefaultPowertoolsKeyAttr)
	set(&p.ExpiryAttr, DefaultPowertoolsExpiryAttr)
	set(&p.InProgressExpiryAttr, DefaultPowertoolsInProgressExpiryAttr)
	set(&p.StatusAttr, DefaultPowertoolsStatusAttr)
	set(&p.DataAttr, DefaultPowertoolsDataAttr)
	set(&p.ValidationKeyAttr, DefaultPowertoolsValidationKeyAttr)
}

// Powertools' status values.
const (
	ptInProgress = "INPROGRESS"
	ptCompleted  = "COMPLETED"
)

// PowertoolsPartitionKey returns the partition-key value under which a
// FormatPowertools store keeps key: for a scoped key "<scope>:<key>" (the
// engine's, dedup/admin.ScopedKey) it is "<scope>#<key>", Powertools'
// "<prefix>#<hash>" when the scope is the Powertools function's prefix
// and the key its hash (lambdadedup/powertools computes it). In the scope,
// "%" and "#" are escaped ("%25", "%23"; ":" is already "%3A"), so that
// the first "#" ends it and two keys never share a partition key; a key
// without ":" keeps no "#" at all ("#" escaped as in a scope). Keys over
// MaxVerbatimKeyBytes are then hashed as PartitionKey hashes them. Errors
// as PartitionKey's.
func PowertoolsPartitionKey(key string) (string, error) {
	if key == "" {
		return PartitionKey(key)
	}
	scope, rest, scoped := strings.Cut(key, ":")
	if !scoped {
		return PartitionKey(ptEscaper.Replace(key))
	}
	return PartitionKey(ptEscaper.Replace(scope) + "#" + rest)
}

var (
	ptEscaper   = strings.NewReplacer("%", "%25", "#", "%23")
	ptUnescaper = strings.NewReplacer("%23", "#", "%25", "%")
)

// powertoolsKey is PowertoolsPartitionKey's inverse on the partition keys
// it returns verbatim: the key that List reports for an item.
func powertoolsKey(pk string) string {
	scope, rest, scoped := strings.Cut(pk, "#")
	if !scoped {
		return ptUnescaper.Replace(pk)
	}
	return ptUnescaper.Replace(scope) + ":" + rest
}

// ptNotLive is the condition under which an item no longer holds its key,
// as Powertools' own claim decides it, with this store's
// ClockSkewMargin: its expiration passed (placeholder s, (now-margin) in
// seconds), or it is in progress with an in_progress_expiration that
// passed: by the margin (placeholder msMargin, now-margin in
// milliseconds), or at all for an item of this store (placeholder ms, now;
// this store writes its lease deadline plus the margin there).
func ptNotLive(a AttributeNames, s, msMargin, ms int) expression.ConditionBuilder {
	ipe := expression.Name(a.Deadline)
	return expression.Name(a.TTL).LessThan(placeholder(s)).Or(
		expression.Name(a.State).Equal(expression.Value(ptInProgress)).And(
			expression.AttributeExists(ipe),
			ipe.LessThan(placeholder(msMargin)).Or(expression.AttributeExists(expression.Name(a.Token)).And(ipe.LessThan(placeholder(ms)))),
		))
}

// The variants of ptStatements.complete, by what holds the result.
const (
	withData = 1 << iota // the data attribute, in Powertools' form
	withRaw              // the result's bytes, in AttributeNames.Result
)

// preparePowertoolsStatements builds the statements of FormatPowertools
// (see statements), with these placeholders:
//
//   - create: none (attribute_not_exists(id)).
//   - claim (the PutItem of a claim after a completed record's retention,
//     or of a record Powertools wrote): 0 (now-margin) s, 1 (now-margin)
//     ms, 2 now ms (ptNotLive), 3 the new fence.
//   - takeOver[v]: claim's, and 4 token, 5 in_progress_expiration, 6
//     expiration, 7 claimed_at, then fingerprint, transport_id, message_id
//     by the bits of v, as in the native layout.
//   - owned: 0 token, 1 now+margin ms (the lease has not ended: the
//     in_progress_expiration is the deadline plus the margin).
//   - release: owned; in_progress_expiration = 0, which both Powertools
//     and this store read as free.
//   - complete[v]: owned; 2 expiration, 3 completed_at, then data (v &
//     withData), result (v & withRaw).
//   - extend: owned; 2 in_progress_expiration, 3 expiration.
func preparePowertoolsStatements(a AttributeNames, dataAttr string) (statements, error) {
	var st statements
	var err error
	id := expression.Name(a.PartitionKey)
	if st.create, err = prepare(expression.NewBuilder().WithCondition(expression.AttributeNotExists(id)), 0); err != nil {
		return st, err
	}
	fenceBelow := expression.AttributeNotExists(expression.Name(a.Fence)).Or(expression.Name(a.Fence).LessThan(placeholder(3)))
	claim := expression.AttributeNotExists(id).Or(ptNotLive(a, 0, 1, 2).And(fenceBelow))
	if st.claim, err = prepare(expression.NewBuilder().WithCondition(claim), 4); err != nil {
		return st, err
	}
	takeOver := expression.AttributeNotExists(id).Or(ptNotLive(a, 0, 1, 2).And(
		expression.Name(a.State).NotEqual(expression.Value(ptCompleted)), fenceBelow))
	for v := range st.takeOver {
		u, n := takeOverUpdate(a, ptInProgress, takeOverSlots{fence: 3, token: 4, deadline: 5, ttl: 6, claimedAt: 7, next: 8}, v)
		u = u.Remove(expression.Name(dataAttr))
		if st.takeOver[v], err = prepare(expression.NewBuilder().WithCondition(takeOver).WithUpdate(u), n); err != nil {
			return st, err
		}
	}
	owned := ownedBy(a, ptInProgress)
	if st.owned, err = prepare(expression.NewBuilder().WithCondition(owned), 2); err != nil {
		return st, err
	}
	release := expression.Set(expression.Name(a.Deadline), expression.Value(0))
	if st.release, err = prepare(expression.NewBuilder().WithCondition(owned).WithUpdate(release), 2); err != nil {
		return st, err
	}
	for v := range st.ptComplete {
		u := expression.Set(expression.Name(a.State), expression.Value(ptCompleted)).
			Set(expression.Name(a.TTL), placeholder(2)).
			Set(expression.Name(a.CompletedAt), placeholder(3)).
			Remove(expression.Name(a.Deadline))
		n := 4
		for _, r := range []struct {
			bit  int
			name string
		}{{withData, dataAttr}, {withRaw, a.Result}} {
			if v&r.bit != 0 {
				u = u.Set(expression.Name(r.name), placeholder(n))
				n++
			} else {
				u = u.Remove(expression.Name(r.name))
			}
		}
		if st.ptComplete[v], err = prepare(expression.NewBuilder().WithCondition(owned).WithUpdate(u), n); err != nil {
			return st, err
		}
	}
	extend := expression.Set(expression.Name(a.Deadline), placeholder(2)).
		Set(expression.Name(a.TTL), placeholder(3))
	if st.extend, err = prepare(expression.NewBuilder().WithCondition(owned).WithUpdate(extend), 4); err != nil {
		return st, err
	}
	return st, nil
}

// seconds is a Unix millisecond time as a DynamoDB number of seconds with
// three decimals, for comparisons with epoch-second attributes.
func seconds(ms int64) types.AttributeValue {
	sign := ""
	if ms < 0 {
		sign, ms = "-", -ms
	}
	return &types.AttributeValueMemberN{Value: fmt.Sprintf("%s%d.%03d", sign, ms/1000, ms%1000)}
}

// decodePowertools reads an item of FormatPowertools, written by this
// store or by a Powertools function (which writes no token, fence or
// who-and-when: its claim replaces the whole item).
func (s *Store) decodePowertools(item map[string]types.AttributeValue) (record, error) {
	var rec record
	str := func(name string, required bool) (string, error) {
		v, ok := item[name]
		if !ok && !required {
			return "", nil
		}
		sv, ok := v.(*types.AttributeValueMemberS)
		if !ok {
			return "", fmt.Errorf("%w: attribute %q is missing or not a string", ErrMalformedRecord, name)
		}
		return sv.Value, nil
	}
	num := func(name string) (int64, bool, error) {
		v, ok := item[name]
		if !ok {
			return 0, false, nil
		}
		n, ok := v.(*types.AttributeValueMemberN)
		if !ok {
			return 0, false, fmt.Errorf("%w: attribute %q is not a number", ErrMalformedRecord, name)
		}
		i, err := strconv.ParseInt(n.Value, 10, 64)
		if err != nil {
			// Powertools writes whole numbers; a fraction is read down.
			f, ferr := strconv.ParseFloat(n.Value, 64)
			if ferr != nil || math.IsInf(f, 0) || math.IsNaN(f) {
				return 0, false, fmt.Errorf("%w: attribute %q: %w", ErrMalformedRecord, name, err)
			}
			i = int64(math.Floor(f))
		}
		return i, true, nil
	}
	status, err := str(s.attr.State, true)
	if err != nil {
		return record{}, err
	}
	var hasExpiry bool
	if rec.expiry, hasExpiry, err = num(s.attr.TTL); err != nil {
		return record{}, err
	}
	if !hasExpiry {
		return record{}, fmt.Errorf("%w: attribute %q is missing", ErrMalformedRecord, s.attr.TTL)
	}
	if rec.ipe, rec.hasIPE, err = num(s.attr.Deadline); err != nil {
		return record{}, err
	}
	if rec.token, err = str(s.attr.Token, false); err != nil {
		return record{}, err
	}
	rec.ours = rec.token != ""
	if rec.fingerprint, err = str(s.attr.Fingerprint, false); err != nil {
		return record{}, err
	}
	switch status {
	case ptCompleted:
		rec.state, rec.deadline = stateCompleted, rec.expiry*1000
	case ptInProgress:
		rec.state, rec.deadline = stateInProgress, rec.expiry*1000
		switch {
		case rec.ours && rec.hasIPE && rec.ipe == 0:
			rec.state, rec.deadline = stateReleased, 0
		case rec.ours && rec.hasIPE:
			rec.deadline = min(rec.deadline, rec.ipe-s.marginMs)
		case rec.hasIPE:
			rec.deadline = min(rec.deadline, rec.ipe)
		}
	default:
		return record{}, fmt.Errorf("%w: unknown status %q", ErrMalformedRecord, status)
	}
	if v, ok := item[s.attr.Result]; ok {
		b, ok := v.(*types.AttributeValueMemberB)
		if !ok {
			return record{}, fmt.Errorf("%w: attribute %q is not binary", ErrMalformedRecord, s.attr.Result)
		}
		rec.result = b.Value
	} else if v, ok := item[s.pt.DataAttr]; ok {
		if rec.result, err = s.pt.decodeData(v); err != nil {
			return record{}, fmt.Errorf("%w: attribute %q: %w", ErrMalformedRecord, s.pt.DataAttr, err)
		}
	}
	if err := s.decodeFenceAndProvenance(item, &rec, str); err != nil {
		return record{}, err
	}
	return rec, nil
}

// ptLive reports whether a FormatPowertools record still holds its key at
// now (Unix milliseconds): the negation of ptNotLive, evaluated here.
func (s *Store) ptLive(rec record, now int64) bool {
	if rec.expiry*1000 < now-s.marginMs {
		return false
	}
	if rec.state != stateCompleted && rec.hasIPE && (rec.ipe < now-s.marginMs || rec.ours && rec.ipe < now) {
		return false
	}
	return true
}

// ptResult is how a FormatPowertools Complete keeps a result: in data (in
// the runtime's form), in AttributeNames.Result (the bytes), or both.
type ptResult struct {
	data types.AttributeValue // nil: not in data
	raw  []byte               // nil: not in AttributeNames.Result
}

// encodeResult decides where a result goes. In data when the runtime can
// read it: for Python valid JSON, kept as its text (read back byte for
// byte); for TypeScript valid JSON whose numbers a JavaScript number holds
// exactly (at most 2^53-1 in magnitude) and DynamoDB can store, kept as
// the DynamoDB value Powertools' marshal makes of it, read back as compact
// JSON with sorted keys. The bytes go to Result too when that reading
// would differ from them (other whitespace or key order, numbers
// DynamoDB rewrites), and alone when data cannot hold the result (not
// JSON, larger numbers), or both together would not fit within limit.
func (p *PowertoolsLayout) encodeResult(result []byte, limit int) ptResult {
	if len(result) == 0 {
		return ptResult{}
	}
	if !utf8.Valid(result) || !json.Valid(result) {
		return ptResult{raw: result}
	}
	if p.Runtime == PowertoolsPython {
		return ptResult{data: &types.AttributeValueMemberS{Value: string(result)}}
	}
	dec := json.NewDecoder(bytes.NewReader(result))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return ptResult{raw: result}
	}
	av, exact, ok := jsonToAttribute(v, 0)
	if !ok {
		return ptResult{raw: result}
	}
	if exact {
		back, err := attributeJSON(av)
		exact = err == nil && bytes.Equal(back, result)
	}
	if exact {
		if valueSize(av) > limit {
			return ptResult{raw: result}
		}
		return ptResult{data: av}
	}
	if len(result)+valueSize(av) > limit {
		return ptResult{raw: result}
	}
	return ptResult{data: av, raw: result}
}

// maxDepth is DynamoDB's limit on nested maps and lists.
const maxDepth = 32

// plainNumber is a number DynamoDB returns as it was written: no exponent,
// no leading zeros, no trailing zeros in the fraction, not "-0".
var plainNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]*[1-9])?$`)

// jsonToAttribute converts a JSON value (decoded with UseNumber) to the
// DynamoDB value Powertools' marshal (TypeScript) makes of it. ok is
// false when it cannot: a number outside ±(2^53-1) (Powertools' unmarshal
// would turn it into a BigInt or fail) or DynamoDB's range, nesting deeper
// than DynamoDB allows, an empty map key. exact is false when DynamoDB
// would return a number written otherwise.
func jsonToAttribute(v any, depth int) (av types.AttributeValue, exact, ok bool) {
	switch v := v.(type) {
	case nil:
		return &types.AttributeValueMemberNULL{Value: true}, true, true
	case bool:
		return &types.AttributeValueMemberBOOL{Value: v}, true, true
	case string:
		return &types.AttributeValueMemberS{Value: v}, true, true
	case json.Number:
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil || math.Abs(f) > 1<<53-1 || f != 0 && math.Abs(f) < 1e-130 {
			return nil, false, false
		}
		digits := strings.TrimLeft(strings.Map(func(r rune) rune {
			if r >= '0' && r <= '9' {
				return r
			}
			return -1
		}, strings.SplitN(strings.ToLower(string(v)), "e", 2)[0]), "0")
		if len(strings.TrimRight(digits, "0")) > 38 {
			return nil, false, false
		}
		return &types.AttributeValueMemberN{Value: string(v)}, plainNumber.MatchString(string(v)) && string(v) != "-0", true
	case []any:
		if depth >= maxDepth {
			return nil, false, false
		}
		l := make([]types.AttributeValue, len(v))
		exact := true
		for i, e := range v {
			a, x, ok := jsonToAttribute(e, depth+1)
			if !ok {
				return nil, false, false
			}
			l[i], exact = a, exact && x
		}
		return &types.AttributeValueMemberL{Value: l}, exact, true
	case map[string]any:
		if depth >= maxDepth {
			return nil, false, false
		}
		m := make(map[string]types.AttributeValue, len(v))
		exact := true
		for k, e := range v {
			if k == "" {
				return nil, false, false
			}
			a, x, ok := jsonToAttribute(e, depth+1)
			if !ok {
				return nil, false, false
			}
			m[k], exact = a, exact && x
		}
		return &types.AttributeValueMemberM{Value: m}, exact, true
	}
	return nil, false, false
}

// decodeData reads the data attribute as the JSON text of the result:
// for Python a string holds that text; otherwise the DynamoDB value is
// written as compact JSON with sorted keys (see attributeJSON).
func (p *PowertoolsLayout) decodeData(v types.AttributeValue) ([]byte, error) {
	if s, ok := v.(*types.AttributeValueMemberS); ok && p.Runtime == PowertoolsPython {
		return []byte(s.Value), nil
	}
	return attributeJSON(v)
}

// attributeJSON writes a DynamoDB value as JSON: compact, map keys sorted,
// strings as encoding/json writes them without HTML escaping, numbers as
// DynamoDB returns them, sets as arrays, binary as base64 text.
func attributeJSON(v types.AttributeValue) ([]byte, error) {
	x, err := attributeValue(v)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(x); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func attributeValue(v types.AttributeValue) (any, error) {
	switch v := v.(type) {
	case *types.AttributeValueMemberNULL:
		return nil, nil
	case *types.AttributeValueMemberBOOL:
		return v.Value, nil
	case *types.AttributeValueMemberS:
		return v.Value, nil
	case *types.AttributeValueMemberN:
		return json.Number(v.Value), nil
	case *types.AttributeValueMemberB:
		return v.Value, nil // encoding/json writes base64
	case *types.AttributeValueMemberSS:
		return v.Value, nil
	case *types.AttributeValueMemberNS:
		l := make([]json.Number, len(v.Value))
		for i, n := range v.Value {
			l[i] = json.Number(n)
		}
		return l, nil
	case *types.AttributeValueMemberBS:
		return v.Value, nil
	case *types.AttributeValueMemberL:
		l := make([]any, len(v.Value))
		for i, e := range v.Value {
			x, err := attributeValue(e)
			if err != nil {
				return nil, err
			}
			l[i] = x
		}
		return l, nil
	case *types.AttributeValueMemberM:
		m := make(map[string]any, len(v.Value))
		for k, e := range v.Value {
			x, err := attributeValue(e)
			if err != nil {
				return nil, err
			}
			m[k] = x
		}
		return m, nil
	}
	return nil, errors.New("unknown DynamoDB value type")
}
