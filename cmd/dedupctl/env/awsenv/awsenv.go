// Package awsenv loads the AWS SDK configuration of dedupctl (and of other
// commands that open the same stores, such as the repository's lab) from
// the standard environment (AWS_REGION, credentials, AWS_ENDPOINT_URL,
// AWS_ENDPOINT_URL_<SERVICE>, shared files), with two conveniences for
// local emulators, and says how to start an emulator when an endpoint does
// not answer. It builds DynamoDB clients; a command that also talks to SQS
// or SNS builds those clients from AWS.Config itself.
package awsenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// Hints printed when an AWS endpoint does not answer. The emulators are the
// npm packages of tools/ (`npm ci --prefix tools` installs them).
const (
	FauxqsHint = "start the local SQS/SNS emulator with `npm ci --prefix tools && node examples/sqs/fauxqs.mjs` (fauxqs on 127.0.0.1:4566) " +
		"and set AWS_ENDPOINT_URL=http://127.0.0.1:4566 (or set AWS_REGION and credentials to use AWS)"
	DynaliteHint = "start the local DynamoDB emulator with `npm ci --prefix tools && node tools/node_modules/dynalite/cli.js --host 127.0.0.1 --port 4567` " +
		"and set AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:4567 (or set AWS_REGION and credentials to use AWS)"
)

// localRegion is the region used with a local emulator when none is set.
const localRegion = "us-east-1"

// AWS is an AWS SDK configuration loaded like any SDK program's: region,
// credentials and endpoints come from the standard environment variables
// and shared files (AWS_REGION, AWS_PROFILE, AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_SQS,
// AWS_ENDPOINT_URL_SNS, AWS_ENDPOINT_URL_DYNAMODB, ...). The same program
// therefore runs against AWS or, with AWS_ENDPOINT_URL set, against a local
// emulator.
type AWS struct {
	// Config is the loaded SDK configuration.
	Config aws.Config
	// Local reports whether every endpoint in use points at a loopback
	// address (an emulator on this machine).
	Local bool

	endpoints map[string]string
}

// endpointEnv returns the endpoint configured for service ("SQS", "SNS",
// "DYNAMODB"): AWS_ENDPOINT_URL_<SERVICE>, else AWS_ENDPOINT_URL, else "".
func endpointEnv(service string) string {
	if v := strings.TrimSpace(os.Getenv("AWS_ENDPOINT_URL_" + strings.ToUpper(service))); v != "" {
		return v
	}
	return strings.TrimSpace(os.Getenv("AWS_ENDPOINT_URL"))
}

func isLoopback(endpoint string) bool {
	u, err := url.Parse(endpoint)
	if err != nil {
		return false
	}
	host := u.Hostname()
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// LoadAWS loads the configuration for the given services ("sqs", "sns",
// "dynamodb"). When every one of them has a loopback endpoint (a local
// emulator), two conveniences apply: the region defaults to us-east-1, and
// when AWS_ACCESS_KEY_ID is unset the credentials are the static pair
// test/test (emulators accept any). Without an endpoint, AWS itself is used
// and a region is required.
func LoadAWS(ctx context.Context, services ...string) (*AWS, error) {
	a := &AWS{endpoints: map[string]string{}, Local: len(services) > 0}
	for _, s := range services {
		e := endpointEnv(s)
		a.endpoints[strings.ToLower(s)] = e
		if e == "" || !isLoopback(e) {
			a.Local = false
		}
	}
	var opts []func(*config.LoadOptions) error
	if a.Local {
		if os.Getenv("AWS_REGION") == "" && os.Getenv("AWS_DEFAULT_REGION") == "" {
			opts = append(opts, config.WithRegion(localRegion))
		}
		if os.Getenv("AWS_ACCESS_KEY_ID") == "" {
			opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("test", "test", "")))
		}
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("awsenv: loading the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, &ConfigError{What: "region", Err: errors.New("set AWS_REGION to use AWS, or AWS_ENDPOINT_URL to use a local emulator")}
	}
	a.Config = cfg
	return a, nil
}

// Endpoint returns the endpoint configured for service, or "" for AWS.
func (a *AWS) Endpoint(service string) string { return a.endpoints[strings.ToLower(service)] }

// Describe names where service is reached, for output lines.
func (a *AWS) Describe(service string) string {
	if e := a.Endpoint(service); e != "" {
		return e
	}
	return "AWS " + a.Config.Region
}

// DynamoDB returns a DynamoDB client.
func (a *AWS) DynamoDB() *dynamodb.Client { return dynamodb.NewFromConfig(a.Config) }

// PingTimeout bounds a request that checks an endpoint answers.
const PingTimeout = 5 * time.Second

// PingDynamoDB checks that DynamoDB answers (one ListTables call, not
// retried). The error is an *UnreachableError naming the endpoint and how to
// start the local emulator.
func (a *AWS) PingDynamoDB(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, PingTimeout)
	defer cancel()
	_, err := a.DynamoDB().ListTables(ctx, &dynamodb.ListTablesInput{Limit: aws.Int32(1)}, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 })
	return a.Unreachable("dynamodb", DynaliteHint, err)
}

// UnreachableError says that an endpoint did not answer, and how to start a
// local emulator for it.
type UnreachableError struct {
	Service  string
	Endpoint string // "" for AWS
	Hint     string
	Err      error
}

func (e *UnreachableError) Error() string {
	where := e.Endpoint
	if where == "" {
		where = "AWS"
	}
	return fmt.Sprintf("%s does not answer at %s: %v", e.Service, where, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// Unreachable wraps the error of a ping of service into an
// *UnreachableError carrying the endpoint and hint; nil stays nil. When
// the configuration's credentials cannot be retrieved, the request never
// left: the error is a *ConfigError about them instead.
func (a *AWS) Unreachable(service, hint string, err error) error {
	if err == nil {
		return nil
	}
	if a.Config.Credentials != nil {
		ctx, cancel := context.WithTimeout(context.Background(), PingTimeout)
		defer cancel()
		if _, cerr := a.Config.Credentials.Retrieve(ctx); cerr != nil && ctx.Err() == nil {
			return &ConfigError{What: "credentials", Err: cerr}
		}
	}
	return &UnreachableError{Service: service, Endpoint: a.Endpoint(service), Hint: hint, Err: err}
}

// ConfigError says that the AWS SDK configuration cannot make a request:
// no region, or credentials that cannot be retrieved. Nothing was sent;
// the environment (AWS_REGION, AWS_PROFILE, the credentials) needs fixing,
// not the network.
type ConfigError struct {
	What string // "region" or "credentials"
	Err  error
}

func (e *ConfigError) Error() string {
	if e.What == "credentials" {
		return fmt.Sprintf("awsenv: no usable AWS credentials (set AWS_PROFILE or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, renew the SSO session, or set AWS_ENDPOINT_URL for a local emulator): %v", e.Err)
	}
	return fmt.Sprintf("awsenv: no AWS %s: %v", e.What, e.Err)
}

func (e *ConfigError) Unwrap() error { return e.Err }
