package dynamo

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// Errors of the table check New makes (see Config.SkipTableCheck). Each is
// returned wrapped, with a message that says what to change.
var (
	// ErrTableNotFound: the table does not exist (in this account and
	// region). Create it (CreateTable, or infrastructure as code), or fix
	// Config.Table or the region.
	ErrTableNotFound = errors.New("dynamo: table not found")

	// ErrTableSchema: the table's key is not the one the store writes: a
	// string (S) partition key named AttributeNames.PartitionKey and no
	// sort key. Set AttributeNames.PartitionKey to the table's, or use
	// another table.
	ErrTableSchema = errors.New("dynamo: the table's key schema is not the store's")

	// ErrTTLDisabled: Time to Live is not enabled on AttributeNames.TTL, so
	// expired records are never deleted and storage grows for ever (the
	// store still treats them as absent). Enable it (EnableTTL), or set
	// Config.SkipTTL.
	ErrTTLDisabled = errors.New("dynamo: Time to Live is not enabled on the table's TTL attribute")

	// ErrAWSConfig: the AWS SDK could not address or sign a request: no
	// region, or credentials that cannot be retrieved (no access key, an
	// expired SSO session, a profile that does not exist). Nothing reached
	// DynamoDB: fix the environment (AWS_REGION, AWS_PROFILE, the
	// credentials), not the network. New returns it as an *AWSConfigError.
	ErrAWSConfig = errors.New("dynamo: the AWS SDK configuration cannot reach DynamoDB")

	// ErrEventuallyConsistentReplicas: the table is a global table
	// replicated with multi-Region eventual consistency (MREC), where a
	// claim is not atomic: each Region decides a conditional write against
	// its own copy of the item, so claims of one key in two Regions can
	// both succeed (replication then keeps the last writer), both run the
	// effect, and carry fences that do not order them. New returns it as
	// a *ReplicasError. Use a single-Region table, a global table created
	// with multi-Region strong consistency (MRSC), or, with every consumer
	// writing to one Region, set Config.AllowEventuallyConsistentReplicas.
	ErrEventuallyConsistentReplicas = errors.New("dynamo: the table is replicated across Regions with eventual consistency")
)

// ReplicasError is New's refusal of a global table replicated with
// eventual consistency (see ErrEventuallyConsistentReplicas). It matches
// ErrEventuallyConsistentReplicas.
type ReplicasError struct {
	// Table is the table's name.
	Table string
	// Regions are the Regions of its replicas, as DescribeTable lists
	// them.
	Regions []string
}

func (e *ReplicasError) Error() string {
	return fmt.Sprintf("%v: table %q has replicas in %s (multi-Region eventual consistency): "+
		"claims of one key in two Regions can both succeed; use a single-Region table or one with multi-Region strong consistency, "+
		"or, if every consumer writes to one Region, set Config.AllowEventuallyConsistentReplicas",
		ErrEventuallyConsistentReplicas, e.Table, strings.Join(e.Regions, ", "))
}

// Unwrap makes the error match ErrEventuallyConsistentReplicas.
func (e *ReplicasError) Unwrap() error { return ErrEventuallyConsistentReplicas }

// AWSConfigError is a region or credentials failure of the AWS SDK (see
// ErrAWSConfig), told apart from a DynamoDB that does not answer. It
// matches ErrAWSConfig and its cause with errors.Is and errors.As.
type AWSConfigError struct {
	// What is "region" or "credentials".
	What string
	// Err is the SDK's error.
	Err error
}

func (e *AWSConfigError) Error() string {
	hint := "set AWS_REGION (or the client's Region)"
	if e.What == "credentials" {
		hint = "check AWS_PROFILE, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the SSO session (aws sso login)"
	}
	return fmt.Sprintf("%v: no usable %s: %s: %v", ErrAWSConfig, e.What, hint, e.Err)
}

// Unwrap returns ErrAWSConfig and the SDK's error.
func (e *AWSConfigError) Unwrap() []error { return []error{ErrAWSConfig, e.Err} }

// checkTable checks, once, that the table can hold the store's records: it
// exists, its key schema is the store's, it is not replicated with
// eventual consistency (unless allowed), and (unless SkipTTL) Time to Live
// is on for the TTL attribute. It notes a table replicated with strong
// consistency, on which RunInTx is refused. A failure of the request
// itself is told apart: a region or credentials failure is an
// *AWSConfigError. Cost: DescribeTable, and DescribeTimeToLive unless
// SkipTTL.
func (s *Store) checkTable(ctx context.Context, config *Config) error {
	skipTTL := config.SkipTTL
	var opts *dynamodb.Options // the client's, once it used the option
	capture := func(o *dynamodb.Options) { c := *o; opts = &c }
	out, err := s.client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(s.table)}, capture)
	var notFound *types.ResourceNotFoundException
	switch {
	case errors.As(err, &notFound):
		return fmt.Errorf("%w: %q: create it (dynamo.CreateTable, or infrastructure as code), or fix Config.Table or the region: %w", ErrTableNotFound, s.table, err)
	case err != nil:
		return s.requestError(ctx, "DescribeTable", opts, err)
	}
	if err := s.checkKeySchema(out.Table); err != nil {
		return err
	}
	strong, err := checkReplicas(out.Table, s.table, config.AllowEventuallyConsistentReplicas)
	if err != nil {
		return err
	}
	s.strongReplicas = strong
	if skipTTL {
		return nil
	}
	ttl, err := s.client.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(s.table)}, capture)
	if err != nil {
		return fmt.Errorf("dynamo: checking Time to Live of table %q (set Config.SkipTTL for servers without it, such as dynalite): %w", s.table, s.requestError(ctx, "DescribeTimeToLive", opts, err))
	}
	d := ttl.TimeToLiveDescription
	on := d != nil && (d.TimeToLiveStatus == types.TimeToLiveStatusEnabled || d.TimeToLiveStatus == types.TimeToLiveStatusEnabling)
	if !on || aws.ToString(d.AttributeName) != s.attr.TTL {
		status, attr := "DISABLED", ""
		if d != nil {
			status, attr = string(d.TimeToLiveStatus), aws.ToString(d.AttributeName)
		}
		if strong {
			return fmt.Errorf("%w: table %q has Time to Live %s on %q: it is a global table with multi-Region strong consistency, "+
				"which DynamoDB gives no Time to Live: set Config.SkipTTL (expired records then stay in the table, treated as absent; delete them otherwise)",
				ErrTTLDisabled, s.table, status, attr)
		}
		return fmt.Errorf("%w: table %q has Time to Live %s on %q, the store writes %q: enable it (dynamo.EnableTTL), or set Config.SkipTTL", ErrTTLDisabled, s.table, status, attr, s.attr.TTL)
	}
	return nil
}

// checkReplicas decides from DescribeTable whether the table's claims are
// atomic: a single-Region table's are, and so are those of a global table
// with multi-Region strong consistency (MRSC: strong reports it); a
// global table with multi-Region eventual consistency (MREC, also when
// MultiRegionConsistency is absent, its default) is a *ReplicasError
// unless allowed. A table is global when DescribeTable lists replicas or
// a witness (which only MRSC tables have); its consistency mode alone
// does not make it one. A replica of global tables version 2017.11.29
// (Legacy, always eventually consistent) is not described as such by
// DescribeTable and passes: only DescribeGlobalTable tells.
func checkReplicas(t *types.TableDescription, table string, allowEventual bool) (strong bool, _ error) {
	if len(t.Replicas) == 0 && len(t.GlobalTableWitnesses) == 0 {
		return false, nil
	}
	if t.MultiRegionConsistency == types.MultiRegionConsistencyStrong ||
		t.MultiRegionConsistency == "" && len(t.GlobalTableWitnesses) > 0 {
		return true, nil
	}
	if allowEventual {
		return false, nil
	}
	regions := make([]string, 0, len(t.Replicas))
	for _, r := range t.Replicas {
		regions = append(regions, aws.ToString(r.RegionName))
	}
	return false, &ReplicasError{Table: table, Regions: regions}
}

// checkKeySchema checks that the table's key is a string partition key
// named after AttributeNames.PartitionKey, without a sort key.
func (s *Store) checkKeySchema(t *types.TableDescription) error {
	if t == nil {
		return fmt.Errorf("%w: DescribeTable of %q returned no description", ErrTableSchema, s.table)
	}
	var hash, other []string
	for _, k := range t.KeySchema {
		if k.KeyType == types.KeyTypeHash {
			hash = append(hash, aws.ToString(k.AttributeName))
		} else {
			other = append(other, aws.ToString(k.AttributeName))
		}
	}
	typ := ""
	for _, a := range t.AttributeDefinitions {
		if aws.ToString(a.AttributeName) == s.attr.PartitionKey {
			typ = string(a.AttributeType)
		}
	}
	if len(hash) != 1 || hash[0] != s.attr.PartitionKey || len(other) > 0 || typ != string(types.ScalarAttributeTypeS) {
		return fmt.Errorf("%w: table %q has partition key %q (type %q) and sort key %q; the store needs a string (S) partition key %q and no sort key: "+
			"set Config.Attributes.PartitionKey to the table's, or use another table", ErrTableSchema, s.table, hash, typ, other, s.attr.PartitionKey)
	}
	return nil
}

// credentialCodes are the DynamoDB error codes of a request whose
// credentials were refused.
var credentialCodes = map[string]bool{
	"UnrecognizedClientException": true, "InvalidSignatureException": true, "ExpiredTokenException": true,
	"MissingAuthenticationTokenException": true, "InvalidClientTokenId": true, "IncompleteSignature": true,
}

// requestError is the error of a request that got no answer from the
// table: an *AWSConfigError when the client (whose options opts are, when
// it used the option) has no region or cannot retrieve its credentials,
// or DynamoDB refused them; else err, wrapped with the operation (and,
// when access was denied, how to skip the check).
func (s *Store) requestError(ctx context.Context, op string, opts *dynamodb.Options, err error) error {
	if ctx.Err() != nil { // New's context ended: nothing to tell about the configuration
		return fmt.Errorf("dynamo: %s of table %q: %w", op, s.table, err)
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) && credentialCodes[apiErr.ErrorCode()] {
		return &AWSConfigError{What: "credentials", Err: err}
	}
	if opts != nil && opts.Region == "" {
		return &AWSConfigError{What: "region", Err: err}
	}
	if opts != nil && opts.Credentials != nil {
		if _, cerr := opts.Credentials.Retrieve(ctx); cerr != nil && ctx.Err() == nil {
			return &AWSConfigError{What: "credentials", Err: cerr}
		}
	}
	if errors.As(err, &apiErr) && apiErr.ErrorCode() == "AccessDeniedException" {
		return fmt.Errorf("dynamo: %s of table %q was denied: grant dynamodb:DescribeTable and dynamodb:DescribeTimeToLive on the table, or set Config.SkipTableCheck: %w", op, s.table, err)
	}
	return fmt.Errorf("dynamo: %s of table %q: %w", op, s.table, err)
}
